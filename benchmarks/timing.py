"""The one timing loop of the CPU benchmarks: one warm-up call, then wall-clock seconds per call.

Each script reads the samples as it reports them (the minimum, the median or both); the scripts import it
as a sibling (their own directory is on ``sys.path`` when they run).
"""

from __future__ import annotations

import time
from collections.abc import Callable


def samples(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, after one warm-up call (page faults, lazy kernel
    builds, tables) that is not timed."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out
