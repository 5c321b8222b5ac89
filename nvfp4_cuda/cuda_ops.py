"""CUDA tensors -> the cffi-loaded library: argument checks, output allocation, stream, status -> exception.

The library (:mod:`nvfp4_cuda.build`) is opened once with ``ffi.dlopen`` in ABI mode from the plain C
header ``csrc/nvfp4.h``; device pointers (``tensor.data_ptr()``) and the current stream
(``torch.cuda.current_stream().cuda_stream``) are passed as integers.  Each wrapper checks what C
cannot (device, dtype, contiguity, shape), allocates outputs with torch, and turns a non-zero
status into :class:`NVFP4CudaError` carrying the library's last-error message.

Out of GPU memory, a wrapper raises ``torch.OutOfMemoryError`` (so the CLI ends with status 3) whose message
names the op and its operands' shapes (:func:`_names_out_of_memory`).

Not done on the GPU path, by design (each would need a host synchronisation): the NaN/Inf checks of
quantize and the Lion step (non-finite blocks come out as NaN instead of raising).  ``encode_mxfp8_cuda``
does check, because it is used for checkpoints, not in the training loop.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ida_common import native_build
from ida_common.cli import is_out_of_memory
from mxfp8_codec.constants import BLOCK_SIZE
from mxfp8_codec.rng import stream_keys
from nvfp4_cuda import build as _build
from nvfp4_cuda.formats import NVFP4_BLOCK
from nvfp4_cuda.reference import check_gemm_operands, check_matrix, check_rounding, padded_to_block
from nvfp4_cuda.reference_master import WRITEBACK_MODES, check_lion_bf16_args, f32_const
from nvfp4_cuda.tensor import NVFP4Tensor

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}  # NVFP4_DTYPE_F32 / _BF16 (2 = MXFP8 input)
WRITEBACK_CODES = {"stochastic": 0, "rne": 1, "compensated": 2}


class NVFP4CudaError(RuntimeError):
    """A library call returned a non-zero status (message from ``nvfp4_last_error``)."""


def header_cdef() -> str:
    """The header text cffi can parse: comments and ``#define``-free lines kept as is."""
    text = _build.HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    return text


def make_ffi() -> Any:
    """A cffi FFI with every declaration of ``csrc/nvfp4.h`` (parsed once per machine: ``native_build.cffi_ffi``)."""
    return native_build.cffi_ffi("nvfp4_cuda", header_cdef())


def header_functions() -> list[str]:
    """Names of all functions declared in the header."""
    return re.findall(r"^\s*(?:const\s+)?\w+\s*\*?\s*(nvfp4_\w+)\s*\(", header_cdef(), flags=re.MULTILINE)


_FFI: Any | None = None
_LIB: Any = None


def load_library(path: str | Path | None = None) -> tuple[Any, Any]:
    """Open the library once (building it first if needed) and return ``(ffi, lib)``."""
    global _FFI, _LIB
    if _LIB is not None and path is None:
        return _FFI, _LIB
    ffi = make_ffi()
    lib_path = Path(path) if path is not None else _build.build()
    try:
        lib = ffi.dlopen(str(lib_path), ffi.RTLD_NOW | ffi.RTLD_LOCAL)
    except OSError as e:
        raise NVFP4CudaError(
            f"nvfp4_cuda: cannot load {lib_path}: {e}. Rebuild with 'python -m nvfp4_cuda build "
            f"--force' (cache dir {_build.cache_dir()})"
        ) from e
    if path is None:
        _FFI, _LIB = ffi, lib
    return ffi, lib


def check(status: int, what: str, lib: Any = None, ffi: Any | None = None) -> None:
    """Raise NVFP4CudaError with the library's message when ``status`` is not NVFP4_OK."""
    if status == 0:
        return
    if lib is None:
        ffi, lib = load_library()
    assert ffi is not None
    buf = ffi.new("char[512]")
    lib.nvfp4_last_error(buf, 512)
    kind = ffi.string(lib.nvfp4_status_string(status)).decode()
    raise NVFP4CudaError(f"{what}: {kind} (status {status}): {ffi.string(buf).decode()}")


def _lib() -> Any:
    return load_library()[1]


# Where the library's "device" pointers live.  "cuda" always in use; the tests' CPU kernel emulator
# (tests/nvfp4_cuda/kernel_emu.py) sets "cpu" while it runs the kernels on host memory.
DEVICE_TYPE = "cuda"


def _stream(t: torch.Tensor) -> int:
    return int(torch.cuda.current_stream(t.device).cuda_stream) if t.is_cuda else 0


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else int(t.data_ptr())


def _need_cuda(t: torch.Tensor, what: str, name: str) -> None:
    if t.device.type != DEVICE_TYPE:
        raise ValueError(f"{what}: {name} must be a CUDA tensor, got device {t.device}")


def _float_input(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    if x.dtype not in DTYPE_CODES:
        x = x.to(torch.float32)
    return x.contiguous(), DTYPE_CODES[x.dtype]


def _call(fn: str, *args: Any) -> None:
    lib = _lib()
    check(getattr(lib, fn)(*args), fn)


LT_WORKSPACE_BYTES = 32 * 1024 * 1024  # cuBLASLt workspace per (device, stream), as PyTorch gives it on Hopper
_SCRATCH: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _scratch(device: torch.device, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(workspace, float32[2] alpha/beta) for cuBLASLt on this device and stream, allocated once.

    Reused by every GEMM on the stream: stream order keeps one GEMM's reads before the next one's writes.
    """
    key = (device.index if device.index is not None else torch.cuda.current_device(), stream)
    if key not in _SCRATCH:
        _SCRATCH[key] = (
            torch.empty(LT_WORKSPACE_BYTES, dtype=torch.uint8, device=device),
            torch.empty(2, dtype=torch.float32, device=device),
        )
    return _SCRATCH[key]


def _aligned(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` contiguous with its data pointer a multiple of ``n`` bytes (a fresh copy only when needed)."""
    t = t.contiguous()
    return t if t.data_ptr() % n == 0 else t.clone()


def cublaslt_library() -> str:
    """Path of the cuBLASLt the emulated GEMM uses ("" until the first GEMM has found it)."""
    ffi, lib = load_library()
    buf = ffi.new("char[512]")
    check(lib.nvfp4_cublaslt_library(buf, 512), "nvfp4_cublaslt_library", lib, ffi)
    return ffi.string(buf).decode()


_F = TypeVar("_F", bound=Callable[..., Any])


def _names_out_of_memory(fn: _F) -> _F:
    """``fn`` with an out-of-memory error (an output or a contiguous copy torch could not allocate) re-raised
    as ``torch.OutOfMemoryError("OP: out of memory for NAME [shape] dtype, ...: <torch's message>")``."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not is_out_of_memory(e) or getattr(e, "names_op", False):  # not OOM, or an inner op named itself
                raise
            bound = sig.bind_partial(*args, **kwargs).arguments
            operands = ", ".join(
                f"{name} {list(v.shape)} {str(getattr(v, 'dtype', type(v).__name__)).replace('torch.', '')}"
                for name, v in bound.items()
                if hasattr(v, "shape")
            )
            err = torch.OutOfMemoryError(f"{fn.__name__}: out of memory for {operands}: {e}")
            err.names_op = True  # type: ignore[attr-defined]
            raise err from e

    return wrapper  # type: ignore[return-value]


@_names_out_of_memory
def quantize_nvfp4(
    x: torch.Tensor,
    *,
    block_2d: bool = False,
    rounding: str = "rne",
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
    hadamard: bool = False,
    transpose: bool = False,
) -> NVFP4Tensor:
    """CUDA quantizer (same bits as :func:`nvfp4_cuda.reference.quantize_nvfp4`)."""
    q = _quantize_float(x, "quantize_nvfp4", block_2d, rounding, seed, step, tensor_id, hadamard, transpose, False)
    assert isinstance(q, NVFP4Tensor)
    return q


def _quantize_float(
    x: torch.Tensor,
    what: str,
    block_2d: bool,
    rounding: str,
    seed: int,
    step: int,
    tensor_id: int,
    hadamard: bool,
    transpose: bool,
    decoded: bool,
) -> NVFP4Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A float32 / BF16 input: its checks and logical shape (``transpose``: x^T, tokens padded), then _quantize."""
    check_matrix(x, what, transpose=transpose)
    check_rounding(rounding, what)
    xc, dt = _float_input(x)
    rows, cols = (x.shape[1], padded_to_block(x.shape[0])) if transpose else (x.shape[0], x.shape[1])
    return _quantize(
        xc, dt, None, rows, cols, transpose, block_2d, rounding, seed, step, tensor_id, hadamard, decoded=decoded
    )


def _quantize(
    x: torch.Tensor,
    dtype_code: int,
    x_scales: torch.Tensor | None,
    rows: int,
    cols: int,
    transpose: bool,
    block_2d: bool,
    rounding: str,
    seed: int,
    step: int,
    tensor_id: int,
    hadamard: bool,
    decoded: bool = False,
) -> NVFP4Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The amax pass then the quantize pass; ``decoded``: BF16 values ``e2m1 * e4m3`` instead of codes.

    ``transpose``: ``x`` is stored [valid_cols, rows] with valid_cols = x.shape[0] <= cols (the logical
    columns past it, fewer than 16, are zero padding).
    """
    dev = x.device
    valid_cols = x.shape[0] if transpose else cols
    amax = torch.empty(1, dtype=torch.float32, device=dev)
    empty = rows == 0 or cols == 0
    ts = torch.ones((), dtype=torch.float32, device=dev) if empty else torch.empty((), dtype=torch.float32, device=dev)
    if decoded:
        codes = scales = None
        values = torch.empty(rows, cols, dtype=torch.bfloat16, device=dev)
    else:
        codes = torch.empty(rows, cols // 2, dtype=torch.uint8, device=dev)
        scales = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.uint8, device=dev)
        values = None
    k2, k3 = stream_keys(seed, step, tensor_id)
    st = _stream(x)
    src = (_ptr(x), dtype_code, _ptr(x_scales), rows, cols, valid_cols, int(transpose), int(hadamard))  # both passes
    _call("nvfp4_amax", *src, _ptr(amax), st)
    _call(
        "nvfp4_quantize",
        *src,
        int(block_2d),
        1 if rounding == "stochastic" else 0,
        k2,
        k3,
        _ptr(amax),
        _ptr(codes),
        _ptr(scales),
        _ptr(ts),
        _ptr(values),
        st,
    )
    if decoded:
        assert values is not None
        return values, ts
    assert codes is not None and scales is not None
    return NVFP4Tensor(codes=codes, block_scales=scales, tensor_scale=ts, shape=(rows, cols), block_2d=block_2d)


@_names_out_of_memory
def quantize_decoded(
    x: torch.Tensor,
    *,
    block_2d: bool = False,
    rounding: str = "rne",
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
    hadamard: bool = False,
    transpose: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(decode_scaled(q), q.tensor_scale)`` of ``q = quantize_nvfp4(x, ...)`` in one pass, without the codes."""
    out = _quantize_float(x, "quantize_decoded", block_2d, rounding, seed, step, tensor_id, hadamard, transpose, True)
    assert isinstance(out, tuple)
    return out


@_names_out_of_memory
def quantize_nvfp4_from_mxfp8(
    payload: torch.Tensor,
    scales: torch.Tensor,
    *,
    block_2d: bool = True,
    rounding: str = "rne",
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
    hadamard: bool = False,
    transpose: bool = False,
    decoded: bool = False,
) -> NVFP4Tensor | tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 straight from an MXFP8 master on the GPU (decoded in registers, never materialised).

    ``decoded=True`` returns ``(decode_scaled(q), q.tensor_scale)`` instead of ``q``, in the same pass.
    """
    if payload.dim() != 2 or payload.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError("quantize_nvfp4_from_mxfp8: expected a 2-D uint8 payload and uint8 scales")
    rows, cols = (payload.shape[1], payload.shape[0]) if transpose else tuple(payload.shape)
    if cols % NVFP4_BLOCK:
        raise ValueError(f"quantize_nvfp4_from_mxfp8: quantized axis has {cols} elements, not a multiple of 16")
    if tuple(scales.shape) != (payload.shape[0], -(-payload.shape[1] // BLOCK_SIZE)):
        raise ValueError(f"quantize_nvfp4_from_mxfp8: scales shape {list(scales.shape)} does not match payload")
    return _quantize(
        payload.contiguous(),
        2,
        scales.contiguous(),
        rows,
        cols,
        transpose,
        block_2d,
        rounding,
        seed,
        step,
        tensor_id,
        hadamard,
        decoded=decoded,
    )


@_names_out_of_memory
def dequantize_nvfp4(q: NVFP4Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """CUDA dequantize (float32 math, one cast)."""
    out_dt = dtype if dtype in DTYPE_CODES else torch.float32
    out = torch.empty(q.shape, dtype=out_dt, device=q.device)
    _call(
        "nvfp4_dequantize",
        _ptr(q.codes.contiguous()),
        _ptr(q.block_scales.contiguous()),
        _ptr(q.tensor_scale),
        q.shape[0],
        q.shape[1],
        _ptr(out),
        DTYPE_CODES[out_dt],
        _stream(out),
    )
    return out.to(dtype)


@_names_out_of_memory
def hadamard16(x: torch.Tensor) -> torch.Tensor:
    """CUDA Hadamard transform along the last axis (float32 out)."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"hadamard16: last dimension {x.shape[-1]} is not a multiple of {NVFP4_BLOCK}")
    xc, dt = _float_input(x.reshape(-1, x.shape[-1]))
    out = torch.empty(xc.shape, dtype=torch.float32, device=x.device)
    _call("nvfp4_hadamard16", _ptr(xc), dt, xc.shape[0], xc.shape[1], _ptr(out), _stream(out))
    return out.reshape(x.shape)


@_names_out_of_memory
def decode_scaled(q: NVFP4Tensor) -> torch.Tensor:
    """BF16 ``e2m1 * e4m3(block scale)`` of ``q`` without the tensor scale: exact (at most 6 significant bits).

    One bandwidth-bound kernel (``nvfp4_decode_bf16``); the emulated GEMM's operand.
    """
    codes, scales = _aligned(q.codes, 8), q.block_scales.contiguous()
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=codes.device)
    _call("nvfp4_decode_bf16", _ptr(codes), _ptr(scales), q.shape[0], q.shape[1], _ptr(out), _stream(out))
    return out


def _operand(t: torch.Tensor, what: str) -> tuple[torch.Tensor, int]:
    """A BF16 GEMM operand [rows, K] as (storage tensor, trans): row-major (0) or the ``.t()`` of one (1)."""
    if t.dtype != torch.bfloat16 or t.dim() != 2 or not t.is_cuda:
        raise ValueError(
            f"gemm_decoded: {what} must be a 2-D bfloat16 CUDA tensor, got {t.dtype} {list(t.shape)} on {t.device}"
        )
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t, 0
    if t.t().is_contiguous() and t.data_ptr() % 16 == 0:
        return t.t(), 1
    return _aligned(t, 16), 0


@_names_out_of_memory
def gemm_decoded(
    da: torch.Tensor,
    db: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """``(da @ db.T) * (a_scale * b_scale)`` with cuBLASLt: BF16 operands, FP32 accumulation, alpha on the device.

    ``da`` [M, K] and ``db`` [N, K] are decoded operands (:func:`decode_scaled`), each row-major or the
    transpose view of a row-major tensor (no copy then: a decoded weight [in, out] serves as ``W`` and,
    through ``.t()``, as ``W^T``).  With ``accumulate`` the product is computed in float32 and added to
    ``out`` in float32, then cast once (the reference's order).
    """
    for name, t in (("db", db), ("a_scale", a_scale), ("b_scale", b_scale)):
        if t.device != da.device:
            raise ValueError(f"gemm_decoded: {name} is on {t.device}, da on {da.device}")
    (a, at), (b, bt) = _operand(da, "da"), _operand(db, "db")
    m, k = da.shape
    n = db.shape[0]
    if db.shape[1] != k:
        raise ValueError(f"gemm_decoded: contraction mismatch, da is {list(da.shape)} and db is {list(db.shape)}")
    if accumulate and out is None:
        raise ValueError("gemm_decoded: accumulate=True needs out=")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype not in DTYPE_CODES):
        raise ValueError(
            f"gemm_decoded: out must be a float32/bfloat16 [{m}, {n}] tensor, got {out.dtype} {list(out.shape)}"
        )
    direct = out is not None and not accumulate and out.is_contiguous()
    res_dtype = torch.float32 if accumulate else (out.dtype if out is not None else out_dtype)
    res = out if direct else torch.empty(m, n, dtype=res_dtype, device=da.device)
    st = _stream(res)
    ws, ab = _scratch(res.device, st)
    ts_a, ts_b = a_scale.to(torch.float32).reshape(()), b_scale.to(torch.float32).reshape(())
    _call(
        "nvfp4_gemm_bf16",
        _ptr(a),
        at,
        _ptr(b),
        bt,
        _ptr(ts_a),
        _ptr(ts_b),
        _ptr(ab),
        m,
        n,
        k,
        _ptr(res),
        DTYPE_CODES[res_dtype],
        _ptr(ws),
        ws.numel(),
        st,
    )
    if direct or out is None:
        return res
    if accumulate:
        res = res + out.to(torch.float32)
    out.copy_(res.to(out.dtype))
    return out


@_names_out_of_memory
def nvfp4_matmul(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """CUDA GEMM: ``emulated`` (exact BF16 decode + cuBLASLt) or ``native`` (sm_120a FP4 MMA); ``auto`` picks."""
    check_gemm_operands(a, b)
    if accumulate and out is None:
        raise ValueError("nvfp4_matmul: accumulate=True needs out=")
    if backend == "auto":
        backend = "native" if torch.cuda.get_device_capability(a.device)[0] == 12 else "emulated"
    if backend == "emulated":
        return gemm_decoded(
            decode_scaled(a),
            decode_scaled(b),
            a.tensor_scale,
            b.tensor_scale,
            out_dtype=out_dtype,
            out=out,
            accumulate=accumulate,
        )
    m, k = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    elif tuple(out.shape) != (m, n) or out.dtype not in DTYPE_CODES or not out.is_contiguous():
        raise ValueError(f"nvfp4_matmul: out must be a contiguous float32/bfloat16 [{m}, {n}] tensor")
    ac, bc = _aligned(a.codes, 8), _aligned(b.codes, 8)
    asf, bsf = a.block_scales.contiguous(), b.block_scales.contiguous()
    _call(
        "nvfp4_gemm_native",
        _ptr(ac),
        _ptr(asf),
        _ptr(a.tensor_scale),
        _ptr(bc),
        _ptr(bsf),
        _ptr(b.tensor_scale),
        m,
        n,
        k,
        _ptr(out),
        DTYPE_CODES[out.dtype],
        int(accumulate),
        _stream(out),
    )
    return out


@_names_out_of_memory
def encode_mxfp8_cuda(
    x: torch.Tensor, *, rounding: str = "rne", seed: int = 0, step: int = 0, tensor_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA kernel of :func:`mxfp8_codec.encode_mxfp8` (same bits as its torch path, RNE and stochastic)."""
    if rounding not in ("rne", "stochastic"):
        raise ValueError(f"encode_mxfp8_cuda: rounding must be 'rne' or 'stochastic', got {rounding!r}")
    if x.dim() < 1 or not x.is_floating_point():
        raise ValueError("encode_mxfp8_cuda: expected a floating tensor of rank >= 1")
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        idx = (~finite).nonzero()[0].tolist()
        raise ValueError(f"encode_mxfp8_cuda: non-finite value at index {idx}")
    c = x.shape[-1]
    xc, dt = _float_input(x.reshape(-1, c))
    payload = torch.empty(xc.shape, dtype=torch.uint8, device=x.device)
    scales = torch.empty(xc.shape[0], -(-c // BLOCK_SIZE), dtype=torch.uint8, device=x.device)
    k2, k3 = stream_keys(seed, step, tensor_id)
    _call(
        "nvfp4_mxfp8_encode",
        _ptr(xc),
        dt,
        xc.shape[0],
        c,
        1 if rounding == "stochastic" else 0,
        k2,
        k3,
        _ptr(payload),
        _ptr(scales),
        _stream(xc),
    )
    return payload.reshape(x.shape), scales.reshape(*x.shape[:-1], -1)


@_names_out_of_memory
def decode_mxfp8_cuda(
    payload: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """CUDA kernel of :func:`mxfp8_codec.decode_mxfp8` (exact float32, then cast)."""
    c = payload.shape[-1]
    if tuple(scales.shape) != (*payload.shape[:-1], -(-c // BLOCK_SIZE)):
        raise ValueError(
            f"decode_mxfp8_cuda: scales shape {list(scales.shape)} does not match payload {list(payload.shape)}"
        )
    out_dt = dtype if dtype in DTYPE_CODES else torch.float32
    p2 = payload.reshape(-1, c).contiguous()
    out = torch.empty(p2.shape, dtype=out_dt, device=payload.device)
    _call(
        "nvfp4_mxfp8_decode",
        _ptr(p2),
        _ptr(scales.contiguous()),
        p2.shape[0],
        c,
        _ptr(out),
        DTYPE_CODES[out_dt],
        _stream(out),
    )
    return out.reshape(payload.shape).to(dtype)


@_names_out_of_memory
def lion_step_mxfp8_(
    payload: torch.Tensor,
    scales: torch.Tensor,
    grad: torch.Tensor,
    momentum: torch.Tensor,
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.99,
    weight_decay: float = 0.0,
    writeback: str = "stochastic",
    compensation: torch.Tensor | None = None,
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
) -> None:
    """Fused CUDA Lion step, in place (payload, scales, momentum, compensation must be contiguous)."""
    if writeback not in WRITEBACK_MODES:
        raise ValueError(f"lion_step_mxfp8_: writeback must be one of {WRITEBACK_MODES}, got {writeback!r}")
    for name, t in (("payload", payload), ("scales", scales), ("momentum", momentum)):
        _need_cuda(t, "lion_step_mxfp8_", name)
        if not t.is_contiguous():
            raise ValueError(f"lion_step_mxfp8_: {name} must be contiguous (it is updated in place)")
    if momentum.dtype != torch.bfloat16 or tuple(momentum.shape) != tuple(payload.shape):
        raise ValueError("lion_step_mxfp8_: momentum must be bfloat16 with payload's shape")
    if tuple(grad.shape) != tuple(payload.shape):
        raise ValueError(f"lion_step_mxfp8_: grad has shape {list(grad.shape)}, expected {list(payload.shape)}")
    if writeback == "compensated" and (
        compensation is None or compensation.dtype != torch.float32 or not compensation.is_contiguous()
    ):
        raise ValueError("lion_step_mxfp8_: writeback='compensated' needs a contiguous float32 compensation=")
    c = payload.shape[-1]
    g, gdt = _float_input(grad)
    k2, k3 = stream_keys(seed, step, tensor_id)
    _call(
        "nvfp4_lion_step_mxfp8",
        _ptr(payload),
        _ptr(scales),
        _ptr(g),
        gdt,
        _ptr(momentum),
        _ptr(compensation if writeback == "compensated" else None),
        payload.numel() // max(c, 1),
        c,
        f32_const(-lr),
        f32_const(1.0 - lr * weight_decay),
        f32_const(beta1),
        f32_const(1.0 - beta1),
        f32_const(beta2),
        f32_const(1.0 - beta2),
        WRITEBACK_CODES[writeback],
        k2,
        k3,
        _stream(payload),
    )


@_names_out_of_memory
def lion_step_bf16_(
    param: torch.Tensor,
    grad: torch.Tensor,
    momentum: torch.Tensor,
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.99,
    weight_decay: float = 0.0,
    writeback: str = "stochastic",
    seed: int = 0,
    step: int = 0,
    tensor_id: int = 0,
) -> None:
    """Fused CUDA Lion step on a BF16 parameter, in place (same bits as ``reference_master.lion_step_bf16_``)."""
    check_lion_bf16_args(param, grad, momentum, writeback)
    for name, t in (("param", param), ("grad", grad), ("momentum", momentum)):
        _need_cuda(t, "lion_step_bf16_", name)
    for name, t in (("param", param), ("momentum", momentum)):
        if not t.is_contiguous():
            raise ValueError(f"lion_step_bf16_: {name} must be contiguous (it is updated in place)")
    g, gdt = _float_input(grad)
    k2, k3 = stream_keys(seed, step, tensor_id)
    _call(
        "nvfp4_lion_step_bf16",
        _ptr(param),
        _ptr(g),
        gdt,
        _ptr(momentum),
        param.numel(),
        f32_const(lr),
        f32_const(1.0 - lr * weight_decay),
        f32_const(beta1),
        f32_const(1.0 - beta1),
        f32_const(beta2),
        f32_const(1.0 - beta2),
        WRITEBACK_CODES[writeback],
        k2,
        k3,
        _stream(param),
    )


@_names_out_of_memory
def stochastic_round_to_bf16_(
    dst_bf16: torch.Tensor, src_fp32: torch.Tensor, *, seed: int, step: int, tensor_id: int
) -> torch.Tensor:
    """CUDA float32 -> bfloat16 stochastic rounding into ``dst_bf16``."""
    if dst_bf16.dtype != torch.bfloat16 or tuple(dst_bf16.shape) != tuple(src_fp32.shape):
        raise ValueError("stochastic_round_to_bf16_: dst must be bfloat16 with src's shape")
    src = src_fp32.to(torch.float32).contiguous()
    dst = dst_bf16 if dst_bf16.is_contiguous() else torch.empty_like(dst_bf16, memory_format=torch.contiguous_format)
    k2, k3 = stream_keys(seed, step, tensor_id)
    _call("nvfp4_sr_bf16", _ptr(dst), _ptr(src), src.numel(), k2, k3, _stream(src))
    if dst is not dst_bf16:
        dst_bf16.copy_(dst)
    return dst_bf16


def device_query() -> dict[str, int]:
    """``nvfp4_query`` through the library: device count and compute capability (raises without a driver)."""
    ffi, lib = load_library()
    out = [ffi.new("int *") for _ in range(4)]
    check(lib.nvfp4_query(*out), "nvfp4_query", lib, ffi)
    return {"device_count": out[0][0], "cc_major": out[1][0], "cc_minor": out[2][0], "native_fp4_compiled": out[3][0]}
