"""benchmarks/bench_resume_memory.py at a small size: a resume's load holds about one tensor beyond the model,
not the model file, and both ways load the same model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_resume_memory.py"
ROW = re.compile(r"^\| bf16 \| (\d+) MiB \| (\d+) MiB \| (.+?) \| \+(\d+) MiB \|", re.M)


def test_a_resume_holds_one_tensor_not_the_model_file() -> None:
    # the bf16 recipe: FP32 weights, the BF16 embedding converted as it is copied
    cmd = [sys.executable, str(SCRIPT), "--recipe", "bf16", "--layers", "8", "--hidden", "512", "--vocab", "4096"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {m[3]: (int(m[1]), int(m[2]), int(m[4])) for m in ROW.finditer(res.stdout)}
    assert rows.keys() == {"read on lookup (now)", "whole file first (before)"}, res.stdout
    (size, largest, whole), (_, _, lookup) = rows["whole file first (before)"], rows["read on lookup (now)"]
    assert (size, largest) == (35, 4)  # 8 layers of 4 MiB at most each, the tied embedding (4 MiB) once
    assert whole >= size  # the dict holds the file
    assert lookup <= 12  # the largest tensor and its FP32 copy, not the file
    assert "the same model both ways: True" in res.stdout
