"""Build and loader without a GPU: nvcc flags, cache location, missing-nvcc error, the one compile test
(slow; reuses the cache), cffi symbol resolution, and error statuses turned into Python exceptions.

Run: python -m pytest -q tests/nvfp4_cuda/test_build.py      (the compile takes ~1-2 min the first time)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import nvfp4_cuda
from ida_common import native_build
from mxfp8_codec import _native
from nvfp4_cuda import build, cpu_native, cuda_ops
from nvfp4_cuda.api import nvidia_driver

HAS_NVCC = shutil.which("nvcc") is not None or bool(os.environ.get("NVFP4_CUDA_NVCC"))


def test_header_parses_with_cffi_and_declares_every_entry_point() -> None:
    ffi = cuda_ops.make_ffi()
    names = cuda_ops.header_functions()
    assert {
        "nvfp4_quantize",
        "nvfp4_decode_bf16",
        "nvfp4_gemm_bf16",
        "nvfp4_gemm_native",
        "nvfp4_lion_step_mxfp8",
        "nvfp4_last_error",
        "nvfp4_query",
    } <= set(names)
    assert ffi.typeof("int(*)(uintptr_t, int, uintptr_t, int64_t, int64_t, int, int, uintptr_t, uintptr_t)")
    api_src = (build.CSRC / "nvfp4_api.cu").read_text()
    for n in names:  # every declaration has a definition in the extern "C" block
        assert f" {n}(" in api_src or f"*{n}(" in api_src, n


def test_gencode_flags_are_explicit_and_include_sm120a() -> None:
    flags = build.gencode_flags()
    assert "-arch=sm_120a" not in flags and not any(f.startswith("-arch") for f in flags)
    joined = " ".join(flags)
    for code in ("code=sm_80", "code=sm_90", "arch=compute_120a,code=sm_120a", "arch=compute_120a,code=compute_120a"):
        assert code in joined
    assert "-fmad=false" in build.BASE_FLAGS


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NVFP4_CUDA_CACHE_DIR", raising=False)
    monkeypatch.delenv("IDA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "xdg" / "ida" / "nvfp4_cuda"
    monkeypatch.setenv("IDA_CACHE_DIR", str(tmp_path / "ida"))  # README's variable: every native build
    assert build.cache_dir() == tmp_path / "ida" / "nvfp4_cuda"
    assert cpu_native.library_path("cc").parent == tmp_path / "ida" / "nvfp4_cuda" / "cpu"
    assert _native.cache_dir() == tmp_path / "ida" / "mxfp8_codec"
    monkeypatch.setenv("NVFP4_CUDA_CACHE_DIR", str(tmp_path / "mine"))
    assert build.cache_dir() == tmp_path / "ida" / "nvfp4_cuda"  # IDA_CACHE_DIR wins over the old alias
    monkeypatch.delenv("IDA_CACHE_DIR")
    native_build._warned.discard("NVFP4_CUDA_CACHE_DIR")
    with pytest.warns(UserWarning, match="NVFP4_CUDA_CACHE_DIR is deprecated; set IDA_CACHE_DIR"):
        assert build.cache_dir() == tmp_path / "mine"  # the old variable, alone, still works
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("NVFP4_CUDA_CACHE_DIR")
    assert build.cache_dir() == Path.home() / ".cache" / "ida" / "nvfp4_cuda"


def test_one_switch_syntax(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, on in (
        ("0", False),
        ("off", False),
        ("No", False),
        ("false", False),
        ("1", True),
        ("on", True),
        ("", True),
    ):
        for var in (cpu_native.ENV_SWITCH, _native.ENV_SWITCH):
            monkeypatch.setenv(var, value)
            assert native_build.switch_enabled(var) is on, (var, value)
    monkeypatch.setenv(cpu_native.ENV_SWITCH, "off")
    assert not cpu_native.available()  # "off" used to be ignored by the NVFP4 CPU path (only "0" worked)
    monkeypatch.setenv(cpu_native.ENV_SWITCH, "maybe")
    native_build._warned.discard(cpu_native.ENV_SWITCH)
    with pytest.warns(UserWarning, match="NVFP4_CPU_NATIVE='maybe' is not one of"):
        assert native_build.switch_enabled(cpu_native.ENV_SWITCH)


_PARSED_HERE = """
import sys
from ida_common import native_build
from mxfp8_codec import _native
ffi = native_build.cffi_ffi("mxfp8_codec", _native._CDEF)
assert ffi.typeof("mx_team_args *") and ffi.typeof("int(*)(void)")  # the kernel's declarations
assert ffi.cast("mx_team_args *", 0) == ffi.NULL
print("parsed here" if "pycparser" in sys.modules else "imported")
"""


@pytest.mark.slow
def test_cffi_declarations_are_parsed_once_per_machine(tmp_path: Path) -> None:
    """The first process parses the kernel's declarations and saves cffi's out-of-line module in the
    cache; later processes import it (no pycparser). A damaged module is regenerated; an unwritable
    cache parses in the process, with the same FFI."""
    env = {**os.environ, "IDA_CACHE_DIR": str(tmp_path / "cache")}

    def run(environ: dict[str, str]) -> str:
        res = subprocess.run(
            [sys.executable, "-c", _PARSED_HERE], env=environ, capture_output=True, text=True, timeout=120, check=False
        )
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    assert run(env) == "parsed here"
    (module,) = (tmp_path / "cache" / "mxfp8_codec").glob("_ida_ffi_*.py")
    assert run(env) == "imported"
    module.write_text("ffi = None  # damaged\n")
    assert run(env) == "parsed here"
    assert run(env) == "imported"
    blocked = tmp_path / "not_a_dir"
    blocked.write_text("")
    assert run({**env, "IDA_CACHE_DIR": str(blocked)}) == "parsed here"


def test_version_comes_from_package_metadata() -> None:
    from importlib import metadata

    assert native_build.package_version() == metadata.version("ida")
    assert not hasattr(build, "PACKAGE_VERSION")


def test_nonexistent_nvcc_is_refused_not_replaced(tmp_path: Path) -> None:
    """NVFP4_CUDA_NVCC naming nothing: one error line naming it, even though another nvcc is on PATH."""
    env = {**os.environ, "NVFP4_CUDA_NVCC": "/nonexistent/nvcc", "IDA_CACHE_DIR": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "nvfp4_cuda", "build"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert res.returncode == 3 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("nvfp4_cuda: error: NVFP4_CUDA_NVCC=/nonexistent/nvcc: no such executable")
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.skipif(not HAS_NVCC, reason="no nvcc")
def test_extra_nvcc_flags_reach_nvcc_and_key_their_own_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """NVFP4_CUDA_NVCC_FLAGS is split as a shell splits it, given to every compile and part of the cache key
    (another library, never the default one replaced); a value that cannot be split is one clear error."""
    monkeypatch.setenv("IDA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(build.EXTRA_FLAGS_ENV, raising=False)
    nvcc = build.find_nvcc()
    default = build.library_path(nvcc)
    monkeypatch.setenv(build.EXTRA_FLAGS_ENV, "")
    assert build.library_path(nvcc) == default
    monkeypatch.setenv(build.EXTRA_FLAGS_ENV, "-DNV_QUANT_NB=1 '-DIDA_NOTE=a b'")
    assert build.extra_flags() == ["-DNV_QUANT_NB=1", "-DIDA_NOTE=a b"]
    assert build.library_path(nvcc) != default
    monkeypatch.setenv(build.EXTRA_FLAGS_ENV, "--no-such-nvcc-flag")
    with pytest.raises(build.BuildError, match="Unknown option '--no-such-nvcc-flag'"):  # nvcc's own words
        build.build(progress=False)
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.o"))
    monkeypatch.setenv(build.EXTRA_FLAGS_ENV, "-DX='unclosed")
    with pytest.raises(build.BuildError, match=r"NVFP4_CUDA_NVCC_FLAGS=\"-DX='unclosed\" cannot be split"):
        build.library_path(nvcc)


@pytest.mark.skipif(nvidia_driver() is not None, reason="an NVIDIA driver is installed here")
def test_info_without_driver_says_no_nvidia_driver() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "nvfp4_cuda", "info"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "driver: no NVIDIA driver" in res.stdout and "reason: no NVIDIA driver" in res.stdout
    assert "InsufficientDriver" not in res.stdout and "insufficient" not in res.stdout


def test_backend_info_names_the_backend_that_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the CUDA backends are reported")
    assert nvfp4_cuda.backend_info()["backend"] == ("cpu-native" if cpu_native.available() else "cpu-reference")
    monkeypatch.setenv(cpu_native.ENV_SWITCH, "0")
    assert nvfp4_cuda.backend_info()["backend"] == "cpu-reference"


def test_missing_nvcc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NVFP4_CUDA_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.build()
    env = {"PATH": str(tmp_path), "IDA_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "nvfp4_cuda", "build"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert res.returncode == 3 and res.stderr.startswith("nvfp4_cuda: error: ") and "nvcc not found" in res.stderr
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1


def test_cli_info_reports_backend() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "nvfp4_cuda", "info", "--json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert '"backend"' in res.stdout and (
        "cpu-native" in res.stdout or "cpu-reference" in res.stdout or "cuda" in res.stdout
    )


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed: cannot compile the CUDA library")
def test_compile_all_arches_load_with_cffi_and_error_paths() -> None:
    """The one compile test: build (cached), dlopen, resolve every symbol, and check error statuses."""
    path = build.build(progress=False)
    assert path.is_file() and path.name == "libnvfp4_cuda.so"
    t0 = time.perf_counter()
    assert build.build(progress=False) == path  # cache hit: no recompilation
    assert time.perf_counter() - t0 < 30
    ffi, lib = cuda_ops.load_library(path)
    for name in cuda_ops.header_functions():
        assert getattr(lib, name) is not None, name
    assert lib.nvfp4_abi_version() == 3
    # argument validation happens before any CUDA call: works on every machine
    status = lib.nvfp4_quantize(256, 0, 0, 16, 24, 24, 0, 0, 0, 0, 0, 0, 256, 256, 256, 256, 0, 0)
    with pytest.raises(cuda_ops.NVFP4CudaError, match="not a multiple of 16"):
        cuda_ops.check(status, "nvfp4_quantize", lib, ffi)
    status = lib.nvfp4_quantize(256, 0, 0, 16, 32, 8, 1, 0, 0, 0, 0, 0, 256, 256, 256, 256, 0, 0)  # padded by 24
    with pytest.raises(cuda_ops.NVFP4CudaError, match="valid_cols 8 with cols 32, transpose 1"):
        cuda_ops.check(status, "nvfp4_quantize", lib, ffi)
    status = lib.nvfp4_gemm_native(256, 256, 256, 256, 256, 256, 16, 16, 64, 256, 7, 0, 0)
    with pytest.raises(cuda_ops.NVFP4CudaError, match="bad out dtype 7"):
        cuda_ops.check(status, "nvfp4_gemm_native", lib, ffi)
    status = lib.nvfp4_decode_bf16(256, 256, 16, 24, 256, 0)
    with pytest.raises(cuda_ops.NVFP4CudaError, match=r"nvfp4_decode_bf16: \[16, 24\]: cols not a multiple of 16"):
        cuda_ops.check(status, "nvfp4_decode_bf16", lib, ffi)
    status = lib.nvfp4_gemm_bf16(256, 0, 256, 0, 256, 256, 256, 16, 16, 64, 256, 0, 0, 1024, 0)
    with pytest.raises(cuda_ops.NVFP4CudaError, match="workspace_bytes without a workspace"):
        cuda_ops.check(status, "nvfp4_gemm_bf16", lib, ffi)
    if not torch.cuda.is_available():
        # no usable GPU/driver: the runtime's status comes back as a message, not a crash
        out = [ffi.new("int *") for _ in range(4)]
        status = lib.nvfp4_query(*out)
        assert status == 2
        with pytest.raises(cuda_ops.NVFP4CudaError, match="CUDA error"):
            cuda_ops.check(status, "nvfp4_query", lib, ffi)
        status = lib.nvfp4_amax(256, 0, 0, 16, 32, 32, 0, 0, 256, 0)
        with pytest.raises(cuda_ops.NVFP4CudaError, match=r"nvfp4_amax: CUDA error \d+"):
            cuda_ops.check(status, "nvfp4_amax", lib, ffi)


def test_docs_quick_start_runs() -> None:
    """The first python block of docs/nvfp4.md executes as written (on CPU)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "nvfp4.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    ns: dict[str, object] = {}
    exec(compile(code, "docs/nvfp4.md", "exec"), ns)  # our own documentation
    assert ns["y"].shape == (512, 2048) and ns["gw"].shape == (2048, 1024)
    assert ns["qw_next"].shape == (2048, 1024) and ns["qw_next"].block_2d


def test_cuda_hadamard_sign_mask_is_the_python_sign_vector() -> None:
    """NV_HADAMARD_NEG (bit i set: element i negated) spells formats.HADAMARD_SIGNS for the kernels."""
    import re

    from nvfp4_cuda.formats import HADAMARD_SIGNS

    src = (build.CSRC / "nvfp4_common.cuh").read_text()
    mask = int(re.search(r"#define NV_HADAMARD_NEG (0x[0-9A-Fa-f]+)u", src).group(1), 16)
    assert mask == sum(1 << i for i, s in enumerate(HADAMARD_SIGNS) if s < 0)
