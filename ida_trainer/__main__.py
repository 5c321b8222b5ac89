"""``python -m ida_trainer [--config FILE.toml] [--preset NAME] [overrides...]`` (no arguments: the demo).

Thin entry point: parse the config, run the job. Errors follow the project's CLI convention
(:mod:`ida_common.cli`, docs/cli.md): a bad setting or input file is one line ``ida_trainer: error:
...`` with status 2, a non-finite loss (training diverged) status 1, Ctrl-C status 130; under torchrun
only rank 0 prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ida_common.cli import CheckFailed, Run, run_main

if TYPE_CHECKING:
    from ida_trainer.config import JobConfig

PROG = "ida_trainer"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run training, return the process exit code (docs/cli.md)."""
    return run_main(PROG, _run, argv)


def _run(run: Run) -> int:
    from ida_trainer.cli import parse_args, usage

    if any(a in ("-h", "--help") for a in run.argv):
        print(usage())
        return 0
    cfg = parse_args(run.argv)
    from ida_trainer.engine import NonFiniteError
    from ida_trainer.trainer import run as run_job

    run.kept = lambda: _kept(cfg)
    try:
        run_job(cfg)
    except NonFiniteError as err:
        raise CheckFailed(f"training failed: {err}") from None
    return 0


def _kept(cfg: JobConfig) -> str:
    """What a Ctrl-C keeps: the newest complete checkpoint to resume from, or nothing yet."""
    from ida_trainer.checkpoint import latest_checkpoint
    from ida_trainer.rundir import DEMO_OUT

    root = Path(cfg.out) / "checkpoints"
    newest = latest_checkpoint(root) if root.is_dir() else None
    if newest is not None:
        return f"the newest checkpoint is {newest}: rerun the same command with --resume to continue from it"
    again = "rerun the same command" + ("" if cfg.out == DEMO_OUT and cfg.is_demo else " with --overwrite")
    return f"no checkpoint was written yet (checkpoint.every sets how often): {again} to start again"


if __name__ == "__main__":
    raise SystemExit(main())
