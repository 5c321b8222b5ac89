"""benchmarks/bench_fsdp_memory.py (device_check step 9) at toy size on the CPU: the trainer's FSDP2 path trains
under torchrun (gloo) with chunked logits, rank 0 prints ida_trainer.memory's count beside what it measured, and
the streamed checkpoint save of that state reads back exactly on both ranks."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.torchrun import torchrun_env, torchrun_script_cmd

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fsdp_memory.py"


def test_two_ranks_train_and_rank_0_reports_the_count() -> None:
    # 2 ranks, 256 tokens of a 1024-word vocabulary (2**18 logits: whole; the GPU run's 8192 x 151936 are chunked)
    cmd = torchrun_script_cmd(
        2, SCRIPT, "--hidden", "64", "--layers", "2", "--tokens", "256", "--steps", "2", "--vocab", "1024"
    )
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=torchrun_env())
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("Qwen3-4B shape", "count (GiB)", "no GPU", "save"))]
    assert len(lines) == 4, res.stdout  # rank 0 only
    assert "FSDP2 over 2 rank(s) (gloo)" in lines[0] and "weights " in lines[1] and "total " in lines[1]
    # the trainer's streamed save of that state, read back by both ranks as --resume reads it: their shards exact
    assert lines[3].startswith("save (streamed, ") and lines[3].endswith("read back on every rank: exact"), lines[3]
