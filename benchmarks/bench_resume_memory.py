"""What a resume adds to a process's host memory while it fills its model from a checkpoint: each tensor read
from the file when it is looked up (now) vs the whole model file read into one dict first (every rank before
2026-12-07), side by side, each in a process of its own.

A Qwen3-4B-shaped model (``bench_fsdp_memory``'s shape: hidden 2560, MLP 9728, vocabulary 151936, tied
embeddings) with fewer layers and random weights takes the recipe (``--recipe``: nvfp4, bf16 or both), and the
trainer's :func:`ida_trainer.checkpoint.save_checkpoint` writes its checkpoint. Then, for each way, a fresh
Python process builds the same model (as ``--resume`` has it before the load: built, other weights) and
measures filling it with :func:`ida_trainer.precision.load_state`:

* read on lookup: ``load_checkpoint(...).tensors`` (:class:`ida_trainer.checkpoint.ModelTensors`), the
  checkpoint opened inside the measurement, as ``--resume`` does;
* whole file first: from :func:`ida_trainer.checkpoint.read_model_tensors` (what every rank did before, with
  today's reader).

The figure is how far the process's peak RSS rose above its RSS before the load: the kernel's high-water mark,
reset first (``timing.peak_rss_growth``), after the memory the building freed went back to the OS
(``malloc_trim``), so that the allocator cannot serve the load from it unseen. Beside it: the model file's size
and its largest stored tensor. Each process prints a sha256 of the model's state it ended with: both ways must
load the same model (exit 1 otherwise).

Run (~2.5 min, ~6 GiB at most)::

    python benchmarks/bench_resume_memory.py                                        # 4 layers, both recipes
    python benchmarks/bench_resume_memory.py --layers 2 --hidden 256 --vocab 4096   # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from bench_fsdp_memory import _config as qwen3_shape
from timing import peak_rss_growth

WAYS = {"lookup": "read on lookup (now)", "whole": "whole file first (before)"}


def _model(args: argparse.Namespace, recipe: str, seed: int) -> torch.nn.Module:
    """The Qwen3-shaped model with random weights (``seed``), the recipe applied, as the trainer builds it."""
    from transformers import AutoModelForCausalLM

    from ida_trainer.config import PrecisionConfig
    from ida_trainer.precision import apply_recipe

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if recipe == "nvfp4" else torch.float32
    model = AutoModelForCausalLM.from_config(qwen3_shape(args), dtype=dtype).train()
    apply_recipe(model, PrecisionConfig(recipe=recipe))
    return model


def _digest(model: torch.nn.Module) -> str:
    """sha256 of every tensor of the model's state (names and bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _child(args: argparse.Namespace) -> None:
    """One way's load in this process: prints {"grew": bytes, "sha256": ...} as JSON."""
    import gc

    from ida_trainer import checkpoint as ckpt
    from ida_trainer.precision import load_state

    model = _model(args, args.recipe, seed=1)  # other weights than the checkpoint's: the load must replace them
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc: free heap memory back to the OS, so that the
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # building's leftovers cannot hide what the load allocates
    path = Path(args.child_of)

    def resume() -> None:  # the checkpoint opened and the model filled, as --resume does
        with ckpt.load_checkpoint(path, verify=False) as loaded:
            load_state(model, loaded.tensors)

    if args.child == "lookup":
        _, grew = peak_rss_growth(resume)
    else:
        _, grew = peak_rss_growth(lambda: load_state(model, ckpt.read_model_tensors(path / ckpt.MODEL_FILE)))
    print(json.dumps({"grew": grew, "sha256": _digest(model)}))


def _checkpoint(args: argparse.Namespace, recipe: str, root: Path) -> Path:
    """The trainer's checkpoint of a fresh model (no optimizer step: the load reads only the model file)."""
    from ida_trainer import checkpoint as ckpt
    from ida_trainer.demo import corpus_texts, train_demo_tokenizer
    from ida_trainer.precision import export_state

    model = _model(args, recipe, seed=0)
    path = ckpt.save_checkpoint(
        root / recipe, 1, tensors=export_state(model), model_config=model.config,
        generation_config=model.generation_config, tokenizer=train_demo_tokenizer(corpus_texts()),
        optimizer_state={"state": {}, "param_groups": []}, trainer_state={"step": 1},
        metadata={"producer": "bench_resume_memory"}, keep=1,
    )  # fmt: skip
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4; Qwen3-4B has 36)")
    ap.add_argument("--hidden", type=int, default=0, help="a toy width instead of Qwen3-4B's (smoke runs)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary with --hidden (default 4096)")
    ap.add_argument("--recipe", choices=("nvfp4", "bf16", "both"), default="both")
    ap.add_argument("--child", choices=tuple(WAYS), help=argparse.SUPPRESS)
    ap.add_argument("--child-of", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    from mxfp8_codec import open_mxfp8

    cfg = qwen3_shape(args)
    print(
        f"Qwen3-4B shape, {args.layers} layers, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size}; "
        f"torch {torch.__version__}"
    )
    print("| recipe | model file | its largest tensor | way | peak RSS growth of the load | / model file |")
    print("|---|---|---|---|---|---|")
    root = Path(tempfile.mkdtemp(prefix="bench_resume_memory."))
    same_everywhere = True
    try:
        for recipe in ("nvfp4", "bf16") if args.recipe == "both" else (args.recipe,):
            path = _checkpoint(args, recipe, root)
            size = (path / "model.safetensors").stat().st_size
            with open_mxfp8(path / "model.safetensors") as reader:
                largest = max(e.nbytes for e in reader.header.entries.values())
            grown, models = {}, set()
            for way, label in WAYS.items():
                cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
                cmd += ["--recipe", recipe, "--child", way, "--child-of", str(path)]
                res = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    sys.stderr.write(res.stderr)
                    return 1
                got = json.loads(res.stdout.splitlines()[-1])
                grown[way] = got["grew"]
                models.add(got["sha256"])
                mib = 2**20
                print(
                    f"| {recipe} | {size / mib:.0f} MiB | {largest / mib:.0f} MiB | {label} "
                    f"| +{got['grew'] / mib:.0f} MiB | {got['grew'] / size:.2f}x |"
                )
            same_everywhere &= len(models) == 1
            print(
                f"| {recipe} | | | now / before | {grown['lookup'] / max(grown['whole'], 1):.2f}x "
                f"| the same model both ways: {len(models) == 1} |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
