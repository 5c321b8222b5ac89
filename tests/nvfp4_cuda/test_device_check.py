"""scripts/device_check.sh where there is no GPU: one clear "no GPU" line, exit 0, a report saying so.

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
