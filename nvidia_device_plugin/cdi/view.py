"""How `plan` shows the CDI specs that would be written (pure; planview and cli call these)."""

from __future__ import annotations

from typing import Any

from nvidia_device_plugin.cdi.model import CdiPlan


def cdi_to_json(cdi: CdiPlan | None) -> dict[str, Any] | None:
    """`plan --output json`'s "cdi" section; None (null) when no CDI device-list strategy is configured.

    {"spec_dir": "/var/run/cdi", "problem": null, "notes": [],
     "specs": [{"file": "k8s.device-plugin.nvidia.com-gpu.json", "kind": "k8s.device-plugin.nvidia.com/gpu",
                "devices": ["k8s.device-plugin.nvidia.com/gpu=GPU-...", ...], "spec": {...the document...}}]}
    """
    if cdi is None:
        return None
    return {
        "spec_dir": cdi.spec_dir,
        "problem": cdi.problem,
        "notes": list(cdi.notes),
        "specs": [
            {"file": s.file_name, "kind": s.kind, "devices": list(s.device_names), "spec": s.document}
            for s in cdi.specs
        ],
    }


def render_cdi_summary(cdi: CdiPlan | None) -> str:
    """A few lines under the plan table: where the specs go and what they define, or why they cannot."""
    if cdi is None:
        return ""
    if cdi.problem is not None:
        return f"CDI: {cdi.problem}; no resource would be served\n"
    lines = [f"CDI specs in {cdi.spec_dir}:"]
    for spec in cdi.specs:
        edits = spec.document.get("containerEdits", {})
        lines.append(
            f"  {spec.file_name}: {len(spec.document['devices'])} devices, "
            f"{len(edits.get('mounts', []))} driver files mounted, {len(edits.get('hooks', []))} hooks"
        )
    lines += [f"  note: {note}" for note in cdi.notes]
    return "\n".join(lines) + "\n"
