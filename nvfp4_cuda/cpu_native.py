"""Native CPU fast path (``cpu/nvfp4_cpu.c``) for the hot reference ops, same bits as the PyTorch reference.

Why: the pure-PyTorch reference needs ~8 elementwise passes to quantize (each a separate tensor),
which on a 2-core machine costs several times a float32 GEMM of trainer-sized shapes.  A 100-line C
loop does block amax and encode in two passes, decode in one, and the Hadamard transform in one;
the MXFP8 master ops (encode, decode, fused Lion, bfloat16 stochastic rounding) are one pass each,
where the PyTorch versions need dozens of int64 passes for the RNG and the grid rounding.  The pure-PyTorch module
:mod:`nvfp4_cuda.reference` stays the oracle: tests check that this path gives the same bits, and
``NVFP4_CPU_NATIVE=0`` switches it off.

Build: compiled on first use with the machine's C compiler, ``-O3 -march=native -ffp-contract=off``
(no fused multiply-add: every float32 operation rounds once, as in PyTorch) and ``-I`` the directory
of ``mxfp8_codec/mxfp8.h`` (the MXFP8 rules the Lion step uses), loaded with cffi ``dlopen``; cached
under ``$IDA_CACHE_DIR/nvfp4_cuda/cpu/`` keyed by sha256 of source, header, flags, compiler banner,
CPU identity (``-march=native`` code must not move between CPUs) and package version; file lock +
atomic install.  Compiler search, cache, switch syntax, key, lock and install are
:mod:`ida_common.native_build`'s.  Any failure -> one warning and the PyTorch path.
"""

from __future__ import annotations

import functools
import subprocess
import warnings
from pathlib import Path
from typing import Any

import cffi
import torch

from ida_common import native_build
from mxfp8_codec.constants import C_HEADER
from mxfp8_codec.rng import stream_keys
from nvfp4_cuda.formats import NVFP4_BLOCK, e4m3_decode_table
from nvfp4_cuda.tensor import NVFP4Tensor

ENV_SWITCH = "NVFP4_CPU_NATIVE"  # "0" / "false" / "no" / "off" disables the native CPU path (native_build syntax)
SOURCE = Path(__file__).resolve().parent / "cpu" / "nvfp4_cpu.c"
CFLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-shared",
    "-fPIC",
    f"-I{C_HEADER.parent}",
)  # mxfp8.h: MXFP8 constants, scale rule, RNG, block encoder
CDEF = """
int64_t nvfp4_cpu_block_amax(const float *x, int64_t rows, int64_t cols, int block_2d, float *bam, float *amax);
void nvfp4_cpu_encode(const float *x, int64_t rows, int64_t cols, const float *bam, float s_enc, float s_dec, int sr,
                      uint32_t k2, uint32_t k3, uint8_t *codes, uint8_t *scales);
void nvfp4_cpu_decode(const uint8_t *codes, const uint8_t *scales, const float *e4m3_table, int64_t rows,
                      int64_t cols, float *out);
void nvfp4_cpu_hadamard16(const float *x, int64_t n_groups, float *out);
int64_t nvfp4_cpu_lion(uint8_t *payload, uint8_t *scales, const float *grad, uint16_t *momentum, float *comp,
                       int64_t rows, int64_t cols, float neg_lr, float decay, float b1, float omb1, float b2,
                       float omb2, int writeback, uint32_t k2, uint32_t k3);
void nvfp4_cpu_sr_bf16(const float *src, int64_t n, uint32_t k2, uint32_t k3, uint16_t *dst);
"""


def library_path(compiler: str) -> Path:
    """Cache path of the compiled library for this source / header / flags / compiler / CPU / version."""
    key = native_build.build_key(
        SOURCE.read_bytes(),
        C_HEADER.read_bytes(),
        " ".join(CFLAGS),
        native_build.compiler_banner(compiler),
        native_build.cpu_identity(),
    )
    return native_build.cache_dir("nvfp4_cuda") / "cpu" / f"nvfp4_cpu-{key}.so"


def _build_library() -> Path:
    try:
        compiler = native_build.find_c_compiler()
    except FileNotFoundError as e:  # $CC names nothing: say so, do not fall back to another compiler
        raise RuntimeError(f"no C compiler found: {e}") from None
    if compiler is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc, clang)")
    lib = library_path(compiler)
    with native_build.file_lock(lib.parent / ".lock"):
        if not lib.is_file():
            with native_build.install_atomic(lib) as out:
                res = subprocess.run(
                    [compiler, *CFLAGS, "-o", str(out), str(SOURCE)], capture_output=True, text=True, check=False
                )
                if res.returncode != 0:
                    raise RuntimeError(f"{compiler} failed: {res.stderr.strip()[-1500:]}")
    return lib


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, Any] | None:
    try:
        ffi = native_build.cffi_ffi("nvfp4_cuda", CDEF)
        return ffi, ffi.dlopen(str(_build_library()))
    except (RuntimeError, OSError, cffi.CDefError) as e:
        warnings.warn(f"nvfp4_cuda: native CPU kernel unavailable, using the PyTorch reference ({e})", stacklevel=3)
        return None


def available() -> bool:
    """True when the native CPU path is enabled and loads."""
    return native_build.switch_enabled(ENV_SWITCH) and _load() is not None


def _ptr(ffi: Any, ctype: str, t: torch.Tensor) -> Any:
    return ffi.cast(ctype, t.data_ptr())


def quantize_nvfp4(
    x32: torch.Tensor, *, block_2d: bool, rounding: str, seed: int, step: int, tensor_id: int
) -> NVFP4Tensor:
    """Quantize a contiguous float32 CPU matrix (already Hadamard-transformed if requested)."""
    from nvfp4_cuda.reference import nvfp4_scales  # the scalar tensor-scale rule lives in one place

    loaded = _load()
    assert loaded is not None
    ffi, lib = loaded
    r, c = x32.shape
    bam = torch.empty(r, c // NVFP4_BLOCK, dtype=torch.float32)
    amax = torch.zeros((), dtype=torch.float32)
    bad = lib.nvfp4_cpu_block_amax(
        _ptr(ffi, "float *", x32), r, c, int(block_2d), _ptr(ffi, "float *", bam), _ptr(ffi, "float *", amax)
    )
    if bad >= 0:
        idx = [bad // c, bad % c]
        raise ValueError(f"quantize_nvfp4: non-finite input at index {idx} (value {x32[idx[0], idx[1]].item()})")
    s_enc, s_dec = nvfp4_scales(amax)
    codes = torch.empty(r, c // 2, dtype=torch.uint8)
    scales = torch.empty(r, c // NVFP4_BLOCK, dtype=torch.uint8)
    k2, k3 = stream_keys(seed, step, tensor_id)
    lib.nvfp4_cpu_encode(
        _ptr(ffi, "float *", x32),
        r,
        c,
        _ptr(ffi, "float *", bam),
        float(s_enc),
        float(s_dec),
        1 if rounding == "stochastic" else 0,
        k2,
        k3,
        _ptr(ffi, "uint8_t *", codes),
        _ptr(ffi, "uint8_t *", scales),
    )
    return NVFP4Tensor(
        codes=codes, block_scales=scales, tensor_scale=s_dec.reshape(()), shape=(r, c), block_2d=block_2d
    )


def decode_scaled(q: NVFP4Tensor) -> torch.Tensor:
    """``e2m1 * e4m3(block scale)`` as float32 [R, C] (no tensor scale)."""
    loaded = _load()
    assert loaded is not None
    ffi, lib = loaded
    r, c = q.shape
    codes, scales = q.codes.contiguous(), q.block_scales.contiguous()
    table = e4m3_decode_table("cpu")
    out = torch.empty(r, c, dtype=torch.float32)
    lib.nvfp4_cpu_decode(
        _ptr(ffi, "uint8_t *", codes),
        _ptr(ffi, "uint8_t *", scales),
        _ptr(ffi, "float *", table),
        r,
        c,
        _ptr(ffi, "float *", out),
    )
    return out


def hadamard16(x: torch.Tensor) -> torch.Tensor:
    """:func:`nvfp4_cuda.reference.hadamard16` on a CPU tensor (float32 out, same bits)."""
    loaded = _load()
    assert loaded is not None
    ffi, lib = loaded
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"hadamard16: last dimension {x.shape[-1]} is not a multiple of {NVFP4_BLOCK}")
    x32 = x.to(torch.float32).contiguous()
    out = torch.empty_like(x32)
    lib.nvfp4_cpu_hadamard16(_ptr(ffi, "float *", x32), x32.numel() // NVFP4_BLOCK, _ptr(ffi, "float *", out))
    return out


def lion_step_mxfp8_(
    payload: torch.Tensor,
    scales: torch.Tensor,
    grad: torch.Tensor,
    momentum: torch.Tensor,
    *,
    consts: tuple[float, float, float, float, float, float],
    writeback_code: int,
    compensation: torch.Tensor | None,
    seed: int,
    step: int,
    tensor_id: int,
) -> int:
    """In-place fused Lion on contiguous CPU tensors; returns -1 or the flat index of a non-finite update."""
    loaded = _load()
    assert loaded is not None
    ffi, lib = loaded
    c = payload.shape[-1]
    g = grad.to(torch.float32).contiguous()
    k2, k3 = stream_keys(seed, step, tensor_id)
    comp_ptr = _ptr(ffi, "float *", compensation) if compensation is not None else ffi.NULL
    return int(
        lib.nvfp4_cpu_lion(
            _ptr(ffi, "uint8_t *", payload),
            _ptr(ffi, "uint8_t *", scales),
            _ptr(ffi, "float *", g),
            _ptr(ffi, "uint16_t *", momentum),
            comp_ptr,
            payload.numel() // c if c else 0,
            c,
            *consts,
            writeback_code,
            k2,
            k3,
        )
    )


def stochastic_round_to_bf16(src: torch.Tensor, *, seed: int, step: int, tensor_id: int) -> torch.Tensor:
    """float32 -> bfloat16 stochastic rounding of a CPU tensor, same bits as the reference (new tensor)."""
    loaded = _load()
    assert loaded is not None
    ffi, lib = loaded
    s = src.to(torch.float32).contiguous()
    out = torch.empty(s.shape, dtype=torch.bfloat16)
    k2, k3 = stream_keys(seed, step, tensor_id)
    lib.nvfp4_cpu_sr_bf16(_ptr(ffi, "float *", s), s.numel(), k2, k3, _ptr(ffi, "uint16_t *", out))
    return out
