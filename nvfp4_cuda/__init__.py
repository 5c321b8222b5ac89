"""NVFP4 quantization / GEMM and MXFP8-master kernels (CUDA via cffi) with a bit-exact PyTorch reference.

CPU tensors run on :mod:`nvfp4_cuda.reference` (pure PyTorch, the oracle); CUDA tensors run on one
shared library compiled with nvcc on first use (``python -m nvfp4_cuda build``) and loaded with cffi.
See docs/nvfp4.md for the numerics (rounding, RNG, layouts) and the C ABI.  MXFP8 (the master's
format: encode with RNE or stochastic rounding, decode) is ``mxfp8_codec``'s, which this package
imports (``mxfp8_codec.encode_mxfp8(x, rounding="stochastic", seed=, step=, tensor_id=)``).

Example:
    >>> import torch, nvfp4_cuda
    >>> x, w = torch.randn(8, 64), torch.randn(16, 64)
    >>> y = nvfp4_cuda.nvfp4_matmul(nvfp4_cuda.quantize_nvfp4(x), nvfp4_cuda.quantize_nvfp4(w, block_2d=True))
    >>> y.shape
    torch.Size([8, 16])
"""

from ida_common.lazy import lazy_attributes

# Imported on first use, so that ``python -m nvfp4_cuda --help`` and ``build`` (nvcc only) answer without
# importing torch; ``import nvfp4_cuda`` then ``nvfp4_cuda.quantize_nvfp4(...)`` works as before.
_LAZY = {
    **dict.fromkeys(
        [
            "backend_info",
            "decode_scaled",
            "dequantize_nvfp4",
            "gemm_decoded",
            "hadamard16",
            "lion_step_bf16_",
            "lion_step_mxfp8_",
            "native_gemm",
            "nvfp4_matmul",
            "quantize_decoded",
            "quantize_decoded_from_mxfp8",
            "quantize_nvfp4",
            "quantize_nvfp4_from_mxfp8",
            "stochastic_round_to_bf16_",
        ],
        "nvfp4_cuda.api",
    ),
    "NVFP4Tensor": "nvfp4_cuda.tensor",
}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)

__all__ = sorted(_LAZY)  # the public names, each defined in the module its entry names
