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

Then (``--save``, the default) the trainer's checkpoint save of that state, streamed one full tensor at a time
(:func:`ida_trainer.checkpoint.streamed_state` into :func:`~ida_trainer.checkpoint.save_checkpoint`, in a temporary
directory), and its round trip: every rank reads it back as ``--resume`` does and compares the shards it cuts with
its own, bit for bit. Rank 0 prints what the save added to its GPU memory (peak over the save) and to its host
RSS (sampled every 2 ms), beside the largest full tensor and the whole state: what a save gathered before
2026-12-07. ``--baseline`` then measures that save too: the same ``save_checkpoint`` with every full tensor
gathered onto rank 0 before the write, and prints the ratios (second, so that memory the streamed save freed
and the allocator kept can only make the baseline look smaller).

Run (one GPU, ~30 s)::

    torchrun --nproc-per-node 1 benchmarks/bench_fsdp_memory.py
    torchrun --nproc-per-node 2 benchmarks/bench_fsdp_memory.py --layers 8 --tokens 16384
    torchrun --nproc-per-node 2 benchmarks/bench_fsdp_memory.py --hidden 1024 --vocab 65536 --tokens 256 --baseline
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
    from ida_trainer.memory import qwen3_4b_config

    cfg = qwen3_4b_config()
    cfg.num_hidden_layers = args.layers
    if getattr(cfg, "layer_types", None):  # one per layer (checked when the config is saved)
        cfg.layer_types = cfg.layer_types[: args.layers]
    if args.hidden:  # a toy shape (the CPU smoke run): width, heads and vocabulary scaled down together
        cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size = args.hidden, 4 * args.hidden, args.vocab
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, args.hidden // 4
    return cfg


def _save_and_reload(model: torch.nn.Module, opt: torch.optim.Optimizer, info: Any, *, baseline: bool) -> None:
    """The trainer's streamed save of ``model`` and ``opt`` (then the baseline's, with ``baseline``), then every
    rank's round trip of the streamed one's shards."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from ida_trainer import checkpoint as ckpt
    from ida_trainer.demo import corpus_texts, train_demo_tokenizer
    from ida_trainer.memory import GIB
    from ida_trainer.sharded import shard_like

    tokenizer = train_demo_tokenizer(corpus_texts())  # a checkpoint directory carries one
    box = [tempfile.mkdtemp(prefix="bench_fsdp_save.") if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    root = Path(box[0])
    cuda = info.device.type == "cuda"

    def save(gathered_first: bool) -> Path | None:
        where = root / ("gathered-first" if gathered_first else "streamed")
        with ckpt.streamed_state(model, opt, main=info.is_main) as contents:
            if contents is None:
                return None
            tensors, optimizer_state, fetch = contents
            if gathered_first:  # the baseline: every full tensor on rank 0 before the write, as before 2026-12-07
                tensors = {k: tensors[k] for k in tensors}
                skeleton, leaves = ckpt.flatten_state(optimizer_state)
                optimizer_state, fetch = ckpt.unflatten_state(skeleton, {n: fetch(n) for n in leaves}), None
            return ckpt.save_checkpoint(
                where, 1, tensors=tensors, model_config=model.config, generation_config=model.generation_config,
                tokenizer=tokenizer, optimizer_state=optimizer_state, optimizer_fetch=fetch,
                trainer_state={"step": 1}, metadata={"producer": "bench_fsdp_memory"}, keep=1,
            )  # fmt: skip

    def measured(gathered_first: bool) -> tuple[Path | None, float, int, int]:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        gpu_before = torch.cuda.memory_allocated() if cuda else 0
        t0 = time.perf_counter()
        path, host = rss_growth_during(lambda: save(gathered_first))
        seconds = time.perf_counter() - t0
        dist.barrier()
        return path, seconds, (torch.cuda.max_memory_allocated() - gpu_before if cuda else 0), host

    path, seconds, gpu, host = measured(False)  # first: the baseline's freed memory would hide the growth
    if baseline:
        _, base_s, base_gpu, base_host = measured(True)
    # every rank, as --resume: the checkpoint read back (checked against its SHA256SUMS), its own shards cut
    with ckpt.load_checkpoint(root / "streamed" / ckpt.checkpoint_name(1)) as loaded:
        saved = ckpt.flatten_state(loaded.optimizer_state)[1]
    mine = ckpt.flatten_state(opt.state_dict())[1]

    def same(n: str, t: torch.Tensor) -> bool:
        if isinstance(t, DTensor):  # the slice this rank would load on --resume, against the one it holds
            return torch.equal(shard_like(saved[n], t).to_local(), t.to_local())
        return torch.equal(saved[n], t.cpu())

    differ = int(mine.keys() != saved.keys()) or sum(not same(n, t) for n, t in mine.items())
    bad = torch.tensor([differ], device=info.device)
    dist.all_reduce(bad)
    full = {n: t.numel() * t.element_size() for n, t in mine.items()}
    if info.is_main:
        assert path is not None
        print(
            f"save (streamed, {seconds:.1f} s, {sum(f.stat().st_size for f in path.iterdir()) / GIB:.2f} GiB written): "
            f"rank 0 GPU +{gpu / GIB:.2f} GiB, host RSS +{host / GIB:.2f} GiB; the largest full tensor "
            f"{max(full.values()) / GIB:.2f} GiB, the whole optimizer state {sum(full.values()) / GIB:.2f} GiB; "
            f"read back on every rank: {'exact' if int(bad) == 0 else f'{int(bad)} tensors DIFFER'}"
        )
        if baseline:
            print(
                f"baseline, every full tensor gathered before the write ({base_s:.1f} s): rank 0 GPU "
                f"+{base_gpu / GIB:.2f} GiB, host RSS +{base_host / GIB:.2f} GiB; streamed / baseline: GPU "
                f"{gpu / max(base_gpu, 1):.2f}x, host {host / max(base_host, 1):.2f}x, time {seconds / base_s:.2f}x"
            )
        shutil.rmtree(root, ignore_errors=True)
    if int(bad):
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4; Qwen3-4B has 36)")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch per rank (default 8192)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps; the peak is taken after the first")
    ap.add_argument("--hidden", type=int, default=0, help="a toy width instead of Qwen3-4B's (smoke runs)")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary with --hidden (default 512)")
    ap.add_argument("--save", action=argparse.BooleanOptionalAction, default=True, help="also save and reload")
    ap.add_argument("--baseline", action="store_true", help="with --save: first the save that gathers everything first")
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
    if args.save:
        _save_and_reload(model, opt, info, baseline=args.baseline)
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
