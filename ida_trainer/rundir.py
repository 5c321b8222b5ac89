"""The run directory policy: one run per directory, refused unless ``--resume`` or ``--overwrite``.

A run directory (``--out``) holds one training run's outputs: ``config.toml``/``config.json``,
``train_log.jsonl``, ``mlperf_log.txt``, ``checkpoints/``, ``export/``, ``eval/``, ``report.json``,
``loss.png`` (and the temporary files of their atomic writes). Mixing two runs there goes wrong quietly:
the new run's log replaces the old one, ``keep``-pruning deletes the new checkpoints because the old
ones have higher step numbers, and a later ``--resume`` continues from the *old* run's weights. So
before any work, :func:`prepare_run_dir` decides:

- an absent or empty directory: a fresh run;
- a directory with a previous run's outputs: an error in one line, unless ``--resume`` (continue that
  run) or ``--overwrite`` (replace it);
- ``--overwrite`` removes the previous run atomically: the whole directory is renamed to a hidden
  sibling ``.<name>.overwritten-<pid>.tmp`` (one ``rename``: the directory is at every moment either
  the complete old run or absent), a fresh directory is created, and the renamed one is deleted. A
  kill during the deletion leaves only the hidden sibling, which the next start of any run into that
  directory sweeps (kill point ``run_dir.moved_aside``, :mod:`ida_common.killpoint`). ``--overwrite``
  refuses a directory that holds anything that is not a run output
  (a data file someone put there, the ``--base`` model being fine-tuned): it never deletes what it did
  not write.

The embedded demo (``python -m ida_trainer`` with its default ``--out runs/demo``) implies
``--overwrite`` of its own previous output, and says so in one line: a newcomer who runs the demo twice
gets a fresh demo, not an error. ``--out`` elsewhere with the demo model follows the normal rule.

Each run gets a random run id, recorded in every checkpoint's ``trainer_state.json``; pruning keeps
and deletes only the run's own checkpoints, and ``--resume`` refuses a checkpoints directory that
holds checkpoints of several runs (see :mod:`ida_trainer.checkpoint`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from ida_common.killpoint import kill_point
from ida_trainer.config import JobConfig

__all__ = ["RUN_OUTPUTS", "new_run_id", "prepare_run_dir", "run_outputs"]

RUN_OUTPUTS = (
    "config.toml",
    "config.json",
    "train_log.jsonl",
    "mlperf_log.txt",
    "report.json",
    "loss.png",
    "checkpoints",
    "export",
    "eval",
)
DEMO_OUT = JobConfig().out  # the embedded demo's own directory
_TRASH_INFIX = ".overwritten-"


def new_run_id() -> str:
    """A fresh random run id (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def _is_run_output(name: str) -> bool:
    if name in RUN_OUTPUTS:
        return True
    # temporaries of the atomic writes: .train_log.jsonl.XXXX.tmp, .loss.png.tmp.png, .export.XXXX.tmp (ida_common.files.atomic_directory)
    bare = name.lstrip(".")
    return (name.endswith(".tmp") or name.endswith(".tmp.png")) and bare.startswith(RUN_OUTPUTS)


def run_outputs(out: Path) -> tuple[list[str], list[str]]:
    """``(run outputs, other entries)`` found in ``out`` (sorted names; both empty if it does not exist)."""
    if not out.is_dir():
        return [], []
    names = sorted(p.name for p in out.iterdir())
    return [n for n in names if _is_run_output(n)], [n for n in names if not _is_run_output(n)]


def _trash_dirs(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}{_TRASH_INFIX}*.tmp"))


def _inside(path: str, out: Path) -> bool:
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(out.resolve())
    except OSError:
        return False


def prepare_run_dir(cfg: JobConfig, *, say: Callable[[str], None] = print) -> None:
    """Apply the run directory policy to ``cfg.out`` (rank 0, before any work).

    Raises:
        ValueError: ``out`` is a file; it holds a previous run and neither ``--resume`` nor
            ``--overwrite`` was given; ``--overwrite`` would delete something that is not a run output.
    """
    out = Path(cfg.out)
    for stale in _trash_dirs(out):  # a previous --overwrite killed while deleting
        shutil.rmtree(stale, ignore_errors=True)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a run directory")
    outputs, others = run_outputs(out)
    if not outputs or cfg.checkpoint.resume:
        return
    overwrite = cfg.checkpoint.overwrite
    implied = not overwrite and cfg.is_demo and cfg.out == DEMO_OUT
    if not overwrite and not implied:
        raise ValueError(
            f"{out} already holds a training run ({', '.join(outputs)}): continue it with --resume, "
            "replace it with --overwrite, or choose another --out"
        )
    flag = "--overwrite" if overwrite else "the demo's own directory"
    if others:
        raise ValueError(
            f"{flag}: {out} also holds {', '.join(others)}, which no training run writes; not deleting "
            "it: move it away or choose another --out"
        )
    for what, path in (
        ("model.base", cfg.model.base),
        ("data.path", cfg.data.path),
        ("eval.problems", cfg.eval.problems),
    ):
        if _inside(path, out):
            raise ValueError(
                f"{flag}: {what} {path} lies inside {out}, which would be deleted; copy it elsewhere "
                "or choose another --out"
            )
    trash = out.parent / f".{out.name}{_TRASH_INFIX}{os.getpid()}.tmp"
    try:
        os.rename(out, trash)
        out.mkdir()
    except OSError as err:
        raise ValueError(f"{flag}: cannot replace {out}: {err.strerror}") from None
    kill_point("run_dir.moved_aside")
    shutil.rmtree(trash)
    if overwrite:
        say(f"--overwrite: removed the previous run in {out} ({', '.join(outputs)})")
    else:
        say(
            f"demo: replacing the previous demo run in {out} (its own directory; --out DIR keeps runs, "
            "--resume continues one)"
        )
