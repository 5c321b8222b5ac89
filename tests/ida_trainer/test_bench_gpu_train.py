"""benchmarks/bench_gpu_train.py (device_check step 6) at toy size on the CPU: both recipes train through the
trainer's own parts in their child processes, and the table and the JSON come out."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_gpu_train.py"
TOY = ["--device", "cpu", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2"]
TOY += ["--intermediate", "128", "--seq", "64", "--warmup", "1", "--steps", "1"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *TOY, *args], capture_output=True, text=True, timeout=300)


def test_both_recipes_train_and_report(tmp_path):
    res = _run("--vocab", "8192", "--out-json", str(tmp_path / "t.json"))
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads((tmp_path / "t.json").read_text())
    results = out["results"]
    assert set(results) == {"nvfp4", "bf16"}
    for r in results.values():
        assert r["tokens_per_s"] > 0 and len(r["losses"]) == 1 and r["tokens_per_step"] > 0
    assert results["nvfp4"]["params"] == results["bf16"]["params"]
    assert results["nvfp4"]["tokens_per_step"] == results["bf16"]["tokens_per_step"]  # like for like
    assert "targets apply to a GPU run only" in res.stdout


def test_after_running_out_of_memory_the_bf16_recipe_tries_fewer_rows_then_fewer_layers():
    """The settings the parent tries, in order, when the bf16 recipe's child exits 3 (out of memory): the
    same tokens per step in smaller micro-batches, then 8 layers fewer at a time, then nothing."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_gpu_train as bench
    finally:
        sys.path.remove(str(SCRIPT.parent))
    # what the parent skips on a GPU: the count (meta device) times the margin the H200 measured at 4B, 2 rows
    # (78.8 GiB with autocast's weight-cast cache on; without it, since 2026-12-07, the count no longer holds a
    # BF16 copy of every layer: 72.3 predicted, not yet measured)
    four_b = argparse.Namespace(hidden=3072, layers=32, heads=24, kv_heads=8, intermediate=9216, vocab=256000, seq=2048)
    need = [bench.bf16_predicted_gib(four_b, m, n) for m, n in ((2, 32), (1, 32), (1, 24), (1, 16))]
    assert abs(need[0] - 72.3) < 0.5 and need == sorted(need, reverse=True)
    tried, setting = [], (4, 2, 32)
    while setting is not None:
        tried.append(setting)
        setting = bench.smaller_setting(*setting)
    assert tried == [(4, 2, 32), (2, 4, 32), (1, 8, 32), (1, 8, 24), (1, 8, 16), (1, 8, 8)]
    assert {m * n for m, n, _ in tried} == {8}
