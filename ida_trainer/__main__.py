"""``python -m ida_trainer [--config FILE.toml] [--preset NAME] [overrides...]`` (no arguments: the demo).

Thin entry point: parse the config, run the job, map user errors to exit code 2 with a one-line message.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run training, return the process exit code (0 ok, 2 bad input, 1 numerics failure)."""
    from ida_trainer.cli import parse_args, usage

    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(usage())
        return 0
    try:
        cfg = parse_args(args)
    except ValueError as err:
        print(f"ida_trainer: error: {err}", file=sys.stderr)
        return 2
    from ida_trainer.engine import NonFiniteError
    from ida_trainer.trainer import run

    try:
        run(cfg)
    except NonFiniteError as err:
        print(f"ida_trainer: training failed: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"ida_trainer: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
