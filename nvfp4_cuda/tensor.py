"""The NVFP4 tensor container: packed E2M1 codes, E4M3 block scales and one float32 tensor scale.

Layout (the same on CPU and GPU, and what the CUDA kernels read and write):

* ``codes``: uint8 ``[R, C/2]``; element ``(r, 2j)`` in the low nibble of byte ``(r, j)``, element
  ``(r, 2j+1)`` in the high nibble (Transformer Engine, torchao, ModelOpt and the mma.sync fragments
  all use this order).
* ``block_scales``: uint8 ``[R, C/16]``, E4M3 bit patterns (used unsigned, PTX ``.ue4m3``), one per 16
  consecutive elements along the last axis (K).  For 2-D (16x16) blocks the tile's scale is written
  for each of its 16 rows, so every consumer can treat the tensor as 1x16.
* ``tensor_scale``: float32 0-d tensor in the *decode* direction, ``S_dec = 1 / (2688 / amax)``.

Decoded value: ``x[r, c] = e2m1(code) * e4m3(block_scales[r, c // 16]) * tensor_scale``.

With 2-D blocks the quantized transpose is exactly the transpose of the codes and of the tile-scale
grid (no requantization), which is what lets the forward GEMM (K = in) and the backward data-gradient
GEMM (K = out) see the same quantized weight; :meth:`NVFP4Tensor.t` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4_cuda.formats import NVFP4_BLOCK, pack_nibbles, unpack_nibbles


@dataclass
class NVFP4Tensor:
    """A quantized 2-D tensor ``[R, C]`` (C % 16 == 0) in NVFP4.

    Attributes:
        codes: uint8 [R, C/2], two E2M1 codes per byte, even element in the low nibble.
        block_scales: uint8 [R, C/16], E4M3 bits of the block scales.
        tensor_scale: float32 0-d tensor, decode-direction per-tensor scale.
        shape: the logical shape (R, C).
        block_2d: True when block scales are shared by 16x16 tiles (weights).
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    shape: tuple[int, int]
    block_2d: bool = False

    def __post_init__(self) -> None:
        r, c = (int(v) for v in self.shape)
        self.shape = (r, c)
        if c % NVFP4_BLOCK:
            raise ValueError(f"NVFP4Tensor: last dimension {c} is not a multiple of {NVFP4_BLOCK}")
        if tuple(self.codes.shape) != (r, c // 2) or self.codes.dtype != torch.uint8:
            raise ValueError(
                f"NVFP4Tensor: codes must be uint8 [{r}, {c // 2}], got {self.codes.dtype} {list(self.codes.shape)}"
            )
        if tuple(self.block_scales.shape) != (r, c // NVFP4_BLOCK) or self.block_scales.dtype != torch.uint8:
            raise ValueError(
                f"NVFP4Tensor: block_scales must be uint8 [{r}, {c // NVFP4_BLOCK}], got "
                f"{self.block_scales.dtype} {list(self.block_scales.shape)}"
            )
        if self.tensor_scale.dtype != torch.float32 or self.tensor_scale.dim() != 0:
            raise ValueError("NVFP4Tensor: tensor_scale must be a float32 0-d tensor")

    @property
    def device(self) -> torch.device:
        """Device of the codes."""
        return self.codes.device

    def t(self) -> NVFP4Tensor:
        """The quantized transpose ``[C, R]`` of a 2-D-block tensor, exactly (no requantization).

        Requires ``block_2d`` and R % 16 == 0 (1x16 blocks run along the wrong axis after a transpose:
        quantize the transposed float tensor instead).

        Example:
            >>> import nvfp4_cuda
            >>> w = torch.randn(32, 64)
            >>> q = nvfp4_cuda.quantize_nvfp4(w, block_2d=True)
            >>> q.t().shape
            (64, 32)
        """
        r, c = self.shape
        if not self.block_2d:
            raise ValueError(
                "NVFP4Tensor.t(): only 2-D (16x16) block tensors transpose exactly; "
                "quantize the transposed tensor for 1x16 blocks"
            )
        if r % NVFP4_BLOCK:
            raise ValueError(f"NVFP4Tensor.t(): rows {r} not a multiple of {NVFP4_BLOCK}")
        codes_t = pack_nibbles(unpack_nibbles(self.codes).t().contiguous())
        tiles = self.block_scales[0::NVFP4_BLOCK, :]  # [R/16, C/16], one scale per tile
        scales_t = tiles.t().repeat_interleave(NVFP4_BLOCK, dim=0)  # [C, R/16]
        return NVFP4Tensor(
            codes=codes_t,
            block_scales=scales_t.contiguous(),
            tensor_scale=self.tensor_scale,
            shape=(c, r),
            block_2d=True,
        )
