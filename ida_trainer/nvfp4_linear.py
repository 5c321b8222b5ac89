"""NVFP4Linear: a projection with an MXFP8 master ([in, out]) and its three GEMMs in NVFP4.

Numerics (NVIDIA's NVFP4 training recipe, arXiv 2509.25149, as in Transformer Engine):

* weights: 2-D 16x16 blocks, RNE, quantized from the MXFP8 master (exactly decoded to float32 first);
  with 2-D tiles the transposed weight is the same quantized tensor (codes and tile scales transposed,
  no requantization), so the forward GEMM (K = in) and the data-gradient GEMM (K = out) see *one* weight;
* activations: 1x16 blocks along K, RNE;
* gradients: 1x16 blocks, stochastic rounding (unbiased: E[q(g)] = g, so gradient noise averages out
  over steps instead of accumulating a bias);
* weight-gradient operands: 16-point random Hadamard transform along the token axis before quantizing
  (orthonormal and applied to both operands along the shared K, so the exact product is unchanged; it
  spreads outliers across each 16-block so one large value does not flush its 15 neighbours to zero).

Every GEMM is ``nvfp4_cuda.nvfp4_matmul`` (FP32 accumulation, the two FP32 tensor scales applied in the
epilogue, BF16 result); the ops run on CUDA tensors through the cffi library and on CPU tensors through
the bit-identical reference, so this module has no numerics of its own beyond choosing operands.

Stochastic rounding is keyed by ``(seed, optimizer step, tensor id)``; :func:`tensor_id` derives ids
from a layer's global transformers name, so every process (pipeline stage, resumed run) draws the same
bits for the same tensor.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

import nvfp4_cuda
from mxfp8_codec import decode_mxfp8, encode_mxfp8
from mxfp8_codec.constants import BLOCK_SIZE as MXFP8_BLOCK_SIZE  # along the last (out) axis of the master
from nvfp4_cuda.formats import NVFP4_BLOCK  # elements per NVFP4 block (and side of a 2-D weight tile)

if TYPE_CHECKING:
    from ida_trainer.config import PrecisionConfig

__all__ = ["NVFP4Linear", "NVFP4LinearFunction", "nvfp4_modules", "tensor_id"]

TENSOR_ID_MASK = 0x7FFF_FFFF  # tensor ids are 31-bit crc32 values of "name#use"


def tensor_id(name: str, use: str) -> int:
    """Stable stochastic-rounding stream id of one use of one tensor (same in every process).

    Example:
        >>> tensor_id("model.layers.0.self_attn.q_proj.weight", "lion") == tensor_id(
        ...     "model.layers.0.self_attn.q_proj.weight", "lion")
        True
    """
    return zlib.crc32(f"{name}#{use}".encode()) & TENSOR_ID_MASK


class NVFP4LinearFunction(torch.autograd.Function):
    """``Y = X W^T`` with all three GEMMs in NVFP4 (float32 accumulation, BF16 results).

    Shapes: ``X`` [M, in] (M = tokens), master ``W_n`` = ``W^T`` [in, out] in MXFP8, ``Y`` [M, out].
    Every GEMM is ``nvfp4_matmul(A, B) = A[M', K] @ B[N', K]^T``, blocks of 16 along K.

    Weight, once per forward: ``Wq_n = quantize_nvfp4_from_mxfp8(payload, scales, block_2d=True)``
    ([in, out], 16x16 tiles, RNE) and ``Wq = Wq_n.t()`` ([out, in]); with 2-D tiles the transpose is an
    exact re-layout of the same codes and scales, so forward and dgrad see the *same* quantized weight.
    Where the GEMM is emulated (every device but sm_120a: ``nvfp4_cuda.native_gemm``), every operand is
    quantized straight to its exact values ``e2m1 * e4m3`` (``nvfp4_cuda.quantize_decoded``: BF16 on CUDA,
    the same bits as quantize-then-decode, no codes written) and multiplied by ``nvfp4_cuda.gemm_decoded``
    (cuBLASLt, the tensor scales as alpha).  The weight's values are the B operand of both GEMMs, as ``W^T``
    through a transposed view in forward and as ``W`` in dgrad: no re-layout, no second quantization; they
    are saved for backward instead of the codes (2 bytes per weight instead of 0.56).

    1. forward (fprop), K = in:  ``Y[M, out] = nvfp4_matmul(Xq, Wq)``
       ``A = Xq = quantize_nvfp4(X)`` [M, in], 1x16 blocks along ``in``, RNE;
       ``B = Wq`` [out, in].
    2. dgrad, K = out:  ``dX[M, in] = dY W = nvfp4_matmul(dYq, Wq_n)``
       ``A = dYq = quantize_nvfp4(dY, rounding="stochastic")`` [M, out], 1x16 along ``out``;
       ``B = Wq_n`` [in, out] (the transposed codes of the forward weight).
    3. wgrad, K = M (tokens):  ``dW_n[in, out] = X^T dY = nvfp4_matmul(XTq, dYTq)``
       ``A = XTq = quantize_nvfp4(X^T, hadamard=True)`` [in, M], RNE;
       ``B = dYTq = quantize_nvfp4(dY^T, hadamard=True, rounding="stochastic")`` [out, M].
       Both operands are rotated by the same 16-point Hadamard transform along the token axis, so
       ``(X^T H)(dY^T H)^T = X^T dY`` in exact arithmetic while outliers are spread before quantizing.
       M is zero-padded to a multiple of 16 (zero tokens add nothing to the sum).  The result is the
       gradient in the master's native ``[in, out]`` orientation, as BF16.

    Stochastic rounding (gradients only) is keyed by ``(seed, optimizer step, tensor id)`` where the
    tensor id encodes the layer's global name, the use (``dgrad``/``wgrad``) and the backward call index
    within the step, so every micro-batch draws fresh bits and every process draws the same ones.
    ``stochastic_grad=False`` uses RNE; ``hadamard_wgrad=False`` skips the rotation.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x2: torch.Tensor,
        anchor: torch.Tensor,
        payload: torch.Tensor,
        scales: torch.Tensor,
        layer: NVFP4Linear,
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.native = nvfp4_cuda.native_gemm(x2.device)
        if ctx.native:  # FP4 MMA on the codes: the weight as [out, in] codes (an exact re-layout)
            wq_n = nvfp4_cuda.quantize_nvfp4_from_mxfp8(payload, scales, block_2d=True)  # [in, out], RNE
            xq = nvfp4_cuda.quantize_nvfp4(x2, rounding="rne")  # [M, in], 1x16 along in
            y = nvfp4_cuda.nvfp4_matmul(xq, wq_n.t(), out_dtype=torch.bfloat16)  # [M, out]
            w_scale, w_saved = wq_n.tensor_scale, (wq_n.codes, wq_n.block_scales)
        else:  # emulation: operands as exact values; the weight's serve W^T here (a view) and W in dgrad
            w_dec, w_scale = nvfp4_cuda.quantize_decoded_from_mxfp8(payload, scales, block_2d=True)  # [in, out]
            x_dec, x_scale = nvfp4_cuda.quantize_decoded(x2, rounding="rne")  # [M, in]
            y = nvfp4_cuda.gemm_decoded(x_dec, w_dec.t(), x_scale, w_scale, out_dtype=torch.bfloat16)  # [M, out]
            w_saved = (w_dec,)
        # Saved as tensors (not ctx attributes) so activation checkpointing drops and recomputes them too.
        ctx.save_for_backward(x2, w_scale, *w_saved)
        ctx.w_shape = (payload.shape[0], payload.shape[1])
        ctx.layer = layer
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x2, w_scale, *w_saved = ctx.saved_tensors
        layer: NVFP4Linear = ctx.layer
        gy = gy.contiguous()
        call = layer.next_backward_call()
        rounding = "stochastic" if layer.stochastic_grad else "rne"
        step, seed = layer.sr_step, layer.seed
        dx = dw = None
        if ctx.needs_input_grad[0]:
            kw = {
                "rounding": rounding,
                "seed": seed,
                "step": step,
                "tensor_id": tensor_id(layer.global_name, f"dgrad:{call}"),
            }
            if ctx.native:
                gq = nvfp4_cuda.quantize_nvfp4(gy, **kw)
                wq_n = nvfp4_cuda.NVFP4Tensor(
                    codes=w_saved[0], block_scales=w_saved[1], tensor_scale=w_scale, shape=ctx.w_shape, block_2d=True
                )
                dx = nvfp4_cuda.nvfp4_matmul(gq, wq_n, out_dtype=torch.bfloat16)  # [M, in]
            else:
                g_dec, g_scale = nvfp4_cuda.quantize_decoded(gy, **kw)
                dx = nvfp4_cuda.gemm_decoded(g_dec, w_saved[0], g_scale, w_scale, out_dtype=torch.bfloat16)  # [M, in]
        if ctx.needs_input_grad[1]:
            # X^T [in, M'] and dY^T [out, M'], M' = M rounded up to 16 (zero tokens): transpose=True quantizes
            # them from x2 and gy as they are (on CUDA the kernel reads the transpose in place, no copy)
            hadamard = layer.hadamard_wgrad
            gkw = {
                "rounding": rounding,
                "hadamard": hadamard,
                "seed": seed,
                "step": step,
                "tensor_id": tensor_id(layer.global_name, f"wgrad:{call}"),
                "transpose": True,
            }
            if ctx.native:
                xtq = nvfp4_cuda.quantize_nvfp4(x2, rounding="rne", hadamard=hadamard, transpose=True)
                gtq = nvfp4_cuda.quantize_nvfp4(gy, **gkw)
                dw = nvfp4_cuda.nvfp4_matmul(xtq, gtq, out_dtype=torch.bfloat16)  # [in, out]
            else:
                xt_dec, xt_scale = nvfp4_cuda.quantize_decoded(x2, rounding="rne", hadamard=hadamard, transpose=True)
                gt_dec, gt_scale = nvfp4_cuda.quantize_decoded(gy, **gkw)
                dw = nvfp4_cuda.gemm_decoded(xt_dec, gt_dec, xt_scale, gt_scale, out_dtype=torch.bfloat16)  # [in, out]
        return dx, dw, None, None, None


class NVFP4Linear(nn.Module):
    """A projection whose master is MXFP8 ([in, out]) and whose GEMMs are NVFP4.

    Buffers ``weight_payload`` (uint8 E4M3 bits [in, out]) and ``weight_scales`` (uint8 UE8M0
    [in, ceil(out/32)]) are the master, exactly what the checkpoint stores.  ``weight`` is not a weight:
    autograd cannot deliver a gradient to uint8 buffers, so ``weight`` is a zero-stride BF16 view
    (one element of storage) of shape [in, out] whose ``.grad`` receives the BF16 weight gradient.  It
    makes the gradient visible to gradient clipping, norms and the optimizer like any other parameter;
    the optimizer's Lion step then updates the master in place.

    Attributes:
        global_name: the module's name in the full transformers model (stream ids, export names).
        sr_step: optimizer step used as the stochastic-rounding key (set by the optimizer).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        global_name: str = "",
        seed: int = 0,
        hadamard_wgrad: bool = True,
        stochastic_grad: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if in_features % NVFP4_BLOCK or out_features % NVFP4_BLOCK:
            raise ValueError(
                f"NVFP4Linear {global_name or '?'}: in_features={in_features} and "
                f"out_features={out_features} must be multiples of {NVFP4_BLOCK}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.global_name = global_name
        self.seed = seed
        self.hadamard_wgrad = hadamard_wgrad
        self.stochastic_grad = stochastic_grad
        self.sr_step = 0
        self._backward_calls = 0
        n_scale = -(-out_features // MXFP8_BLOCK_SIZE)
        self.register_buffer("weight_payload", torch.zeros(in_features, out_features, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scales", torch.zeros(in_features, n_scale, dtype=torch.uint8, device=device))
        self.weight = nn.Parameter(self._anchor(self.weight_payload.device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=torch.bfloat16, device=device)) if bias else None

    def _anchor(self, device: torch.device) -> torch.Tensor:
        return torch.zeros((), dtype=torch.bfloat16, device=device).expand(self.in_features, self.out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, global_name: str, precision: PrecisionConfig) -> NVFP4Linear:
        """Build from an ``nn.Linear``: its weight is transposed and encoded to the MXFP8 master (RNE)."""
        w = linear.weight
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            global_name=global_name,
            seed=precision.seed,
            hadamard_wgrad=precision.hadamard_wgrad,
            stochastic_grad=precision.stochastic_grad,
            device=w.device,
        )
        if w.device.type != "meta":
            layer.set_weight_(w.detach())
            if linear.bias is not None:
                with torch.no_grad():
                    layer.bias.copy_(linear.bias.detach().to(torch.bfloat16))  # type: ignore[union-attr]
        return layer

    @torch.no_grad()
    def set_weight_(self, weight_out_in: torch.Tensor) -> None:
        """Encode a float weight in ``nn.Linear`` orientation [out, in] into the master (RNE)."""
        if tuple(weight_out_in.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"{self.global_name}: weight shape {list(weight_out_in.shape)}, expected "
                f"{[self.out_features, self.in_features]}"
            )
        payload, scales = encode_mxfp8(weight_out_in.to(torch.float32).t().contiguous())
        self.weight_payload.copy_(payload)
        self.weight_scales.copy_(scales)

    @torch.no_grad()
    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The master decoded, in ``nn.Linear`` orientation [out, in] (exact in float32)."""
        return decode_mxfp8(self.weight_payload, self.weight_scales, dtype=torch.float32).t().to(dtype)

    def next_backward_call(self) -> int:
        """Index of this backward within the optimizer step (fresh SR bits per micro-batch)."""
        call = self._backward_calls
        self._backward_calls += 1
        return call

    def set_sr_step(self, step: int) -> None:
        """Start a new optimizer step: SR key step = ``step``, backward call counter reset."""
        self.sr_step = int(step)
        self._backward_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = NVFP4LinearFunction.apply(x2, self.weight, self.weight_payload, self.weight_scales, self)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> NVFP4Linear:
        # Device moves and dtype casts apply to the master buffers and the bias; the gradient anchor
        # stays a BF16 zero-stride view (a plain .to() would materialize it) on the buffers' device.
        anchor = self._parameters.pop("weight")
        try:
            super()._apply(fn, recurse)
        finally:
            self._parameters["weight"] = anchor
        if anchor.device != self.weight_payload.device:
            self._parameters["weight"] = nn.Parameter(self._anchor(self.weight_payload.device))
        return self

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, master=MXFP8[in,out], compute=NVFP4"
        )


def nvfp4_modules(model: nn.Module) -> Iterator[tuple[str, NVFP4Linear]]:
    """``(name, module)`` of every :class:`NVFP4Linear` in ``model``."""
    for name, mod in model.named_modules():
        if isinstance(mod, NVFP4Linear):
            yield name, mod
