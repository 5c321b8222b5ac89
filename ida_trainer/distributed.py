"""Distributed training: 1F1B pipeline stages and FSDP2, through torch.distributed only.

Pipeline (``--pipeline-stages S``, one process per stage, launched with ``torchrun``):

* The decoder layers are split into S contiguous ranges (earlier stages take the remainder).  Each
  process prunes the model *in place* to its range (stage 0 also keeps the embeddings, the last
  stage the final norm and ``lm_head``), so it holds, computes and updates only its layers (a tied
  ``lm_head`` is stage 0's embedding, lent to the last stage each step: :class:`PipelineEngine`).  Module
  names stay the transformers names (``model.layers.17.mlp.up_proj``), which is what keys the
  stochastic-rounding streams and the checkpoint: a pipelined run draws the same random bits as a
  single-process run and :meth:`PipelineEngine.streamed_state` writes ONE checkpoint with global names,
  identical to a single-process run's, with the stages' optimizer states merged into a single-process run's
  too, so a pipelined checkpoint resumes with any number of stages or in one process (each optimizer takes its
  parameters' part by name); each tensor is sent to rank 0 as it is written.
* ``torch.distributed.pipelining``: one :class:`~torch.distributed.pipelining.PipelineStage` per
  process and a :class:`~torch.distributed.pipelining.Schedule1F1B` with ``scale_grads=False``.
  Micro-batches carry ``input_ids`` (fed to stage 0) and ``labels`` (fed to the last stage's loss);
  ``attention_mask``/``position_ids`` are not sent between stages: every rank draws the same global
  batch, so each stage reads them from its own copy of the micro-batch list.  Stage metadata is
  static (shapes known from the micro-batch); the boundary activation example is marked
  ``requires_grad=True``, without which the receiving stage computes no input gradient.  A schedule is
  built per micro-batch shape (the data pads every micro-batch of a step to one length).
* Loss: each micro-batch's ``cross_entropy(logits.float(), labels, reduction="sum", ignore_index=-100)
  / global_valid_tokens`` on the last stage, exactly as the single-process engine computes it; the step
  loss is broadcast to every rank.  When a micro-batch's logits would exceed
  :data:`~ida_trainer.engine.LOGITS_CHUNK_ENTRIES` (2**27 tokens x vocabulary entries: 1.75 GiB at 14 B
  each; 1024 tokens of a 256000-word vocabulary is 2x that), the last stage returns the final-norm hidden
  states and the loss runs lm_head + cross-entropy over token chunks, each recomputed in backward, so only
  one chunk's logits are alive (:func:`~ida_trainer.engine.chunked_loss_sum`, which the single-process and
  FSDP engine runs too; float32 sums in another order, so not bit-identical to an unchunked loss).
* Backends: gloo on CPU (and for host-staged transfers), NCCL when CUDA is available.

FSDP2 (``--data-parallel fsdp``): :func:`apply_fsdp` calls ``fully_shard`` on every decoder layer and
on the root, with gradients reduced in float32 and *summed* (divide factor 1: the loss is already
normalised by the global token count).  Parameters stay FP32 masters and are gathered in FP32; the
bf16 recipe's ``torch.autocast`` casts at each GEMM, so an FSDP run performs the same computation as a
single-process run and differs only in the order of the float32 gradient sums.  Its checkpoints hold full
tensors, as a single-process run's (:mod:`ida_trainer.sharded`), so they resume with any number of
processes.  The nvfp4 recipe is
refused: its master is a pair of uint8 buffers (E4M3 payload + per-32 UE8M0 scales) updated in place by
a fused Lion kernel, which FSDP2 can neither shard (it shards floating parameters, on dim 0, with no
regard for 32-element scale blocks) nor gather.

Example (two processes, CPU)::

    torchrun --nproc-per-node 2 -m ida_trainer --pipeline-stages 2 --parallel.microbatches 4
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ida_common.launch import launch_env
from ida_trainer.checkpoint import flatten_state, unflatten_state
from ida_trainer.engine import causal_lm_loss_sum, chunked_loss_sum, logits_are_chunked
from ida_trainer.precision import PIPELINE_ATTR, bf16_autocast, export_state, merge_stage_states, model_recipe
from ida_trainer.sharded import compute_non_persistent_buffers, fill_from_rank_0, named_tensors, rank_0_requests
from mxfp8_codec import MXFP8Tensor
from mxfp8_codec.convert import numpy_dtype_of

if TYPE_CHECKING:
    from ida_trainer.config import ParallelConfig

__all__ = [
    "DistInfo",
    "PipelineEngine",
    "apply_fsdp",
    "init_distributed",
    "split_layers",
]

BACKEND_ENV = "IDA_DIST_BACKEND"  # override the process-group backend ("gloo" | "nccl")
MAX_SCHEDULES = 4  # cached (shape -> PipelineStage + schedule) entries per engine


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits.

    Attributes:
        rank, world_size, local_rank: from torchrun (0, 1, 0 for a single process).
        backend: process-group backend, or ``"none"``.
        device: the device this rank computes on.
        pipeline_stages: stages of the pipeline (1 = none); the stage index is the rank.
        data_parallel: ``"none"`` or ``"fsdp"``.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"
    device: torch.device = torch.device("cpu")
    pipeline_stages: int = 1
    data_parallel: str = "none"

    @property
    def is_main(self) -> bool:
        """True on the rank that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (0 without FSDP)."""
        return self.rank if self.data_parallel == "fsdp" else 0

    @property
    def dp_size(self) -> int:
        """Data-parallel size (1 without FSDP)."""
        return self.world_size if self.data_parallel == "fsdp" else 1


def init_distributed(parallel: ParallelConfig) -> DistInfo:
    """Initialise the process group the parallel config needs (or none) and return this rank's place.

    Raises:
        ValueError: the number of processes does not fit the config (with the command that would).

    Example:
        >>> from ida_trainer.config import ParallelConfig
        >>> init_distributed(ParallelConfig()).world_size
        1
    """
    env = launch_env()
    world, rank, local_rank = env.world_size, env.rank, env.local_rank
    wants = parallel.pipeline_stages > 1 or parallel.data_parallel == "fsdp"
    if not wants:
        if world > 1:
            raise ValueError(
                f"launched with {world} processes but neither --pipeline-stages > 1 nor "
                "--data-parallel fsdp is set; run a single process or choose a parallelism"
            )
        return DistInfo()
    if parallel.pipeline_stages > 1 and world != parallel.pipeline_stages:
        raise ValueError(
            f"--pipeline-stages {parallel.pipeline_stages} needs exactly {parallel.pipeline_stages} "
            f"processes, got WORLD_SIZE={world}: launch with "
            f"torchrun --nproc-per-node {parallel.pipeline_stages} -m ida_trainer ..."
        )
    if parallel.data_parallel == "fsdp" and not env.launched:
        raise ValueError("--data-parallel fsdp needs torchrun: torchrun --nproc-per-node N -m ida_trainer ...")
    cuda = torch.cuda.is_available()
    backend = os.environ.get(BACKEND_ENV, "nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        backend=backend,
        device=device,
        pipeline_stages=parallel.pipeline_stages,
        data_parallel=parallel.data_parallel,
    )


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges per stage; the first ``num_layers % num_stages`` stages get one more.

    Example:
        >>> split_layers(5, 2)
        [range(0, 3), range(3, 5)]
    """
    if num_stages < 1 or num_layers < num_stages:
        raise ValueError(
            f"cannot split {num_layers} decoder layers over {num_stages} pipeline stages "
            "(every stage needs at least one layer)"
        )
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def _decoder(model: nn.Module) -> nn.Module:
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers") or not hasattr(model, "lm_head"):
        raise ValueError(
            f"{type(model).__name__}: pipelining needs a transformers causal LM with .model.layers "
            "and .lm_head (Nemotron, Llama, Qwen3 ...)"
        )
    return base


class _StageModule(nn.Module):
    """One pipeline stage of a transformers causal LM: (embed) -> layers[a:b] -> (norm, lm_head)."""

    def __init__(
        self,
        lm: nn.Module,
        layers: range,
        *,
        is_first: bool,
        is_last: bool,
        boundary_dtype: torch.dtype,
        autocast_device: str | None,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.layer_ids = list(layers)
        self.is_first = is_first
        self.is_last = is_last
        self.boundary_dtype = boundary_dtype
        self.autocast_device = autocast_device
        self.side: Sequence[Mapping[str, torch.Tensor]] = ()
        self.calls = 0
        self.return_hidden = False  # last stage: return the final-norm hidden states (chunked loss)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        mb = self.side[self.calls]
        self.calls += 1
        base = self.lm.model
        with bf16_autocast(self.autocast_device) if self.autocast_device else nullcontext():
            h = base.embed_tokens(x) if self.is_first else x
            pos = mb.get("position_ids")
            if pos is None:
                pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pos = pos.to(h.device)
            am = mb.get("attention_mask")
            mask = create_causal_mask(
                config=self.lm.config,
                inputs_embeds=h,
                attention_mask=None if am is None else am.to(h.device),
                cache=None,
                position_ids=pos,
            )
            pe = base.rotary_emb(h, position_ids=pos)
            for i in self.layer_ids:
                h = base.layers[i](
                    h, attention_mask=mask, position_ids=pos, cache=None, use_cache=False, position_embeddings=pe
                )
            if self.is_last:
                h = base.norm(h)
                if self.return_hidden:
                    return h.to(self.boundary_dtype)
                return self.lm.lm_head(h).float()
        return h.to(self.boundary_dtype)


@contextmanager
def _sent_on_demand(
    local: Mapping[str, torch.Tensor], *, main: bool, device: torch.device
) -> Iterator[Callable[[int, str, tuple[int, ...], torch.dtype], torch.Tensor] | None]:
    """Rank 0 reads tensors that other ranks hold, one at a time (:func:`~ida_trainer.sharded.rank_0_requests`):
    ``pull(rank, name, shape, dtype)`` asks for ``(rank, name)``, that rank sends ``local[name]`` (from
    ``device``: NCCL sends device memory), rank 0 receives it into a buffer of ``shape`` and ``dtype`` on its
    device and returns it on the CPU (its own are copied to the CPU). Every other rank gets None, after it has
    sent what rank 0 asked for until rank 0 leaves the block. A collective of every rank."""
    me = dist.get_rank()

    def serve(request: tuple[int, str]) -> None:
        rank, name = request
        if rank == me:
            dist.send(local[name].to(device).contiguous(), dst=0)

    with rank_0_requests(serve, main=main) as ask:
        if ask is None:
            yield None
            return

        def pull(rank: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            if rank == 0:
                return local[name].cpu()
            ask((rank, name))
            buf = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buf, src=rank)
            return buf.cpu()

        yield pull


class _StagedWeights(Mapping[str, Any]):
    """Rank 0's view of every stage's checkpoint weights (:func:`~ida_trainer.precision.export_state` entries):
    each read when it is read, from the stage that holds it; ``spec`` plans the file from the stages'
    catalogs (an NVFP4 master: its payload's shape and the dtype None, an MXFP8Tensor)."""

    def __init__(
        self,
        where: Mapping[str, int],
        catalogs: Sequence[Mapping[str, tuple[tuple[int, ...], torch.dtype]]],
        get: Callable[[int, str], torch.Tensor],
    ) -> None:
        self._where, self._catalogs, self._get = where, catalogs, get

    def _mxfp8(self, name: str) -> bool:
        return f"model/{name}#payload" in self._catalogs[self._where[name]]

    def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype | None]:
        catalog = self._catalogs[self._where[name]]
        if self._mxfp8(name):
            return catalog[f"model/{name}#payload"][0], None
        shape, dtype = catalog[f"model/{name}"]
        return shape, numpy_dtype_of(torch.empty((), dtype=dtype))

    def __getitem__(self, name: str) -> Any:
        stage = self._where[name]
        if self._mxfp8(name):
            return MXFP8Tensor(self._get(stage, f"model/{name}#payload"), self._get(stage, f"model/{name}#scales"))
        return self._get(stage, f"model/{name}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class PipelineEngine:
    """1F1B pipeline engine with the same interface as the single-process ``LocalEngine``.

    Args:
        model: the full causal LM with the precision recipe applied; pruned IN PLACE to this stage
            (also available as ``engine.stage_module``; build the optimizer on it). Its weights are rank 0's
            (:func:`ida_trainer.sharded.fill_from_rank_0`): the other stages may pass it built on the meta device
            (:func:`ida_eval.loader.empty_model`). ``from_checkpoint``: every stage may, as :func:`apply_fsdp`.
        parallel: ``pipeline_stages`` (> 1) and ``microbatches`` (>= stages) per optimizer step.
        info: this rank's :class:`DistInfo` (rank = stage index).

    A model whose ``lm_head`` is its input embedding (``tie_word_embeddings``: Qwen3) keeps that one matrix on
    stage 0, as a parameter there alone: each step stage 0 lends it to the last stage, whose ``lm_head`` computes
    with it, and the last stage's gradient of it is added to stage 0's after the schedule, before clipping, so it
    is clipped, counted and updated once (the optimizer, its stochastic rounding and the checkpoint see what one
    process has). The sum differs from one process's only in its order (the embedding's micro-batches, then
    ``lm_head``'s, where one process interleaves them): equal to rounding, not bit for bit.

    Raises:
        ValueError: the stage or micro-batch counts do not fit, or a stage's model differs.

    Attributes:
        group: the process group of the stages (sum squared gradient norms over it).

    Example (inside a ``torchrun --nproc-per-node 2`` process)::

        parallel = ParallelConfig(pipeline_stages=2, microbatches=4)
        engine = PipelineEngine(model, parallel, init_distributed(parallel))
        opt = build_optimizer(engine.stage_module, optim_cfg, precision_cfg)   # this stage's parameters
        loss = engine.forward_backward(step.microbatches, step.global_valid_tokens)
        opt.step(); opt.zero_grad()
        with engine.streamed_state(opt) as contents:   # rank 0: what save_checkpoint writes; None elsewhere
            ...
    """

    def __init__(
        self, model: nn.Module, parallel: ParallelConfig, info: DistInfo, *, from_checkpoint: bool = False
    ) -> None:
        microbatches = parallel.microbatches
        if info.pipeline_stages != parallel.pipeline_stages or info.world_size != parallel.pipeline_stages:
            raise ValueError(
                f"PipelineEngine: {parallel.pipeline_stages} stages configured but the process group "
                f"has {info.world_size} ranks"
            )
        if info.pipeline_stages < 2:
            raise ValueError("PipelineEngine needs pipeline_stages >= 2 (use the local engine otherwise)")
        if microbatches < info.pipeline_stages:
            raise ValueError(
                f"a {info.pipeline_stages}-stage 1F1B pipeline needs >= {info.pipeline_stages} "
                f"micro-batches per step, got {microbatches}"
            )
        base = _decoder(model)
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        # lm_head's weight is the embedding's (Qwen3): stage 0 holds it and lends it to the last stage each step
        self.tied = head is not None and embed is not None and head.weight is embed.weight
        recipe = model_recipe(model)
        empty, full = _rank_0s_tensors(model, info, "PipelineEngine", from_checkpoint=from_checkpoint)
        self.info = info
        self.model = model
        self.stage_index = info.rank
        self.num_stages = info.pipeline_stages
        self.microbatches = microbatches
        self.layers = split_layers(len(base.layers), self.num_stages)[self.stage_index]
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.num_stages - 1
        for i in range(len(base.layers)):
            if i not in self.layers:
                base.layers[i] = nn.Module()  # placeholder keeps the indices (and names) of the others
        if not self.is_first:
            base.embed_tokens = None
        if not self.is_last:
            base.norm = None
            model.lm_head = None
        setattr(model, PIPELINE_ATTR, self.stage_index)
        if empty:
            model.to_empty(device=info.device)
        else:
            model.to(info.device)
        _fill(model, full, info, from_checkpoint=from_checkpoint, empty=empty, whole=False)
        del full
        self._borrowed: torch.Tensor | None = None  # the last stage's lm_head weight, stage 0's embedding
        if self.tied and self.is_last:
            weight = model.lm_head.weight
            del model.lm_head.weight  # a parameter no more: stage 0's optimizer alone updates the matrix
            self._borrowed = weight.detach().requires_grad_()
            model.lm_head.weight = self._borrowed
        self.stage_module = model
        self.group = dist.group.WORLD
        autocast = info.device.type if recipe == "bf16" else None
        self.boundary_dtype = torch.float32 if recipe == "bf16" else torch.bfloat16
        self.module = _StageModule(
            model,
            self.layers,
            is_first=self.is_first,
            is_last=self.is_last,
            boundary_dtype=self.boundary_dtype,
            autocast_device=autocast,
        )
        self.hidden_size = int(model.config.hidden_size)
        self.vocab_size = int(model.config.vocab_size)
        self._schedules: dict[tuple[int, int], Any] = {}
        self._gvt = 1

    def parameters(self) -> Iterator[nn.Parameter]:
        """Parameters this stage holds and updates."""
        return self.model.parameters()

    def _schedule(self, b: int, t: int) -> Any:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        key = (b, t)
        if key in self._schedules:
            return self._schedules[key]
        dev = self.info.device
        hid = torch.zeros(b, t, self.hidden_size, dtype=self.boundary_dtype, device=dev, requires_grad=True)
        inp = torch.zeros(b, t, dtype=torch.long, device=dev) if self.is_first else hid
        chunked = self._chunked(b, t)
        out = (
            torch.zeros(b, t, self.vocab_size, dtype=torch.float32, device=dev, requires_grad=True)
            if self.is_last and not chunked
            else hid
        )
        stage = PipelineStage(
            self.module, self.stage_index, self.num_stages, dev, input_args=(inp,), output_args=(out,)
        )
        sched = Schedule1F1B(stage, n_microbatches=self.microbatches, loss_fn=self._loss, scale_grads=False)
        if len(self._schedules) >= MAX_SCHEDULES:
            self._schedules.pop(next(iter(self._schedules)))
        self._schedules[key] = sched
        return sched

    def _chunked(self, b: int, t: int) -> bool:
        """Whether the last stage returns hidden states and chunks lm_head + loss for this shape."""
        return self.is_last and logits_are_chunked(b * t, self.vocab_size)

    def _loss(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not self.module.return_hidden:
            return causal_lm_loss_sum(output, labels) / self._gvt
        return chunked_loss_sum(output, labels, self.model.lm_head, self.module.autocast_device) / self._gvt

    def forward_backward(self, microbatches: list[dict[str, torch.Tensor]], global_valid_tokens: int) -> float:
        """Run one optimizer step's micro-batches through the 1F1B schedule; gradients accumulate.

        Returns:
            The step loss (sum over micro-batches of the token-normalised loss), on every rank.
        """
        if len(microbatches) != self.microbatches:
            raise ValueError(
                f"PipelineEngine: got {len(microbatches)} micro-batches, the schedule was built for {self.microbatches}"
            )
        shapes = {tuple(mb["input_ids"].shape) for mb in microbatches}
        if len(shapes) != 1:
            raise ValueError(f"PipelineEngine: micro-batches of one step must share a shape, got {sorted(shapes)}")
        b, t = shapes.pop()
        self._gvt = max(int(global_valid_tokens), 1)
        sched = self._schedule(b, t)
        self.module.side = microbatches
        self.module.calls = 0
        self.module.return_hidden = self._chunked(b, t)
        dev = self.info.device
        losses: list[torch.Tensor] = []
        if self.tied:
            self._lend_embedding()
        if self.is_first:
            sched.step(torch.cat([mb["input_ids"] for mb in microbatches]).to(dev))
        elif self.is_last:
            sched.step(target=torch.cat([mb["labels"] for mb in microbatches]).to(dev), losses=losses)
        else:
            sched.step()
        if self.tied:
            self._return_head_gradient()
        total = torch.zeros((), dtype=torch.float64, device=dev)
        if self.is_last:
            total = torch.stack([loss.detach().to(torch.float64) for loss in losses]).sum()
        dist.broadcast(total, src=self.num_stages - 1)
        self.module.side = ()
        return float(total.item())

    def _lend_embedding(self) -> None:
        """Stage 0 sends its embedding (as the optimizer left it) to the last stage, into its lm_head's weight."""
        if self.is_first:
            dist.send(self.model.get_input_embeddings().weight.detach(), dst=self.num_stages - 1)
        elif self._borrowed is not None:
            dist.recv(self._borrowed.detach(), src=0)

    def _return_head_gradient(self) -> None:
        """The last stage's gradient of the borrowed embedding, summed over its micro-batches, is added to the
        embedding's on stage 0 (which has summed its own first)."""
        if self._borrowed is not None:
            grad = self._borrowed.grad
            dist.send(torch.zeros_like(self._borrowed) if grad is None else grad, dst=0)
            self._borrowed.grad = None
        elif self.is_first:
            weight = self.model.get_input_embeddings().weight
            grad = torch.empty_like(weight)
            dist.recv(grad, src=self.num_stages - 1)
            if weight.grad is None:
                weight.grad = grad
            else:
                weight.grad.add_(grad)

    @contextmanager
    def streamed_state(
        self, optimizer: torch.optim.Optimizer
    ) -> Iterator[tuple[Mapping[str, Any], dict[str, Any], Callable[[str], torch.Tensor]] | None]:
        """What :func:`~ida_trainer.checkpoint.save_checkpoint` writes of the whole model and its optimizer, each
        tensor sent to rank 0 by the stage that holds it as it is written: rank 0 holds its own stage and one
        tensor of another at a time, never every stage's state. A collective: every stage enters it.

        Yields, on rank 0, ``(tensors, optimizer_state, optimizer_fetch)`` for ``save_checkpoint``: the weights
        under global names (one checkpoint file, the same a single-process run writes) and the stages' optimizer
        states merged into a single-process run's (:func:`~ida_trainer.precision.merge_stage_states`; its
        tensors are placeholders on the meta device that ``optimizer_fetch`` reads), so one optimizer file serves
        any number of stages, or one process. None on the other stages, once rank 0 has written everything.
        """
        weights = export_state(self.model)  # this stage's entries, global names (a tied lm_head: stage 0's embedding)
        skeleton, leaves = flatten_state(optimizer.state_dict())
        local: dict[str, torch.Tensor] = {}
        for name, v in weights.items():
            if isinstance(v, MXFP8Tensor):
                local[f"model/{name}#payload"], local[f"model/{name}#scales"] = v.payload, v.scales
            else:
                local[f"model/{name}"] = v
        local.update({f"optimizer/{path}": t for path, t in leaves.items()})
        mine = (skeleton, {n: (tuple(t.shape), t.dtype) for n, t in local.items()}, sorted(weights))
        parts: list[Any] = [None] * self.num_stages if self.info.is_main else []
        dist.gather_object(mine, parts if self.info.is_main else None, dst=0)
        with _sent_on_demand(local, main=self.info.is_main, device=self.info.device) as pull:
            if pull is None:
                yield None
                return
            catalogs = [catalog for _, catalog, _ in parts]
            where: dict[str, int] = {}
            for stage, (_, _, names) in enumerate(parts):
                for name in names:
                    if name in where:
                        raise RuntimeError(f"streamed_state: tensor {name} is held by two pipeline stages")
                    where[name] = stage
            placeholders: dict[int, tuple[int, str]] = {}  # id of a meta tensor -> (stage, its name there)
            states = []
            for stage, (skel, catalog, _) in enumerate(parts):
                metas = {}
                for n, (shape, dtype) in catalog.items():
                    if n.startswith("optimizer/"):
                        metas[n.removeprefix("optimizer/")] = t = torch.empty(shape, dtype=dtype, device="meta")
                        placeholders[id(t)] = (stage, n)
                states.append(unflatten_state(skel, metas))
            merged = merge_stage_states(states)
            merged_leaves = flatten_state(merged)[1]

            def get(stage: int, n: str) -> torch.Tensor:
                return pull(stage, n, *catalogs[stage][n])

            def optimizer_fetch(path: str) -> torch.Tensor:
                return get(*placeholders[id(merged_leaves[path])])

            yield _StagedWeights(where, catalogs, get), merged, optimizer_fetch

    def barrier(self) -> None:
        """Wait for every stage."""
        dist.barrier()


def _rank_0s_tensors(
    model: nn.Module, info: DistInfo, who: str, *, from_checkpoint: bool
) -> tuple[bool, dict[str, torch.Tensor] | None]:
    """Whether ``model`` was built on the meta device (:func:`ida_eval.loader.empty_model`: every rank but 0 may;
    every rank, ``from_checkpoint``), and on rank 0 its tensors by name, for
    :func:`ida_trainer.sharded.fill_from_rank_0` (None everywhere ``from_checkpoint``: nothing is sent).

    Raises:
        ValueError: the model is partly on the meta device, or rank 0's is (not ``from_checkpoint``).
    """
    tensors = [*model.parameters(), *model.buffers()]
    empty = all(t.is_meta for t in tensors)
    if not empty and any(t.is_meta for t in tensors):
        raise ValueError(f"{who}: the model is partly on the meta device; build it there whole, or load it")
    if from_checkpoint:
        return empty, None
    if info.is_main and empty:
        raise ValueError(f"{who}: rank 0's model is on the meta device; rank 0 holds the weights of the run")
    full = None
    if info.is_main:  # detached now: the CPU copies, whatever moving and sharding do to the parameters
        detached: dict[int, torch.Tensor] = {}
        full = {name: detached.setdefault(id(t), t.detach()) for name, t in named_tensors(model).items()}
    return empty, full


def _fill(
    model: nn.Module,
    full: dict[str, torch.Tensor] | None,
    info: DistInfo,
    *,
    from_checkpoint: bool,
    empty: bool,
    whole: bool,
) -> None:
    """Rank 0's tensors to every rank (:func:`~ida_trainer.sharded.fill_from_rank_0`, a collective), or, for a run
    whose weights will come from a checkpoint, the computed buffers of a model built empty."""
    if not from_checkpoint:
        fill_from_rank_0(model, full, main=info.is_main, whole=whole)
    elif empty:
        compute_non_persistent_buffers(model)


def apply_fsdp(model: nn.Module, info: DistInfo, *, from_checkpoint: bool = False) -> nn.Module:
    """Shard ``model`` with FSDP2 ``fully_shard`` (each decoder layer, then the root); returns it.

    The run starts from rank 0's weights (:func:`ida_trainer.sharded.fill_from_rank_0`): the other ranks may
    pass their model on the meta device (:func:`ida_eval.loader.empty_model`), built but not loaded.
    ``from_checkpoint``: every rank may pass it empty, and nothing is sent; the caller loads every persistent
    tensor from a checkpoint (:func:`ida_trainer.precision.load_state`) before training (``--resume``: the base is
    not read), and the buffers no checkpoint holds are computed
    (:func:`ida_trainer.sharded.compute_non_persistent_buffers`).

    Gradients are reduced in float32 and summed across ranks (the loss is normalised by the global
    supervised-token count).  Checkpoints hold full tensors, gathered one at a time as they are written
    (:func:`ida_trainer.checkpoint.streamed_state`, every rank enters it).

    Raises:
        ValueError: the model uses the nvfp4 recipe (see the module docstring for why), the process group is
            not initialised, rank 0's model is (partly) on the meta device, or the ranks' models differ.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    recipe = model_recipe(model)
    if recipe == "nvfp4":
        raise ValueError(
            "--data-parallel fsdp supports the bf16 recipe only: the nvfp4 recipe's MXFP8 master is a "
            "pair of uint8 buffers (E4M3 payload + per-32-element UE8M0 scales) updated in place by a "
            "fused Lion kernel; FSDP2 shards only floating-point parameters along dim 0 and cannot "
            "keep 32-element scale blocks intact or gather them. Use --pipeline-stages for nvfp4."
        )
    if not dist.is_initialized():
        raise ValueError("apply_fsdp: no process group; call init_distributed first (launch with torchrun)")
    base = _decoder(model)
    empty, full = _rank_0s_tensors(model, info, "apply_fsdp", from_checkpoint=from_checkpoint)
    if not empty:
        model.to(info.device)
    policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
    for layer in base.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if empty:
        model.to_empty(device=info.device)
    _fill(model, full, info, from_checkpoint=from_checkpoint, empty=empty, whole=True)
    del full
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.set_gradient_divide_factor(1.0)
            mod.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return model
