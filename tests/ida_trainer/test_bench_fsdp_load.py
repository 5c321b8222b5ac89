"""benchmarks/bench_fsdp_load.py at toy size on the CPU: under torchrun (gloo) both ways of loading an FSDP run's
base run, and rank 0 prints every rank's host growth in both, side by side."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.torchrun import torchrun_env, torchrun_script_cmd

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fsdp_load.py"


def test_two_ranks_load_both_ways_and_rank_0_prints_both() -> None:
    cmd = torchrun_script_cmd(2, SCRIPT, "--hidden", "64", "--layers", "2", "--vocab", "1024")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=torchrun_env())
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("Qwen3-4B shape", "rank |", "0 |", "1 |"))]
    assert len(lines) == 4, res.stdout  # rank 0 only
    assert "2 layers" in lines[0] and "FSDP2 over 2 rank(s) (gloo)" in lines[0]
    for rank, line in enumerate(lines[2:]):
        cells = line.split(" | ")
        assert len(cells) == 5 and cells[0] == str(rank) and cells[4].endswith("x"), line
