"""Resource names from patterns and MIG profiles, as NVIDIA's plugin (v0.20) derives them."""

from __future__ import annotations

import re
from functools import lru_cache

from nvidia_device_plugin.config.v1 import RESOURCE_PREFIX

_COMPUTE_INSTANCE_PREFIX = re.compile(r"^\d+c\.")

__all__ = ["default_mig_resource_name", "resource_pattern_matches"]


def resource_pattern_matches(pattern: str, name: str) -> bool:
    """NVIDIA's ResourcePattern.Matches (v0.20): `*` is any run of characters, the rest is literal, and the
    pattern must match the whole name ("1g.10gb" does not match "1g.10gb+me"; "A100" does not match
    "NVIDIA A100-SXM4-80GB", "*A100*" does)."""
    return _compiled_pattern(pattern).fullmatch(name) is not None


@lru_cache(maxsize=256)
def _compiled_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(literal) for literal in pattern.split("*")), re.DOTALL)


def default_mig_resource_name(profile: str) -> str:
    """The `mixed` strategy's resource for a MIG profile: "1g.10gb" -> nvidia.com/mig-1g.10gb.

    "+" is not valid in a resource name, so "1g.10gb+me" -> mig-1g.10gb.me (as NVIDIA names it); a
    compute-instance profile "1c.3g.40gb" goes with its GPU instance, mig-3g.40gb.
    """
    gpu_instance_profile = _COMPUTE_INSTANCE_PREFIX.sub("", profile)
    return f"{RESOURCE_PREFIX}/mig-{gpu_instance_profile.replace('+', '.')}"
