"""``python -m ida_trainer [--config FILE.toml] [--preset NAME] [overrides...]`` (no arguments: the demo).

Thin entry point: parse the config, run the job. Errors follow the project's CLI convention
(:mod:`ida_common.cli`, docs/cli.md): a bad setting or input file is one line ``ida_trainer: error:
...`` with status 2, a non-finite loss (training diverged) status 1, Ctrl-C status 130; under torchrun
only rank 0 prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from ida_common.cli import CheckFailed, Run, run_main

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

    run.kept = (f"checkpoints written so far are kept in {cfg.out}/checkpoints: rerun the same command with "
                "--resume to continue from the newest one")
    try:
        run_job(cfg)
    except NonFiniteError as err:
        raise CheckFailed(f"training failed: {err}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
