"""Compile the CUDA sources into ONE shared library with nvcc, cached by a hash of sources + flags + nvcc.

Architectures: explicit ``-gencode`` lines for sm_80 and sm_90 (the BF16-emulated GEMM), sm_120a (the
native FP4 ``mma.sync ... kind::mxf4nvf4``) and compute_120a PTX.  Never ``-arch=sm_120a`` together
with ``-c``/``-shared``: that also emits non-"a" compute_120 PTX, which ptxas rejects for the
block-scaled MMA (verified with nvcc 13.0).  The FP4 instruction sits behind
``__CUDA_ARCH_FEAT_SM120_ALL || __CUDA_ARCH_FAMILY_SPECIFIC__ == 1200`` so the other images compile.
``-fmad=false`` keeps every float32 operation separately rounded, as in the PyTorch reference.
nvcc links cudart statically, so the library depends only on the driver at run time (and on the
cuBLASLt that a CUDA build of PyTorch has already loaded, found with ``dl_iterate_phdr`` / ``dlsym`` at
the first emulated GEMM: nothing of cuBLAS is needed to build).

Cache: ``$IDA_CACHE_DIR/nvfp4_cuda`` (else ``$XDG_CACHE_HOME/ida/nvfp4_cuda``, else
``~/.cache/ida/nvfp4_cuda``; the old ``$NVFP4_CUDA_CACHE_DIR`` still works, with a deprecation
warning); the library goes to ``<cache>/<key>/libnvfp4_cuda.so`` where ``key`` is the first 16 hex
digits of sha256(sources incl. ``mxfp8_codec/mxfp8.h``, flags, ``nvcc --version``, package version
from package metadata).  Concurrent builders (torchrun ranks) serialise on an ``fcntl`` lock; the
library is written to a temporary name and installed atomically -- cache, key, lock and install are
:mod:`ida_common.native_build`'s, shared with the two C builds.  nvcc: ``$NVFP4_CUDA_NVCC`` if set (a
nonexistent one is an error, never silently replaced), else ``$CUDA_HOME/bin/nvcc``, else ``PATH``.
``$NVFP4_CUDA_NVCC_FLAGS``: extra nvcc flags for every compile, split as a shell splits them (e.g.
``-DNV_QUANT_NB=1``, the quantizer's one-block variant that the device check measures); they are part
of the key, so each set of flags has its own cached library.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from tqdm import tqdm

from ida_common import native_build
from mxfp8_codec.constants import C_HEADER

NVCC_ENV = "NVFP4_CUDA_NVCC"  # explicit nvcc; must exist when set
EXTRA_FLAGS_ENV = "NVFP4_CUDA_NVCC_FLAGS"  # extra nvcc flags for every compile; part of the cache key
CSRC = Path(__file__).resolve().parent / "csrc"
HEADER = CSRC / "nvfp4.h"
LIB_NAME = "libnvfp4_cuda.so"
GENCODES: tuple[tuple[str, str], ...] = (
    ("compute_80", "sm_80"),
    ("compute_90", "sm_90"),
    ("compute_120a", "sm_120a"),
    ("compute_120a", "compute_120a"),  # PTX for forward compatibility within the 12.0 "a" family
)
BASE_FLAGS: tuple[str, ...] = (
    "-O3",
    "-std=c++17",
    "-fmad=false",
    "-Xcompiler",
    "-fPIC",
    "--threads",
    "2",
    f"-I{C_HEADER.parent}",
)  # mxfp8.h: MXFP8 constants, scale rule, RNG
LINK_FLAGS: tuple[str, ...] = ("-ldl", "-lpthread")  # cuBLASLt is found at run time (nvfp4_lt.cu), not linked


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


def extra_flags() -> list[str]:
    """``$NVFP4_CUDA_NVCC_FLAGS`` split as a shell would (empty when unset); BuildError if it cannot be."""
    raw = os.environ.get(EXTRA_FLAGS_ENV, "")
    try:
        return shlex.split(raw)
    except ValueError as e:
        raise BuildError(f"{EXTRA_FLAGS_ENV}={raw!r} cannot be split into flags: {e}") from None


def find_nvcc() -> str:
    """Path of nvcc: ``$NVFP4_CUDA_NVCC``, ``$CUDA_HOME/bin/nvcc`` or ``PATH``; BuildError if absent.

    A set ``$NVFP4_CUDA_NVCC`` that names nothing executable is refused (BuildError naming it), not
    replaced by another nvcc.
    """
    try:
        explicit = native_build.tool_from_env(NVCC_ENV, "CUDA compiler nvcc")
    except FileNotFoundError as e:
        raise BuildError(str(e)) from None
    if explicit:
        return explicit
    candidates: list[str] = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    found = shutil.which("nvcc")
    if found:
        candidates.append(found)
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise BuildError(
        "nvcc not found (looked at $NVFP4_CUDA_NVCC, $CUDA_HOME/bin/nvcc and PATH). "
        "Install the CUDA toolkit (12.8+ for sm_120a) or point NVFP4_CUDA_NVCC at nvcc; "
        "CPU tensors do not need it (they use nvfp4_cuda.reference); NVFP4_CUDA_BACKEND=reference "
        "runs CUDA tensors through the PyTorch reference as well."
    )


def nvcc_version(nvcc: str) -> str:
    """``nvcc --version`` text (part of the cache key)."""
    res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"'{nvcc} --version' failed: {res.stderr.strip()}")
    return res.stdout.strip()


def cache_dir() -> Path:
    """Root of the CUDA build cache: ``native_build.cache_dir("nvfp4_cuda")`` (see module docstring)."""
    return native_build.cache_dir("nvfp4_cuda")


def build_key(nvcc: str) -> str:
    """16 hex digits of sha256 over sources, flags, nvcc version and package version."""
    parts: list[bytes | str] = []
    for p in source_files():
        parts += [p.name, p.read_bytes()]
    flags = " ".join(BASE_FLAGS + tuple(gencode_flags()) + LINK_FLAGS + tuple(extra_flags()))
    return native_build.build_key(*parts, flags, nvcc_version(nvcc))


def library_path(nvcc: str | None = None) -> Path:
    """Where the library for the current sources/flags/nvcc lives (it may not be built yet)."""
    nvcc = nvcc or find_nvcc()
    return cache_dir() / build_key(nvcc) / LIB_NAME


def _run(cmd: list[str], what: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-25:])
        raise BuildError(f"{what} failed (exit {res.returncode}):\n{' '.join(cmd)}\n{tail}")


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
    extra = extra_flags()
    with native_build.file_lock(target.parent / ".lock"):
        if target.is_file() and not force:
            return target
        cus = [p for p in source_files() if p.suffix == ".cu"]
        with native_build.install_atomic(target) as out_tmp:
            objs = []
            bar = tqdm(total=len(cus) + 1, desc="nvcc nvfp4_cuda", disable=not progress, unit="step")
            for cu in cus:
                obj = out_tmp.with_name(f"{out_tmp.name}.{cu.stem}.o")
                objs.append(obj)
                bar.set_postfix_str(cu.name)
                try:
                    _run(
                        [nvcc, *BASE_FLAGS, *extra, *gencode_flags(), "-c", str(cu), "-o", str(obj)],
                        f"compiling {cu.name}",
                    )
                except BuildError:
                    for o in objs:
                        o.unlink(missing_ok=True)
                    raise
                bar.update(1)
            bar.set_postfix_str("link")
            try:
                _run([nvcc, "-shared", *gencode_flags(), *map(str, objs), *LINK_FLAGS, "-o", str(out_tmp)], "linking")
            finally:
                for o in objs:
                    o.unlink(missing_ok=True)
            bar.update(1)
            bar.close()
        return target
