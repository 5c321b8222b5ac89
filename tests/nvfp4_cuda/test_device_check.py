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


def _script(name: str):
    import importlib.util
    import sys

    scripts = str(REPO / "scripts")
    sys.path.insert(0, scripts)  # device_prep imports check_deps from beside it
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(scripts)
    return module


def test_check_deps_names_each_unmet_requirement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1's requirement check (scripts/check_deps.py): this environment meets pyproject.toml (the test extra
    too); an out-of-range version, a missing distribution and a requirement of a requirement are each one line;
    a marker that does not apply is skipped; an unreadable pyproject is exit 2."""
    check_deps = _script("check_deps")
    assert check_deps.main(["--extra", "test"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "check_deps: every requirement met"
    numpy_version = __import__("numpy").__version__
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\ndependencies = ["numpy>=999", "no-such-distribution-ida>=1", '
        '"torch>=2.6", "windows-only-thing>=1; sys_platform == \'win32\'"]\n'
    )
    assert check_deps.main(["--pyproject", str(pyproject)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"UNMET numpy: {numpy_version} installed, >=999 required (pyproject.toml: numpy>=999)" in out
    assert "UNMET no-such-distribution-ida: not installed (pyproject.toml: no-such-distribution-ida>=1)" in out
    assert any(line.startswith("ok    torch ") for line in out) and not any("windows-only" in line for line in out)
    assert out[-1] == "check_deps: 2 unmet"
    # one level down: a requirement's own requirements (a wheel installed with --no-deps must find them): a
    # distribution installed in a folder on sys.path, as the carried wheels are on PYTHONPATH
    dist = tmp_path / "site" / "carried_ida_probe-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: carried_ida_probe\nVersion: 1.0\nRequires-Dist: numpy>=999\n"
        "Requires-Dist: pytest; extra == 'dev'\n"
    )
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["carried_ida_probe>=1"]\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert check_deps.main(["--pyproject", str(pyproject)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "ok    carried_ida_probe 1.0 (>=1)",
        f"UNMET numpy: {numpy_version} installed, >=999 required (needed by carried_ida_probe 1.0: numpy>=999)",
        "check_deps: 1 unmet",
    ]
    pyproject.write_text("[project\n")
    assert check_deps.main(["--pyproject", str(pyproject)]) == 2
    assert "cannot read [project] dependencies" in capsys.readouterr().err


def test_device_prep_carries_the_transformers_floor_and_this_cffi() -> None:
    """scripts/device_prep.py's wheels (downloading them needs the network, so not here): transformers at
    pyproject.toml's floor (the device image's is older, a newer one needs a newer huggingface-hub than the
    image has), cffi and pycparser as installed here."""
    from importlib import metadata

    prep = _script("device_prep")
    assert prep.wanted_wheels() == [
        f"cffi=={metadata.version('cffi')}",
        f"pycparser=={metadata.version('pycparser')}",
        "transformers==5.24.*",
    ]
    assert "device_check.sh /tmp/report" in prep.COMMAND and '"$OUT/device_report.tgz"' in prep.COMMAND
