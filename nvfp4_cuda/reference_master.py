"""Reference for the MXFP8 weight master: fused Lion step, BF16 stochastic rounding.

MXFP8 itself (format, RCEIL scale rule, RNE and stochastic rounding with the counter RNG, decode) is
``mxfp8_codec``'s: this module calls its pure-torch path (:func:`mxfp8_codec.encode_mxfp8_torch` /
:func:`mxfp8_codec.decode_mxfp8_torch`, the oracle for the C and CUDA kernels) and adds only what is
specific to training on an MXFP8 master. Quantizing the master to NVFP4 for a GEMM
(:func:`nvfp4_cuda.reference.quantize_nvfp4_from_mxfp8`) is NVFP4 quantization and lives beside it.

**Why the Lion step rounds stochastically.**  An E4M3 master has a spacing of 2**(floor(log2|w|)-3),
6.7-12.5 % of |w|.  A Lion update is exactly ``lr`` per element; at lr = 1e-5 and |w| = 0.02 that is
about 1 % of half a spacing, so round-to-nearest write-back returns the old value every step and the
weights never move (this froze the original engine's SFT runs).  Stochastic rounding moves a weight
by one full spacing with probability ``|delta| / spacing``, so the *expected* update is exactly the
intended one; ``"compensated"`` keeps RNE but carries the float32 residual ``target - stored`` to the
next step (Kahan-style), costing 4 bytes per parameter.  ``"rne"`` is kept to reproduce the failure.

Lion (Chen et al. 2023, decoupled weight decay as in lucidrains/lion-pytorch), float32, in this
exact operation order (the CUDA kernel uses the same, without FMA contraction)::

    c  = (beta1 * m) + ((1 - beta1) * g)
    w' = (w [+ comp]) * (1 - lr * wd)  +  (-lr * sign(c))        (+0.0 when c == 0)
    m' = bf16_rne( (beta2 * m) + ((1 - beta2) * g) )

where ``beta1``, ``1 - beta1``, ``beta2``, ``1 - beta2``, ``lr`` and ``1 - lr * wd`` are rounded once
to float32 on the host.  Then each 32-block of ``w'`` is re-encoded with a freshly computed scale.

``stochastic_round_to_bf16_`` rounds float32 to bfloat16 by adding 16 random bits to the 16 bits
that are dropped (round away from zero with probability equal to the dropped fraction), the
method of torchao's ``_fp32_to_bf16_sr`` and llm.c, with random bits from :mod:`mxfp8_codec.rng`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mxfp8_codec.numerics_numpy import scales_shape
from mxfp8_codec.numerics_torch import decode_mxfp8_torch, encode_mxfp8_torch, f32_bits
from mxfp8_codec.rng import rand16_like

WRITEBACK_MODES = ("stochastic", "rne", "compensated")  # Lion master write-back rounding


def f32_const(v: float) -> float:
    """Round a Python float to the nearest float32 (how host-side constants reach the kernels)."""
    return float(np.float32(v))


def _label(name: str | None) -> str:
    return f" (tensor {name!r})" if name else ""


def _check_finite(x32: torch.Tensor, what: str) -> None:
    finite = torch.isfinite(x32)
    if not bool(finite.all()):
        idx = tuple((~finite).nonzero()[0].tolist())
        raise ValueError(f"{what}: non-finite value {x32[idx].item()} at index {list(idx)}")


def _decode_f32(payload: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return decode_mxfp8_torch(payload, scales, dtype=torch.float32)


def _check_same_shape(t: torch.Tensor, shape: torch.Size, what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"lion_step_mxfp8_: {what} has shape {list(t.shape)}, expected {list(shape)}")


def check_lion_args(
    payload: torch.Tensor,
    scales: torch.Tensor,
    grad: torch.Tensor,
    momentum: torch.Tensor,
    writeback: str,
    compensation: torch.Tensor | None,
) -> None:
    """Validate the Lion step's arguments (shapes, dtypes, mode); raises ValueError naming the problem."""
    if writeback not in WRITEBACK_MODES:
        raise ValueError(f"lion_step_mxfp8_: writeback must be one of {WRITEBACK_MODES}, got {writeback!r}")
    if payload.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"lion_step_mxfp8_: payload and scales must be uint8, got {payload.dtype}, {scales.dtype}")
    shape = payload.shape
    _check_same_shape(scales, torch.Size(scales_shape(tuple(shape))), "scales")
    _check_same_shape(grad, shape, "grad")
    _check_same_shape(momentum, shape, "momentum")
    if momentum.dtype != torch.bfloat16:
        raise ValueError(f"lion_step_mxfp8_: momentum must be bfloat16, got {momentum.dtype}")
    if writeback == "compensated":
        if compensation is None:
            raise ValueError("lion_step_mxfp8_: writeback='compensated' needs a float32 compensation= buffer")
        _check_same_shape(compensation, shape, "compensation")
        if compensation.dtype != torch.float32:
            raise ValueError(f"lion_step_mxfp8_: compensation must be float32, got {compensation.dtype}")


def lion_constants(lr: float, beta1: float, beta2: float, weight_decay: float) -> tuple[float, ...]:
    """``(-lr, 1 - lr*wd, beta1, 1 - beta1, beta2, 1 - beta2)``, each rounded once to float32 (host side)."""
    return (
        f32_const(-lr),
        f32_const(1.0 - lr * weight_decay),
        f32_const(beta1),
        f32_const(1.0 - beta1),
        f32_const(beta2),
        f32_const(1.0 - beta2),
    )


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
    """One fused Lion step on an MXFP8 master, in place on payload, scales, momentum (and compensation).

    Args:
        payload: uint8 E4M3 master [..., C]; scales: uint8 UE8M0 [..., ceil(C/32)].
        grad: float gradient of payload's shape.  momentum: bfloat16, payload's shape.
        lr, beta1, beta2, weight_decay: Lion hyper-parameters (decoupled weight decay).
        writeback: ``"stochastic"`` (default, unbiased), ``"rne"`` (reproduces the frozen-master
            failure) or ``"compensated"`` (RNE + float32 residual in ``compensation``).
        compensation: float32 residual buffer of payload's shape (required for ``"compensated"``).
        seed, step, tensor_id: stochastic-rounding stream key.

    Example:
        >>> p, s = encode_mxfp8_torch(torch.full((2, 32), 0.02))
        >>> m = torch.zeros(2, 32, dtype=torch.bfloat16)
        >>> lion_step_mxfp8_(p, s, torch.ones(2, 32), m, lr=1e-3)
        >>> round(float(_decode_f32(p, s).mean()), 4) < 0.02
        True
    """
    check_lion_args(payload, scales, grad, momentum, writeback, compensation)
    w = _decode_f32(payload, scales)
    g = grad.to(torch.float32)
    m = momentum.to(torch.float32)
    neg_lr, decay, b1, omb1, b2, omb2 = lion_constants(lr, beta1, beta2, weight_decay)
    c = (m * b1) + (g * omb1)
    if writeback == "compensated":
        w = w + compensation
    # -lr * sign(c), with +0.0 (not -0.0) when c == 0, exactly as the kernel's select
    upd = torch.where(c > 0, neg_lr, torch.where(c < 0, -neg_lr, 0.0)).to(torch.float32)
    target = (w * decay) + upd
    _check_finite(target, f"lion_step_mxfp8_ (tensor_id {tensor_id}): updated weight")
    new_payload, new_scales = encode_mxfp8_torch(
        target, rounding="stochastic" if writeback == "stochastic" else "rne", seed=seed, step=step, tensor_id=tensor_id
    )
    if writeback == "compensated":
        assert compensation is not None
        compensation.copy_(target - _decode_f32(new_payload, new_scales))
    momentum.copy_(((m * b2) + (g * omb2)).to(torch.bfloat16))
    payload.copy_(new_payload)
    scales.copy_(new_scales)


def check_lion_bf16_args(param: torch.Tensor, grad: torch.Tensor, momentum: torch.Tensor, writeback: str) -> None:
    """Validate :func:`lion_step_bf16_`'s arguments (mode, dtypes, shapes); raises ValueError naming the problem."""
    if writeback not in WRITEBACK_MODES:
        raise ValueError(f"lion_step_bf16_: writeback must be one of {WRITEBACK_MODES}, got {writeback!r}")
    if param.dtype != torch.bfloat16 or momentum.dtype != torch.bfloat16:
        raise ValueError(f"lion_step_bf16_: param and momentum must be bfloat16, got {param.dtype}, {momentum.dtype}")
    if tuple(grad.shape) != tuple(param.shape) or tuple(momentum.shape) != tuple(param.shape):
        raise ValueError(
            f"lion_step_bf16_: grad {list(grad.shape)} and momentum {list(momentum.shape)} must have "
            f"param's shape {list(param.shape)}"
        )


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
    round_bf16: Callable[..., torch.Tensor] | None = None,
) -> None:
    """One Lion step on a plain BF16 parameter (embeddings, norms, kept-BF16 layers), in place.

    Float32 math in the optimizer's order, each operation rounded once (the constants as float32)::

        c = b1*m + (1-b1)*g;   w' = w*(1 - lr*wd) - lr*sign(c);   m' = bf16_rne(b2*m + (1-b2)*g)

    then ``w'`` is written back as BF16 with RNE (``writeback="rne"``) or stochastic rounding (any other
    mode; ``round_bf16``, default :func:`stochastic_round_to_bf16_`, keyed by seed, step, tensor_id).
    ``sign`` is torch's: 0 for 0 and NaN.

    Example:
        >>> p = torch.full((4,), 0.5, dtype=torch.bfloat16)
        >>> m = torch.zeros(4, dtype=torch.bfloat16)
        >>> lion_step_bf16_(p, torch.ones(4), m, lr=0.25, writeback="rne")
        >>> p.tolist(), m.tolist()
        ([0.25, 0.25, 0.25, 0.25], [0.010009765625, 0.010009765625, 0.010009765625, 0.010009765625])
    """
    check_lion_bf16_args(param, grad, momentum, writeback)
    m = momentum.to(torch.float32)
    g = grad.to(torch.float32)
    c = m * beta1 + g * (1.0 - beta1)
    w = param.to(torch.float32) * (1.0 - lr * weight_decay) - lr * torch.sign(c)
    momentum.copy_(m * beta2 + g * (1.0 - beta2))
    if writeback == "rne":
        param.copy_(w)
    else:
        (round_bf16 or stochastic_round_to_bf16_)(param, w, seed=seed, step=step, tensor_id=tensor_id)


def stochastic_round_to_bf16_(
    dst_bf16: torch.Tensor, src_fp32: torch.Tensor, *, seed: int, step: int, tensor_id: int
) -> torch.Tensor:
    """Round float32 to bfloat16 stochastically (unbiased), writing into ``dst_bf16``; returns it.

    Example:
        >>> dst = torch.empty(3, dtype=torch.bfloat16)
        >>> stochastic_round_to_bf16_(dst, torch.tensor([1.0, -2.0, 0.5]), seed=0, step=0, tensor_id=0).tolist()
        [1.0, -2.0, 0.5]
    """
    if dst_bf16.dtype != torch.bfloat16:
        raise ValueError(f"stochastic_round_to_bf16_: dst must be bfloat16, got {dst_bf16.dtype}")
    if tuple(dst_bf16.shape) != tuple(src_fp32.shape):
        raise ValueError(
            f"stochastic_round_to_bf16_: shapes differ, dst {list(dst_bf16.shape)} src {list(src_fp32.shape)}"
        )
    src = src_fp32.to(torch.float32).contiguous()
    bits = f32_bits(src)
    r16 = rand16_like(tuple(src.shape), seed, step, tensor_id, device=src.device)
    finite = torch.isfinite(src)
    hi = torch.where(finite, (bits + r16) >> 16, (bits >> 16) | (torch.isnan(src).to(torch.int64) << 6))
    hi = hi & 0xFFFF
    hi = torch.where(hi >= 0x8000, hi - 0x10000, hi).to(torch.int16)
    dst_bf16.copy_(hi.view(torch.bfloat16))
    return dst_bf16
