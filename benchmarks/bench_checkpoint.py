"""What SHA256SUMS costs a checkpoint save and a resume, side by side with the save and the load themselves.

Each recipe's model (the demo's NemotronForCausalLM at a larger size) takes one optimizer step, so its
optimizer state exists; then the trainer's own :func:`ida_trainer.checkpoint.save_checkpoint` writes the
checkpoint (every file fsynced, ``SHA256SUMS`` written last) and :func:`ida_trainer.checkpoint.load_checkpoint`
reads it back (every file checked against ``SHA256SUMS`` first, as ``--resume`` does; then every model tensor
looked up, which reads it). Baselines, in the same run on the same files: the save without ``SHA256SUMS``
(``write_sums`` skipped: the save as it was before 2026-12-07; the two saves alternate), and beside the load,
:func:`~ida_common.checksums.verify_sums` alone and one plain read of every byte (page cache warm in all three).
Saves: medians of ``--repeats`` pairs; loads: best of ``--repeats``.

A second table puts the optimizer state file alone beside the format it replaced on 2026-12-07: ``optimizer.st``
(:func:`~ida_trainer.checkpoint.write_optimizer_state`, safetensors, written one tensor at a time, fsynced) vs
``torch.save`` of the same state (``optimizer.pt``) plus an fsync; and the reads, each followed by one pass over
every tensor (a mapped file reads nothing until it is touched): :func:`~ida_trainer.checkpoint.read_optimizer_state`
vs ``torch.load(mmap=True, weights_only=True)``. Writes: medians of ``--repeats`` pairs; reads: best of.

Run:  python benchmarks/bench_checkpoint.py [--hidden 1024] [--layers 8] [--intermediate 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import torch
from timing import samples

from ida_common.checksums import verify_sums
from ida_trainer import checkpoint as ckpt
from ida_trainer.config import ModelConfig, OptimConfig, PrecisionConfig
from ida_trainer.demo import build_demo_model, corpus_texts, train_demo_tokenizer
from ida_trainer.precision import apply_recipe, build_optimizer, export_state


def _stepped(recipe: str, cfg: ModelConfig, tokenizer: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_demo_model(cfg, tokenizer, seed=0)
    prec = PrecisionConfig(recipe=recipe)
    apply_recipe(model, prec)
    optim = OptimConfig(name="lion" if recipe == "nvfp4" else "adamw", lr=1e-4)
    opt = build_optimizer(model, optim, prec)
    ids = torch.tensor([tokenizer(corpus_texts()[0])["input_ids"][:64]])
    model(input_ids=ids).logits.float().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


def _read_all(path: Path) -> None:
    """Every byte of the checkpoint's files read once: what any reader of the whole checkpoint pays."""
    buf = bytearray(8 << 20)
    for p in path.iterdir():
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _resume_read(path: Path) -> None:
    """What ``--resume`` reads: :func:`ida_trainer.checkpoint.load_checkpoint` and every model tensor."""
    with ckpt.load_checkpoint(path) as loaded:
        for _ in loaded.tensors.values():
            pass


def _touch(state: object) -> None:
    for t in ckpt.flatten_state(state)[1].values():
        t.sum()


def _torch_save(state: dict, path: Path) -> None:
    torch.save(state, path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _optimizer_file_rows(recipe: str, state: dict, root: Path, repeats: int) -> str:
    new, old = root / f"{recipe}.optimizer.st", root / f"{recipe}.optimizer.pt"
    writes: dict[str, list[float]] = {"st": [], "pt": []}
    for _ in range(repeats + 1):  # the first pair is a warm-up
        for variant, fn in (
            ("st", lambda: ckpt.write_optimizer_state(new, state)),
            ("pt", lambda: _torch_save(state, old)),
        ):
            t0 = time.perf_counter()
            fn()
            writes[variant].append(time.perf_counter() - t0)
    w_st, w_pt = statistics.median(writes["st"][1:]), statistics.median(writes["pt"][1:])
    r_st = min(samples(lambda: _touch(ckpt.read_optimizer_state(new)), repeats))
    r_pt = min(samples(lambda: _touch(torch.load(old, map_location="cpu", weights_only=True, mmap=True)), repeats))
    return (
        f"| {recipe} | {new.stat().st_size / 2**20:.0f} MiB | {w_st:.2f} s | {w_pt:.2f} s | {w_st / w_pt:.2f}x "
        f"| {r_st:.2f} s | {r_pt:.2f} s | {r_st / r_pt:.2f}x |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table (exit 0: a measurement, no target)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: the system temp dir)")
    args = ap.parse_args(argv)

    tokenizer = train_demo_tokenizer(corpus_texts())
    cfg = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, intermediate_size=args.intermediate)
    root = Path(tempfile.mkdtemp(prefix="bench_checkpoint.", dir=args.dir))
    print(
        f"demo NemotronForCausalLM hidden {args.hidden}, {args.layers} layers, intermediate {args.intermediate}; "
        f"{args.repeats} repeats; files in {root}; torch {torch.__version__}"
    )
    print(
        "| recipe | files | save | save without SHA256SUMS | ratio | load_checkpoint | of it the check "
        "| read every byte once |"
    )
    print("|---|---|---|---|---|---|---|---|")
    files = []
    try:
        for recipe in ("nvfp4", "bf16"):
            model, opt = _stepped(recipe, cfg, tokenizer)
            save = functools.partial(
                ckpt.save_checkpoint,
                root / recipe,
                1,
                tensors=export_state(model),
                model_config=model.config,
                generation_config=model.generation_config,
                tokenizer=tokenizer,
                optimizer_state=opt.state_dict(),
                trainer_state={"step": 1, "rng": ckpt.rng_state()},
                metadata={"producer": "bench_checkpoint"},
                keep=1,
            )

            def save_without_sums(save: functools.partial = save) -> None:
                with mock.patch.object(ckpt, "write_sums", lambda *a, **k: {}):  # the save before SHA256SUMS
                    save()

            path = save()  # warm-up
            times: dict[str, list[float]] = {"with": [], "without": []}
            for _ in range(args.repeats):  # interleaved: load from elsewhere and disk write-back hit both alike
                for variant, fn in (("with", save), ("without", save_without_sums)):
                    t0 = time.perf_counter()
                    fn()
                    times[variant].append(time.perf_counter() - t0)
            t_save, t_base = statistics.median(times["with"]), statistics.median(times["without"])
            save()  # the checkpoint the loads read has its SHA256SUMS
            t_load = min(samples(lambda path=path: _resume_read(path), args.repeats))
            t_check = min(samples(lambda path=path: verify_sums(path), args.repeats))
            t_read = min(samples(lambda path=path: _read_all(path), args.repeats))
            mib = _size(path) / 2**20
            print(
                f"| {recipe} | {mib:.0f} MiB | {t_save:.2f} s | {t_base:.2f} s | {t_save / t_base:.2f}x | "
                f"{t_load:.2f} s | {t_check:.2f} s | {t_read:.2f} s |"
            )
            files.append(_optimizer_file_rows(recipe, opt.state_dict(), root, args.repeats))
            del model, opt, save
        print(
            "\noptimizer state file alone: optimizer.st (safetensors) vs torch.save (optimizer.pt, before 2026-12-07)"
        )
        print("| recipe | file | write .st | write .pt | ratio | read + touch .st | read + touch .pt | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(files))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
