"""Deterministic kill points: crash tests make a process SIGKILL itself at a named phase of its work.

A kill -9 at a random moment is how the chaos campaign (``scripts/chaos.py``) finds bugs; a test needs
the same crash at a *chosen* moment, every time, without sleeps or timing guesses. Code that writes
something a crash could damage calls :func:`kill_point` with a phase name at each step that matters
(``"checkpoint.files_written"``, ``"train_log.torn_record"``, ...). Normally this is one dictionary
lookup and nothing happens. When the environment variable ``IDA_KILL_AT`` names the phase, the process
sends itself ``SIGKILL`` there: no ``finally`` blocks, no atexit handlers, no flushing of Python
buffers — exactly what an OOM kill or a power cut does.

``IDA_KILL_AT=PHASE`` kills on the first arrival at ``PHASE``; ``IDA_KILL_AT=PHASE:N`` on the N-th
(1-based), so "during the third checkpoint save" is ``checkpoint.files_written:3``.

Example:
    >>> kill_point("example.phase")  # IDA_KILL_AT is unset: returns at once
"""

from __future__ import annotations

import os
import signal

__all__ = ["KILL_ENV", "kill_point"]

KILL_ENV = "IDA_KILL_AT"

_arrivals: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int]:
    phase, sep, count = spec.strip().rpartition(":")
    if not sep:
        return spec.strip(), 1
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{KILL_ENV}={spec!r}: write PHASE or PHASE:N with N >= 1")
    return phase, int(count)


def kill_point(phase: str) -> None:
    """SIGKILL this process if ``IDA_KILL_AT`` names ``phase`` and this is the requested arrival."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    target, nth = _parse(spec)
    if target != phase:
        return
    _arrivals[phase] = _arrivals.get(phase, 0) + 1
    if _arrivals[phase] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
