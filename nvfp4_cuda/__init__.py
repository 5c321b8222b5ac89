"""NVFP4 quantization / GEMM / MXFP8 master kernels (CUDA via cffi) and their PyTorch reference."""

__all__: list[str] = []
