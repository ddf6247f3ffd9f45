"""The environment of the programs tests start (config-manager, gpu-feature-discovery, the daemon).

CHILD_PATH goes first on their PYTHONPATH: it hides test-only packages the image does not have and that cost
a program seconds to import (child_path/kubernetes_validate.py says which and why). tests/conftest.py puts
it on this process's PYTHONPATH for programs started with the test's environment; `clean_environment` gives
it to programs started with an environment of their own, as a container would have.
"""

from __future__ import annotations

import os
from pathlib import Path

CHILD_PATH = Path(__file__).parent / "child_path"


def clean_environment(**variables: str) -> dict[str, str]:
    """PATH (this process's), CHILD_PATH as PYTHONPATH, then `variables`; nothing else of the test's."""
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(CHILD_PATH), **variables}
