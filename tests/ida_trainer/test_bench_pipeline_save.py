"""benchmarks/bench_pipeline_save.py at toy size on the CPU: a 2-stage nvfp4 pipeline saves its checkpoint
streamed and gathered first, rank 0 prints both saves' memory and time, and both wrote the same bytes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.torchrun import torchrun_env, torchrun_script_cmd

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_pipeline_save.py"


def test_two_stages_save_both_ways_and_rank_0_reports_the_ratio() -> None:
    cmd = torchrun_script_cmd(2, SCRIPT, "--layers", "2", "--hidden", "256", "--vocab", "4096")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=torchrun_env())
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("Minitron-4B shape", "save ", "streamed / before"))]
    assert len(lines) == 4, res.stdout  # rank 0 only
    assert "2 pipeline stages (gloo)" in lines[0]
    assert lines[1].startswith("save streamed (now): ") and lines[2].startswith("save every stage's state pickled")
    assert lines[3].endswith("the same bytes: True"), lines[3]
