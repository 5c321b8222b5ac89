"""Loader for the native MXFP8 kernel (``_kernel.c``): lazy build, cache, cffi ABI-mode load.

Why native: exact pure-numpy decoding (a chunked 65 536-entry table gather) runs ~15x slower
than copying the output, torch's float8 cast ~25x; a 150-line C loop runs near memory speed.

How:

* The source (with its header ``mxfp8.h``) is compiled on first use with the machine's C compiler
  with ``-O3 -march=native`` into a shared library, then opened with ``cffi.FFI().dlopen`` (ABI
  mode: no Python headers or extension build needed), its declarations parsed once per machine
  (:func:`ida_common.native_build.cffi_ffi`).
* Compiler search, cache directory (``$IDA_CACHE_DIR/mxfp8_codec``), the on/off switch syntax, the
  build key (sha256 of source, header, flags, compiler banner, CPU model/flags -- ``-march=native``
  code must not run on another CPU -- and the package version), the ``fcntl`` lock and the atomic
  install are :mod:`ida_common.native_build`'s, shared with nvfp4_cuda's two native builds.
* Fallback: no compiler, a failed build or ``MXFP8_CODEC_NATIVE=0`` -> :func:`get_kernel` returns
  None and the codec uses the pure-numpy path, which gives identical bits (tests check both).
  A failed build emits one warning with the compiler's message.

This is the only place in the codec that reads the environment or writes files outside the
caller's paths.
"""

from __future__ import annotations

import functools
import platform
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ida_common import native_build

__all__ = [
    "ENV_SWITCH",
    "NativeKernel",
    "build_variant",
    "cache_dir",
    "get_kernel",
    "kernel_info",
    "open_library",
]

ENV_SWITCH = "MXFP8_CODEC_NATIVE"  # "0" / "false" / "no" / "off" forces the numpy fallback (native_build syntax)
KERNEL_SOURCE = Path(__file__).with_name("_kernel.c")
KERNEL_HEADER = Path(__file__).with_name("mxfp8.h")  # #included by the kernel (and by nvfp4_cuda's C/CUDA)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
# -march=native: AVX-512 intrinsics where the CPU has them (see _kernel.c), else portable C
CFLAGS = (
    "-O3",
    "-march=native",
    *(("-mprefer-vector-width=512",) if _X86 else ()),
    "-std=c11",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
)
PORTABLE_CFLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fno-math-errno")  # no CPU extensions
AVX2_CFLAGS = ("-O3", "-mavx2", "-std=c11", "-fPIC", "-shared", "-fno-math-errno")  # the AVX2 decode, no AVX-512
SIMD_NAMES = ("portable-c", "avx512", "avx2")  # by mx_kernel_simd()
_CDEF = """
int mx_kernel_version(void);
int mx_kernel_simd(void);
int64_t mx_encode_f32(const float *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil);
int64_t mx_encode_bf16(const uint16_t *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil);
void mx_decode_bf16(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t k,
                    uint16_t *out, const uint16_t *lut);
void mx_decode_f32(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t k,
                   uint32_t *out, const uint32_t *lut);
void mx_decode_bf16_t(const uint8_t *q, int64_t ldq, const uint8_t *s, int64_t lds, int64_t rows,
                      int64_t k, uint16_t *out, int64_t ld, const uint16_t *lut);
void mx_decode_f32_t(const uint8_t *q, int64_t ldq, const uint8_t *s, int64_t lds, int64_t rows,
                     int64_t k, uint32_t *out, int64_t ld, const uint32_t *lut);
typedef struct {
    const uint8_t *q; const uint8_t *s; int64_t rows, k; void *out; const void *lut;
    int (*thread_num)(void); int (*num_threads)(void);
} mx_team_args;
void mx_decode_bf16_team(void *arg);
void mx_decode_f32_team(void *arg);
void mx_decode_bf16_t_team(void *arg);
void mx_decode_f32_t_team(void *arg);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
int64_t mx_encode_grid(const void *x, int bf16, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil,
                       int sr, uint64_t index0, uint32_t k2, uint32_t k3);
"""
_EXPECTED_VERSION = 9  # MX_KERNEL_VERSION in _kernel.c
_lock = threading.Lock()
_openmp_libs: dict[str, Any] = {}  # NativeKernel._openmp: runtime path -> cffi library


def cache_dir() -> Path:
    """Where built kernels live: ``native_build.cache_dir("mxfp8_codec")`` (``$IDA_CACHE_DIR/mxfp8_codec``)."""
    return native_build.cache_dir("mxfp8_codec")


def _find_compiler() -> str | None:
    try:
        return native_build.find_c_compiler()
    except FileNotFoundError as exc:  # $CC names nothing: say so, do not fall back to another compiler
        raise RuntimeError(f"no C compiler found: {exc}") from None


def _build_key(compiler: str) -> str:
    return native_build.build_key(
        KERNEL_SOURCE.read_bytes(),
        KERNEL_HEADER.read_bytes(),
        " ".join(CFLAGS),
        native_build.compiler_banner(compiler),
        native_build.cpu_identity(),
        length=20,
    )


def _compile(compiler: str, out: Path, cflags: tuple[str, ...] = CFLAGS) -> None:
    """Compile the kernel to ``out`` atomically (temporary file + fsync + os.replace)."""
    with native_build.install_atomic(out) as tmp:
        proc = subprocess.run(
            [compiler, *cflags, "-o", str(tmp), str(KERNEL_SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _build_library(bad_contents: bytes | None = None) -> Path:
    """Return the path of the built library for this source/compiler/CPU, building it if needed.

    Args:
        bad_contents: the bytes of a cached library that failed to load (damaged, or written by
            something else); it is rebuilt under the lock unless another process already did.
    """
    compiler = _find_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc, clang)")
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    lib = directory / f"mxfp8_kernel-{_build_key(compiler)}.so"
    if lib.exists() and bad_contents is None:
        return lib
    with native_build.file_lock(lib.with_suffix(".lock")):
        # another process may have built (or repaired) it while we waited for the lock
        if not lib.exists() or (bad_contents is not None and lib.read_bytes() == bad_contents):
            _compile(compiler, lib)
    return lib


@dataclass(frozen=True)
class NativeKernel:
    """The loaded native kernel: thin typed wrappers over the C entry points.

    All arrays must be C-contiguous 2-D views ``[rows, k]`` (the caller reshapes and copies).
    """

    ffi: Any
    lib: Any
    path: Path

    @property
    def simd(self) -> str:
        """The intrinsics the fast paths were compiled with: ``"avx512"``, ``"avx2"`` or ``"portable-c"``."""
        return SIMD_NAMES[self.lib.mx_kernel_simd()]

    def _ptr(self, ctype: str, a: np.ndarray) -> Any:
        return self.ffi.cast(ctype, a.ctypes.data)

    def encode(self, x: np.ndarray, q: np.ndarray, s: np.ndarray, rceil: bool) -> int:
        """Encode float32 or bfloat16 (given as uint16 bits) rows; -1 or the first bad block index."""
        rows, k = x.shape
        fn = self.lib.mx_encode_f32 if x.dtype == np.float32 else self.lib.mx_encode_bf16
        ctype = "const float *" if x.dtype == np.float32 else "const uint16_t *"
        assert x.dtype in (np.float32, np.uint16) and x.flags.c_contiguous
        assert q.flags.c_contiguous and s.flags.c_contiguous and q.shape == x.shape
        return int(fn(self._ptr(ctype, x), rows, k, self._ptr("uint8_t *", q), self._ptr("uint8_t *", s), int(rceil)))

    def encode_grid(
        self,
        x: np.ndarray,
        q: np.ndarray,
        s: np.ndarray,
        rceil: bool,
        stochastic: bool,
        index0: int,
        keys: tuple[int, int],
    ) -> int:
        """Grid-rounding encode (RNE or stochastic with the counter RNG's round ``keys``) of float32
        or bfloat16-bits rows; element (r, c) uses the word of flat index ``index0 + r * k + c``.
        Returns -1 or the first bad block index."""
        rows, k = x.shape
        assert x.dtype in (np.float32, np.uint16) and x.flags.c_contiguous
        assert q.flags.c_contiguous and s.flags.c_contiguous and q.shape == x.shape
        return int(
            self.lib.mx_encode_grid(
                self._ptr("const void *", x),
                int(x.dtype == np.uint16),
                rows,
                k,
                self._ptr("uint8_t *", q),
                self._ptr("uint8_t *", s),
                int(rceil),
                int(stochastic),
                index0,
                keys[0],
                keys[1],
            )
        )

    def decode(
        self, q: np.ndarray, s: np.ndarray, out: np.ndarray, table: np.ndarray, team: tuple[str, int] | None = None
    ) -> None:
        """Decode rows into ``out`` (uint16 bfloat16 bits or uint32 float32 bits).

        ``team = (runtime, threads)`` runs the decode on the thread team of the OpenMP runtime
        library ``runtime`` (the path of one already loaded in this process, e.g. torch's
        libgomp), ``threads`` wide, each thread one row range; the same bits as one thread."""
        rows, k = q.shape
        assert q.flags.c_contiguous and s.flags.c_contiguous and out.flags.c_contiguous
        assert out.shape == q.shape and table.dtype == out.dtype and table.size == 65536
        if team is not None and rows > 1:
            body = self.lib.mx_decode_bf16_team if out.dtype == np.uint16 else self.lib.mx_decode_f32_team
            self._on_team(team, body, q, s, out, table)
            return
        if out.dtype == np.uint16:
            self.lib.mx_decode_bf16(
                self._ptr("const uint8_t *", q),
                self._ptr("const uint8_t *", s),
                rows,
                k,
                self._ptr("uint16_t *", out),
                self._ptr("const uint16_t *", table),
            )
        else:
            self.lib.mx_decode_f32(
                self._ptr("const uint8_t *", q),
                self._ptr("const uint8_t *", s),
                rows,
                k,
                self._ptr("uint32_t *", out),
                self._ptr("const uint32_t *", table),
            )

    def _on_team(
        self, team: tuple[str, int], body: Any, q: np.ndarray, s: np.ndarray, out: np.ndarray, table: Any
    ) -> None:
        """Run a team entry point (``mx_decode_*_team``) on the OpenMP runtime ``team[0]``, ``team[1]`` wide."""
        omp = self._openmp(team[0])
        rows, k = q.shape
        args = self.ffi.new(
            "mx_team_args *",
            {
                "q": self._ptr("const uint8_t *", q),
                "s": self._ptr("const uint8_t *", s),
                "rows": rows,
                "k": k,
                "out": self._ptr("void *", out),
                "lut": self._ptr("const void *", table),
                "thread_num": omp.omp_get_thread_num,
                "num_threads": omp.omp_get_num_threads,
            },
        )
        omp.GOMP_parallel(body, args, max(1, team[1]), 0)

    def _openmp(self, runtime: str) -> Any:
        """The OpenMP runtime library at ``runtime``, opened once (dlopen of a library the process
        already has loaded returns that same copy, with its existing threads)."""
        lib = _openmp_libs.get(runtime)
        if lib is None:
            with _lock:
                lib = _openmp_libs.get(runtime) or _openmp_libs.setdefault(runtime, self.ffi.dlopen(runtime))
        return lib

    def decode_transposed(
        self, q: np.ndarray, s: np.ndarray, out: np.ndarray, table: np.ndarray, team: tuple[str, int] | None = None
    ) -> None:
        """Decode ``q [rows, k]`` into ``out [k, rows]`` (the transpose), tile by tile in C.

        Each of ``q``, ``s`` and ``out`` needs unit stride along its last axis only: ``q`` / ``s``
        may be a column range of larger arrays (block-aligned, a multiple of 32 wide) and ``out``
        a row or column range of a larger C-contiguous array, so callers can split work over
        threads without copies. ``team`` as in :meth:`decode` (all three C-contiguous; each thread a
        range of block columns); the same bits as one thread.
        """
        rows, k = q.shape
        assert table.size == 65536 and table.dtype == out.dtype and out.shape == (k, rows)
        for a in (q, s, out):
            assert a.ndim == 2 and (a.shape[1] <= 1 or a.strides[1] == a.itemsize) and a.strides[0] >= 0
        if team is not None and k > 32 and all(a.flags.c_contiguous for a in (q, s, out)):
            body = self.lib.mx_decode_bf16_t_team if out.dtype == np.uint16 else self.lib.mx_decode_f32_t_team
            self._on_team(team, body, q, s, out, table)
            return
        ldq, lds = q.strides[0], s.strides[0]  # uint8: bytes == elements
        ld = out.strides[0] // out.itemsize
        args = (self._ptr("const uint8_t *", q), ldq, self._ptr("const uint8_t *", s), lds, rows, k)
        if out.dtype == np.uint16:
            self.lib.mx_decode_bf16_t(*args, self._ptr("uint16_t *", out), ld, self._ptr("const uint16_t *", table))
        else:
            self.lib.mx_decode_f32_t(*args, self._ptr("uint32_t *", out), ld, self._ptr("const uint32_t *", table))


def open_library(path: Path) -> NativeKernel:
    """Open a built kernel library with cffi (ABI mode) and check its version."""
    ffi = native_build.cffi_ffi("mxfp8_codec", _CDEF)
    lib = ffi.dlopen(str(path))
    version = lib.mx_kernel_version()
    if version != _EXPECTED_VERSION:
        raise RuntimeError(f"{path}: kernel version {version}, expected {_EXPECTED_VERSION}")
    return NativeKernel(ffi=ffi, lib=lib, path=path)


def build_variant(out: Path, cflags: tuple[str, ...]) -> NativeKernel:
    """Compile the kernel with other flags to ``out`` and open it, bypassing the cache.

    Used by the tests to check the portable C and AVX2 fast paths (:data:`PORTABLE_CFLAGS`,
    :data:`AVX2_CFLAGS`) against the numpy path on a machine where the default build uses AVX-512.
    """
    compiler = _find_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc, clang)")
    _compile(compiler, out, cflags)
    return open_library(out)


@functools.cache
def _load() -> NativeKernel | str:
    """Build (if needed) and load the kernel once per process; a string explains a failure."""
    try:
        path = _build_library()
        try:
            return open_library(path)
        except (OSError, RuntimeError):  # a damaged or foreign cache entry: rebuild it once
            return open_library(_build_library(bad_contents=path.read_bytes()))
    except Exception as exc:  # noqa: BLE001 -- any build/load problem means: use the numpy path
        reason = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"mxfp8_codec: native kernel unavailable, using the pure-numpy path ({reason})",
            RuntimeWarning,
            stacklevel=3,
        )
        return reason


def _disabled_by_env() -> bool:
    return not native_build.switch_enabled(ENV_SWITCH)


def get_kernel() -> NativeKernel | None:
    """The native kernel, or None when disabled (``MXFP8_CODEC_NATIVE=0``) or unavailable.

    Example:
        >>> k = get_kernel()
        >>> k is None or k.path.exists()
        True
    """
    if _disabled_by_env():
        return None
    with _lock:
        loaded = _load()
    return loaded if isinstance(loaded, NativeKernel) else None


def kernel_info() -> dict[str, str]:
    """Which implementation the codec uses and why: ``{"backend": "native"|"numpy", ...}``."""
    if _disabled_by_env():
        return {"backend": "numpy", "reason": f"{ENV_SWITCH}=0"}
    with _lock:
        loaded = _load()
    if isinstance(loaded, NativeKernel):
        return {"backend": "native", "library": str(loaded.path), "simd": loaded.simd}
    return {"backend": "numpy", "reason": loaded}
