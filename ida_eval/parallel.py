"""Data-parallel MBXP generation under ``torchrun``: each rank generates a disjoint share, rank 0 executes.

``torchrun --nproc-per-node N -m ida_eval.mbxp ...`` starts N copies of the harness. Each loads the
model on its own device (``cuda:LOCAL_RANK``, or the CPU) and generates every N-th of the samples
still missing (ordered as :func:`ida_eval.generate.generate_completions` orders them, longest prompt
first, so the shares are balanced), appending them to its own ``samples.rank<R>.jsonl``. When all
are done, rank 0 merges the shards into ``samples.jsonl`` (:func:`ida_eval.rundir.merge_shards`), executes every
program with all the machine's cores and writes the summary; the other ranks wait and return the
same summary. The run directory then holds what a one-process run leaves (greedy samples are the
same, so are the verdicts: tested with 2 gloo processes on the CPU).

A killed rank (torchrun then stops the others) loses only its current batch: the shards are merged
by the next start, with any number of processes, before the work is shared out again.

The ranks talk through a gloo process group (small Python objects, barriers) whatever the device, so
no NCCL set-up is needed; its timeout is :data:`RANK_WAIT`, the longest rank 0 may take to execute a
language's programs while the others wait.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ida_common.launch import LaunchEnv, launch_env

T = TypeVar("T")
RANK_WAIT = datetime.timedelta(days=2)  # gloo timeout: a barrier waits this long for rank 0's execution
SHARD_GLOB = "samples.rank*.jsonl"


def shard_name(rank: int) -> str:
    """The samples file rank ``rank`` appends to in a multi-process run."""
    return f"samples.rank{rank}.jsonl"


@dataclass(frozen=True)
class Ranks:
    """The processes of this evaluation (one, without torchrun)."""

    env: LaunchEnv

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for in one process)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (``[obj]`` in one process)."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def once_per_machine(self, work: Callable[[], T]) -> T:
        """``work()`` done once for every rank of a launch that is all on this machine (reading files that every
        rank would read alike: hashing a checkpoint, tens of GB for a 4B model's training state): rank 0 does it
        and every rank returns its result (it must pickle), or raises its ValueError, the same one. A collective.
        Each rank does it itself in one process, or across machines (each reads its own copy of the files).
        """
        if self.world_size == 1 or not self.env.one_machine:
            return work()
        import torch.distributed as dist

        failure: Exception | None = None
        box: list[Any] = [None]  # ("done", result) | ("refused", a ValueError) | ("failed", its line)
        if self.is_main:
            try:
                box[0] = ("done", work())
            except ValueError as exc:
                failure, box[0] = exc, ("refused", exc)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks are told
                failure, box[0] = exc, ("failed", f"{type(exc).__name__}: {exc}")
        dist.broadcast_object_list(box, src=0)
        if failure is not None:
            raise failure
        what, value = box[0]
        if what == "refused":
            raise value
        if what == "failed":
            raise RuntimeError(f"rank 0 failed: {value}")
        return value


ONE_PROCESS = Ranks(LaunchEnv())  # the default of the harness's functions: no other rank takes part


def current_ranks() -> Ranks:
    """This process's :class:`Ranks`; joins the gloo group on the first call of a multi-process launch.
    Only the CLI calls it: a library caller (the trainer's periodic eval on its rank 0) evaluates as
    one process unless it passes ranks explicitly.

    Raises:
        ValueError: torchrun's environment variables are malformed.
    """
    env = launch_env()
    if env.world_size > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="gloo", timeout=RANK_WAIT)
    return Ranks(env)


def cuda_device_for(ranks: Ranks) -> str:
    """The CUDA device of this rank: ``cuda:LOCAL_RANK``."""
    return f"cuda:{ranks.env.local_rank}"


def shard_paths(out_dir: Path) -> list[Path]:
    """The rank shards present in a run directory, sorted."""
    return sorted(out_dir.glob(SHARD_GLOB))
