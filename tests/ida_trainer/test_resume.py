"""Resume: a run killed with SIGKILL mid-training and resumed has exactly the uninterrupted run's losses.

The uninterrupted and the interrupted run are real ``python -m ida_trainer`` subprocesses (tiny nvfp4
demo model). The interrupted one is killed with SIGKILL as soon as its step-2 checkpoint exists (it is
then somewhere in steps 3-10, possibly mid-save), resumed with ``--resume``, and its ``train_log.jsonl``
(loss, grad norm, lr per step) and final checkpoint bytes must equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ida_trainer.cli import parse_args
from ida_trainer.trainer import run
from tests.ida_trainer.support import TINY_MODEL, loss_records

STEPS = 10
ARGS = [
    *TINY_MODEL,
    "--train.global_batch_size",
    "2",
    "--steps",
    str(STEPS),
    "--checkpoint.every",
    "2",
    "--checkpoint.keep",
    "3",
    "--eval.final",
    "false",
    "--checkpoint.export",
    "false",
    "--train.progress",
    "false",
]
REPO = Path(__file__).resolve().parents[2]


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ida_trainer", "--out", str(out), *ARGS, *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # same thread count in every process: same float summation order
    return env


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_loss_curve(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    ref = subprocess.Popen(_cmd(full), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = subprocess.Popen(_cmd(killed), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "ckpt-000002").is_dir():
        assert victim.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no step-2 checkpoint within 300 s"
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    done_before_kill = [s for s, *_ in loss_records(killed)]
    assert done_before_kill and max(done_before_kill) < STEPS
    _, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err
    resumed = subprocess.run(
        _cmd(killed, "--resume"), env=_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    # each save says where it went, how big and how long (a 4B save takes minutes: not a silent stall)
    assert re.search(r"^checkpoint: \S+/checkpoints/ckpt-\d{6} \(\d+\.\d MiB in \d+\.\d s\)$", resumed.stdout, re.M)
    assert loss_records(killed) == loss_records(full)  # every step's loss, grad norm and lr, exactly
    assert [s for s, *_ in loss_records(full)] == list(range(1, STEPS + 1))
    last = f"checkpoints/ckpt-{STEPS:06d}"
    for name in ("model.safetensors",):
        assert (killed / last / name).read_bytes() == (full / last / name).read_bytes()
    state_a = json.loads((killed / last / "trainer_state.json").read_text())
    state_b = json.loads((full / last / "trainer_state.json").read_text())
    assert state_a["data_cursor"] == state_b["data_cursor"]


def test_bf16_recipe_resume_is_exact_in_process(tmp_path):
    """The bf16 recipe's FP32 masters travel in the optimizer state: resuming from step 2 of 4 is exact."""
    common = [
        "--recipe",
        "bf16",
        *TINY_MODEL,
        "--train.global_batch_size",
        "2",
        "--steps",
        "4",
        "--checkpoint.keep",
        "5",
        "--eval.final",
        "false",
        "--checkpoint.export",
        "false",
        "--train.progress",
        "false",
        "--checkpoint.every",
        "2",
    ]
    run(parse_args([*common, "--out", str(tmp_path / "a")]))
    # a copy of the run that "died" after its step-2 checkpoint: later checkpoint gone, log runs on to step 4
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "ckpt-000004")
    with open(tmp_path / "b" / "train_log.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "loss": 0.0}) + "\n")  # a record the resumed run must drop
    report = run(parse_args([*common, "--out", str(tmp_path / "b"), "--resume"]))
    assert report["resumed_from"].endswith("ckpt-000002")
    assert loss_records(tmp_path / "b") == loss_records(tmp_path / "a")
    a = (tmp_path / "a" / "checkpoints" / "ckpt-000004" / "model.safetensors").read_bytes()
    b = (tmp_path / "b" / "checkpoints" / "ckpt-000004" / "model.safetensors").read_bytes()
    assert a == b
