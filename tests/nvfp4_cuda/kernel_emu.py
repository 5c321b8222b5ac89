"""Build the library's CUDA kernels for the CPU (``emu/cuda_emu.h``) and run them through ``cuda_ops``.

:func:`build` rewrites every launch ``kernel<<<grid, block, shmem, stream>>>(args)`` of the library's sources
into ``emu::launch(grid, block, [&] { kernel(args); })``, compiles nvfp4_quant.cu, nvfp4_master.cu and the
C entry points of nvfp4_api.cu with the host C++ compiler into one shared library, and opens it with the same
cffi declarations as the real one.  The GEMMs (cuBLASLt, the sm_120a FP4 MMA) are not emulated: their entry
points return NVFP4_ERR_UNSUPPORTED.  :func:`installed` then points ``nvfp4_cuda.cuda_ops`` at it, so the
wrappers run unchanged on CPU tensors (host memory plays device memory).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nvfp4_cuda import build as nvbuild
from nvfp4_cuda import cuda_ops

HERE = Path(__file__).resolve().parent
EMU_HEADER = HERE / "emu" / "cuda_emu.h"
SOURCES = ("nvfp4_quant.cu", "nvfp4_master.cu", "nvfp4_api.cu")
CUDA_INCLUDE_CANDIDATES = ("/usr/local/cuda/include",)

# The GEMM back ends the emulator leaves out (definitions the entry points of nvfp4_api.cu link against).
GEMM_STUBS = r"""
int nv_lt_gemm(const __nv_bfloat16 *, int, const __nv_bfloat16 *, int, const float *, const float *, float *, int64_t,
               int64_t, int64_t, void *, int, void *, size_t, cudaStream_t, char *msg, size_t n, int *cuda_error) {
  snprintf(msg, n, "the cuBLASLt GEMM is not emulated");
  *cuda_error = 0;
  return 2;
}
const char *nv_lt_library(void) { return ""; }
cudaError_t nv_launch_gemm_native(const uint8_t *, const uint8_t *, const float *, const uint8_t *, const uint8_t *,
                                  const float *, int64_t, int64_t, int64_t, void *, int, int, cudaStream_t) {
  return cudaErrorNotSupported;
}
"""


def rewrite_launches(text: str) -> str:
    """``k<<<g, b, s, st>>>(args)`` -> ``emu::launch(g, b, [&] { k(args); })`` (templates and macros kept)."""
    out, pos = [], 0
    while (start := text.find("<<<", pos)) >= 0:
        # the kernel name before <<<: an identifier, optionally with template arguments <...>
        i = start
        if text[i - 1] == ">":
            depth, i = 0, i - 1
            while True:
                depth += {">": 1, "<": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i -= 1
        m = re.search(r"[A-Za-z_]\w*$", text[:i])
        if m is None:
            raise ValueError(f"kernel_emu: no kernel name before <<< at offset {start}")
        name_start = m.start()
        end_cfg = text.index(">>>", start)
        cfg = _split_top(text[start + 3 : end_cfg])
        if text[end_cfg + 3] != "(":
            raise ValueError(f"kernel_emu: no argument list after >>> at offset {end_cfg}")
        j, depth = end_cfg + 3, 0
        while True:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        kernel, args = text[name_start:start], text[end_cfg + 4 : j]
        out.append(text[pos:name_start])
        out.append(f"emu::launch(dim3({cfg[0]}), dim3({cfg[1]}), [&] {{ {kernel}({args}); }})")
        pos = j + 1
    out.append(text[pos:])
    return "".join(out)


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def cuda_include() -> Path:
    """The CUDA toolkit's include directory (next to the nvcc the library builds with)."""
    nvcc = Path(os.path.realpath(nvbuild.find_nvcc()))
    for cand in (nvcc.parent.parent / "include", *map(Path, CUDA_INCLUDE_CANDIDATES)):
        if (cand / "cuda_runtime.h").exists():
            return cand
    raise FileNotFoundError(f"kernel_emu: no cuda_runtime.h beside {nvcc}")


def build(cache: Path | None = None) -> Path:
    """The emulated library's path, compiled once per source hash (into ``cache`` or a temp directory)."""
    csrc = Path(nvbuild.CSRC)
    texts = {name: rewrite_launches((csrc / name).read_text()) for name in SOURCES}
    h = hashlib.sha256(EMU_HEADER.read_bytes() + GEMM_STUBS.encode())
    for p in nvbuild.source_files():
        h.update(p.read_bytes())
    cache = cache or Path(tempfile.gettempdir()) / "nvfp4_kernel_emu"
    lib = cache / f"libnvfp4_emu_{h.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise FileNotFoundError("kernel_emu: no C++ compiler (g++)")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, text in texts.items():
            (d / f"{name}.cpp").write_text(text)
        (d / "stubs.cpp").write_text('#include "nvfp4_common.cuh"\n#include <stdio.h>\n' + GEMM_STUBS)
        shutil.copy(csrc / "nvfp4_common.cuh", d / "nvfp4_common.cuh")
        cmd = [
            cxx,
            "-std=c++20",
            "-O1",
            "-fPIC",
            "-shared",
            "-pthread",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-w",
            "-include",
            str(EMU_HEADER),
            f"-I{d}",
            f"-I{cuda_include()}",
            f"-I{Path(nvbuild.__file__).resolve().parents[1] / 'mxfp8_codec'}",
            *[str(d / f"{n}.cpp") for n in SOURCES],
            str(d / "stubs.cpp"),
            "-o",
            str(d / lib.name),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"kernel_emu: compiling the emulated kernels failed:\n{r.stderr[-4000:]}")
        cache.mkdir(parents=True, exist_ok=True)
        tmp_lib = cache / f".{lib.name}.{os.getpid()}"
        shutil.copy(d / lib.name, tmp_lib)
        os.replace(tmp_lib, lib)
    return lib


@contextlib.contextmanager
def installed(lib_path: Path) -> Iterator[Any]:
    """``cuda_ops`` calls the emulated library (on CPU tensors) inside the block; yields the cffi lib."""
    ffi, lib = cuda_ops.load_library(lib_path)
    saved = cuda_ops._FFI, cuda_ops._LIB, cuda_ops.DEVICE_TYPE
    cuda_ops._FFI, cuda_ops._LIB, cuda_ops.DEVICE_TYPE = ffi, lib, "cpu"
    try:
        yield lib
    finally:
        cuda_ops._FFI, cuda_ops._LIB, cuda_ops.DEVICE_TYPE = saved
