from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """The commands run in process here configure logging as `main` does (root level and handler);
    put it back, so that no later test of the session finds its warnings filtered out."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    noisy = {name: logging.getLogger(name).level for name in ("watchdog", "grpc")}
    yield
    root.setLevel(level)
    root.handlers[:] = handlers
    for name, was in noisy.items():
        logging.getLogger(name).setLevel(was)
