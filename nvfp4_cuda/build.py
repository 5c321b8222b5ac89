"""Compile the CUDA sources into ONE shared library with nvcc, cached by a hash of sources + flags + nvcc.

Architectures: explicit ``-gencode`` lines for sm_80 and sm_90 (the BF16-emulated GEMM), sm_120a (the
native FP4 ``mma.sync ... kind::mxf4nvf4``) and compute_120a PTX.  Never ``-arch=sm_120a`` together
with ``-c``/``-shared``: that also emits non-"a" compute_120 PTX, which ptxas rejects for the
block-scaled MMA (verified with nvcc 13.0).  The FP4 instruction sits behind
``__CUDA_ARCH_FEAT_SM120_ALL || __CUDA_ARCH_FAMILY_SPECIFIC__ == 1200`` so the other images compile.
``-fmad=false`` keeps every float32 operation separately rounded, as in the PyTorch reference.
nvcc links cudart statically, so the library depends only on the driver at run time.

Cache: ``$NVFP4_CUDA_CACHE_DIR``, else ``$XDG_CACHE_HOME/ida/nvfp4_cuda``, else
``~/.cache/ida/nvfp4_cuda``; the library goes to ``<cache>/<key>/libnvfp4_cuda.so`` where ``key`` is the
first 16 hex digits of sha256(sources, flags, ``nvcc --version``, package version).  Concurrent
builders (torchrun ranks) serialise on an ``fcntl`` lock; the library is written to a temporary name
and installed with ``os.replace`` (atomic).  ``$NVFP4_CUDA_NVCC`` or ``$CUDA_HOME/bin/nvcc`` override
the nvcc found on ``PATH``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tqdm import tqdm

from mxfp8_codec.constants import C_HEADER

PACKAGE_VERSION = "0.1.0"
CSRC = Path(__file__).resolve().parent / "csrc"
HEADER = CSRC / "nvfp4.h"
LIB_NAME = "libnvfp4_cuda.so"
GENCODES: tuple[tuple[str, str], ...] = (
    ("compute_80", "sm_80"),
    ("compute_90", "sm_90"),
    ("compute_120a", "sm_120a"),
    ("compute_120a", "compute_120a"),  # PTX for forward compatibility within the 12.0 "a" family
)
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-fmad=false", "-Xcompiler", "-fPIC", "--threads", "2",
                               f"-I{C_HEADER.parent}")  # mxfp8.h: MXFP8 constants, scale rule, RNG


class BuildError(RuntimeError):
    """nvcc is missing or the compilation failed (the message says which and how to fix it)."""


def source_files() -> list[Path]:
    """All files that go into the library hash (sorted), the .cu files first compiled one by one."""
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h")) + [C_HEADER]


def gencode_flags() -> list[str]:
    """The explicit ``-gencode arch=...,code=...`` list."""
    out: list[str] = []
    for arch, code in GENCODES:
        out += ["-gencode", f"arch={arch},code={code}"]
    return out


def find_nvcc() -> str:
    """Path of nvcc: ``$NVFP4_CUDA_NVCC``, ``$CUDA_HOME/bin/nvcc`` or ``PATH``; BuildError if absent."""
    env = os.environ.get("NVFP4_CUDA_NVCC")
    candidates = [env] if env else []
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    found = shutil.which("nvcc")
    if found:
        candidates.append(found)
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise BuildError("nvfp4_cuda: nvcc not found (looked at $NVFP4_CUDA_NVCC, $CUDA_HOME/bin/nvcc and PATH). "
                     "Install the CUDA toolkit (12.8+ for sm_120a) or point NVFP4_CUDA_NVCC at nvcc; "
                     "CPU tensors do not need it (they use nvfp4_cuda.reference); NVFP4_CUDA_BACKEND=reference "
                     "runs CUDA tensors through the PyTorch reference as well.")


def nvcc_version(nvcc: str) -> str:
    """``nvcc --version`` text (part of the cache key)."""
    res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"nvfp4_cuda: '{nvcc} --version' failed: {res.stderr.strip()}")
    return res.stdout.strip()


def cache_dir() -> Path:
    """Root of the build cache (see module docstring)."""
    env = os.environ.get("NVFP4_CUDA_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ida" / "nvfp4_cuda"


def build_key(nvcc: str) -> str:
    """16 hex digits of sha256 over sources, flags, nvcc version and package version."""
    h = hashlib.sha256()
    for p in source_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(BASE_FLAGS + tuple(gencode_flags())).encode())
    h.update(nvcc_version(nvcc).encode())
    h.update(PACKAGE_VERSION.encode())
    return h.hexdigest()[:16]


def library_path(nvcc: str | None = None) -> Path:
    """Where the library for the current sources/flags/nvcc lives (it may not be built yet)."""
    nvcc = nvcc or find_nvcc()
    return cache_dir() / build_key(nvcc) / LIB_NAME


def _run(cmd: list[str], what: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-25:])
        raise BuildError(f"nvfp4_cuda: {what} failed (exit {res.returncode}):\n{' '.join(cmd)}\n{tail}")


def build(*, force: bool = False, progress: bool = True) -> Path:
    """Compile (if needed) and return the path of ``libnvfp4_cuda.so``.

    Args:
        force: rebuild even if the cached library exists.
        progress: show a tqdm bar (one step per source file plus the link).

    Raises:
        BuildError: nvcc missing, or a compile/link error (with nvcc's messages).

    Example:
        >>> from nvfp4_cuda import build as b
        >>> path = b.build()  # doctest: +SKIP
    """
    nvcc = find_nvcc()
    target = library_path(nvcc)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / ".lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.is_file() and not force:
                return target
            cus = [p for p in source_files() if p.suffix == ".cu"]
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                objs = []
                bar = tqdm(total=len(cus) + 1, desc="nvcc nvfp4_cuda", disable=not progress, unit="step")
                for cu in cus:
                    obj = Path(tmp) / (cu.stem + ".o")
                    bar.set_postfix_str(cu.name)
                    _run([nvcc, *BASE_FLAGS, *gencode_flags(), "-c", str(cu), "-o", str(obj)], f"compiling {cu.name}")
                    objs.append(str(obj))
                    bar.update(1)
                out_tmp = Path(tmp) / LIB_NAME
                bar.set_postfix_str("link")
                _run([nvcc, "-shared", *gencode_flags(), *objs, "-o", str(out_tmp)], "linking")
                bar.update(1)
                bar.close()
                with open(out_tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(out_tmp, target)
            return target
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
