"""Reference for the MXFP8 weight master: encode/decode, NVFP4-from-MXFP8, fused Lion step, BF16 SR.

MXFP8 (the ``mxfp8_codec`` format): E4M3 elements, one UE8M0 scale byte per 32 consecutive elements of
the last axis (a partial trailing block is allowed).  The scale rule is RCEIL, computed from the bits
of the float32 block amax: ``e = floor(log2 amax) - 8 + [mantissa(amax) > 1.75]`` clamped to
[-127, 127]; the byte is ``e + 127`` (a zero block gets byte 0 and zero codes, ``-0`` stays 0x80;
blocks with byte 247 saturate elements at 240 so that no finite value decodes to 2**128 = inf, the
codec's top-of-range rule).
Elements are ``x * 2**-e`` (an exact power-of-two scaling) rounded onto the E4M3 grid - RNE, which
is bit-identical to ``mxfp8_codec.encode_mxfp8``, or stochastic (unbiased) with the counter RNG.

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
method of torchao's ``_fp32_to_bf16_sr`` and llm.c, with random bits from :mod:`nvfp4_cuda.rng`.
"""

from __future__ import annotations

import numpy as np
import torch

from nvfp4_cuda.formats import (
    E4M3_MAX,
    E8M0_BIAS,
    MX_BLOCK,
    e4m3_decode,
    e4m3_encode,
    e8m0_decode,
    f32_bits,
    pow2_f32,
)
from nvfp4_cuda.rng import rand16_like, rand24_like
from nvfp4_cuda.tensor import NVFP4Tensor

WRITEBACK_MODES = ("stochastic", "rne", "compensated")  # Lion master write-back rounding
TOP_SCALE_EXPONENT = 120  # RCEIL exponent of blocks with amax >= 2**127 (scale byte 247)
TOP_CLAMP_VALUE = 240.0  # largest element magnitude in such blocks (256 * 2**120 would decode to inf)


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


def rceil_exponent(amax: torch.Tensor) -> torch.Tensor:
    """RCEIL block exponent (int64) of float32 block amax values, clamped to [-127, 127]."""
    bits = f32_bits(amax)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int64)
    return e.clamp(-127, 127)


def _expand_blocks(per_block: torch.Tensor, c: int) -> torch.Tensor:
    return per_block.repeat_interleave(MX_BLOCK, dim=-1)[..., :c]


def _encode_f32(x32: torch.Tensor, rand24: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode finite float32 [..., C] to (payload uint8 [..., C], scales uint8 [..., ceil(C/32)])."""
    c = x32.shape[-1]
    nb = -(-c // MX_BLOCK)
    a = x32.abs()
    pad = nb * MX_BLOCK - c
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))
    amax = a.reshape(*x32.shape[:-1], nb, MX_BLOCK).amax(dim=-1)
    e = torch.where(amax > 0, rceil_exponent(amax), torch.full_like(amax, -E8M0_BIAS, dtype=torch.int64))
    scaled = x32 * _expand_blocks(pow2_f32(-e), c)  # exact power-of-two scaling
    top = e == TOP_SCALE_EXPONENT
    if bool(top.any()):  # mxfp8_codec's top-of-range rule: never encode a finite weight as 2**128 (inf)
        lim = _expand_blocks(torch.where(top, TOP_CLAMP_VALUE, E4M3_MAX).to(torch.float32), c)
        scaled = torch.maximum(torch.minimum(scaled, lim), -lim)
    payload = e4m3_encode(scaled, rand24)
    return payload, (e + E8M0_BIAS).to(torch.uint8)


def mxfp8_encode(x: torch.Tensor, *, rounding: str = "rne", seed: int = 0, step: int = 0, tensor_id: int = 0,
                 name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode a float tensor (rank >= 1) to MXFP8 with the RCEIL scale rule.

    Args:
        x: float32/bfloat16/float16 tensor [..., C], finite.
        rounding: ``"rne"`` (bit-identical to ``mxfp8_codec.encode_mxfp8``) or ``"stochastic"``.
        seed, step, tensor_id: stochastic-rounding stream key (flat element index is the counter).
        name: used only in error messages.

    Returns:
        ``(payload, scales)``: uint8 E4M3 bits of x's shape and uint8 UE8M0 bytes [..., ceil(C/32)].

    Example:
        >>> p, s = mxfp8_encode(torch.tensor([1.0, -0.5, 448.0]))
        >>> mxfp8_decode(p, s).tolist()
        [1.0, -0.5, 448.0]
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ValueError(f"mxfp8_encode{_label(name)}: expected a floating torch tensor of rank >= 1")
    if rounding not in ("rne", "stochastic"):
        raise ValueError(f"mxfp8_encode{_label(name)}: rounding must be 'rne' or 'stochastic', got {rounding!r}")
    x32 = x.to(torch.float32).contiguous()
    _check_finite(x32, f"mxfp8_encode{_label(name)}")
    rand = rand24_like(tuple(x32.shape), seed, step, tensor_id, device=x.device) if rounding == "stochastic" else None
    return _encode_f32(x32, rand)


def mxfp8_decode(payload: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode MXFP8 ``e4m3(q) * 2**(s - 127)`` exactly in float32 (NaN codes / scale 0xFF give NaN), then cast."""
    c = payload.shape[-1]
    nb = -(-c // MX_BLOCK)
    if payload.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"mxfp8_decode: payload and scales must be uint8, got {payload.dtype} and {scales.dtype}")
    if tuple(scales.shape) != (*payload.shape[:-1], nb):
        raise ValueError(f"mxfp8_decode: scales shape {list(scales.shape)} does not match payload "
                         f"{list(payload.shape)} (expected {[*payload.shape[:-1], nb]})")
    v = e4m3_decode(payload) * _expand_blocks(e8m0_decode(scales), c)
    return v.to(dtype)


def quantize_nvfp4_from_mxfp8(payload: torch.Tensor, scales: torch.Tensor, *, block_2d: bool = True,
                              rounding: str = "rne", seed: int = 0, step: int = 0, tensor_id: int = 0,
                              hadamard: bool = False, transpose: bool = False) -> NVFP4Tensor:
    """NVFP4-quantize a 2-D MXFP8 tensor (decoded exactly to float32 first; optionally its transpose).

    ``transpose=True`` quantizes ``decode(payload, scales).T`` - with the trainer's master stored
    [in, out] this gives the forward GEMM operand W [out, in] directly.
    """
    from nvfp4_cuda.reference import quantize_nvfp4  # reference.py imports this module

    if payload.dim() != 2:
        raise ValueError(f"quantize_nvfp4_from_mxfp8: expected a 2-D payload, got shape {list(payload.shape)}")
    w = mxfp8_decode(payload, scales)
    if transpose:
        w = w.t().contiguous()
    return quantize_nvfp4(w, block_2d=block_2d, rounding=rounding, seed=seed, step=step, tensor_id=tensor_id,
                          hadamard=hadamard)


def _check_same_shape(t: torch.Tensor, shape: torch.Size, what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"lion_step_mxfp8_: {what} has shape {list(t.shape)}, expected {list(shape)}")


def check_lion_args(payload: torch.Tensor, scales: torch.Tensor, grad: torch.Tensor, momentum: torch.Tensor,
                    writeback: str, compensation: torch.Tensor | None) -> None:
    """Validate the Lion step's arguments (shapes, dtypes, mode); raises ValueError naming the problem."""
    if writeback not in WRITEBACK_MODES:
        raise ValueError(f"lion_step_mxfp8_: writeback must be one of {WRITEBACK_MODES}, got {writeback!r}")
    if payload.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"lion_step_mxfp8_: payload and scales must be uint8, got {payload.dtype}, {scales.dtype}")
    shape = payload.shape
    _check_same_shape(scales, torch.Size((*shape[:-1], -(-shape[-1] // MX_BLOCK))), "scales")
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
    return (f32_const(-lr), f32_const(1.0 - lr * weight_decay), f32_const(beta1), f32_const(1.0 - beta1),
            f32_const(beta2), f32_const(1.0 - beta2))


def lion_step_mxfp8_(payload: torch.Tensor, scales: torch.Tensor, grad: torch.Tensor, momentum: torch.Tensor, *,
                     lr: float, beta1: float = 0.9, beta2: float = 0.99, weight_decay: float = 0.0,
                     writeback: str = "stochastic", compensation: torch.Tensor | None = None, seed: int = 0,
                     step: int = 0, tensor_id: int = 0) -> None:
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
        >>> p, s = mxfp8_encode(torch.full((2, 32), 0.02))
        >>> m = torch.zeros(2, 32, dtype=torch.bfloat16)
        >>> lion_step_mxfp8_(p, s, torch.ones(2, 32), m, lr=1e-3)
        >>> round(float(mxfp8_decode(p, s).mean()), 4) < 0.02
        True
    """
    check_lion_args(payload, scales, grad, momentum, writeback, compensation)
    shape = payload.shape
    w = mxfp8_decode(payload, scales)
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
    rand = rand24_like(tuple(shape), seed, step, tensor_id, device=payload.device) if writeback == "stochastic" else None
    new_payload, new_scales = _encode_f32(target, rand)
    if writeback == "compensated":
        assert compensation is not None
        compensation.copy_(target - mxfp8_decode(new_payload, new_scales))
    momentum.copy_(((m * b2) + (g * omb2)).to(torch.bfloat16))
    payload.copy_(new_payload)
    scales.copy_(new_scales)


def stochastic_round_to_bf16_(dst_bf16: torch.Tensor, src_fp32: torch.Tensor, *, seed: int, step: int,
                              tensor_id: int) -> torch.Tensor:
    """Round float32 to bfloat16 stochastically (unbiased), writing into ``dst_bf16``; returns it.

    Example:
        >>> dst = torch.empty(3, dtype=torch.bfloat16)
        >>> stochastic_round_to_bf16_(dst, torch.tensor([1.0, -2.0, 0.5]), seed=0, step=0, tensor_id=0).tolist()
        [1.0, -2.0, 0.5]
    """
    if dst_bf16.dtype != torch.bfloat16:
        raise ValueError(f"stochastic_round_to_bf16_: dst must be bfloat16, got {dst_bf16.dtype}")
    if tuple(dst_bf16.shape) != tuple(src_fp32.shape):
        raise ValueError(f"stochastic_round_to_bf16_: shapes differ, dst {list(dst_bf16.shape)} "
                         f"src {list(src_fp32.shape)}")
    src = src_fp32.to(torch.float32).contiguous()
    bits = f32_bits(src)
    r16 = rand16_like(tuple(src.shape), seed, step, tensor_id, device=src.device)
    finite = torch.isfinite(src)
    hi = torch.where(finite, (bits + r16) >> 16, (bits >> 16) | (torch.isnan(src).to(torch.int64) << 6))
    hi = hi & 0xFFFF
    hi = torch.where(hi >= 0x8000, hi - 0x10000, hi).to(torch.int16)
    dst_bf16.copy_(hi.view(torch.bfloat16))
    return dst_bf16
