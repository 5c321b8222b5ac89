"""Training-step cost of the nvfp4 recipe (reference backend on CPU) against the bf16 recipe, side by side.

Baseline: the bf16 recipe (FP32 master, BF16 autocast GEMMs, AdamW) on the same demo model (tiny
NemotronForCausalLM from ``ida_trainer.demo``, tokenizer trained on the shipped corpus), the same
micro-batches (the trainer's own data pipeline), the same engine (``LocalEngine``).  A step is
forward + backward over all micro-batches plus the optimizer step.  Steps of the two recipes are
interleaved (A B A B ...) so that load from other processes hits both alike; the median is reported.

Target (issue 5): nvfp4 step <= 3x the bf16 step.

Run:  python benchmarks/bench_trainer_step.py [--steps 12] [--hidden 128] [--layers 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from ida_trainer.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig
from ida_trainer.data import build_batcher, load_examples
from ida_trainer.demo import build_demo_model, corpus_path, corpus_texts, train_demo_tokenizer
from ida_trainer.engine import LocalEngine
from ida_trainer.precision import apply_recipe, build_optimizer

TARGET_RATIO = 3.0  # nvfp4 step / bf16 step, at most


def _setup(recipe: str, model_cfg: ModelConfig, tokenizer: object) -> tuple[LocalEngine, torch.optim.Optimizer]:
    model = build_demo_model(model_cfg, tokenizer, seed=0)
    prec = PrecisionConfig(recipe=recipe)
    apply_recipe(model, prec)
    optim = (
        OptimConfig(name="lion", lr=1e-3)
        if recipe == "nvfp4"
        else OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.95))
    )
    return LocalEngine(model), build_optimizer(model, optim, prec)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the side-by-side table; exit 1 when the ratio misses the target."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per recipe (after 2 warm-up steps)")
    ap.add_argument("--hidden", type=int, default=ModelConfig().hidden_size)
    ap.add_argument("--layers", type=int, default=ModelConfig().num_layers)
    ap.add_argument("--intermediate", type=int, default=ModelConfig().intermediate_size)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    tokenizer = train_demo_tokenizer(corpus_texts())
    model_cfg = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, intermediate_size=args.intermediate)
    data_cfg = DataConfig(max_len=args.max_len, packing=True)
    examples, _ = load_examples(data_cfg, tokenizer, path=corpus_path())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batcher = build_batcher(
        data_cfg, examples, global_batch_size=args.batch, microbatches=args.microbatches, seed=0, pad_id=pad
    )
    batches = [batcher.next_step() for _ in range(args.steps + 2)]
    runs = {r: _setup(r, model_cfg, tokenizer) for r in ("bf16", "nvfp4")}
    times: dict[str, list[float]] = {r: [] for r in runs}
    losses: dict[str, float] = {}
    for i, batch in enumerate(batches):
        for recipe, (engine, opt) in runs.items():
            t0 = time.perf_counter()
            losses[recipe] = engine.forward_backward(batch.microbatches, batch.global_valid_tokens)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= 2:
                times[recipe].append(time.perf_counter() - t0)
    tokens = statistics.mean(b.num_tokens for b in batches)
    med = {r: statistics.median(v) for r, v in times.items()}
    ratio = med["nvfp4"] / med["bf16"]
    print(
        f"demo NemotronForCausalLM hidden {args.hidden}, {args.layers} layers, intermediate {args.intermediate}; "
        f"{args.batch} x {args.max_len}-token packed rows per step ({tokens:.0f} tokens), "
        f"{args.microbatches} micro-batches, {args.steps} timed steps, {args.threads} threads, "
        f"torch {torch.__version__}"
    )
    print("| recipe | median s/step | tokens/s | vs bf16 | last loss |")
    print("|---|---|---|---|---|")
    for r in ("bf16", "nvfp4"):
        print(f"| {r} | {med[r]:.3f} | {tokens / med[r]:.0f} | {med[r] / med['bf16']:.2f}x | {losses[r]:.3f} |")
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"nvfp4 / bf16 step cost: {ratio:.2f}x (target <= {TARGET_RATIO:.1f}x): {verdict}")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
