"""Helpers shared by the trainer's run-level tests (kill, resume, parallel resume)."""

from __future__ import annotations

from pathlib import Path

from ida_trainer.logs import read_train_log

# the smallest model the run-level tests train: hidden 32, MLP 64, 2 heads (the demo's other settings)
TINY_MODEL = ["--model.hidden_size", "32", "--model.intermediate_size", "64", "--model.num_heads", "2"]


def loss_records(run_dir: Path) -> list[tuple[int, float, float, float]]:
    """(step, loss, grad norm, lr) of every record in a run's ``train_log.jsonl``: what "the same run" compares."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in read_train_log(run_dir / "train_log.jsonl")]
