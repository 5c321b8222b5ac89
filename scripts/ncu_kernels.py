"""A few launches of nvfp4_cuda's bandwidth-bound kernels, for Nsight Compute (is each memory- or compute-bound?).

Run on a GPU machine (docs/benchmarks.md, "GPU kernels", quotes its output)::

    ncu --clock-control none --section SpeedOfLight -k 'regex:nv_(quantize|amax|lion|decode_bf16)_kernel' \\
        python scripts/ncu_kernels.py

Shapes as in benchmarks/bench_nvfp4_gpu.py: a 16384 x 4096 BF16 activation (quantize RNE and stochastic,
decode) and a 4096 x 8192 MXFP8 master (Lion, stochastic and RNE write-back).
"""

import sys

import torch

import mxfp8_codec
import nvfp4_cuda

if not torch.cuda.is_available():
    print("ncu_kernels.py: error: no CUDA device visible to torch (run it on a GPU machine)", file=sys.stderr)
    sys.exit(3)  # this machine cannot (docs/cli.md)
x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
for kw in ({}, {"rounding": "stochastic"}):
    nvfp4_cuda.quantize_nvfp4(x, **kw)
nvfp4_cuda.decode_scaled(nvfp4_cuda.quantize_nvfp4(x))
p, s = mxfp8_codec.encode_mxfp8(0.02 * torch.randn(4096, 8192, device="cuda"))
g = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
m = torch.zeros_like(g)
for wb in ("stochastic", "rne"):
    nvfp4_cuda.lion_step_mxfp8_(p, s, g, m, lr=1e-5, writeback=wb)
torch.cuda.synchronize()
