"""What each FSDP2 rank's host memory grows by while the run's base is loaded and sharded, and what it grew by
when every rank loaded the base.

One torchrun run, a Qwen3-shaped model with random weights and fewer layers (default 4; hidden 2560, vocabulary
151936, tied embeddings: ``bench_fsdp_memory``'s shape), saved by rank 0 as a BF16 transformers base in
a temporary directory. Then, as the trainer does with ``--base`` and the bf16 recipe (FP32 masters), on every
rank, each phase's RSS growth sampled every 2 ms (``timing.rss_growth_during``):

* **ida** (since 2026-12-07): rank 0 ``load_model(base, float32)``, the other ranks ``empty_model`` (the meta
  device); ``apply_recipe``; ``apply_fsdp``, which fills the other ranks from rank 0 one full tensor at a time;
* **baseline** (before): every rank ``load_model(base, float32)``; ``apply_recipe``; ``apply_fsdp``.

After an unmeasured warm-up of the first (imports), the baseline runs second, so that memory the first phase
freed and the allocator kept can only make it look smaller. Rank 0 prints each rank's growth in both, and their
ratio beyond the rank's own shard: on the CPU (gloo) the shard lives in host memory in both phases; on a GPU
(NCCL) it and the broadcast buffer are on the device, and the host holds what is beyond it.

Run (CPU, gloo, ~1 min)::

    torchrun --nproc-per-node 2 benchmarks/bench_fsdp_load.py
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from bench_fsdp_memory import _config as qwen3_shape
from timing import rss_growth_during
from torch.distributed.tensor import DTensor


def _base(args: argparse.Namespace, root: Path) -> None:
    """A random Qwen3-shaped BF16 base with a tokenizer, in ``root``."""
    from transformers import AutoModelForCausalLM

    from ida_trainer.demo import corpus_texts, train_demo_tokenizer

    cfg = qwen3_shape(args)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(root)
    train_demo_tokenizer(corpus_texts()).save_pretrained(root)


def _load_and_shard(base: Path, info: Any, *, every_rank_loads: bool) -> tuple[float, int]:
    """Seconds to load and shard, and the bytes of this rank's shard (parameters and buffers)."""
    from ida_eval import load_model
    from ida_eval.loader import empty_model
    from ida_trainer.config import PrecisionConfig
    from ida_trainer.distributed import apply_fsdp
    from ida_trainer.precision import apply_recipe

    start = time.perf_counter()
    loads = info.is_main or every_rank_loads
    model, _ = (load_model if loads else empty_model)(base, dtype=torch.float32)
    apply_recipe(model, PrecisionConfig(recipe="bf16"))
    apply_fsdp(model, info)
    dist.barrier()
    seconds = time.perf_counter() - start
    shard = sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in [*model.parameters(), *model.buffers()])
    del model
    gc.collect()
    return seconds, shard


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4; Qwen3-4B has 36)")
    ap.add_argument("--hidden", type=int, default=0, help="a toy width instead of Qwen3-4B's (smoke runs)")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary with --hidden (default 512)")
    args = ap.parse_args(argv)

    from ida_trainer.config import ParallelConfig
    from ida_trainer.distributed import init_distributed
    from ida_trainer.memory import GIB

    info = init_distributed(ParallelConfig(data_parallel="fsdp"))
    box = [tempfile.mkdtemp(prefix="bench_fsdp_load.") if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    base = Path(box[0])
    try:
        if info.is_main:
            _base(args, base)
        dist.barrier()
        size = sum(f.stat().st_size for f in base.glob("*.safetensors"))
        _load_and_shard(base, info, every_rank_loads=False)  # warm-up: imports and first-call caches, unmeasured
        rows = []
        for every_rank_loads in (False, True):
            seconds, grown = rss_growth_during(
                lambda e=every_rank_loads: _load_and_shard(base, info, every_rank_loads=e)
            )
            rows.append((seconds, grown))
        per_rank: list[Any] = [None] * info.world_size
        dist.all_gather_object(per_rank, rows)
        if info.is_main:
            print(
                f"Qwen3-4B shape, {args.layers} layers, base {size / GIB:.2f} GiB BF16 (FP32 in memory: "
                f"{2 * size / GIB:.2f} GiB); FSDP2 over {info.world_size} rank(s) ({info.backend}), bf16 recipe"
            )
            print(
                "rank | its shard GiB | rank 0 loads (ida): host RSS +GiB, s | every rank loads (baseline): +GiB, s "
                "| ida / baseline, beyond the shard"
            )
            for rank, (((s_ida, shard), ida), ((s_base, _), baseline)) in enumerate(per_rank):
                print(
                    f"{rank} | {shard / GIB:.2f} | +{ida / GIB:.2f}, {s_ida:.1f} | +{baseline / GIB:.2f}, {s_base:.1f} "
                    f"| {max(ida - shard, 0) / max(baseline - shard, 1):.2f}x"
                )
    finally:
        dist.barrier()
        if info.is_main:
            shutil.rmtree(base, ignore_errors=True)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
