"""What a pipelined run's checkpoint save adds to rank 0's host memory: streamed (now) vs every stage's state
pickled to rank 0 first (the save before 2026-12-07), in the same run.

A Minitron-4B-shaped model (``ida_trainer.memory.minitron_4b_config``: hidden 3072, MLP 9216, 24 heads / 8 KV,
vocabulary 256000) with fewer layers and random weights, the nvfp4 recipe, split over the launched processes by
the trainer's ``PipelineEngine``; one Lion step so that the optimizer state exists. Then the trainer's checkpoint
save, :func:`ida_trainer.checkpoint.save_checkpoint` of :meth:`~ida_trainer.distributed.PipelineEngine.streamed_state`
(each tensor sent to rank 0 by the stage that holds it as it is written), and the baseline: the same
``save_checkpoint`` after every stage's ``export_state`` and optimizer state went to rank 0 through
``gather_object`` and were merged (:func:`~ida_trainer.precision.merge_stage_states`), as the trainer did before.
Rank 0 prints each save's time and the growth of its RSS over it (sampled every 2 ms), the streamed save first
(memory the baseline frees and the allocator keeps can then only make the baseline look smaller), and checks
that both saves wrote the same bytes.

Run (CPU, gloo; on GPUs NCCL)::

    torchrun --nproc-per-node 2 benchmarks/bench_pipeline_save.py                     # 4 layers
    torchrun --nproc-per-node 2 benchmarks/bench_pipeline_save.py --layers 2 --hidden 256 --vocab 4096   # smoke
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from timing import rss_growth_during


def _config(args: argparse.Namespace) -> Any:
    from ida_trainer.memory import minitron_4b_config

    cfg = minitron_4b_config()
    cfg.num_hidden_layers = args.layers
    if args.hidden:  # a toy shape: width, heads and vocabulary scaled down together
        cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size = args.hidden, 3 * args.hidden, args.vocab
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, args.hidden // 4
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4; Minitron-4B has 32)")
    ap.add_argument("--hidden", type=int, default=0, help="a toy width instead of Minitron-4B's (smoke runs)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary with --hidden (default 4096)")
    args = ap.parse_args(argv)

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from ida_common.launch import launch_env
    from ida_trainer import checkpoint as ckpt
    from ida_trainer.config import OptimConfig, ParallelConfig, PrecisionConfig
    from ida_trainer.demo import corpus_texts, train_demo_tokenizer
    from ida_trainer.distributed import PipelineEngine, init_distributed
    from ida_trainer.memory import GIB
    from ida_trainer.precision import apply_recipe, build_optimizer, export_state, merge_stage_states
    from mxfp8_codec import MXFP8Tensor

    parallel = ParallelConfig(pipeline_stages=launch_env().world_size, microbatches=4)
    info = init_distributed(parallel)
    cfg = _config(args)
    prec = PrecisionConfig(recipe="nvfp4")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).train()  # the recipe's dtype, as loaded
    apply_recipe(model, prec)
    engine = PipelineEngine(model, parallel, info)
    opt = build_optimizer(engine.stage_module, OptimConfig(name="lion", lr=1e-5), prec)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (4, 1, 64), generator=g)
    engine.forward_backward([{"input_ids": i, "labels": i} for i in ids], global_valid_tokens=4 * 64)
    opt.step()
    opt.zero_grad(set_to_none=True)

    tokenizer = train_demo_tokenizer(corpus_texts())
    box = [tempfile.mkdtemp(prefix="bench_pipeline_save.") if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    root = Path(box[0])

    def write(where: str, tensors: Any, optimizer_state: Any, fetch: Any) -> Path:
        return ckpt.save_checkpoint(
            root / where, 1, tensors=tensors, model_config=model.config, generation_config=model.generation_config,
            tokenizer=tokenizer, optimizer_state=optimizer_state, optimizer_fetch=fetch,
            trainer_state={"step": 1}, metadata={"producer": "bench_pipeline_save"}, keep=1,
        )  # fmt: skip

    def streamed() -> Path | None:
        with engine.streamed_state(opt) as contents:
            return None if contents is None else write("streamed", *contents)

    def gathered_first() -> Path | None:  # the save before 2026-12-07
        local = {
            k: MXFP8Tensor(v.payload.cpu(), v.scales.cpu()) if isinstance(v, MXFP8Tensor) else v.cpu()
            for k, v in export_state(engine.stage_module).items()
        }
        skeleton, leaves = ckpt.flatten_state(opt.state_dict())
        state = ckpt.unflatten_state(skeleton, {n: t.cpu() for n, t in leaves.items()})
        parts: list[Any] = [None] * info.world_size if info.is_main else []
        dist.gather_object((local, state), parts if info.is_main else None, dst=0)
        if not info.is_main:
            return None
        weights = {k: v for part, _ in parts for k, v in part.items()}
        return write("gathered-first", weights, merge_stage_states([s for _, s in parts]), None)

    rows = []
    for name, fn in (
        ("streamed (now)", streamed),
        ("every stage's state pickled to rank 0 first (before)", gathered_first),
    ):
        t0 = time.perf_counter()
        path, grew = rss_growth_during(fn)
        rows.append((name, time.perf_counter() - t0, grew, path))
        dist.barrier()
    if info.is_main:
        size = sum(f.stat().st_size for f in rows[0][3].iterdir())
        same = all(
            (rows[0][3] / f).read_bytes() == (rows[1][3] / f).read_bytes()
            for f in ("model.safetensors", ckpt.OPTIM_FILE)
        )
        print(
            f"Minitron-4B shape, {args.layers} layers, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size}; nvfp4 "
            f"recipe, {info.world_size} pipeline stages ({info.backend}); checkpoint {size / GIB:.2f} GiB"
        )
        for name, seconds, grew, _ in rows:
            print(f"save {name}: {seconds:.1f} s, rank 0 host RSS +{grew / GIB:.2f} GiB")
        print(
            f"streamed / before: host {rows[0][2] / max(rows[1][2], 1):.2f}x, time {rows[0][1] / rows[1][1]:.2f}x; "
            f"the same bytes: {same}"
        )
        shutil.rmtree(root, ignore_errors=True)
        if not same:
            return 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
