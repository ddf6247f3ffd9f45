"""The suite's own set-up costs, which every pytest worker pays before its first test."""

from __future__ import annotations

import sys


def test_no_worker_builds_the_rfc3987_grammar() -> None:
    # tests/conftest.py leaves rfc3987_syntax out (None in sys.modules), so jsonschema skips building its
    # RFC 3987 grammar: 1.2-1.9 s of CPU in every worker. A support module that imports jsonschema while
    # conftest is imported, before pytest_configure runs, builds it anyway (support.programs did).
    assert "rfc3987_syntax" in sys.modules
    assert sys.modules["rfc3987_syntax"] is None
