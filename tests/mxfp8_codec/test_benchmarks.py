"""The codec's benchmark scripts at toy size, so that the commands docs/benchmarks.md quotes keep running:
``bench_mxfp8_codec.py`` with ``--old-kernel`` (an earlier kernel compiled here, its transposed decodes
paired with ours) and ``bench_hf.py --layouts`` (the layout rule of resident projections, per dtype)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mxfp8_codec import _native
from mxfp8_codec.hf_modules import gemm_takes_transposed

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.skipif(
    _native._find_compiler() is None or shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs a C compiler and the git history",
)
def test_codec_benchmark_pairs_an_old_kernel_with_ours() -> None:
    out = _run(
        "benchmarks/bench_mxfp8_codec.py", "--elements", "131072", "--repeats", "1", "--slow-repeats", "1",
        "--old-kernel", "HEAD",
    )  # fmt: skip
    assert "decode->f32   ours native, transposed into out=" in out
    old = out[out.index("kernel at HEAD") :].splitlines()[1:]
    assert [line.split()[0] for line in old] == ["weights", "random", "weights,", "weights,"]
    assert all(line.endswith("True)") for line in old), old


def test_layout_benchmark_times_each_dtype_both_ways() -> None:
    lines = _run("benchmarks/bench_hf.py", "--layouts", "--hidden", "64").splitlines()
    rows = [line.split() for line in lines if line.startswith("torch.")]
    assert [(r[0], r[1]) for r in rows] == [
        (f"torch.{d}", t) for d in ("bfloat16", "float32", "float16") for t in ("1", "64")
    ]
    for r in rows:
        dtype = getattr(torch, r[0].removeprefix("torch."))
        layout = " ".join(r[2:-3])
        assert layout == ("view" if gemm_takes_transposed(torch.device("cpu"), dtype) else "[out, in]")
        assert r[-1] in ("True", "False") and float(r[-3]) > 0 and float(r[-2]) > 0
