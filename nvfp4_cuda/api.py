"""Public entry points: CPU tensors go to the PyTorch reference, CUDA tensors to the cffi library.

Both backends implement the same semantics bit for bit (see :mod:`nvfp4_cuda.reference`, the oracle),
so callers never branch on the device.  CPU tensors use the native C fast path of quantize / decode
(:mod:`nvfp4_cuda.cpu_native`, same bits, ``NVFP4_CPU_NATIVE=0`` disables it) when a C compiler is
available, the pure-PyTorch reference otherwise.  Backend selection for CUDA tensors:

* ``NVFP4_CUDA_BACKEND=reference`` forces the pure-PyTorch reference on any device (slow, exact);
* otherwise the shared library is built/loaded lazily (:mod:`nvfp4_cuda.build`) and the GEMM uses
  ``native-sm120a`` on compute capability 12.x and ``emulated-cuda`` elsewhere: each operand decoded
  exactly to BF16 by one bandwidth-bound kernel (:func:`decode_scaled`), then cuBLASLt's BF16 GEMM with
  FP32 accumulation and the two tensor scales as its alpha (:func:`gemm_decoded`);
  ``nvfp4_matmul(..., backend="emulated")`` forces the emulation (to cross-check the two).
"""

from __future__ import annotations

import ctypes
import math
import os
from typing import Any

import torch

from mxfp8_codec import decode_mxfp8
from nvfp4_cuda import cpu_native, reference, reference_master
from nvfp4_cuda.tensor import NVFP4Tensor

BACKEND_ENV = "NVFP4_CUDA_BACKEND"  # "reference" forces the PyTorch path for CUDA tensors
GEMM_BACKENDS = ("auto", "native", "emulated", "reference")


def _use_cuda(t: torch.Tensor) -> bool:
    return t.is_cuda and os.environ.get(BACKEND_ENV, "").lower() != "reference"


def _cuda():  # the cffi-backed ops, imported only when a CUDA tensor shows up
    from nvfp4_cuda import cuda_ops

    return cuda_ops


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
    """Quantize x [R, C] to NVFP4 (see :func:`nvfp4_cuda.reference.quantize_nvfp4` for the exact rules).

    ``transpose=True`` quantizes ``x.T`` [C, R'] with R zero-padded to a multiple of 16
    (:func:`nvfp4_cuda.reference.transpose_padded`): a weight-gradient operand, blocks along the tokens.  On
    CUDA the kernel reads ``x`` in place; no transposed copy is made.

    Example:
        >>> import torch, nvfp4_cuda
        >>> q = nvfp4_cuda.quantize_nvfp4(torch.randn(16, 64), block_2d=True)
        >>> q.codes.shape, q.block_scales.shape
        (torch.Size([16, 32]), torch.Size([16, 4]))
    """
    kw: dict[str, Any] = {
        "block_2d": block_2d,
        "rounding": rounding,
        "seed": seed,
        "step": step,
        "tensor_id": tensor_id,
    }
    if _use_cuda(x):
        return _cuda().quantize_nvfp4(x, hadamard=hadamard, transpose=transpose, **kw)
    if x.device.type == "cpu" and cpu_native.available():
        reference.check_matrix(x, "quantize_nvfp4", transpose=transpose)
        reference.check_rounding(rounding, "quantize_nvfp4")
        if transpose:
            x = reference.transpose_padded(x)
        x32 = cpu_native.hadamard16(x) if hadamard else x.to(torch.float32).contiguous()
        return cpu_native.quantize_nvfp4(x32, **kw)
    return reference.quantize_nvfp4(x, hadamard=hadamard, transpose=transpose, **kw)


def dequantize_nvfp4(q: NVFP4Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode an NVFP4Tensor to ``dtype`` (float32 math, one final cast)."""
    if _use_cuda(q.codes):
        return _cuda().dequantize_nvfp4(q, dtype=dtype)
    if q.codes.device.type == "cpu" and cpu_native.available():
        return (cpu_native.decode_scaled(q) * q.tensor_scale).to(dtype)
    return reference.dequantize_nvfp4(q, dtype=dtype)


def nvfp4_matmul(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """``C[M, N] = A[M, K] @ B[N, K]^T``, FP32 accumulation, ``alpha = S_dec_a * S_dec_b`` in the epilogue.

    Args:
        a, b: NVFP4 operands [M, K] and [N, K] on the same device.
        out_dtype: bfloat16 or float32 (when ``out`` is None).
        out: optional preallocated [M, N] output (contiguous); with ``accumulate`` its values are added.
        backend: ``"auto"``, ``"native"`` (sm_120a tensor cores), ``"emulated"`` (exact BF16 decode + cuBLASLt)
            or ``"reference"`` (PyTorch). CPU tensors always use the reference.

    Example:
        >>> import torch, nvfp4_cuda
        >>> a = nvfp4_cuda.quantize_nvfp4(torch.randn(4, 32))
        >>> b = nvfp4_cuda.quantize_nvfp4(torch.randn(8, 32), block_2d=True)
        >>> nvfp4_cuda.nvfp4_matmul(a, b).shape
        torch.Size([4, 8])
    """
    if backend not in GEMM_BACKENDS:
        raise ValueError(f"nvfp4_matmul: backend must be one of {GEMM_BACKENDS}, got {backend!r}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"nvfp4_matmul: out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if a.codes.device != b.codes.device:
        raise ValueError(f"nvfp4_matmul: operands on different devices ({a.codes.device} vs {b.codes.device})")
    if backend != "reference" and _use_cuda(a.codes):
        return _cuda().nvfp4_matmul(a, b, out_dtype=out_dtype, out=out, accumulate=accumulate, backend=backend)
    if backend != "reference" and a.codes.device.type == "cpu" and cpu_native.available():
        reference.check_gemm_operands(a, b)
        if accumulate and out is None:
            raise ValueError("nvfp4_matmul: accumulate=True needs out=")
        if out is not None and tuple(out.shape) != (a.shape[0], b.shape[0]):
            raise ValueError(f"nvfp4_matmul: out has shape {list(out.shape)}, expected {[a.shape[0], b.shape[0]]}")
        return reference.gemm_decoded(
            cpu_native.decode_scaled(a),
            cpu_native.decode_scaled(b),
            a.tensor_scale,
            b.tensor_scale,
            out_dtype=out_dtype,
            out=out,
            accumulate=accumulate,
        )
    return reference.nvfp4_matmul(a, b, out_dtype=out_dtype, out=out, accumulate=accumulate)


def native_gemm(device: torch.device) -> bool:
    """True where :func:`nvfp4_matmul` multiplies NVFP4 codes directly (sm_120a FP4 MMA: compute capability 12.x).

    Everywhere else the GEMM is the emulation ``gemm_decoded(decode_scaled(a), decode_scaled(b), ...)``,
    and a caller that multiplies one operand several times (a weight in forward and backward) can decode it
    once and reuse it.
    """
    if device.type != "cuda" or os.environ.get(BACKEND_ENV, "").lower() == "reference":
        return False
    return torch.cuda.get_device_capability(device)[0] == 12


def decode_scaled(q: NVFP4Tensor) -> torch.Tensor:
    """The exact values ``e2m1 * e4m3(block scale)`` of ``q``, without its tensor scale: the emulated GEMM's operand.

    Every such product has at most 6 significant bits, so it is exact in BF16 (CUDA: one bandwidth-bound
    kernel, the dtype cuBLAS multiplies) and in float32 (CPU: the dtype of the reference GEMM).

    Example:
        >>> import torch, nvfp4_cuda
        >>> q = nvfp4_cuda.quantize_nvfp4(torch.tensor([[0.0, 1.0, -2.0, 3.0] * 4]))
        >>> bool(torch.equal(nvfp4_cuda.decode_scaled(q) * q.tensor_scale, nvfp4_cuda.dequantize_nvfp4(q)))
        True
    """
    if _use_cuda(q.codes):
        return _cuda().decode_scaled(q)
    if q.codes.device.type == "cpu" and cpu_native.available():
        return cpu_native.decode_scaled(q)
    return reference.decode_scaled(q)


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
    """``(decode_scaled(q), q.tensor_scale)`` for ``q = quantize_nvfp4(x, ...)``: an emulated-GEMM operand.

    The same bits as the two calls; on CUDA one pass that writes the BF16 values and never the codes
    (an activation or gradient operand whose codes nobody reads).  Arguments as :func:`quantize_nvfp4`.

    Example:
        >>> import torch, nvfp4_cuda
        >>> x = torch.randn(4, 32)
        >>> v, s = nvfp4_cuda.quantize_decoded(x)
        >>> q = nvfp4_cuda.quantize_nvfp4(x)
        >>> bool(torch.equal(v, nvfp4_cuda.decode_scaled(q))), bool(torch.equal(s, q.tensor_scale))
        (True, True)
    """
    kw: dict[str, Any] = {
        "block_2d": block_2d,
        "rounding": rounding,
        "seed": seed,
        "step": step,
        "tensor_id": tensor_id,
        "hadamard": hadamard,
        "transpose": transpose,
    }
    if _use_cuda(x):
        return _cuda().quantize_decoded(x, **kw)
    q = quantize_nvfp4(x, **kw)
    return decode_scaled(q), q.tensor_scale


def quantize_decoded_from_mxfp8(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(decode_scaled(q), q.tensor_scale)`` for ``q = quantize_nvfp4_from_mxfp8(...)``, one pass on CUDA."""
    kw: dict[str, Any] = {
        "block_2d": block_2d,
        "rounding": rounding,
        "seed": seed,
        "step": step,
        "tensor_id": tensor_id,
        "hadamard": hadamard,
        "transpose": transpose,
    }
    if _use_cuda(payload):
        out = _cuda().quantize_nvfp4_from_mxfp8(payload, scales, decoded=True, **kw)
        assert isinstance(out, tuple)
        return out
    q = quantize_nvfp4_from_mxfp8(payload, scales, **kw)
    return decode_scaled(q), q.tensor_scale


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
    """``(da @ db.T) * (a_scale * b_scale)``, FP32 accumulation: :func:`nvfp4_matmul` on decoded operands.

    Args:
        da, db: :func:`decode_scaled` operands [M, K] and [N, K]; on CUDA either may be the ``.t()`` view of
            a row-major tensor (cuBLASLt reads it transposed, no copy).
        a_scale, b_scale: the operands' float32 tensor scales (0-d tensors on the operands' device).
        out_dtype, out, accumulate: as :func:`nvfp4_matmul`.

    Example:
        >>> import torch, nvfp4_cuda
        >>> a = nvfp4_cuda.quantize_nvfp4(torch.randn(4, 32))
        >>> w = nvfp4_cuda.quantize_nvfp4(torch.randn(32, 16), block_2d=True)  # [K, N], e.g. a weight [in, out]
        >>> y = nvfp4_cuda.gemm_decoded(nvfp4_cuda.decode_scaled(a), nvfp4_cuda.decode_scaled(w).t(),
        ...                             a.tensor_scale, w.tensor_scale)
        >>> bool(torch.equal(y, nvfp4_cuda.nvfp4_matmul(a, w.t())))
        True
    """
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"gemm_decoded: out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if _use_cuda(da):
        return _cuda().gemm_decoded(da, db, a_scale, b_scale, out_dtype=out_dtype, out=out, accumulate=accumulate)
    if accumulate and out is None:
        raise ValueError("gemm_decoded: accumulate=True needs out=")
    if out is not None and tuple(out.shape) != (da.shape[0], db.shape[0]):
        raise ValueError(f"gemm_decoded: out has shape {list(out.shape)}, expected {[da.shape[0], db.shape[0]]}")
    return reference.gemm_decoded(da, db, a_scale, b_scale, out_dtype=out_dtype, out=out, accumulate=accumulate)


def hadamard16(x: torch.Tensor) -> torch.Tensor:
    """16-point random Hadamard transform along the last axis (TE's fixed sign vector), float32 out."""
    if _use_cuda(x):
        return _cuda().hadamard16(x)
    if x.device.type == "cpu" and cpu_native.available():
        return cpu_native.hadamard16(x)
    return reference.hadamard16(x)


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
) -> NVFP4Tensor:
    """NVFP4 of an MXFP8 master (``transpose=True``: of its transpose, e.g. [in, out] master -> W [out, in])."""
    kw: dict[str, Any] = {
        "block_2d": block_2d,
        "rounding": rounding,
        "seed": seed,
        "step": step,
        "tensor_id": tensor_id,
        "hadamard": hadamard,
        "transpose": transpose,
    }
    if _use_cuda(payload):
        return _cuda().quantize_nvfp4_from_mxfp8(payload, scales, **kw)
    if payload.device.type == "cpu" and cpu_native.available():
        if payload.dim() != 2:
            raise ValueError(f"quantize_nvfp4_from_mxfp8: expected a 2-D payload, got shape {list(payload.shape)}")
        w = decode_mxfp8(payload, scales, dtype=torch.float32, transpose=transpose)
        return quantize_nvfp4(
            w, block_2d=block_2d, rounding=rounding, seed=seed, step=step, tensor_id=tensor_id, hadamard=hadamard
        )
    return reference.quantize_nvfp4_from_mxfp8(payload, scales, **kw)


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
    """Fused Lion step on an MXFP8 master, in place (see :mod:`nvfp4_cuda.reference_master`).

    Example:
        >>> import torch, nvfp4_cuda
        >>> from mxfp8_codec import encode_mxfp8
        >>> p, s = encode_mxfp8(torch.full((1, 32), 0.02))
        >>> m = torch.zeros(1, 32, dtype=torch.bfloat16)
        >>> nvfp4_cuda.lion_step_mxfp8_(p, s, torch.ones(1, 32), m, lr=1e-5, step=1)
    """
    kw: dict[str, Any] = {
        "lr": lr,
        "beta1": beta1,
        "beta2": beta2,
        "weight_decay": weight_decay,
        "writeback": writeback,
        "compensation": compensation,
        "seed": seed,
        "step": step,
        "tensor_id": tensor_id,
    }
    if _use_cuda(payload):
        return _cuda().lion_step_mxfp8_(payload, scales, grad, momentum, **kw)
    in_place = (payload, scales, momentum) + ((compensation,) if compensation is not None else ())
    if payload.device.type == "cpu" and cpu_native.available() and all(t.is_contiguous() for t in in_place):
        reference_master.check_lion_args(payload, scales, grad, momentum, writeback, compensation)
        consts = reference_master.lion_constants(lr, beta1, beta2, weight_decay)
        if not all(math.isfinite(v) for v in consts):
            raise ValueError(
                f"lion_step_mxfp8_ (tensor_id {tensor_id}): non-finite hyper-parameter "
                f"(lr={lr}, weight_decay={weight_decay}); nothing was updated"
            )
        bad = cpu_native.lion_step_mxfp8_(
            payload,
            scales,
            grad,
            momentum,
            consts=consts,
            writeback_code=reference_master.WRITEBACK_MODES.index(writeback),
            compensation=compensation if writeback == "compensated" else None,
            seed=seed,
            step=step,
            tensor_id=tensor_id,
        )
        if bad <= -2:
            raise ValueError(
                f"lion_step_mxfp8_ (tensor_id {tensor_id}): non-finite gradient at flat index "
                f"{-2 - bad}; nothing was updated"
            )
        if bad >= 0:
            raise ValueError(
                f"lion_step_mxfp8_ (tensor_id {tensor_id}): non-finite updated weight in the block "
                f"starting at flat index {bad} (corrupt master or compensation buffer)"
            )
        return None
    return reference.lion_step_mxfp8_(payload, scales, grad, momentum, **kw)


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
    """Lion step on a plain BF16 parameter, in place (see :func:`nvfp4_cuda.reference_master.lion_step_bf16_`).

    CUDA: one fused kernel (no float32 copies of the parameter); CPU: PyTorch with the C stochastic
    rounding.  Same bits on both.

    Example:
        >>> import torch, nvfp4_cuda
        >>> p = torch.full((4,), 0.5, dtype=torch.bfloat16)
        >>> m = torch.zeros(4, dtype=torch.bfloat16)
        >>> nvfp4_cuda.lion_step_bf16_(p, torch.ones(4), m, lr=0.25, writeback="rne")
        >>> p.tolist()
        [0.25, 0.25, 0.25, 0.25]
    """
    kw: dict[str, Any] = {
        "lr": lr,
        "beta1": beta1,
        "beta2": beta2,
        "weight_decay": weight_decay,
        "writeback": writeback,
        "seed": seed,
        "step": step,
        "tensor_id": tensor_id,
    }
    if _use_cuda(param):
        return _cuda().lion_step_bf16_(param, grad, momentum, **kw)
    reference_master.lion_step_bf16_(param, grad, momentum, round_bf16=stochastic_round_to_bf16_, **kw)
    return None


def stochastic_round_to_bf16_(
    dst_bf16: torch.Tensor, src_fp32: torch.Tensor, *, seed: int, step: int, tensor_id: int
) -> torch.Tensor:
    """Unbiased float32 -> bfloat16 rounding into ``dst_bf16`` (for plain BF16 params under the nvfp4 recipe)."""
    if _use_cuda(src_fp32):
        return _cuda().stochastic_round_to_bf16_(dst_bf16, src_fp32, seed=seed, step=step, tensor_id=tensor_id)
    if src_fp32.device.type == "cpu" and cpu_native.available():
        if dst_bf16.dtype != torch.bfloat16 or tuple(dst_bf16.shape) != tuple(src_fp32.shape):
            raise ValueError(
                f"stochastic_round_to_bf16_: dst must be bfloat16 of shape {list(src_fp32.shape)}, got "
                f"{dst_bf16.dtype} {list(dst_bf16.shape)}"
            )
        dst_bf16.copy_(cpu_native.stochastic_round_to_bf16(src_fp32, seed=seed, step=step, tensor_id=tensor_id))
        return dst_bf16
    return reference.stochastic_round_to_bf16_(dst_bf16, src_fp32, seed=seed, step=step, tensor_id=tensor_id)


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version line, ``"present"`` when only its library is found, or None (no driver).

    Looks at ``/proc/driver/nvidia/version`` and tries to load ``libcuda.so.1`` (nothing is initialised).
    """
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip() or "present"
    except OSError:
        pass
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return "present"


def backend_info() -> dict[str, Any]:
    """The backend that actually runs here, the device, and the library path (nothing is compiled).

    ``backend`` is ``native-sm120a`` / ``emulated-cuda`` for CUDA tensors on a usable GPU, else the
    CPU path that runs: ``cpu-native`` (the C fast path, :mod:`nvfp4_cuda.cpu_native`) or
    ``cpu-reference`` (pure PyTorch: ``NVFP4_CPU_NATIVE=0``, no compiler, or a failed build).

    Example:
        >>> import nvfp4_cuda
        >>> nvfp4_cuda.backend_info()["backend"] in ("native-sm120a", "emulated-cuda", "cpu-native", "cpu-reference")
        True
    """
    native = cpu_native.available()
    cpu_backend = "cpu-native" if native else "cpu-reference"
    info: dict[str, Any] = {
        "backend": cpu_backend,
        "device": "cpu",
        "library": None,
        "reason": "",
        "cpu_native": native,
    }
    if os.environ.get(BACKEND_ENV, "").lower() == "reference":
        info["backend"] = "cpu-reference"
        info["reason"] = f"{BACKEND_ENV}=reference (every tensor runs through the PyTorch reference)"
        return info
    if not torch.cuda.is_available():
        driver = nvidia_driver()
        info["driver"] = driver or "no NVIDIA driver"
        why = "no NVIDIA driver (libcuda.so.1 not found)" if driver is None else "no CUDA device visible to torch"
        info["reason"] = f"{why}; CPU tensors use the {'native C path' if native else 'PyTorch reference'}"
        return info
    from nvfp4_cuda import build

    major, minor = torch.cuda.get_device_capability()
    info["device"] = f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
    try:
        info["library"] = str(build.library_path())
    except build.BuildError as e:  # no nvcc: CUDA tensors cannot run (NVFP4_CUDA_BACKEND=reference can)
        info["library"] = None
        info["reason"] = str(e)
        return info
    info["backend"] = "native-sm120a" if major == 12 else "emulated-cuda"
    info["reason"] = (
        "compute capability 12.x has FP4 mma.sync"
        if major == 12
        else "no FP4 tensor cores: exact BF16 decode + cuBLASLt BF16 GEMM (FP32 accumulation)"
    )
    return info
