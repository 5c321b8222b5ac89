"""Full tensors in checkpoints, FSDP2 shards in memory: checkpoints that do not depend on the process count.

An FSDP2 run (``--data-parallel fsdp``, :func:`ida_trainer.distributed.apply_fsdp`) holds every parameter,
its optimizer state and its exact master copy as DTensor shards (dim 0 split over the ranks). A checkpoint
holds full tensors, laid out as a single-process run's: :func:`gather_full_state` before writing,
:func:`shard_like` and :func:`shard_optimizer_state` when loading. So a checkpoint written by N processes
resumes with N, with another number of processes or in one process, and a single-process checkpoint
resumes under FSDP.

Example:
    >>> import torch
    >>> gather_full_state({"step": 3, "m": torch.ones(2)})  # no DTensor: returned as it is
    {'step': 3, 'm': tensor([1., 1.])}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor

__all__ = ["gather_full_state", "holds_shards", "shard_like", "shard_optimizer_state"]


def gather_full_state(obj: Any, *, keep: bool = True) -> Any:
    """``obj`` (nested dicts, lists, tuples) with every DTensor replaced by its full tensor on the CPU.

    A collective: every rank calls it on a structure of the same shape. One full tensor is on the device
    at a time. ``keep=False`` (a rank that writes nothing): the gathers happen, nothing is kept, returns None.
    """

    def walk(x: Any) -> Any:
        if isinstance(x, DTensor):
            full = x.full_tensor()
            return full.cpu() if keep else None
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x

    out = walk(obj)
    return out if keep else None


def holds_shards(obj: Any) -> bool:
    """True when ``obj`` (nested dicts, lists, tuples) holds a DTensor: one rank's shard, not a full state."""
    if isinstance(obj, DTensor):
        return True
    if isinstance(obj, dict):
        return any(holds_shards(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(holds_shards(v) for v in obj)
    return False


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` as ``like`` holds it: on its device, in its dtype, and this rank's shard when ``like`` is a
    DTensor. Every rank holds ``full`` (read from the checkpoint) and takes its own slice: no communication.
    The slice is cut on the CPU, where ``full`` is, and only it goes to the device: a rank of N moves 1/N of
    the bytes and never holds the full tensor there. Its offsets and sizes are the DTensor's own
    (``__create_chunk_list__``, what torch's distributed checkpointing reads and writes shards by).
    """
    if not isinstance(like, DTensor):
        return full.to(device=like.device, dtype=like.dtype)
    if tuple(full.shape) != tuple(like.shape):
        raise ValueError(f"shard_like: a full tensor of shape {list(full.shape)} for a DTensor of {list(like.shape)}")
    (chunk,) = like.__create_chunk_list__()
    part = full[tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes, strict=True))]
    local = part.to(device=like.to_local().device, dtype=like.dtype).contiguous()
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
    )


def shard_optimizer_state(state_dict: Mapping[str, Any], param_groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A full ``torch.optim.Optimizer.state_dict()`` with each state tensor of a DTensor parameter sharded as
    the parameter (matched as ``load_state_dict`` matches them: group by group, in order; ``step`` is a
    scalar and stays as it is)."""
    params = {  # unequal counts: torch's load_state_dict says so, after this
        i: p
        for saved, group in zip(state_dict["param_groups"], param_groups, strict=False)
        for i, p in zip(saved["params"], group["params"], strict=False)
    }
    state = {}
    for i, entry in state_dict["state"].items():
        p = params.get(i)
        state[i] = {
            k: shard_like(v, p) if k != "step" and p is not None and isinstance(v, torch.Tensor) else v
            for k, v in entry.items()
        }
    return {**state_dict, "state": state}
