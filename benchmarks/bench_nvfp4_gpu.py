"""Benchmark (GPU): NVFP4 kernels against baselines measured in the same run on the same device.

* GEMM 4096^3: our emulated NVFP4 GEMM (decode to BF16 + mma.sync bf16) vs ``torch.matmul`` in BF16
  (cuBLAS); target >= 50 % of torch's throughput.  On compute capability 12.x also the native
  sm_120a FP4 MMA path.
* Quantize (1x16 RNE, 4096 x 4096 bf16 input): achieved bytes/s (read bf16 twice - amax pass and
  quantize pass - write codes + scales) as a fraction of the device-copy bandwidth measured with
  ``dst.copy_(src)`` in this run; target >= 50 %.
* Lion step on a 4096 x 4096 MXFP8 master: bytes moved (payload r/w, scales r/w, bf16 grad r,
  bf16 momentum r/w) / time as a fraction of copy bandwidth; target >= 50 %.

Writes a JSON file and a markdown table (``--out-prefix``).  Exits 0 with a message when no GPU.

Run::

    python -m nvfp4_cuda build && python benchmarks/bench_nvfp4_gpu.py --out-prefix /tmp/nvfp4_gpu
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch

import mxfp8_codec
import nvfp4_cuda

GEMM_TARGET = 0.50  # emulated NVFP4 / torch bf16 throughput
BW_TARGET = 0.50  # fraction of copy bandwidth


def _cuda_time(fn: Callable[[], object], iters: int) -> float:
    """Mean seconds per call, timed with CUDA events after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def run(size: int, iters: int) -> dict[str, object]:
    """All measurements; returns a result dict."""
    dev = torch.device("cuda")
    res: dict[str, object] = {"device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
                              "backend_info": nvfp4_cuda.backend_info(), "size": size}
    m = n = k = size
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    flops = 2.0 * m * n * k
    t_bf16 = _cuda_time(lambda: torch.matmul(a, b.t()), iters)
    qa, qb = nvfp4_cuda.quantize_nvfp4(a), nvfp4_cuda.quantize_nvfp4(b, block_2d=True)
    gemm = {"torch_bf16_tflops": flops / t_bf16 / 1e12}
    backends = ["emulated"] + (["native"] if torch.cuda.get_device_capability()[0] == 12 else [])
    for be in backends:
        t = _cuda_time(lambda be=be: nvfp4_cuda.nvfp4_matmul(qa, qb, backend=be), iters)
        gemm[f"{be}_tflops"] = flops / t / 1e12
        gemm[f"{be}_vs_torch_bf16"] = t_bf16 / t
    res["gemm"] = gemm

    src = torch.empty(size * size * 4, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t_copy = _cuda_time(lambda: dst.copy_(src), iters)
    copy_bw = 2 * src.numel() / t_copy  # read + write
    res["copy_GBps"] = copy_bw / 1e9

    x = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    t_q = _cuda_time(lambda: nvfp4_cuda.quantize_nvfp4(x), iters)
    q_bytes = 2 * x.numel() * 2 + x.numel() // 2 + x.numel() // 16
    res["quantize"] = {"GBps": q_bytes / t_q / 1e9, "fraction_of_copy": q_bytes / t_q / copy_bw}

    p, s = mxfp8_codec.encode_mxfp8(0.02 * torch.randn(size, size, device=dev))
    grad = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    mom = torch.zeros(size, size, device=dev, dtype=torch.bfloat16)
    step = iter(range(10**9))
    t_l = _cuda_time(lambda: nvfp4_cuda.lion_step_mxfp8_(p, s, grad, mom, lr=1e-5, step=next(step)), iters)
    l_bytes = p.numel() * (1 + 1 + 2 + 2 + 2) + 2 * s.numel()
    res["lion"] = {"GBps": l_bytes / t_l / 1e9, "fraction_of_copy": l_bytes / t_l / copy_bw}
    res["targets_met"] = {
        "gemm_emulated": gemm["emulated_vs_torch_bf16"] >= GEMM_TARGET,
        "quantize_bw": res["quantize"]["fraction_of_copy"] >= BW_TARGET,
        "lion_bw": res["lion"]["fraction_of_copy"] >= BW_TARGET,
    }
    return res


def markdown(res: dict[str, object]) -> str:
    """A small markdown table of the ratios."""
    g = res["gemm"]
    rows = [f"| GEMM {res['size']}^3 emulated vs torch bf16 | {g['emulated_vs_torch_bf16']:.2f} | >= {GEMM_TARGET} |"]
    if "native_vs_torch_bf16" in g:
        rows.append(f"| GEMM native sm_120a vs torch bf16 | {g['native_vs_torch_bf16']:.2f} | (info) |")
    rows.append(f"| quantize bandwidth / copy | {res['quantize']['fraction_of_copy']:.2f} | >= {BW_TARGET} |")
    rows.append(f"| Lion step bandwidth / copy | {res['lion']['fraction_of_copy']:.2f} | >= {BW_TARGET} |")
    return (f"Device: {res['device']} (sm_{res['capability'][0]}{res['capability'][1]})\n\n| measurement | ratio | target |\n"
            "|---|---|---|\n" + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run and print; write JSON/markdown when asked."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out-prefix", default=None, help="write <prefix>.json and <prefix>.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: GPU benchmark not run")
        return 0
    res = run(args.size, args.iters)
    print(json.dumps(res, indent=2, default=str))
    md = markdown(res)
    print(md)
    if args.out_prefix:
        with open(args.out_prefix + ".json", "w") as f:
            json.dump(res, f, indent=2, default=str)
        with open(args.out_prefix + ".md", "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
