"""benchmarks/bench_resume_memory.py at a small size: a resume's load holds about one tensor beyond the model,
not the model file, and both ways load the same model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_resume_memory.py"


def test_a_resume_holds_one_tensor_not_the_model_file() -> None:
    # 8 layers of 4 MiB at most each (the bf16 recipe: FP32 weights, a BF16 embedding converted as it is copied)
    cmd = [sys.executable, str(SCRIPT), "--recipe", "bf16", "--layers", "8", "--hidden", "512", "--vocab", "4096"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {
        m[1]: float(m[2])
        for m in re.finditer(r"^\| bf16 \| 39 MiB \| 4 MiB \| (.+?) \| \+(\d+) MiB \|", res.stdout, re.M)
    }
    assert rows.keys() == {"read on lookup (now)", "whole file first (before)"}, res.stdout
    assert rows["whole file first (before)"] >= 39  # the dict holds the file
    assert rows["read on lookup (now)"] <= 12  # the largest tensor (4 MiB) and its FP32 copy, not the file
    assert "the same model both ways: True" in res.stdout
