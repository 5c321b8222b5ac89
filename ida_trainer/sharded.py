"""Full tensors in checkpoints, FSDP2 shards in memory: checkpoints that do not depend on the process count.

An FSDP2 run (``--data-parallel fsdp``, :func:`ida_trainer.distributed.apply_fsdp`) holds every parameter,
its optimizer state and its exact master copy as DTensor shards (dim 0 split over the ranks). A checkpoint
holds full tensors, laid out as a single-process run's: :func:`gather_on_demand` and :class:`OnDemand` while
writing, :func:`shard_like` and :func:`shard_optimizer_state` when loading. So a checkpoint written by N
processes resumes with N, with another number of processes or in one process, and a single-process
checkpoint resumes under FSDP.

A run starts from rank 0's weights: only rank 0 loads the base, the other ranks build it on the meta device
(:func:`ida_eval.loader.empty_model`), and :func:`fill_from_rank_0` sends each sharded model one full tensor at a
time; a machine holds one host copy of the base, not one per rank.

A save streams: the checkpoint writers plan a file from shapes and dtypes alone (:meth:`OnDemand.spec`) and
then read one tensor at a time, and each read gathers that one full tensor, so rank 0 holds one or two full
tensors on its device and on its CPU beyond its own shards (the collective's work handle lets the previous one go
a moment later), not the whole state (48 GB for a 4B model's AdamW state:
:func:`ida_trainer.checkpoint.streamed_state`).

Example:
    >>> with gather_on_demand({"m": torch.ones(2)}, main=True) as fetch:  # no DTensor: no collective
    ...     fetch("m")
    tensor([1., 1.])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["OnDemand", "gather_on_demand", "holds_shards", "rank_0_requests", "shard_like", "shard_optimizer_state"]


@contextmanager
def rank_0_requests(serve: Callable[[Any], object], *, main: bool) -> Iterator[Callable[[Any], None] | None]:
    """Rank 0 asks, every other rank serves, one request at a time, for as long as rank 0 stays in the block.

    A collective of every rank. Rank 0 (``main``) gets ``ask(request)``: the request (any picklable object)
    is broadcast and every other rank calls ``serve(request)`` with it, in rank 0's order (a collective inside
    ``serve`` pairs with rank 0's part of it after ``ask``). Every other rank gets None, once rank 0 has left
    the block, also by an exception: the others are released, never left waiting.
    """
    if not main:
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                break
            serve(box[0])
        yield None
        return
    try:
        yield lambda request: dist.broadcast_object_list([request], src=0)
    finally:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list([None], src=0)


@contextmanager
def gather_on_demand(
    sources: Mapping[str, torch.Tensor], *, main: bool
) -> Iterator[Callable[[str], torch.Tensor] | None]:
    """Full tensors of ``sources`` (name -> DTensor shard or plain tensor; the same names on every rank), one at
    a time, on rank 0's CPU, in whatever order rank 0 reads them.

    A collective of every rank (:func:`rank_0_requests`). Rank 0 (``main``) gets ``fetch(name)``: a DTensor's
    name is sent to the other ranks and they gather it with rank 0 (a plain tensor is copied to the CPU without
    them). Every other rank gets None, after it has served rank 0's gathers until rank 0 leaves the block.
    """
    with rank_0_requests(lambda name: sources[name].full_tensor(), main=main) as ask:  # type: ignore[attr-defined]
        if ask is None:
            yield None
            return

        def fetch(name: str) -> torch.Tensor:
            t = sources[name]
            if isinstance(t, DTensor):
                ask(name)
                t = t.full_tensor()
            return t.cpu()

        yield fetch


class OnDemand(Mapping[str, torch.Tensor]):
    """``name -> transform(name, fetch(name))``, read when it is read, for the checkpoint writers: their
    ``spec(name)`` (shape and numpy dtype, from ``sources[name]`` run through ``transform`` on the meta device)
    plans a file without reading anything (:func:`mxfp8_codec.write_mxfp8_safetensors`).

    Example:
        >>> m = OnDemand({"w": torch.zeros(2, 3)}, lambda n: torch.ones(2, 3), lambda n, t: t.T)
        >>> m.spec("w"), m["w"].shape
        (((3, 2), dtype('float32')), torch.Size([3, 2]))
    """

    def __init__(
        self,
        sources: Mapping[str, torch.Tensor],
        fetch: Callable[[str], torch.Tensor],
        transform: Callable[[str, torch.Tensor], torch.Tensor] = lambda name, t: t,
    ) -> None:
        self._sources, self._fetch, self._transform = sources, fetch, transform

    def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        from mxfp8_codec.convert import numpy_dtype_of

        src = self._sources[name]
        out = self._transform(name, torch.empty(src.shape, dtype=src.dtype, device="meta"))
        return tuple(out.shape), numpy_dtype_of(out)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._transform(name, self._fetch(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


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


Spec = list[tuple[tuple[str, ...], tuple[int, ...], torch.dtype]]
"""A model's tensors as :func:`fill_from_rank_0` compares and sends them: ``(names, shape, dtype)`` per tensor, its
names all those it has (tied weights: one tensor, several names)."""


def named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` (non-persistent ones included) under every name it has, tied ones
    as one object; without the broadcast views (a zero stride along a dimension of more than one element: one
    value seen many times, e.g. NVFP4Linear's gradient anchor), which hold nothing to send and cannot be written.
    """
    pairs = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {
        name: t
        for name, t in pairs
        if not any(step == 0 and size > 1 for step, size in zip(t.stride(), t.shape, strict=True))
    }


def names_per_tensor(named: Iterable[tuple[str, torch.Tensor]]) -> list[list[str]]:
    """The names of each distinct tensor among ``named`` (name, tensor) pairs, in order of first appearance: tied
    ones are one tensor under several names (a tied ``lm_head``: ``[model.embed_tokens.weight, lm_head.weight]``)."""
    names: dict[int, list[str]] = {}
    for name, t in named:
        names.setdefault(id(t), []).append(name)
    return list(names.values())


def _spec(tensors: Mapping[str, torch.Tensor]) -> Spec:
    return [
        (tuple(group), tuple(tensors[group[0]].shape), tensors[group[0]].dtype)
        for group in names_per_tensor(tensors.items())
    ]


def _differs(mine: Spec, theirs: Spec, *, whole: bool) -> str | None:
    """Where ``mine`` (a rank's :func:`_spec`) is not rank 0's ``theirs`` (``whole``), or not a part of it (tied
    tensors tied as there)."""
    if whole:
        first = next(((a, b) for a, b in zip([*mine, None], [*theirs, None], strict=False) if a != b), None)
    else:
        entry_of = {name: k for k, entry in enumerate(theirs) for name in entry[0]}
        taken: set[int] = set()
        first = None
        for names, shape, dtype in mine:
            k = entry_of.get(names[0])
            entry = None if k is None else theirs[k]
            if entry is None or entry[1:] != (shape, dtype) or not set(names) <= set(entry[0]) or k in taken:
                first = ((names, shape, dtype), entry)
                break
            taken.add(k)  # type: ignore[arg-type]
    return None if first is None else f"{first[0]} there, {first[1]} on rank 0 (names, shape, dtype)"


def fill_from_rank_0(
    model: torch.nn.Module, full: Mapping[str, torch.Tensor] | None, *, main: bool, whole: bool = True
) -> None:
    """Give every parameter and buffer of ``model`` rank 0's value, in place: rank 0 (``main``) passes ``full``,
    its model's :func:`named_tensors` from before it was sharded or pruned (detached, tied ones still one
    object); the other ranks pass None and may have built their model on the meta device (then ``to_empty``).
    ``whole``: every rank holds all of rank 0's tensors, as DTensor shards or whole (FSDP2); else each holds some
    of them (a pipeline stage: its layers).

    A collective of every rank: the structures are compared first, then each of rank 0's tensors is broadcast in
    turn (a tied one once) and every rank that holds it keeps its part (:func:`shard_like`), so a rank holds one
    full tensor beyond its own at a time.

    Raises:
        ValueError: on every rank, a rank's model differs from rank 0's tensors (names the rank and the first
            tensor whose names, shape, dtype or tying differ), or rank 0 passed none.
    """
    targets = named_tensors(model)
    if main and full is None:
        raise ValueError("fill_from_rank_0: rank 0 passes its model's full tensors by name")
    box: list[Any] = [_spec(full) if main else None]  # type: ignore[arg-type]
    dist.broadcast_object_list(box, src=0)
    (spec,) = box
    problems: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, _differs(_spec(targets), spec, whole=whole))
    for rank, problem in enumerate(problems):
        if problem is not None:
            raise ValueError(
                f"rank {rank}'s model differs from rank 0's: {problem}; every rank must build the same model"
            )
    local_of = {name: t.to_local() if isinstance(t, DTensor) else t for name, t in targets.items()}
    device = next(iter(local_of.values())).device
    with torch.no_grad():
        for names, shape, dtype in spec:
            buf = (
                full[names[0]].to(device=device, dtype=dtype)  # type: ignore[index]
                if main
                else torch.empty(shape, dtype=dtype, device=device)
            )
            dist.broadcast(buf, src=0)
            done: set[int] = set()
            for name in names:
                t = targets.get(name)
                if t is not None and id(t) not in done:
                    done.add(id(t))
                    local_of[name].copy_(shard_like(buf, t).to_local() if isinstance(t, DTensor) else buf)
            del buf


def to_empty_keeping_ties(model: torch.nn.Module, device: torch.device | str) -> None:
    """``model.to_empty(device=device)``, with tied parameters still one (``to_empty`` gives each module's
    reference a tensor of its own: a tied ``lm_head`` would become a second matrix, trained apart)."""
    groups = names_per_tensor(model.named_parameters(remove_duplicate=False))
    model.to_empty(device=device)
    for first, *others in groups:
        for name in others:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, model.get_parameter(first))


@torch.no_grad()
def compute_non_persistent_buffers(model: torch.nn.Module) -> None:
    """Give a model built on the meta device and then made real (``to_empty``) the buffers no checkpoint holds,
    in place: each transformers ``*RotaryEmbedding``'s ``inv_freq`` / ``original_inv_freq``, computed anew from
    its config as transformers builds them. A run resumed from a checkpoint needs nothing else from its base:
    every persistent tensor comes from the checkpoint (:func:`ida_trainer.precision.load_state`, strict).

    Raises:
        ValueError: a non-persistent buffer of another kind of module (named; nothing here computes it).
    """
    persistent = set(model.state_dict(keep_vars=True))
    owners: dict[str, list[str]] = {}
    for name, _ in model.named_buffers():
        if name not in persistent:
            owner, _, buffer = name.rpartition(".")
            owners.setdefault(owner, []).append(buffer)
    for owner, buffers in owners.items():
        module = model.get_submodule(owner)
        if "RotaryEmbedding" not in type(module).__name__ or not hasattr(module, "config"):
            raise ValueError(
                f"{owner}.{buffers[0]}: a non-persistent buffer of a {type(module).__name__}, which no checkpoint "
                "holds and ida cannot compute (only transformers' rotary embeddings): a bug in ida, please report it"
            )
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for buffer in buffers:
            getattr(module, buffer).copy_(getattr(fresh, buffer))


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
