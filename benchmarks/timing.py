"""The measuring loops the benchmarks share: :func:`samples` (one warm-up call, then wall-clock seconds per
call), :func:`rss_growth_during` (how much a call grew the process's resident memory, sampled) and
:func:`peak_rss_growth` (the same from the kernel's high-water mark: exact, for a process of its own).

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


def _hwm() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def peak_rss_growth(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and how far this process's peak RSS over it rose above its RSS before it, in bytes: the kernel's
    high-water mark (``VmHWM``), reset first (``/proc/self/clear_refs``), so no peak is missed between samples.
    Where the reset is not allowed, :func:`rss_growth_during`."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := the RSS now
    except OSError:
        return rss_growth_during(fn)
    before = _rss()
    out = fn()
    return out, _hwm() - before
