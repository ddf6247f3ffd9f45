"""How the scenarios take samples: how many (Budget), interleaved with their reference, in which unit."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MS = 1000.0


@dataclass(frozen=True)
class Budget:
    """How many samples each scenario takes; `python -m bench --quick` uses QUICK."""

    allocate_calls: int = 2000
    preferred_calls: int = 300
    health_injections: int = 20
    restarts: int = 10
    spawns: int = 5
    memory_calls: int = 10_000
    idle_seconds: float = 30.0
    plan_runs: int = 5
    warmup: int = 50
    contention_seconds: float = 4.0  # Allocate sampled idle, then as long again under load

    def capped(self, n: int) -> Budget:
        """Every count at most n (at least 1): the smoke test's tiny mode."""
        n = max(1, n)
        return Budget(
            allocate_calls=min(self.allocate_calls, n),
            preferred_calls=min(self.preferred_calls, n),
            health_injections=min(self.health_injections, n),
            restarts=min(self.restarts, n),
            spawns=min(self.spawns, n),
            memory_calls=min(self.memory_calls, n),
            idle_seconds=min(self.idle_seconds, float(n)),
            plan_runs=min(self.plan_runs, n),
            warmup=min(self.warmup, n),
            contention_seconds=min(self.contention_seconds, float(n)),
        )


FULL = Budget()
QUICK = Budget(
    allocate_calls=200,
    preferred_calls=30,
    health_injections=4,
    restarts=3,
    spawns=1,
    memory_calls=500,
    idle_seconds=3.0,
    plan_runs=1,
    warmup=10,
    contention_seconds=1.5,
)


def interleaved(
    calls: Sequence[Callable[[], object]], total: int, chunk: int = 50, rest: float = 0.0
) -> list[list[float]]:
    """Seconds per call for each of `calls`, `total` each, run in alternating chunks; after each call, an
    untimed pause of `rest` times its duration."""
    samples: list[list[float]] = [[] for _ in calls]
    clock = time.perf_counter
    done = 0
    while done < total:
        n = min(chunk, total - done)
        for call, out in zip(calls, samples, strict=True):
            for _ in range(n):
                started = clock()
                call()
                took = clock() - started
                out.append(took)
                if rest > 0:
                    time.sleep(rest * took)
        done += n
    return samples


def in_ms(samples: Sequence[float]) -> list[float]:
    return [s * MS for s in samples]
