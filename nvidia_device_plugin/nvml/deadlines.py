"""How long an NVML call may take (nvml/bounded.py enforces it): the default and the bounds of
`--nvml-call-deadline`, kept apart so that parsing the flag does not load pynvml."""

from __future__ import annotations

DEFAULT_CALL_TIMEOUT_S = 10.0
MIN_CALL_TIMEOUT_S = 1.0  # shorter, and a busy driver's ordinary calls would be called stuck
MAX_CALL_TIMEOUT_S = 600.0  # longer, and a hung GPU would be served as usable for minutes
SLOW_FRACTION = 0.25  # a call that took this share of its deadline is slow (counted and logged)
