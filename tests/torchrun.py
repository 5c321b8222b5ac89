"""Commands the tests launch with torchrun: two gloo processes on the CPU, each launch on a free port."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port nobody listens on now (pytest-xdist runs several launches at once: never torchrun's 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_cmd(n: int, module: str, *args: str) -> list[str]:
    """``torchrun --nproc-per-node N -m MODULE ARGS`` through this interpreter, on a free port."""
    return [*_torchrun(n), "-m", module, *args]


def torchrun_script_cmd(n: int, script: Path, *args: str) -> list[str]:
    """``torchrun --nproc-per-node N SCRIPT ARGS`` (a benchmark script) through this interpreter, on a free port."""
    return [*_torchrun(n), str(script), *args]


def _torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", f"--master-port={free_port()}"]


def torchrun_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on the path and no rank variables of an enclosing launch."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}
