"""MXFP8 checkpoint file IO against named baselines, measured in one run; prints ratios.

Workload: a synthetic checkpoint of projection weights (default 16 x [1024, 2048] = 32 Mi elements:
a 33 MiB MXFP8 file, 64 MiB as BF16), page-cached, so the numbers are CPU cost, not disk speed.

Rows (ours vs baseline):

* load, streaming to torch BF16: ``iter_mxfp8_safetensors(framework="pt", dtype=torch.bfloat16)``
  vs (a) ``safetensors.safe_open`` of the same weights stored as plain BF16 (what an unquantized
  checkpoint costs to load) and (b) the naive torch path on our file (``safe_open`` +
  ``payload.to(bf16) * 2^(s - 127)``, scales expanded with ``repeat_interleave``);
* write from torch BF16 tensors: ``write_mxfp8_safetensors`` (encode + atomic write) vs
  ``safetensors.torch.save_file`` of the BF16 tensors;
* header-only rename: ``rename_tensors`` (copy + sha256 of every tensor before and after) vs
  ``shutil.copyfile`` and vs one ``hashlib.sha256`` pass over the file;
* memory: tracemalloc peak while streaming vs while reading everything (``read_mxfp8_safetensors``).

Usage: ``python benchmarks/bench_mxfp8_io.py [--tensors 16 --rows 1024 --cols 2048 --repeat 3]``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from timing import samples  # this directory is on sys.path

from mxfp8_codec import iter_mxfp8_safetensors, read_mxfp8_safetensors, rename_tensors, write_mxfp8_safetensors


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Minimum wall time of ``repeat`` runs after one warm-up (the box is shared: the minimum is the signal)."""
    return min(samples(fn, repeat))


def naive_torch_load(path: Path) -> None:
    """The path people write by hand: safetensors + torch cast and multiply by the expanded scale."""
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            if name.endswith(".scale"):
                continue
            q = f.get_tensor(name)
            s = f.get_tensor(name + ".scale")
            scale = torch.exp2(s.to(torch.float32) - 127).repeat_interleave(32, dim=-1)[..., : q.shape[-1]]
            _ = (q.to(torch.bfloat16) * scale.to(torch.bfloat16)).contiguous()


def bf16_load(path: Path) -> None:
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            _ = f.get_tensor(name).clone()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    g = torch.Generator().manual_seed(0)
    tensors = {
        f"model.layers.{i}.mlp.up_proj.weight": (torch.randn(args.rows, args.cols, generator=g) * 0.02).to(
            torch.bfloat16
        )
        for i in range(args.tensors)
    }
    n_el = args.tensors * args.rows * args.cols
    with tempfile.TemporaryDirectory() as d:
        mx, bf, renamed, copied = (
            Path(d) / n for n in ("mx.safetensors", "bf16.safetensors", "r.safetensors", "c.safetensors")
        )
        t_write = best_of(lambda: write_mxfp8_safetensors(mx, tensors, progress=False), args.repeat)
        t_save = best_of(lambda: save_file(tensors, str(bf)), args.repeat)

        def stream() -> None:
            for _name, _t in iter_mxfp8_safetensors(mx, framework="pt", dtype=torch.bfloat16):
                pass

        t_stream = best_of(stream, args.repeat)
        t_bf16 = best_of(lambda: bf16_load(bf), args.repeat)
        t_naive = best_of(lambda: naive_torch_load(mx), args.repeat)

        t_rename = best_of(lambda: rename_tensors(mx, renamed, lambda n: "renamed." + n), args.repeat)
        t_copy = best_of(lambda: shutil.copyfile(mx, copied), args.repeat)
        t_hash = best_of(lambda: hashlib.sha256(mx.read_bytes()).hexdigest(), args.repeat)

        one = args.rows * args.cols * 4
        tracemalloc.start()
        stream_np = iter_mxfp8_safetensors(mx)
        for _name, arr in stream_np:
            del arr
        _, peak_stream = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        everything = read_mxfp8_safetensors(mx)
        _, peak_all = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del everything
        size_mx, size_bf = mx.stat().st_size, bf.stat().st_size

    mib = 1 << 20
    print(
        f"workload: {args.tensors} x [{args.rows}, {args.cols}] = {n_el / mib:.0f} Mi elements; "
        f"MXFP8 file {size_mx / mib:.1f} MiB, BF16 file {size_bf / mib:.1f} MiB; torch threads {torch.get_num_threads()}"
    )
    rows = [
        ("load -> torch bf16 (streaming)", t_stream, "safe_open BF16 file", t_bf16),
        ("load -> torch bf16 (streaming)", t_stream, "naive torch cast*scale on MXFP8", t_naive),
        ("write from torch bf16 (encode+atomic)", t_write, "safetensors save_file BF16", t_save),
        ("header-only rename (+2 sha256 passes)", t_rename, "shutil.copyfile", t_copy),
        ("header-only rename (+2 sha256 passes)", t_rename, "one sha256 pass over the file", t_hash),
    ]
    print(f"{'ours':40s} {'time':>9s}   {'baseline':34s} {'time':>9s}   ours/baseline")
    for name, t, base, tb in rows:
        print(f"{name:40s} {t * 1e3:7.1f}ms   {base:34s} {tb * 1e3:7.1f}ms   {t / tb:6.2f}x")
    print(
        f"memory: streaming peak {peak_stream / mib:.1f} MiB vs read-all peak {peak_all / mib:.1f} MiB "
        f"(one decoded float32 tensor = {one / mib:.1f} MiB; ratio {peak_all / peak_stream:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
