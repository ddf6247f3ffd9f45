"""Running a command as PID 1 of its own PID namespace (as in a container), where this machine allows it."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.waiting import scaled


def pid_namespace_prefix(for_what: str) -> list[str]:
    """The argv prefix that runs a command as PID 1 of a new PID namespace with its own /proc (a user
    namespace too when not root); the test is skipped, naming `for_what`, where unshare cannot."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=scaled(30), check=False)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace {for_what} (unshare: {probe.stderr.strip()})")
    return prefix
