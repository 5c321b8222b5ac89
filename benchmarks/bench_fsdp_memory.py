"""One FSDP2 rank's peak GPU memory beside ``ida_trainer.memory.fsdp_memory``'s count of it.

The count (docs/trainer_precision.md, "FSDP2") is exact for the shards and rule-based for what FSDP2 gathers;
neither it nor the trainer's FSDP path over NCCL had run on a GPU. This runs them: a Qwen3-4B-shaped model with
random weights and fewer layers (default 4; hidden 2560, 32 heads / 8 KV, MLP 9728, vocabulary 151936, tied
embeddings), the bf16 recipe, activation checkpointing, ``fully_shard``-ed by the trainer's ``apply_fsdp`` over
the launched process group (NCCL on a GPU, gloo on the CPU), trained by ``LocalEngine`` (its chunked
``lm_head`` + loss above 2**27 logits), ``grad_norm_and_clip`` and AdamW on one micro-batch of ``--tokens``
random ids per rank. Rank 0 prints the count's parts, the peak ``torch.cuda.max_memory_allocated`` over the
steps after the first (AdamW's moments exist from then on), and measured / counted (the count without its
0.75 GiB of CUDA runtime, which the allocator does not see). On the CPU nothing is measured: a smoke run
(tests/ida_trainer/test_bench_fsdp_memory.py).

Run (one GPU, ~30 s)::

    torchrun --nproc-per-node 1 benchmarks/bench_fsdp_memory.py
    torchrun --nproc-per-node 2 benchmarks/bench_fsdp_memory.py --layers 8 --tokens 16384
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch


def _config(args: argparse.Namespace) -> Any:
    from ida_trainer.memory import qwen3_4b_config

    cfg = qwen3_4b_config()
    cfg.num_hidden_layers = args.layers
    if args.hidden:  # a toy shape (the CPU smoke run): width, heads and vocabulary scaled down together
        cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size = args.hidden, 4 * args.hidden, args.vocab
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, args.hidden // 4
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4; Qwen3-4B has 36)")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch per rank (default 8192)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps; the peak is taken after the first")
    ap.add_argument("--hidden", type=int, default=0, help="a toy width instead of Qwen3-4B's (smoke runs)")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary with --hidden (default 512)")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from ida_trainer.config import OptimConfig, ParallelConfig, PrecisionConfig
    from ida_trainer.distributed import apply_fsdp, init_distributed
    from ida_trainer.engine import LocalEngine, enable_activation_checkpointing, grad_norm_and_clip
    from ida_trainer.memory import GIB, ActivationSpec, fsdp_memory
    from ida_trainer.precision import apply_recipe, build_optimizer

    info = init_distributed(ParallelConfig(data_parallel="fsdp"))
    cfg = _config(args)
    prec = PrecisionConfig(recipe="bf16")
    count = fsdp_memory(cfg, prec, ranks=info.world_size, activations=ActivationSpec(args.tokens))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).train()
    enable_activation_checkpointing(model)
    apply_recipe(model, prec)
    apply_fsdp(model, info)
    engine = LocalEngine(model, device=info.device)
    optim = OptimConfig(name="adamw", lr=1e-5, betas=(0.9, 0.95), weight_decay=0.01, grad_clip=1.0)
    opt = build_optimizer(model, optim, prec)
    cuda = info.device.type == "cuda"
    g = torch.Generator().manual_seed(1 + info.rank)
    peak = 0
    for step in range(args.steps):
        ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=g)
        mb = {"input_ids": ids, "labels": torch.roll(ids, -1, 1)}
        engine.forward_backward([mb], global_valid_tokens=args.tokens * info.world_size)
        grad_norm_and_clip(engine.parameters(), optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            if step > 0:
                peak = max(peak, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
    if info.rank == 0:
        parts = {
            "weights": count.weights_bytes,
            "grads": count.grads_bytes,
            "optimizer": count.optimizer_bytes,
            "gathered": count.transient_bytes,
            "activations": count.activation_bytes,
            "logits": count.logits_bytes,
        }
        counted = count.total_bytes - count.runtime_bytes
        print(
            f"Qwen3-4B shape, {args.layers} layers, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size}; FSDP2 over "
            f"{info.world_size} rank(s) ({info.backend}), {args.tokens} tokens per micro-batch, bf16 recipe"
        )
        print(
            "count (GiB): " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in parts.items()) + f"; total {counted / GIB:.2f}"
        )
        if cuda:
            print(
                f"measured peak {peak / GIB:.2f} GiB = {peak / counted:.3f}x the count (rank 0, steps 2-{args.steps})"
            )
        else:
            print("no GPU: nothing measured (a smoke run)")
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
