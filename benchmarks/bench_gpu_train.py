"""Training throughput and memory on one GPU: the nvfp4 recipe against the bf16 recipe, side by side.

The model is Minitron-4B's shape with random weights (NemotronForCausalLM: hidden 3072, 32 layers, 24
heads, 8 KV heads, MLP 9216, vocabulary 256000; nothing is downloaded), trained the way the
``minitron-4b`` preset trains it, through the trainer's own parts: the data pipeline (the shipped demo
corpus, tokenized and packed into ``--seq``-token rows by ``build_batcher``), ``LocalEngine`` (forward,
loss, backward over the micro-batches), activation checkpointing, ``grad_norm_and_clip`` and the
recipe's optimizer (nvfp4: MXFP8 masters, Lion with BF16 momentum, stochastic write-back, layers 0 and
L-1 kept BF16 as in the preset; bf16: FP32 masters under BF16 autocast, AdamW).  Each recipe runs in its
own child process (clean peak-memory counters, an out-of-memory in one cannot hide the other).  The
bf16 recipe runs first: where it does not fit at ``--micro-batch`` rows (its FP32 masters and AdamW
moments take ~62 GiB at 4B: it peaked at 78.8 GiB at 2 rows on an H200, more than an 80 GB H100 gives), the
micro-batch is halved and the number of micro-batches doubled, down to 1 row (the same tokens per step),
then 8 decoder layers fewer at a time (the same width; at 4B and 1 row the bf16 recipe needs ~78 GiB, which
an 80 GB H100 may not give). Settings that ``ida_trainer.memory``'s count puts above the GPU's memory are
not tried (each failed try costs ~30 s). The nvfp4 recipe then runs at the setting that fitted, so that both
are measured like for like; the table says so. Where layers had to go, the nvfp4 recipe also runs the full
shape once more (a line below the table: what fits on this GPU with nvfp4 and not with bf16).

Per recipe: tokens/s (median of the timed steps, each synchronised), MFU against the dense BF16 peak
(``--peak-tflops``, 989 for an H100/H200 SXM; model FLOPs = 6 x matmul parameters x tokens plus the
attention scores, activation recomputation not counted) and peak GPU memory (``max_memory_allocated``).
Targets (issue 22): nvfp4 >= 0.8x bf16's tokens/s, nvfp4 peak memory <= 0.5x bf16's.  Exit 1 when one
is missed or a recipe failed, 0 with a message when there is no GPU; ``--device cpu`` runs the same code at
toy sizes and judges no target (a smoke test: tests/ida_trainer/test_bench_gpu_train.py).

Run::

    python benchmarks/bench_gpu_train.py                      # 4B shape, 2 warm-up + 6 timed steps per recipe
    python benchmarks/bench_gpu_train.py --layers 8 --steps 3 # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ida_common.files import atomic_write_text

SPEED_TARGET = 0.8  # nvfp4 tokens/s / bf16 tokens/s, at least
MEMORY_TARGET = 0.5  # nvfp4 peak / bf16 peak, at most
RECIPES = ("nvfp4", "bf16")  # table order; the bf16 recipe (the larger) is measured first
EXIT_OUT_OF_MEMORY = 3  # a child that ran out of memory (the project's "this machine cannot" status)
LAYER_STEP = 8  # decoder layers dropped at a time when the bf16 recipe does not fit at 1 row per micro-batch
PREDICTION_MARGIN = 1.05  # measured / ida_trainer.memory's count, bf16 recipe at 4B (78.8 / 75.1 GiB, H200;
# measured with autocast's weight-cast cache on and LocalEngine's whole logits (~13.7 GiB), counted then with every
# layer's BF16 copy held: both are gone since 2026-12-07, recalibrate from the next run)
OUTSIDE_TORCH_GIB = 1.0  # device memory torch's allocator does not count: the CUDA context, cuBLAS workspaces


def smaller_setting(micro_batch: int, microbatches: int, layers: int) -> tuple[int, int, int] | None:
    """The next (micro-batch, micro-batches, layers) to try after the bf16 recipe ran out of memory: half
    the rows per micro-batch and twice the micro-batches (the same tokens per step) down to 1 row, then
    ``LAYER_STEP`` decoder layers fewer down to ``LAYER_STEP``; None when nothing smaller is left.

    Example:
        >>> smaller_setting(2, 4, 32), smaller_setting(1, 8, 32), smaller_setting(1, 8, 8)
        ((1, 8, 32), (1, 8, 24), None)
    """
    if micro_batch > 1:
        return micro_batch // 2, 2 * microbatches, layers
    if layers > LAYER_STEP:
        return micro_batch, microbatches, layers - LAYER_STEP
    return None


def _model_config(args: argparse.Namespace, layers: int, eos_token_id: int | None = None) -> Any:
    """The benchmark's NemotronConfig (Minitron-4B's shape by default) with ``layers`` decoder layers."""
    from transformers import NemotronConfig

    return NemotronConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=max(4096, args.seq),
        tie_word_embeddings=False,
        bos_token_id=None,
        pad_token_id=None,
        eos_token_id=eos_token_id,
    )


def bf16_predicted_gib(args: argparse.Namespace, micro_batch: int, layers: int) -> float:
    """The bf16 recipe's peak GiB at this setting: ``ida_trainer.memory``'s count on the meta device times
    ``PREDICTION_MARGIN`` (it counted 75.1 GiB where the H200 measured 78.8 at 4B, 2 rows)."""
    from ida_trainer.config import PrecisionConfig
    from ida_trainer.memory import ActivationSpec, stage_memory

    spec = ActivationSpec(tokens_per_microbatch=micro_batch * args.seq)
    stage = stage_memory(_model_config(args, layers), PrecisionConfig(recipe="bf16"), stages=1, activations=spec)[0]
    return stage.total_bytes * PREDICTION_MARGIN / 2**30


def _gpu_memory_gib() -> float:
    """The GPU's memory, asked in a short-lived child process: a CUDA context in this parent (torch creates one
    for the question) would hold memory the children need."""
    ask = "import torch; print(torch.cuda.mem_get_info()[1])"
    res = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, check=True, timeout=120)
    return int(res.stdout.split()[-1]) / 2**30


def _model_flops_per_token(cfg: Any, seq: int) -> float:
    """6 x matmul parameters (projections + lm_head) + 6 x the attention score/value products per token."""
    h, layers, inter, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = h * h + 2 * h * kv + h * h + 2 * h * inter  # q, k, v, o; Nemotron MLP: up + down (no gate)
    return 6.0 * (layers * per_layer + h * vocab) + 6.0 * layers * 2 * seq * h / 2  # causal: half the scores


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Build, train ``warmup + steps`` steps with one recipe on the GPU, measure (runs in a child)."""
    from transformers import NemotronForCausalLM

    from ida_trainer.config import DataConfig, OptimConfig, PrecisionConfig
    from ida_trainer.data import build_batcher, load_examples
    from ida_trainer.demo import corpus_path, corpus_texts, train_demo_tokenizer
    from ida_trainer.engine import LocalEngine, enable_activation_checkpointing, grad_norm_and_clip
    from ida_trainer.precision import apply_recipe, build_optimizer, count_parameters

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    t_setup = time.perf_counter()
    tokenizer = train_demo_tokenizer(corpus_texts())
    data_cfg = DataConfig(max_len=args.seq, packing=True)
    examples, _ = load_examples(data_cfg, tokenizer, path=corpus_path())
    if args.vocab < len(tokenizer):
        raise SystemExit(f"bench_gpu_train: --vocab {args.vocab} is below the demo tokenizer's {len(tokenizer)} tokens")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batcher = build_batcher(
        data_cfg,
        examples,
        global_batch_size=args.micro_batch * args.microbatches,
        microbatches=args.microbatches,
        seed=0,
        pad_id=pad,
    )
    cfg = _model_config(args, args.layers, eos_token_id=tokenizer.eos_token_id)
    with dev:
        model = NemotronForCausalLM(cfg).train()
    recipe = args.only
    keep = ("model.layers.0.*", f"model.layers.{args.layers - 1}.*") if recipe == "nvfp4" else ()
    prec = PrecisionConfig(recipe=recipe, keep_bf16=keep)
    optim = (
        OptimConfig(name="lion", lr=1e-5, betas=(0.9, 0.99), grad_clip=1.0)
        if recipe == "nvfp4"
        else OptimConfig(name="adamw", lr=1e-5, betas=(0.9, 0.95), weight_decay=0.01, grad_clip=1.0)
    )
    enable_activation_checkpointing(model)
    apply_recipe(model, prec)
    model.to(dev)
    n_params = count_parameters(model)
    engine = LocalEngine(model, device=dev)
    opt = build_optimizer(model, optim, prec)
    sync()
    setup_s = time.perf_counter() - t_setup
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, tokens, losses = [], [], []
    for i in range(args.warmup + args.steps):
        batch = batcher.next_step()
        sync()
        t0 = time.perf_counter()
        loss = engine.forward_backward(batch.microbatches, batch.global_valid_tokens)
        grad_norm_and_clip(engine.parameters(), optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(batch.num_tokens)
            losses.append(loss)
    prof = None
    if args.profile:
        try:  # a profiler that fails (even out of memory) keeps the measurement above
            prof = _profile_step(engine, opt, batcher, optim.grad_clip, sync)
        except Exception as e:  # noqa: BLE001
            print(f"bench_gpu_train: the profiled step failed: {type(e).__name__}: {e}", file=sys.stderr)
    step_s = statistics.median(times)
    tok_s = statistics.mean(tokens) / step_s
    flops = _model_flops_per_token(cfg, args.seq) * tok_s
    import nvfp4_cuda

    backend = str(nvfp4_cuda.backend_info()["backend"]) if recipe == "nvfp4" else "torch bf16"
    return {
        "recipe": recipe,
        "params": n_params,
        "tokens_per_step": statistics.mean(tokens),
        "step_s": step_s,
        "tokens_per_s": tok_s,
        "mfu": flops / (args.peak_tflops * 1e12),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "setup_s": setup_s,
        "losses": losses,
        "backend": backend,
        "profile": prof,
    }


def _profile_step(engine: Any, opt: Any, batcher: Any, grad_clip: float, sync: Any) -> dict[str, Any]:
    """One more step under torch.profiler: device time per kernel name (top 25) and in all, and the wall time."""
    from torch.profiler import ProfilerActivity, profile

    from ida_trainer.engine import grad_norm_and_clip

    batch = batcher.next_step()
    sync()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.forward_backward(batch.microbatches, batch.global_valid_tokens)
        grad_norm_and_clip(engine.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
    wall = time.perf_counter() - t0

    def dev_us(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))

    kernels = [(e.key, dev_us(e), e.count) for e in prof.key_averages() if dev_us(e) > 0]
    kernels.sort(key=lambda k: -k[1])
    return {
        "wall_ms_profiled": 1e3 * wall,
        "device_ms": sum(k[1] for k in kernels) / 1e3,
        "top": [{"kernel": k[:120], "ms": t / 1e3, "calls": c} for k, t, c in kernels[:25]],
    }


def main(argv: list[str] | None = None) -> int:
    """Parent: one child per recipe, then the side-by-side table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=9216)
    ap.add_argument("--vocab", type=int, default=256000)
    ap.add_argument("--seq", type=int, default=2048, help="tokens per packed row")
    ap.add_argument("--micro-batch", type=int, default=2, help="rows per micro-batch")
    ap.add_argument("--microbatches", type=int, default=4, help="micro-batches per optimizer step")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per recipe")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense BF16 peak for MFU (H100/H200 SXM)")
    ap.add_argument(
        "--profile", action="store_true", help="one extra step under torch.profiler: device time per kernel"
    )
    ap.add_argument("--out-json", default=None)
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the same code at toy sizes (a smoke test)")
    ap.add_argument("--only", choices=RECIPES, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--child-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: GPU training benchmark not run")
        return 0
    if args.only:
        try:
            Path(args.child_json).write_text(json.dumps(run_one(args)))
        except Exception as e:
            from ida_common.cli import is_out_of_memory

            if not is_out_of_memory(e):
                raise
            print(
                f"bench_gpu_train: {args.only} recipe, micro-batch {args.micro_batch}: {str(e)[:300]}", file=sys.stderr
            )
            return EXIT_OUT_OF_MEMORY
        return 0
    results: dict[str, Any] = {}
    notes: list[str] = []
    passthrough = list(argv if argv is not None else sys.argv[1:])
    full_layers = args.layers
    with tempfile.TemporaryDirectory() as tmp:

        def child(recipe: str, layers: int) -> tuple[int, dict[str, Any]]:
            out = Path(tmp) / f"{recipe}-{layers}.json"
            res = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    *passthrough,
                    "--micro-batch",
                    str(args.micro_batch),
                    "--microbatches",
                    str(args.microbatches),
                    "--layers",
                    str(layers),
                    "--only",
                    recipe,
                    "--child-json",
                    str(out),
                ],
                check=False,
            )
            if res.returncode == 0 and out.exists():
                return 0, json.loads(out.read_text())
            error = (
                f"out of memory at {args.micro_batch} rows per micro-batch, {layers} layers"
                if res.returncode == EXIT_OUT_OF_MEMORY
                else f"child exited {res.returncode}"
            )
            return res.returncode, {"recipe": recipe, "error": error}

        if args.device == "cuda":  # settings the bf16 recipe cannot fit here by the count: not tried (~30 s each)
            total_gib = _gpu_memory_gib() - OUTSIDE_TORCH_GIB
            while (smaller := smaller_setting(args.micro_batch, args.microbatches, args.layers)) is not None and (
                need := bf16_predicted_gib(args, args.micro_batch, args.layers)
            ) > total_gib:
                notes.append(
                    f"The bf16 recipe is predicted to need {need:.1f} GiB at {args.micro_batch} x {args.microbatches} "
                    f"rows and {args.layers} layers, more than this GPU's {total_gib:.1f} GiB for torch (ida_trainer.memory x "
                    f"{PREDICTION_MARGIN}): both recipes measured at {smaller[0]} x {smaller[1]} rows and "
                    f"{smaller[2]} layers."
                )
                args.micro_batch, args.microbatches, args.layers = smaller
        for recipe in reversed(RECIPES):  # bf16 first: the setting it fits is the one both run at
            rc, results[recipe] = child(recipe, args.layers)
            while rc == EXIT_OUT_OF_MEMORY and recipe == "bf16":
                smaller = smaller_setting(args.micro_batch, args.microbatches, args.layers)
                if smaller is None:
                    break
                notes.append(
                    f"The bf16 recipe ran out of GPU memory at {args.micro_batch} x {args.microbatches} rows and "
                    f"{args.layers} layers: both recipes measured at {smaller[0]} x {smaller[1]} rows and "
                    f"{smaller[2]} layers (same tokens per step)."
                )
                args.micro_batch, args.microbatches, args.layers = smaller
                rc, results[recipe] = child(recipe, args.layers)
        lines, ok = _table(args, results, notes)
        print("\n".join(lines), flush=True)  # before the extra run below: a time limit cannot take it
        _write_json(args, results, lines)
        if args.layers < full_layers and "error" not in results["nvfp4"]:
            # what this GPU trains with nvfp4 and not with bf16: the full shape, at the same micro-batches
            _, results["nvfp4_full"] = child("nvfp4", full_layers)
            r = results["nvfp4_full"]
            extra = (
                f"nvfp4 at the full {full_layers} layers ({r['params']} params), where the bf16 recipe does not "
                f"fit: {r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f} %, peak {r['peak_mem_gib']:.1f} GiB"
                if "error" not in r
                else f"nvfp4 at the full {full_layers} layers: {r['error']}"
            )
            print(extra)
            lines.append(extra)
            _write_json(args, results, lines)
    return 0 if ok else 1


def _write_json(args: argparse.Namespace, results: dict[str, Any], lines: list[str]) -> None:
    if args.out_json:
        atomic_write_text(
            args.out_json, json.dumps({"config": vars(args), "results": results, "table": lines}, indent=1)
        )


def _table(args: argparse.Namespace, results: dict[str, Any], notes: list[str]) -> tuple[list[str], bool]:
    """The side-by-side table of the two recipes (at the setting both ran), and whether the targets hold."""
    shape = (
        f"NemotronForCausalLM hidden {args.hidden}, {args.layers} layers, {args.heads} heads "
        f"({args.kv_heads} KV), "
        f"MLP {args.intermediate}, vocab {args.vocab}; {args.micro_batch} x {args.microbatches} rows of {args.seq} "
        f"tokens per step; {args.warmup} warm-up + {args.steps} timed steps; "
        f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, "
        f"torch {torch.__version__}"
    )
    lines = [
        shape,
        *notes,
        "",
        "| recipe | params | s/step | tokens/s | MFU | peak GiB | vs bf16 tokens/s | vs bf16 memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ok = all("error" not in r for r in results.values())
    if ok:
        b = results["bf16"]
        for r in (results[k] for k in RECIPES):
            lines.append(
                f"| {r['recipe']} ({r['backend']}) | {r['params']} | {r['step_s']:.3f} | "
                f"{r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f} % | {r['peak_mem_gib']:.1f} | "
                f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x | "
                f"{r['peak_mem_gib'] / b['peak_mem_gib']:.2f}x |"
            )
        speed = results["nvfp4"]["tokens_per_s"] / b["tokens_per_s"]
        mem = results["nvfp4"]["peak_mem_gib"] / b["peak_mem_gib"]
        met = speed >= SPEED_TARGET and mem <= MEMORY_TARGET
        verdict = ("PASS" if met else "MISS") if args.device == "cuda" else "targets apply to a GPU run only"
        ok = met or args.device != "cuda"
        lines.append(
            f"\nnvfp4 / bf16: tokens/s {speed:.2f}x (target >= {SPEED_TARGET}), peak memory {mem:.2f}x "
            f"(target <= {MEMORY_TARGET}): {verdict}"
        )
    else:
        lines += [
            f"| {k} | "
            + (r["error"] if "error" in r else f"{r['tokens_per_s']:.0f} tokens/s, peak {r['peak_mem_gib']:.1f} GiB")
            + " |"
            for k, r in results.items()
        ]
    for r in results.values():
        if r.get("profile"):
            pr = r["profile"]
            lines.append(
                f"\n{r['recipe']}: one profiled step, {pr['device_ms']:.0f} ms of kernels in "
                f"{pr['wall_ms_profiled']:.0f} ms wall; top kernels (ms, calls):"
            )
            lines += [f"  {k['ms']:8.1f} {k['calls']:6d}  {k['kernel']}" for k in pr["top"][:15]]
    return lines, ok


if __name__ == "__main__":
    sys.exit(main())
