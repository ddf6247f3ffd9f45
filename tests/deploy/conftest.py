from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helm_engine import share_renders


@pytest.fixture(scope="session", autouse=True)
def _helm_renders_shared_by_the_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under xdist, the workers of one run share Helm's renders: each worker's base temp is popen-gwN under
    the run's own directory, which no other run uses. A single process has its own in-memory caches."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "helm-renders"
        shared.mkdir(exist_ok=True)
        share_renders(shared)
    yield
    share_renders(None)
