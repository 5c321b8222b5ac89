"""scripts/device_check.sh where there is no GPU: one clear "no GPU" line, exit 0, a report saying so; and
the kernel benchmark's tables (step 5), formatted from given rows.

(On a GPU machine the script itself is the test: it builds, runs `pytest -m gpu`, trains 20 steps on GPU
and CPU and compares them, and benchmarks -- see docs/nvfp4.md, "Device check".)

Run: python -m pytest -q tests/nvfp4_cuda/test_device_check.py
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the script would run the real check")
def test_no_gpu_exits_cleanly_with_a_clear_message(tmp_path: Path) -> None:
    out = tmp_path / "report"
    res = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("device_check: no GPU: ")
    assert "nothing to check on this machine" in lines[0]
    report = (out / "report.md").read_text()
    assert "no GPU" in report and "build" not in report.split("no GPU", 1)[1]  # it stopped before any step


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "usage: scripts/device_check.sh REPORT_DIR" in res.stderr
    res = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "20-step nvfp4 training" in res.stdout


def test_kernel_benchmark_report_with_and_without_the_gemm_rows() -> None:
    """bench_nvfp4_gpu's tables (step 5), which only a GPU fills: the GEMM table only when it was measured
    (``--no-gemm`` for the one-block quantizer's library), that library's nvcc flags in the header, a missed
    target marked in its row and listed at the end."""
    import sys

    bench_dir = str(REPO / "benchmarks")
    sys.path.insert(0, bench_dir)
    try:
        import bench_nvfp4_gpu as bench
    finally:
        sys.path.remove(bench_dir)
    base = {"device": "H200", "capability": (9, 0), "torch": "2.11", "cuda": "13.0", "copy_GBps": 4256.0}
    bandwidth = [
        {"name": "quantize 1x16 RNE", "GBps": 2108.0, "fraction_of_copy": 0.5, "target": 0.8},
        {"name": "amax pass alone", "GBps": 3552.0, "fraction_of_copy": 0.83, "target": None},
    ]
    gemm = {
        "name": "4096^3",
        "m": 4096,
        "n": 4096,
        "k": 4096,
        "torch_bf16_tflops": 785.0,
        "emulated_tflops": 660.0,
        "emulated_vs_torch_bf16": 0.84,
        "decoded_weight_vs_torch_bf16": 0.91,
        "target": 0.85,
    }
    missed = ["4096^3", "quantize 1x16 RNE"]
    full = bench.markdown(
        {**base, "cublaslt": None, "nvcc_extra_flags": "", "gemm": [gemm], "bandwidth": bandwidth, "missed": missed}
    )
    assert "| 4096^3 (4096 x 4096 x 4096) | 785 | 660 | 0.84x **MISSED** | 0.91x | >= 0.85 |" in full
    assert (
        "| quantize 1x16 RNE | 2108 | 0.50 **MISSED** | >= 0.8 |" in full
        and "| amax pass alone | 3552 | 0.83 | (info) |" in full
    )
    assert "Missed: 4096^3, quantize 1x16 RNE." in full and "NVFP4_CUDA_NVCC_FLAGS" not in full
    nb1 = bench.markdown(
        {
            **base,
            "cublaslt": None,
            "nvcc_extra_flags": "-DNV_QUANT_NB=1",
            "gemm": [],
            "bandwidth": bandwidth,
            "missed": missed[1:],
        }
    )
    assert "GEMM" not in nb1 and "; library built with NVFP4_CUDA_NVCC_FLAGS=-DNV_QUANT_NB=1" in nb1.splitlines()[0]
    assert "| quantize 1x16 RNE | 2108 | 0.50 **MISSED** | >= 0.8 |" in nb1
