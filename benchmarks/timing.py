"""The measuring loops the benchmarks share: :func:`samples` (one warm-up call, then wall-clock seconds per
call) and :func:`rss_growth_during` (how much a call grew the process's resident memory).

Each script reads the samples as it reports them (the minimum, the median or both); the scripts import it
as a sibling (their own directory is on ``sys.path`` when they run).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any


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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_growth_during(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the most this process's RSS grew over it (sampled every 2 ms), in bytes."""
    before, peak, stop = _rss(), [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], _rss())

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        out = fn()
    finally:
        stop.set()
        thread.join()
    return out, max(peak[0], _rss()) - before
