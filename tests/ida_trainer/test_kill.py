"""Kill tests with deterministic kill points (issue 11): a trainer process SIGKILLs itself at a named
phase (``IDA_KILL_AT``, :mod:`ida_common.killpoint`) and the next run must lose nothing and not be stuck.

For each phase: the run dies with SIGKILL exactly there; the newest checkpoint written before the kill is
intact and loadable and byte-identical to the unkilled reference run's; ``--resume`` (or, for an
interrupted ``--overwrite``, a plain rerun) succeeds without manual cleanup; the resumed run's loss records
(step, loss, grad norm, lr) and final checkpoint bytes equal the reference's; ``mlperf_log.txt`` holds
every step's ``train_loss`` exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ida_common.checksums import file_sha256
from ida_trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from ida_trainer.logs import read_mllog
from tests.ida_trainer.support import TINY_MODEL, loss_records

STEPS = 6
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

pytestmark = pytest.mark.slow


def _train(out: Path, *extra: str, kill_at: str = "") -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
        IDA_KILL_AT=kill_at,
    )  # one thread everywhere: the same float sums
    return subprocess.run(
        [sys.executable, "-m", "ida_trainer", "--out", str(out), *ARGS, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    res = _train(out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.parametrize(
    "kill_at, last_complete",
    [
        ("checkpoint.files_written:2", 2),  # mid-save of ckpt-4: everything written, not yet renamed
        ("checkpoint.renamed:2", 4),  # ckpt-4 in place, older ones not yet pruned
        ("train_log.torn_record:5", 4),  # half of step 5's record on disk
    ],
)
def test_killed_then_resumed_equals_the_unkilled_run(reference, tmp_path, kill_at, last_complete):
    out = tmp_path / "run"
    killed = _train(out, kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    newest = latest_checkpoint(out / "checkpoints")
    assert newest is not None and newest.name == f"ckpt-{last_complete:06d}"
    with load_checkpoint(newest):  # intact and loadable ...
        pass
    assert file_sha256(newest / "model.safetensors") == file_sha256(
        reference / "checkpoints" / newest.name / "model.safetensors"
    )
    if kill_at.startswith("train_log"):
        assert not (out / "train_log.jsonl").read_bytes().endswith(b"\n")  # the torn line is really there
    resumed = _train(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {newest}" in resumed.stdout
    assert loss_records(out) == loss_records(reference)
    last = f"ckpt-{STEPS:06d}"
    assert file_sha256(out / "checkpoints" / last / "model.safetensors") == file_sha256(
        reference / "checkpoints" / last / "model.safetensors"
    )
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [2, 4, 6]
    losses = [r["metadata"]["step_num"] for r in read_mllog(out / "mlperf_log.txt") if r["key"] == "train_loss"]
    assert losses == list(range(1, STEPS + 1))
    assert not list((out / "checkpoints").glob("*.tmp"))


def test_an_overwrite_killed_midway_leaves_nothing_stuck(reference, tmp_path):
    """--overwrite renames the old run aside, makes a fresh directory, then deletes the old one: killed in
    between, the directory is empty (not half a run) and the next plain run succeeds and sweeps the rest."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    killed = _train(out, "--overwrite", kill_at="run_dir.moved_aside")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert out.is_dir() and not list(out.iterdir())
    assert list(tmp_path.glob(".run.overwritten-*.tmp"))
    rerun = _train(out)
    assert rerun.returncode == 0, rerun.stderr
    assert not list(tmp_path.glob(".run.overwritten-*.tmp"))
    assert loss_records(out) == loss_records(reference)
