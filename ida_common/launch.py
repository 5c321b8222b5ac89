"""Where this process stands in a ``torchrun`` launch: the one reader of its environment variables.

``torchrun --nproc-per-node N`` starts N copies of a command with ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` set; a plain ``python -m ...`` has none of them and is rank 0 of 1. The trainer (its
pipeline and FSDP) and the MBXP harness (data-parallel generation) both read them here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in the launch.

    Attributes:
        rank: global rank (0 ... world_size - 1).
        world_size: number of processes (1 without torchrun).
        local_rank: rank on this machine (the GPU index to use).
        launched: True when started by a launcher (``WORLD_SIZE`` is set), even with one process.
        one_machine: True when every process runs on this machine (torchrun's ``LOCAL_WORLD_SIZE`` equals
            ``WORLD_SIZE``, or a single process); False when that is unknown (a launcher that does not say).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False
    one_machine: bool = True

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the one that writes shared files)."""
        return self.rank == 0


def launch_env() -> LaunchEnv:
    """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (defaults 0, 1, 0).

    Raises:
        ValueError: a variable that is not an integer, or a rank outside ``0 ... WORLD_SIZE - 1``.

    Example:
        >>> launch_env().world_size >= 1
        True
    """
    values = {}
    for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
        text = os.environ.get(name)
        try:
            values[name] = default if text is None else int(text)
        except ValueError:
            raise ValueError(f"environment variable {name}={text!r} is not an integer (set by torchrun)") from None
    world, rank, local = values["WORLD_SIZE"], values["RANK"], values["LOCAL_RANK"]
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}: not a valid launch (from torchrun?)")
    one_machine = world == 1 or os.environ.get("LOCAL_WORLD_SIZE") == str(world)
    return LaunchEnv(
        rank=rank, world_size=world, local_rank=local, launched="WORLD_SIZE" in os.environ, one_machine=one_machine
    )
