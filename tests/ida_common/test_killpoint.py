"""ida_common.killpoint: a process SIGKILLs itself at the named phase's N-th arrival, and only there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
from ida_common.killpoint import kill_point
for i in range(1, 4):
    kill_point("other")
    print(i, flush=True)
    kill_point("phase")
print("done", flush=True)
"""


@pytest.mark.parametrize(
    "spec, printed, rc",
    [
        ("phase", "1", -signal.SIGKILL),
        ("phase:2", "1 2", -signal.SIGKILL),
        ("phase:9", "1 2 3 done", 0),
        ("", "1 2 3 done", 0),
    ],
)
def test_kill_point(spec, printed, rc):
    env = dict(os.environ, IDA_KILL_AT=spec, PYTHONPATH=str(REPO))
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == rc and res.stdout.split() == printed.split()


def test_a_bad_count_is_an_error(monkeypatch):
    from ida_common.killpoint import kill_point

    monkeypatch.setenv("IDA_KILL_AT", "phase:0")
    with pytest.raises(ValueError, match="PHASE:N with N >= 1"):
        kill_point("phase")
