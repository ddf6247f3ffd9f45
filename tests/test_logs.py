"""Log formats: readable lines by default, one JSON object per line with --log-format json."""

from __future__ import annotations

import json
import logging

import pytest

from nvidia_device_plugin.logs import configure_logging


@pytest.fixture(autouse=True)
def restore_root_logger() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_for_log_pipelines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    logging.getLogger("nvidia_device_plugin.plugin.manager").info(
        "registered %s with kubelet", "nvidia.com/gpu"
    )
    logging.getLogger("nvidia_device_plugin.daemon").debug("not shown at info")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("nvidia_device_plugin.daemon").exception("reload failed")
    lines = capsys.readouterr().err.strip().splitlines()
    entries = [json.loads(line) for line in lines]
    assert len(entries) == 2
    assert entries[0]["msg"] == "registered nvidia.com/gpu with kubelet"
    assert entries[0]["level"] == "info"
    assert entries[0]["logger"] == "nvidia_device_plugin.plugin.manager"
    assert entries[0]["ts"].endswith("Z")
    assert entries[1]["level"] == "error" and "RuntimeError: boom" in entries[1]["error"]


def test_text_lines_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "text")
    logging.getLogger("nvidia_device_plugin.health").warning("GPU 3 is unhealthy: XID 79")
    logging.getLogger("nvidia_device_plugin.health").info("hidden at warning")
    err = capsys.readouterr().err
    assert "WARNING" in err and "nvidia_device_plugin.health: GPU 3 is unhealthy: XID 79" in err
    assert "hidden" not in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err.strip())
