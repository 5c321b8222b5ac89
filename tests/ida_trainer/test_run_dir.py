"""The run directory policy (issue 11 item 4): one run per directory, ``--resume`` or ``--overwrite``.

Before, a fresh run into a directory that held a run truncated the old ``train_log.jsonl`` silently,
pruned its *own* new checkpoints (the old ones had higher step numbers, ``keep=2``), and a later
``--resume`` continued from the old run's checkpoint. These tests run the real trainer (tiny demo model).
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from ida_common.checksums import SUMS_FILE, write_sums
from ida_trainer.__main__ import main
from ida_trainer.checkpoint import checkpoint_run_id, list_checkpoints
from ida_trainer.cli import parse_args
from ida_trainer.logs import read_train_log
from ida_trainer.trainer import run
from tests.ida_trainer.support import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "--train.global_batch_size",
    "2",
    "--checkpoint.every",
    "1",
    "--checkpoint.keep",
    "2",
    "--eval.final",
    "false",
    "--checkpoint.export",
    "false",
    "--train.progress",
    "false",
]


def _run(out, steps, *extra):
    return run(parse_args([*TINY, "--out", str(out), "--steps", str(steps), *extra]))


def _tree_digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    """A finished 4-step run: checkpoints 3 and 4 (keep 2), a 4-record log."""
    out = tmp_path_factory.mktemp("old") / "run"
    _run(out, 4)
    return out


def test_a_fresh_run_into_a_previous_run_is_refused_in_one_line(old_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    before = _tree_digest(out)
    rc = main([*TINY, "--out", str(out), "--steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"{out} already holds a training run" in err[0] and "--resume" in err[0] and "--overwrite" in err[0]
    assert _tree_digest(out) == before  # nothing touched: not the log, not a checkpoint


def test_overwrite_replaces_the_previous_run_and_resume_continues_the_new_one(old_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    old_ids = {checkpoint_run_id(p) for _, p in list_checkpoints(out / "checkpoints")}
    report = _run(out, 2, "--overwrite")
    assert "--overwrite: removed the previous run in" in capsys.readouterr().out
    ckpts = list_checkpoints(out / "checkpoints")
    assert [s for s, _ in ckpts] == [1, 2]  # its own checkpoints, not pruned in favour of the old 3 and 4
    assert {checkpoint_run_id(p) for _, p in ckpts} == {report["run_id"]} and report["run_id"] not in old_ids
    assert [r["step"] for r in read_train_log(out / "train_log.jsonl")] == [1, 2]
    # the saved config reproduces the run, never its run control: --config <run>/config.toml alone is refused
    assert "overwrite = false" in (out / "config.toml").read_text()
    with pytest.raises(ValueError, match="already holds a training run"):
        run(parse_args(["--config", str(out / "config.toml")]))
    resumed = _run(out, 3, "--resume")
    assert resumed["resumed_from"].endswith("ckpt-000002") and resumed["run_id"] == report["run_id"]
    assert [r["step"] for r in read_train_log(out / "train_log.jsonl")] == [1, 2, 3]
    assert not list(tmp_path.glob(".run.overwritten-*"))


def test_overwrite_never_deletes_what_no_run_wrote(old_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    (out / "notes.txt").write_text("mine")
    before = _tree_digest(out)
    rc = main([*TINY, "--out", str(out), "--steps", "2", "--overwrite"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "notes.txt" in err[0] and "not deleting" in err[0], err
    assert _tree_digest(out) == before
    with pytest.raises(ValueError, match="--resume continues .* --overwrite replaces"):
        parse_args([*TINY, "--out", str(out), "--resume", "--overwrite"])


def test_resume_refuses_checkpoints_of_two_runs(old_run, tmp_path):
    out = tmp_path / "run"
    _run(out, 2)  # checkpoints 1, 2 of a new run
    for _, p in list_checkpoints(old_run / "checkpoints"):
        shutil.copytree(p, out / "checkpoints" / p.name)  # 3, 4 of the old run, sorting newer
    with pytest.raises(ValueError, match="holds checkpoints of 2 different runs"):
        _run(out, 5, "--resume")


@pytest.mark.parametrize("sums", [True, False], ids=["with SHA256SUMS", "older checkpoint without"])
def test_a_damaged_checkpoint_is_named_not_taken_for_another_run(old_run, tmp_path, sums):
    """A torn trainer_state.json used to read as "checkpoints of 2 different runs", a torn optimizer file as an
    internal error: each is now one line naming the file and the way on (resume from the checkpoint before).
    SHA256SUMS names it first; a checkpoint without one (an older ida's) is named by the file's reader."""
    for name, damage in (("trainer_state.json", b'{"step": 4,'), ("optimizer.st", None)):
        out = tmp_path / name / "run"
        shutil.copytree(old_run, out)
        if not sums:
            for listed in (out / "checkpoints").glob(f"*/{SUMS_FILE}"):
                listed.unlink()
        f = out / "checkpoints" / "ckpt-000004" / name
        if damage is None:
            with f.open("r+b") as fh:
                fh.truncate(1000)
        else:
            f.write_bytes(damage)
        why = "its bytes differ from the sha256 recorded in SHA256SUMS" if sums else "(?!its bytes).+"
        with pytest.raises(ValueError, match=rf"ckpt-000004/{name} is damaged \({why}.*\); move ckpt-000004 out of"):
            _run(out, 6, "--resume")
        shutil.move(out / "checkpoints" / "ckpt-000004", tmp_path / name / "aside")  # what the line says
        assert _run(out, 6, "--resume")["resumed_from"].endswith("ckpt-000003")


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda s: s.update(step=-3), r"its step -3 is not the step ckpt-000004 was saved at"),
        (lambda s: s.update(step=10**6), r"its step 1000000 is not the step ckpt-000004 was saved at"),
        (lambda s: s["data_cursor"].update(position=10**9), r"its data cursor .* is not epoch, position <= num_rows"),
        (lambda s: s.pop("rng"), r"it holds no RNG states"),
        (lambda s: s["rng"]["numpy"].update(keys=[1, 2]), r"its RNG states do not load: IndexError: .*"),
    ],
    ids=["negative step", "step of another checkpoint", "cursor past the rows", "no rng", "short numpy state"],
)
def test_a_trainer_state_that_cannot_resume_is_named(old_run, tmp_path, edit, why):
    """Valid JSON that is not what the trainer wrote (edited, with SHA256SUMS rewritten to match, or an older
    checkpoint) used to resume at the wrong step, wrap the data cursor silently, or end in an internal error."""
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    ckpt = out / "checkpoints" / "ckpt-000004"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    edit(state)
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    write_sums(ckpt)
    with pytest.raises(ValueError, match=rf"ckpt-000004/trainer_state.json is damaged \({why}\); move ckpt-000004 out"):
        _run(out, 6, "--resume")


def test_the_demo_replaces_its_own_previous_output_and_says_so(tmp_path, monkeypatch, capsys):
    """A newcomer runs the demo twice: the second run replaces the first demo's runs/demo, in one line."""
    monkeypatch.chdir(tmp_path)
    assert main([*TINY, "--steps", "1"]) == 0
    first = json.loads((tmp_path / "runs" / "demo" / "report.json").read_text())["run_id"]
    capsys.readouterr()
    assert main([*TINY, "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "demo: replacing the previous demo run in runs/demo" in out
    assert json.loads((tmp_path / "runs" / "demo" / "report.json").read_text())["run_id"] != first
    # --out elsewhere follows the normal rule, demo model or not
    assert main([*TINY, "--steps", "1", "--out", "runs/demo2"]) == 0
    assert main([*TINY, "--steps", "1", "--out", "runs/demo2"]) == 2
