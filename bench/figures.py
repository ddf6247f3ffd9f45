"""What a benchmark reports: a figure (median, p99) beside its reference and target, as JSON and a table."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (q in 0..100): always one of the samples, so p99 of 20 is the max."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    median: float
    p99: float | None  # None for a figure measured once (a single RSS reading, one CPU window)
    samples: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        if len(samples) == 1:
            return cls(samples[0], None, 1)
        return cls(percentile(samples, 50), percentile(samples, 99), len(samples))


@dataclass(frozen=True)
class Reference:
    """What the figure is compared with, measured in the same run."""

    title: str
    value: Summary


@dataclass(frozen=True)
class Target:
    """A goal for the figure; reported as met or missed, never asserted."""

    text: str  # e.g. "p99 < 3x reference p99"
    met: bool


@dataclass(frozen=True)
class Figure:
    key: str  # stable identifier, e.g. "allocate.whole.1"
    title: str
    unit: str  # "ms", "s", "MB", "% of a core", "bytes"
    value: Summary
    reference: Reference | None = None
    target: Target | None = None
    note: str = ""

    @property
    def ratio(self) -> tuple[float | None, float | None]:
        """(median / reference median, p99 / reference p99), None where either side is missing or 0."""
        if self.reference is None:
            return None, None
        ref = self.reference.value
        return _div(self.value.median, ref.median), _div(self.value.p99, ref.p99)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        median_ratio, p99_ratio = self.ratio
        doc["ratio"] = {"median": median_ratio, "p99": p99_ratio}
        return doc


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---- targets --------------------------------------------------------------------------------------------


def p99_within(factor: float) -> Callable[[Summary, Summary | None], Target | None]:
    """Target: the figure's p99 under `factor` times the reference's p99 (median when either has no p99)."""

    def judge(value: Summary, ref: Summary | None) -> Target | None:
        if ref is None:
            return None
        ours = value.p99 if value.p99 is not None and ref.p99 is not None else value.median
        theirs = ref.p99 if value.p99 is not None and ref.p99 is not None else ref.median
        what = "p99" if value.p99 is not None and ref.p99 is not None else "median"
        return Target(f"{what} < {factor:g}x reference", ours < factor * theirs)

    return judge


def median_within(factor: float) -> Callable[[Summary, Summary | None], Target | None]:
    """Target: the figure's median at most `factor` times the reference's median (its only value if one)."""

    def judge(value: Summary, ref: Summary | None) -> Target | None:
        if ref is None:
            return None
        return Target(f"median <= {factor:g}x reference", value.median <= factor * ref.median)

    return judge


def worst_under(
    limit: float, unit: str, shown: str | None = None
) -> Callable[[Summary, Summary | None], Target | None]:
    """Target: the figure's p99 (its only value when measured once) under an absolute `limit`."""

    def judge(value: Summary, ref: Summary | None) -> Target | None:
        worst = value.p99 if value.p99 is not None else value.median
        label = "p99" if value.p99 is not None else "value"
        return Target(f"{label} < {shown or f'{limit:g} {unit}'}", worst < limit)

    return judge


def figure(
    key: str,
    title: str,
    unit: str,
    samples: Sequence[float],
    reference: tuple[str, Sequence[float]] | None = None,
    target: Callable[[Summary, Summary | None], Target | None] | None = None,
    note: str = "",
) -> Figure:
    value = Summary.of(samples)
    ref = Reference(reference[0], Summary.of(reference[1])) if reference is not None else None
    judged = target(value, ref.value if ref else None) if target is not None else None
    return Figure(key, title, unit, value, ref, judged, note)


# ---- the table ------------------------------------------------------------------------------------------

_HEADERS = ("measurement", "median", "p99", "reference: median / p99", "ratio", "target", "result")


def render_table(figures: Sequence[Figure]) -> str:
    rows = [_HEADERS, *(_row(f) for f in figures)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADERS))]
    right = {1, 2, 4}
    lines = []
    for n, row in enumerate(rows):
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [f"[{f.key}] {f.note}" for f in figures if f.note]
    return "\n".join([*lines, *([""] if notes else []), *notes]) + "\n"


def _row(f: Figure) -> tuple[str, str, str, str, str, str, str]:
    median_ratio, p99_ratio = f.ratio
    if f.reference is None:
        ref = ""
    else:
        r = f.reference.value
        ref = f"{f.reference.title}: {_num(r.median)}" + (f" / {_num(r.p99)}" if r.p99 is not None else "")
    if median_ratio is None:
        ratio = ""
    else:
        ratio = f"{median_ratio:.1f}x" + (f" / {p99_ratio:.1f}x" if p99_ratio is not None else "")
    met = "" if f.target is None else ("met" if f.target.met else "MISSED")
    return (
        f"{f.title} ({f.unit})",
        _num(f.value.median),
        _num(f.value.p99) if f.value.p99 is not None else "-",
        ref,
        ratio,
        f.target.text if f.target else "",
        met,
    )


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 10000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"
