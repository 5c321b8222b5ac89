"""Learning comparison on the demo: does the nvfp4 recipe (MXFP8 master + SR write-back) learn like bf16?

Runs, on the embedded demo (tiny Nemotron, shipped code corpus, same seed and data order for every run):

* ``bf16``          BF16 compute, FP32 master, AdamW (the comparison recipe), its demo learning rate;
* ``nvfp4-sr``      NVFP4 compute, MXFP8 master, Lion, stochastic-rounding write-back (the default);
* ``nvfp4-comp``    the same with the ``compensated`` write-back (residual buffer);
* ``nvfp4-rne-low`` the same at a small learning rate (default 1e-5) with round-to-nearest write-back:
  the original engine's failure, where every update is smaller than half an MXFP8/BF16 spacing;
* ``nvfp4-sr-low``  the same small learning rate with stochastic rounding (the fix).

For each run it prints the mean training loss of the last 10 steps, the loss on the whole corpus (fixed,
no grad) before and after, and the fraction of master bytes (MXFP8 payloads, BF16 parameters) that
changed. Checks (PASS/MISS): nvfp4-sr's final training loss within 10 % of bf16's; nvfp4-rne-low moves
the corpus loss by less than a tenth of what nvfp4-sr-low achieves at the same learning rate.

Usage::

    python benchmarks/bench_trainer_recipes.py                 # ~10 min on 2 busy cores
    python benchmarks/bench_trainer_recipes.py --steps 40       # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ida_trainer.cli import parse_args
from ida_trainer.data import collate
from ida_trainer.engine import causal_lm_loss_sum
from ida_trainer.trainer import Trainer

TARGET_RATIO = 1.10  # nvfp4-sr final loss / bf16 final loss must be <= this (issue 5)
LAST_K = 10  # steps averaged for the "final training loss"
RNE_MAX_FRACTION = 0.1  # rne at the small lr must move the corpus loss by < 10 % of what SR moves it


def corpus_loss(trainer: Trainer) -> float:
    """Mean token loss over every row of the training data (eval mode, no grad)."""
    rows = trainer.batcher.rows
    length = max(sum(len(e.input_ids) for e in r) for r in rows)
    pad = (
        trainer.tokenizer.pad_token_id if trainer.tokenizer.pad_token_id is not None else trainer.tokenizer.eos_token_id
    )
    mb = collate(rows, pad_id=pad, length=length, packed=trainer.batcher.packed)
    model = trainer.model
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(
                input_ids=mb["input_ids"],
                attention_mask=mb["attention_mask"],
                position_ids=mb["position_ids"],
                use_cache=False,
            )
            total = causal_lm_loss_sum(out.logits, mb["labels"])
    finally:
        model.train(was)
    return float(total) / int((mb["labels"] != -100).sum())


def master_bytes(model: torch.nn.Module) -> dict[str, bytes]:
    """Bytes of every stored weight: MXFP8 payload/scale buffers and floating parameters."""
    out = {}
    for name, t in model.state_dict().items():
        if t.dtype in (torch.uint8, torch.bfloat16, torch.float32):
            out[name] = t.detach().contiguous().view(torch.uint8).flatten().clone()
    return out


def changed_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    changed = sum(int((before[k] != after[k]).sum()) for k in before)
    total = sum(before[k].numel() for k in before)
    return changed / max(total, 1)


def run_one(name: str, argv: list[str], out_root: Path) -> dict[str, Any]:
    cfg = parse_args(
        [
            *argv,
            "--out",
            str(out_root / name),
            "--train.progress",
            "false",
            "--eval.final",
            "false",
            "--checkpoint.export",
            "false",
            "--train.log_every",
            "1000000",
        ]
    )
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    try:
        trainer.setup()
        before_loss = corpus_loss(trainer)
        before = master_bytes(trainer.model)
        trainer.train()
        after_loss = corpus_loss(trainer)
        frac = changed_fraction(before, master_bytes(trainer.model))
        losses = [loss for _, loss in trainer.logger.losses]
    finally:
        trainer.close()
    return {
        "run": name,
        "recipe": cfg.precision.recipe,
        "optimizer": cfg.optim.name,
        "lr": cfg.optim.lr,
        "writeback": cfg.precision.writeback if cfg.precision.recipe == "nvfp4" else "-",
        "first_train_loss": losses[0],
        "final_train_loss": sum(losses[-LAST_K:]) / len(losses[-LAST_K:]),
        "corpus_loss_before": before_loss,
        "corpus_loss_after": after_loss,
        "bytes_changed": frac,
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--low-lr", type=float, default=1e-5)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--results", type=Path, default=None, help="print table and checks of a saved --json file")
    args = ap.parse_args(argv)
    if args.results is not None:
        return report(json.loads(args.results.read_text()), args)
    common = [
        "--steps",
        str(args.steps),
        "--model.hidden_size",
        str(args.hidden),
        "--model.intermediate_size",
        str(args.intermediate),
        "--train.global_batch_size",
        str(args.batch),
    ]
    runs = {
        "bf16": [*common, "--recipe", "bf16"],
        "nvfp4-sr": [*common, "--recipe", "nvfp4", "--writeback", "stochastic"],
        "nvfp4-comp": [*common, "--recipe", "nvfp4", "--writeback", "compensated"],
        "nvfp4-rne-low": [
            *common,
            "--recipe",
            "nvfp4",
            "--writeback",
            "rne",
            "--optim.lr",
            str(args.low_lr),
            "--optim.warmup_steps",
            "0",
            "--optim.min_lr_ratio",
            "1.0",
        ],
        "nvfp4-sr-low": [
            *common,
            "--recipe",
            "nvfp4",
            "--writeback",
            "stochastic",
            "--optim.lr",
            str(args.low_lr),
            "--optim.warmup_steps",
            "0",
            "--optim.min_lr_ratio",
            "1.0",
        ],
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, a in runs.items():
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = run_one(name, a, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return report(results, args)


def report(results: dict[str, Any], args: argparse.Namespace) -> int:
    """Print the markdown table and the PASS/MISS lines."""
    print(
        f"demo corpus, {args.steps} steps, hidden {args.hidden}, intermediate {args.intermediate}, "
        f"global batch {args.batch}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        "| run | recipe | optimizer | lr | write-back | train loss step 1 | train loss last 10 | "
        "corpus loss before -> after | master bytes changed | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results.values():
        print(
            f"| {r['run']} | {r['recipe']} | {r['optimizer']} | {r['lr']:g} | {r['writeback']} | "
            f"{r['first_train_loss']:.4f} | {r['final_train_loss']:.4f} | {r['corpus_loss_before']:.4f} -> "
            f"{r['corpus_loss_after']:.4f} | {100 * r['bytes_changed']:.2f} % | {r['wall_s']:.0f} |"
        )
    ratio = results["nvfp4-sr"]["final_train_loss"] / results["bf16"]["final_train_loss"]
    rne, sr = results["nvfp4-rne-low"], results["nvfp4-sr-low"]
    rne_drop = rne["corpus_loss_before"] - rne["corpus_loss_after"]
    sr_drop = sr["corpus_loss_before"] - sr["corpus_loss_after"]
    ok1 = ratio <= TARGET_RATIO
    # "does not learn": the corpus loss moves by less than a tenth of what SR achieves at the same lr.
    # Some bytes do change under rne (measured, 20 steps at 1e-5: 4-7 % of MXFP8 payload bytes and 3-6 %
    # of scale bytes, 5 % of embedding rows' elements, 15 % of lm_head, all the zero-initialised norm
    # biases): values near zero have an absolute spacing fine enough for a 1e-5 step. The bulk of every
    # weight matrix cannot move, and the loss shows it.
    ok2 = sr_drop > 0 and rne_drop < RNE_MAX_FRACTION * sr_drop
    print(f"{'PASS' if ok1 else 'MISS'}: nvfp4-sr / bf16 final training loss = {ratio:.3f} (target <= {TARGET_RATIO})")
    if "nvfp4-comp" in results:
        ratio_c = results["nvfp4-comp"]["final_train_loss"] / results["bf16"]["final_train_loss"]
        print(
            f"{'PASS' if ratio_c <= TARGET_RATIO else 'MISS'}: nvfp4-comp / bf16 final training loss = "
            f"{ratio_c:.3f} (target <= {TARGET_RATIO})"
        )
    print(
        f"{'PASS' if ok2 else 'MISS'}: at lr {args.low_lr:g}, rne write-back changed "
        f"{100 * rne['bytes_changed']:.3f} % of master bytes and moved the corpus loss by {rne_drop:+.4f}; "
        f"stochastic rounding changed {100 * sr['bytes_changed']:.2f} % and moved it by {sr_drop:+.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
