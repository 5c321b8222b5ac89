"""Two-process (gloo, CPU) pipeline and FSDP runs against the single-process engine, same seed and data."""

from __future__ import annotations

import copy
import hashlib
import os
import time
import warnings
from contextlib import nullcontext
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from ida_trainer.checkpoint import (
    flatten_state,
    read_model_tensors,
    read_optimizer_state,
    streamed_state,
    unflatten_state,
    write_optimizer_state,
)
from ida_trainer.config import OptimConfig, ParallelConfig, PrecisionConfig
from ida_trainer.distributed import DistInfo, PipelineEngine, apply_fsdp, init_distributed, split_layers
from ida_trainer.engine import LOGITS_CHUNK_ENTRIES, LocalEngine, enable_activation_checkpointing, grad_norm_and_clip
from ida_trainer.memory import stage_memory
from ida_trainer.precision import apply_recipe, build_optimizer, export_sources, export_state, load_state
from ida_trainer.sharded import holds_shards
from mxfp8_codec import MXFP8Tensor, decode_mxfp8, write_mxfp8_safetensors
from tests.conftest import flip_bit
from tests.torchrun import free_port

pytestmark = pytest.mark.slow  # torch.distributed process groups (gloo) per test

STEPS = 2
MICROBATCHES = 4
CLIP = 0.25  # below the tiny model's gradient norms: every step is clipped


def tiny_model(recipe: str, *, checkpointing: bool = False, vocab: int = 256) -> torch.nn.Module:
    from transformers import NemotronConfig, NemotronForCausalLM

    cfg = NemotronConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    m = NemotronForCausalLM(cfg).train()
    if checkpointing:
        enable_activation_checkpointing(m)
    apply_recipe(m, PrecisionConfig(recipe=recipe))
    return m


def tiny_tied_model(recipe: str, *, untied: bool = False) -> torch.nn.Module:
    """A tiny Qwen3 whose lm_head is its input embedding (tie_word_embeddings), as Qwen3-4B's; ``untied``: the
    same weights with lm_head a copy of its own (its gradient apart from the embedding's)."""
    from tests.ida_eval.support import tiny_model as tiny_lm

    m = tiny_lm("qwen3", 256).train()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    if untied:
        m.config.tie_word_embeddings = False
        m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())
    apply_recipe(m, PrecisionConfig(recipe=recipe))
    return m


def optim_cfg(recipe: str) -> OptimConfig:
    if recipe == "nvfp4":
        return OptimConfig(name="lion", lr=1e-3, weight_decay=0.01)
    return OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)


def step_data(step: int, n: int = MICROBATCHES, b: int = 2, t: int = 16) -> tuple[list[dict[str, torch.Tensor]], int]:
    """Micro-batches like ida_trainer.data builds them: pre-shifted labels, padding mask, positions."""
    g = torch.Generator().manual_seed(100 + step)
    mbs = []
    for _ in range(n):
        ids = torch.randint(3, 256, (b, t), generator=g)
        labels = torch.cat([ids[:, 1:], torch.full((b, 1), -100)], 1)
        labels[:, :3] = -100  # prompt
        mask = torch.ones(b, t, dtype=torch.long)
        mask[1, -4:] = 0  # padding
        labels[1, -5:] = -100
        ids[1, -4:] = 0
        mbs.append(
            {
                "input_ids": ids,
                "labels": labels,
                "attention_mask": mask,
                "position_ids": torch.arange(t).expand(b, t).clone(),
            }
        )
    return mbs, sum(int((mb["labels"] != -100).sum()) for mb in mbs)


def flat_state(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if isinstance(v, MXFP8Tensor):
            out[k + "#payload"], out[k + "#scales"] = v.payload.cpu(), v.scales.cpu()
        else:
            out[k] = v.detach().cpu()
    return out


def single_process_run(
    recipe: str, vocab: int = 256, *, tied: bool = False, adam_eps: float | None = None
) -> tuple[list[float], dict[str, Any], dict[str, Any]]:
    """Losses, exported state and optimizer state of STEPS steps in one process (``tied``: of
    :func:`tiny_tied_model`; ``adam_eps``: the bf16 recipe's AdamW with that ``eps``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers: CPU reductions may split differently with more threads
    try:
        m = tiny_tied_model(recipe) if tied else tiny_model(recipe, vocab=vocab)
        return _single_process_run(m, recipe, adam_eps)
    finally:
        torch.set_num_threads(threads)


def adamw(m: torch.nn.Module, eps: float | None = None) -> torch.optim.Optimizer:
    """The bf16 recipe's optimizer of ``m``, with AdamW's ``eps`` set to ``eps`` when given."""
    return with_eps(build_optimizer(m, optim_cfg("bf16"), PrecisionConfig(recipe="bf16")), eps)


def with_eps(opt: torch.optim.Optimizer, eps: float | None) -> torch.optim.Optimizer:
    """``opt`` with AdamW's ``eps`` set to ``eps`` in every group (None: as built)."""
    if eps is not None:
        for group in opt.param_groups:
            group["eps"] = eps
    return opt


def _single_process_run(
    m: torch.nn.Module, recipe: str, adam_eps: float | None = None
) -> tuple[list[float], dict[str, Any], dict[str, Any]]:
    opt = (
        adamw(m, adam_eps)
        if recipe == "bf16"
        else build_optimizer(m, optim_cfg(recipe), PrecisionConfig(recipe=recipe))
    )
    engine = LocalEngine(m)
    losses, norms = [], []
    for s in range(STEPS):
        mbs, gvt = step_data(s)
        losses.append(engine.forward_backward(mbs, gvt))
        norms.append(grad_norm_and_clip(engine.parameters(), CLIP))
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert min(norms) > CLIP  # clipping was active
    return losses, export_state(m), opt.state_dict()


RANKS_DEADLINE_S = 300  # the longest run here takes ~12 s alone on 2 cores


def _fork_two(worker: Any, *args: Any) -> None:
    """Run ``worker(rank, port, *args)`` in two processes on a fresh port.

    The processes are forked from this one, which has imported torch, transformers and ida already: a spawned
    process imports them again (with this module), about 5 s of CPU per rank, which made this file 94 s instead
    of 13 on 2 cores. Each worker sets its own threads (``_init``) and seeds, so nothing it computes depends on
    what this process ran before; the one-process references the workers are compared with run here.

    A run that has not finished after ``RANKS_DEADLINE_S`` is killed and fails (a hung rank must not hold
    CI until its limit). A rank killed by a signal inside torch's C++ (gloo / TCPStore) is retried once: CI once saw rank 1
    of the chunked-loss run abort with "terminate called without an active exception" (SIGABRT), and
    1 of 73 local runs did the same, ~10 s in (before the first pipeline step), with no Python error;
    the other 72, under CPU and disk load too, passed. A Python exception in a worker (a wrong result)
    is never retried, and neither is a second crash.
    """
    for attempt in (1, 2):
        try:
            ranks = mp.start_processes(worker, args=(free_port(), *args), nprocs=2, join=False, start_method="fork")
            deadline = time.monotonic() + RANKS_DEADLINE_S
            while not ranks.join(timeout=1):  # raises as soon as a rank fails (and stops the other)
                if time.monotonic() > deadline:
                    for p in ranks.processes:
                        p.kill()
                        p.join()
                    pytest.fail(f"{worker.__name__}: the ranks did not finish in {RANKS_DEADLINE_S} s; killed")
            return
        except mp.ProcessExitedException as exc:
            if attempt == 2 or exc.signal_name is None:
                raise
            warnings.warn(
                f"rank {exc.error_index} died by {exc.signal_name}; running both ranks once more", stacklevel=2
            )


def _init(rank: int, world: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)  # two processes share the cores; also fixes the reduction split


def pipeline_worker(rank: int, port: int, recipe: str, out: str) -> None:
    _init(rank, 2, port)
    parallel = ParallelConfig(pipeline_stages=2, microbatches=MICROBATCHES)
    info = init_distributed(parallel)
    try:
        m = tiny_model(recipe, checkpointing=True)  # recomputation must not change a bit
        engine = PipelineEngine(m, parallel, info)
        assert {n.split(".")[2] for n, _ in engine.stage_module.named_parameters() if ".layers." in n} == {
            str(i) for i in split_layers(2, 2)[rank]
        }
        prec = PrecisionConfig(recipe=recipe)
        opt = build_optimizer(engine.stage_module, optim_cfg(recipe), prec)
        losses = []
        for s in range(STEPS):
            mbs, gvt = step_data(s)
            losses.append(engine.forward_backward(mbs, gvt))
            grad_norm_and_clip(engine.parameters(), CLIP, group=engine.group)
            opt.step()
            opt.zero_grad(set_to_none=True)
        # what the trainer's save does: every stage enters, rank 0 reads each tensor from the stage holding it
        with engine.streamed_state(opt) as contents:  # the weights, read here as export_state gives one process
            state = None if contents is None else {k: contents[0][k] for k in contents[0]}
        received = _watch_received() if rank == 0 else None
        with engine.streamed_state(opt) as contents:  # the two files of a checkpoint
            if contents is not None:
                tensors, optimizer_state, fetch = contents
                write_mxfp8_safetensors(Path(out) / "pipeline.safetensors", tensors, metadata={"run": "x"})
                write_optimizer_state(Path(out) / "optimizer.st", optimizer_state, fetch=fetch)
        stage_1 = [*export_state(engine.stage_module).values(), *_leaves(opt)] if rank == 1 else []
        counts: list[Any] = [None, None] if rank == 0 else []
        dist.gather_object(sum(2 if isinstance(v, MXFP8Tensor) else 1 for v in stage_1), counts or None, dst=0)
        if rank == 0:
            assert received is not None
            torch.save(
                {
                    "losses": losses,
                    "state": flat_state(state),
                    "received": received.count,
                    "stage_1_tensors": counts[1],
                    "received_alive": received.most_alive,
                },
                Path(out) / "pipeline.pt",
            )
        dist.barrier()
        # every stage restores its own part of the one optimizer file, exactly
        fresh = build_optimizer(engine.stage_module, optim_cfg(recipe), prec)
        fresh.load_state_dict(read_optimizer_state(Path(out) / "optimizer.st"))
        for p in opt.state:
            for k, v in opt.state[p].items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(v, fresh.state[p][k]), k
        dist.barrier()
    finally:
        dist.destroy_process_group()


def chunked_grad_worker(rank: int, port: int, out: str) -> None:
    _init(rank, 2, port)
    import ida_trainer.engine

    ida_trainer.engine.LOGITS_CHUNK_ENTRIES = 2**12  # 256-word vocabulary: 16-token chunks, two per 2 x 16 tokens
    parallel = ParallelConfig(pipeline_stages=2, microbatches=MICROBATCHES)
    info = init_distributed(parallel)
    try:
        m = tiny_model("bf16")
        engine = PipelineEngine(m, parallel, info)
        mbs, gvt = step_data(0)
        loss = engine.forward_backward(mbs, gvt)
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        parts: list[Any] = [None, None] if rank == 0 else []
        dist.gather_object(grads, parts if rank == 0 else None, dst=0)
        if rank == 0:
            torch.save({"loss": loss, "grads": {**parts[0], **parts[1]}}, Path(out) / "chunked.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_pipeline_chunked_loss_gives_the_same_loss_and_gradients(tmp_path: Path) -> None:
    _fork_two(chunked_grad_worker, str(tmp_path))
    got = torch.load(tmp_path / "chunked.pt", weights_only=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = tiny_model("bf16")
        mbs, gvt = step_data(0)
        loss = LocalEngine(m).forward_backward(mbs, gvt)
    finally:
        torch.set_num_threads(threads)
    ref = {n: p.grad for n, p in m.named_parameters()}
    assert got["loss"] == pytest.approx(loss, rel=1e-6)  # float32 sums in another order
    assert got["grads"].keys() == ref.keys()
    for k, g in ref.items():
        # lm_head's weight gradient is a sum of per-chunk BF16 (autocast) products instead of one
        tol = 1e-2 if k == "lm_head.weight" else 1e-5
        torch.testing.assert_close(got["grads"][k], g, rtol=tol, atol=tol * float(g.abs().max()), msg=k)


class _LogitRows(TorchDispatchMode):
    """The most rows of vocabulary-wide values (logits, their FP32 copies, log-softmax, gradients) that one
    op made: a micro-batch's T tokens when its whole logits exist, one chunk's when they never do (lm_head's
    weight, [vocab, 64], and its transposes are not counted)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and t.dim() >= 2
                and t.shape[-1] == self.vocab
                and t.shape[-2:] != (64, self.vocab)
            ):
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def _grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone() for n, p in m.named_parameters()
    }


def _assert_chunked_equals_whole(loss: float, grads: dict[str, torch.Tensor], ref_loss: float, ref: dict) -> None:
    assert loss == pytest.approx(ref_loss, rel=1e-6)  # float32 sums in another order
    assert grads.keys() == ref.keys()
    for k, g in ref.items():
        # lm_head's weight gradient is a sum of per-chunk BF16 products instead of one
        tol = 1e-2 if k == "lm_head.weight" else 1e-5
        torch.testing.assert_close(grads[k], g, rtol=tol, atol=tol * float(g.abs().max()), msg=k)


@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
def test_local_engine_runs_lm_head_and_loss_in_chunks_above_the_threshold(recipe: str, monkeypatch) -> None:
    """The single-process and FSDP engine made every micro-batch's whole logits: ~14 B per token x vocabulary
    entry, 65 GiB for the qwen3-4b preset's 8 rows of 4096 tokens on 2 ranks (vocabulary 151936), where only the
    pipeline's last stage chunked. Above LOGITS_CHUNK_ENTRIES it now runs lm_head + loss over recomputed token
    chunks as the pipeline does: no op makes more than one chunk's rows of logits, and the loss and gradients
    are the unchunked engine's (to float32 rounding; lm_head's to the rounding of its per-chunk products)."""
    import ida_trainer.engine

    mbs, gvt = step_data(0)  # 2 x 16 tokens per micro-batch
    ref_model = tiny_model(recipe)
    with _LogitRows(256) as whole:
        ref_loss = LocalEngine(ref_model).forward_backward(mbs, gvt)
    monkeypatch.setattr(ida_trainer.engine, "LOGITS_CHUNK_ENTRIES", 2**12)  # 16-token chunks: two per micro-batch
    m = tiny_model(recipe, checkpointing=True)
    with _LogitRows(256) as chunked:
        loss = LocalEngine(m).forward_backward(mbs, gvt)
    assert (whole.rows, chunked.rows) == (32, 16)
    _assert_chunked_equals_whole(loss, _grads(m), ref_loss, _grads(ref_model))


def fsdp_chunked_worker(rank: int, port: int, out: str) -> None:
    _init(rank, 2, port)
    import ida_trainer.engine

    ida_trainer.engine.LOGITS_CHUNK_ENTRIES = 2**12  # 257-word vocabulary: 15-token chunks, three per micro-batch
    info = init_distributed(ParallelConfig(data_parallel="fsdp", microbatches=MICROBATCHES // 2))
    try:
        m = tiny_model("bf16", vocab=FSDP_VOCAB)
        apply_fsdp(m, info)
        opt = adamw(m)
        mbs, gvt = step_data(0)
        with _LogitRows(FSDP_VOCAB) as chunked:
            loss = torch.tensor([LocalEngine(m).forward_backward(mbs[rank::2], gvt)], dtype=torch.float64)
        dist.all_reduce(loss)
        grads = _grads(m)  # gathers the reduce-scattered gradients: every rank calls it
        opt.step()  # the AdamW moments exist from here: what a rank holds while training
        params = list(m.parameters())
        local = {
            "weights": [p.to_local() for p in params] + list(m.buffers()),
            "grads": [p.grad.to_local() for p in params],
            "optimizer": [t.to_local() for st in opt.state.values() for k, t in st.items() if k.startswith("exp_avg")],
        }
        if rank == 0:
            torch.save(
                {
                    "loss": float(loss),
                    "grads": grads,
                    "rows": chunked.rows,
                    "shard_bytes": {k: sum(t.numel() * t.element_size() for t in ts) for k, ts in local.items()},
                },
                Path(out) / "fsdp_chunked.pt",
            )
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp_chunked_step(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One FSDP2 step of 2 gloo processes with lm_head + loss chunked (rank 0's record of it), run once for
    the tests that read it."""
    out = tmp_path_factory.mktemp("fsdp_chunked")
    _fork_two(fsdp_chunked_worker, str(out))
    return torch.load(out / "fsdp_chunked.pt", weights_only=False)


def test_fsdp_runs_lm_head_and_loss_in_chunks_through_the_root(fsdp_chunked_step: dict[str, Any]) -> None:
    """Under FSDP2 the chunked loss bypasses the root's forward (it calls the decoder, then lm_head): it is
    registered as an FSDP forward method, so the root still gathers the embeddings, final norm and lm_head
    around it and reduce-scatters their gradients; the result is the single-process unchunked step's."""
    got = fsdp_chunked_step
    m = tiny_model("bf16", vocab=FSDP_VOCAB)
    mbs, gvt = step_data(0)
    ref_loss = LocalEngine(m).forward_backward(mbs, gvt)
    assert got["rows"] == 15
    _assert_chunked_equals_whole(got["loss"], got["grads"], ref_loss, _grads(m))


def test_fsdp_memory_counts_the_shards_a_rank_holds(fsdp_chunked_step: dict[str, Any]) -> None:
    """ida_trainer.memory.fsdp_memory's sharded part is what an FSDP2 rank holds after a step: rank 0's local
    FP32 masters (and the whole buffers), gradients and AdamW moments, with the 257-row embedding and lm_head
    split unevenly (129 + 128 rows)."""
    from transformers import NemotronConfig

    from ida_trainer.memory import fsdp_memory

    got = fsdp_chunked_step["shard_bytes"]
    est = fsdp_memory(
        NemotronConfig(**tiny_model("bf16", vocab=FSDP_VOCAB).config.to_dict()), PrecisionConfig(recipe="bf16"), ranks=2
    )
    assert got == {"weights": est.weights_bytes, "grads": est.grads_bytes, "optimizer": est.optimizer_bytes}


FSDP_VOCAB = 257  # odd: FSDP2 splits the embedding and lm_head rows unevenly (129 + 128)
# AdamW divides by sqrt(v) + eps. With the default 1e-8, a gradient element that cancels to within float32 rounding
# of zero takes a full +-lr step whose sign is the sum order's (FSDP reduce-scatters two partial sums; a tied
# pipeline adds the two stages' gradients of its one matrix), and the next step's gradients follow: on an AVX2 AMD
# EPYC (2026-12-07) FSDP's weights after 2 steps differed by up to 1.5e-3 and the second loss by 1.5e-6 relative.
# An eps of ~10 % of these gradients (~1e-3: norm clipped to CLIP) bounds that step by lr / eps times the gradient's
# rounding: there, the same losses and weights within 6e-8. Every bf16 test that compares two sum orders uses it.
ORDER_ADAM_EPS = 1e-4


class _FullTensorWatch:
    """Counts DTensor.full_tensor calls in this process, and the most full tensors of earlier calls whose memory
    is still held (by any tensor or array over it) at any call: what rank 0 holds beyond its shards while a
    checkpoint is written."""

    def __init__(self) -> None:
        self.alive: list[StorageWeakRef] = []
        self.count = self.most_alive = 0

    def clear(self) -> None:
        self.alive.clear()
        self.count = self.most_alive = 0

    def seen(self, t: torch.Tensor) -> torch.Tensor:
        self.most_alive = max(self.most_alive, sum(not r.expired() for r in self.alive))
        self.alive.append(StorageWeakRef(t.untyped_storage()))
        self.count += 1
        return t


def _watch_received() -> _FullTensorWatch:
    """The same count for the tensors this process receives with dist.recv (a pipeline save's rank 0)."""
    watch = _FullTensorWatch()
    recv = dist.recv

    def watched(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = recv(tensor, *args, **kwargs)
        watch.seen(tensor)
        return out

    dist.recv = watched  # type: ignore[assignment]
    return watch


def _watch_full_tensors() -> _FullTensorWatch:
    watch = _FullTensorWatch()
    full_tensor = DTensor.full_tensor
    DTensor.full_tensor = lambda self, **kw: watch.seen(full_tensor(self, **kw))  # type: ignore[method-assign]
    return watch


def _leaves(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return list(flatten_state(opt.state_dict())[1].values())


def _full_optimizer_state(contents: tuple[Any, Any, Any]) -> Any:
    """The optimizer state streamed_state yields, with every tensor read (full) and copied."""
    _, state, fetch = contents
    skeleton, tensors = flatten_state(state)
    return unflatten_state(skeleton, {n: fetch(n).clone() for n in tensors})


def fsdp_worker(rank: int, port: int, out: str) -> None:
    _init(rank, 2, port)
    parallel = ParallelConfig(data_parallel="fsdp", microbatches=MICROBATCHES // 2)
    info = init_distributed(parallel)
    try:
        m = tiny_model("bf16", vocab=FSDP_VOCAB)
        apply_fsdp(m, info)
        opt = adamw(m, ORDER_ADAM_EPS)
        engine = LocalEngine(m)
        losses = []
        for s in range(STEPS):
            mbs, gvt = step_data(s)
            loss = engine.forward_backward(mbs[rank::2], gvt)  # this rank's half of the global batch
            t = torch.tensor([loss], dtype=torch.float64)
            dist.all_reduce(t)
            losses.append(float(t))
            grad_norm_and_clip(engine.parameters(), CLIP)  # DTensor gradients: FSDP's own global norm
            opt.step()
            opt.zero_grad(set_to_none=True)
        # what the trainer's save does (ida_trainer.checkpoint.streamed_state): every rank enters, rank 0 reads
        # the full tensors one at a time; the full weights read here, as export_state gives one process
        gathered = _watch_full_tensors() if rank == 0 else None
        with streamed_state(m, opt, main=rank == 0) as contents:
            state = None if contents is None else {k: contents[0][k].clone() for k in contents[0]}
        with streamed_state(m, opt, main=rank == 0) as contents:  # the two files of a checkpoint
            if contents is not None:
                assert gathered is not None
                gathered.clear()
                tensors, optimizer_state, fetch = contents
                write_mxfp8_safetensors(Path(out) / "model.safetensors", tensors, orientation="in_out", progress=False)
                write_optimizer_state(Path(out) / "optimizer.st", optimizer_state, fetch=fetch)
                full_tensors_alive = gathered.most_alive
                gathers = gathered.count
        dist.barrier()
        # a checkpoint's round trip, as --resume: a fresh sharded model and optimizer loaded from the files
        full = read_optimizer_state(Path(out) / "optimizer.st")
        saved = copy.deepcopy(full)  # (opt2 takes full's `step` tensors as its own, and steps on below)
        m2 = tiny_model("bf16", vocab=FSDP_VOCAB)
        apply_fsdp(m2, info)
        opt2 = adamw(m2, ORDER_ADAM_EPS)
        load_state(m2, read_model_tensors(Path(out) / "model.safetensors"))
        opt2.load_state_dict(full)
        with streamed_state(m2, opt2, main=rank == 0) as contents:
            again = None if contents is None else _full_optimizer_state(contents)
        for model, optim in ((m, opt), (m2, opt2)):  # one more step each: the loaded one must go on the same
            mbs, gvt = step_data(STEPS)
            LocalEngine(model).forward_backward(mbs[rank::2], gvt)
            grad_norm_and_clip([q for q in model.parameters() if q.requires_grad], CLIP)
            optim.step()
            optim.zero_grad(set_to_none=True)
        masters = [
            (n, p.full_tensor(), p2.full_tensor())
            for (n, p), (_, p2) in zip(m.named_parameters(), m2.named_parameters(), strict=True)
        ]
        if rank == 0:
            torch.save(
                {
                    "losses": losses,
                    "state": flat_state(state),
                    "optimizer": saved,
                    "optimizer_again": again,
                    "full_tensors_alive": full_tensors_alive,
                    "gathers": gathers,
                    "dtensors": sum(isinstance(t, DTensor) for t in [*m.state_dict().values(), *_leaves(opt)]),
                    "masters_differ": [n for n, a, b in masters if not torch.equal(a, b)],
                    "local_rows": [p.to_local().shape[0] for _, p in m.named_parameters()],
                },
                Path(out) / "fsdp.pt",
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["nvfp4", "bf16"])
def test_pipeline_1f1b_equals_single_process_bit_for_bit(recipe: str, tmp_path: Path) -> None:
    _fork_two(pipeline_worker, recipe, str(tmp_path))
    got = torch.load(tmp_path / "pipeline.pt", weights_only=False)
    ref_losses, ref_state, ref_opt = single_process_run(recipe)
    assert got["losses"] == ref_losses  # exact, step for step
    # the save streams: each of stage 1's tensors (an MXFP8 master: payload and scales) is sent to rank 0 once, as
    # it is written, and none accumulate there (at most the previous one is still held at the next)
    assert got["received"] == got["stage_1_tensors"] > 0 and got["received_alive"] <= 1
    ref = flat_state(ref_state)
    assert got["state"].keys() == ref.keys()
    for k in ref:
        assert torch.equal(got["state"][k], ref[k]), k
    # one checkpoint file with global names, byte-identical to the single-process run's
    write_mxfp8_safetensors(tmp_path / "single.safetensors", ref_state, metadata={"run": "x"})
    digest = [
        hashlib.sha256((tmp_path / f).read_bytes()).hexdigest() for f in ("pipeline.safetensors", "single.safetensors")
    ]
    assert digest[0] == digest[1]
    # one optimizer file, the stages' states merged: a single-process run's state, bit for bit
    opt = read_optimizer_state(tmp_path / "optimizer.st")
    assert opt["param_groups"] == ref_opt["param_groups"] and opt["state"].keys() == ref_opt["state"].keys()
    for i, entry in ref_opt["state"].items():
        assert entry.keys() == opt["state"][i].keys()
        for k, v in entry.items():
            assert torch.equal(opt["state"][i][k], v) if isinstance(v, torch.Tensor) else opt["state"][i][k] == v, (
                i,
                k,
            )
    exact, ref_exact = opt["ida"].pop("exact_params"), ref_opt["ida"].pop("exact_params")
    assert opt["ida"] == ref_opt["ida"] and exact.keys() == ref_exact.keys()
    assert all(torch.equal(exact[n], t) for n, t in ref_exact.items())


def _as_float(v: MXFP8Tensor | torch.Tensor) -> torch.Tensor:
    """A copy in FP32 (an MXFP8 value decoded)."""
    return (
        decode_mxfp8(*v, dtype=torch.float32) if isinstance(v, MXFP8Tensor) else v.detach().to(torch.float32, copy=True)
    )


def tied_pipeline_worker(rank: int, port: int, recipe: str, out: str, chunk_entries: int) -> None:
    """STEPS steps of :func:`tiny_tied_model` over 2 stages, a checkpoint, and one more step from it and on, with
    lm_head + loss in chunks above ``chunk_entries`` logits."""
    import ida_trainer.engine

    ida_trainer.engine.LOGITS_CHUNK_ENTRIES = chunk_entries
    _init(rank, 2, port)
    parallel = ParallelConfig(pipeline_stages=2, microbatches=MICROBATCHES)
    info = init_distributed(parallel)
    prec = PrecisionConfig(recipe=recipe)
    empty = torch.device("meta") if rank == 1 else nullcontext()  # as the trainer builds it there
    try:
        with empty:
            m = tiny_tied_model(recipe)
        engine = PipelineEngine(m, parallel, info)
        opt = build_optimizer(engine.stage_module, optim_cfg(recipe), prec)
        with_eps(opt, ORDER_ADAM_EPS if recipe == "bf16" else None)  # two sum orders: see ORDER_ADAM_EPS
        losses, first_grad, head = [], None, []  # head: stage 0's embedding before each step, the last stage's lm_head
        for s in range(STEPS):
            mbs, gvt = step_data(s)
            before = m.model.embed_tokens.weight.detach().clone() if rank == 0 else None
            losses.append(engine.forward_backward(mbs, gvt))
            head.append(before if rank == 0 else m.lm_head.weight.detach().clone())
            if s == 0 and rank == 0:
                first_grad = m.model.embed_tokens.weight.grad.clone()
            grad_norm_and_clip(engine.parameters(), CLIP, group=engine.group)
            opt.step()
            opt.zero_grad(set_to_none=True)
        state = None
        with engine.streamed_state(opt) as contents:  # the two files of a checkpoint
            if contents is not None:
                tensors, optimizer_state, fetch = contents
                state = {k: _as_float(tensors[k]) for k in tensors}
                write_mxfp8_safetensors(Path(out) / "pipeline.safetensors", tensors, metadata={"run": "x"})
                write_optimizer_state(Path(out) / "optimizer.st", optimizer_state, fetch=fetch)
        dist.barrier()
        # --resume: a fresh model, pruned to its stage, takes the files; one more step of each must agree
        with empty:
            m2 = tiny_tied_model(recipe)
        engine2 = PipelineEngine(m2, parallel, info)
        load_state(engine2.stage_module, read_model_tensors(Path(out) / "pipeline.safetensors"))
        opt2 = build_optimizer(engine2.stage_module, optim_cfg(recipe), prec)
        opt2.load_state_dict(read_optimizer_state(Path(out) / "optimizer.st"))
        again = []
        for e, o in ((engine, opt), (engine2, opt2)):
            mbs, gvt = step_data(STEPS)
            before = e.stage_module.model.embed_tokens.weight.detach().clone() if rank == 0 else None
            again.append(e.forward_backward(mbs, gvt))
            head.append(before if rank == 0 else e.stage_module.lm_head.weight.detach().clone())
            grad_norm_and_clip(e.parameters(), CLIP, group=e.group)
            o.step()
            o.zero_grad(set_to_none=True)
        mine, resumed = flat_state(export_state(m)), flat_state(export_state(m2))
        resumed_differ = [k for k in mine if not torch.equal(mine[k], resumed[k])]
        stage = engine.stage_module
        held = [n for n, _ in stage.named_parameters()]
        anchors = {id(mod.weight) for mod in stage.modules() if hasattr(mod, "weight_payload")}
        borrowed = [stage.lm_head.weight] if rank == 1 else []
        tensors = {id(t): t for t in [*stage.parameters(), *stage.buffers(), *borrowed]}
        weights = sum(t.numel() * t.element_size() for i, t in tensors.items() if i not in anchors)
        moments = sum(t.numel() * t.element_size() for v in opt.state.values() for t in v.values() if t.dim() > 0)
        facts = {"held": held, "resumed_differ": resumed_differ, "again": again, "weights": weights, "state": moments}
        facts["head"] = head
        parts: list[Any] = [None, None] if rank == 0 else []
        dist.gather_object(facts, parts or None, dst=0)
        if rank == 0:
            torch.save(
                {"losses": losses, "first_grad": first_grad, "state": state, "ranks": parts}, Path(out) / "tied.pt"
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe,chunk_entries",
    [("nvfp4", LOGITS_CHUNK_ENTRIES), ("bf16", LOGITS_CHUNK_ENTRIES), ("nvfp4", 2**12)],
    ids=["nvfp4", "bf16", "nvfp4-chunked"],
)
def test_a_pipeline_trains_a_tied_lm_head_as_one_matrix(
    recipe: str, chunk_entries: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen3 ties lm_head to its input embedding. Stage 0 holds that matrix; the last stage borrows it each step
    and returns its gradient, so one matrix is clipped and updated once (until 2026-12-07 each stage trained a
    copy: the losses left one process's at step 2). The summed gradient is exactly the embedding's plus lm_head's
    (measured apart on an untied copy in one process), so the run is one process's to rounding (one process sums
    the two per micro-batch); its checkpoint is one process's, and resumes exactly. Also where lm_head + loss run
    in recomputed chunks, as Qwen3-4B's 151936-word vocabulary makes them (here: 2 chunks per micro-batch, in
    both engines)."""
    import ida_trainer.engine
    from tests.ida_eval.support import tiny_config

    monkeypatch.setattr(ida_trainer.engine, "LOGITS_CHUNK_ENTRIES", chunk_entries)
    _fork_two(tied_pipeline_worker, recipe, str(tmp_path), chunk_entries)
    got = torch.load(tmp_path / "tied.pt", weights_only=False)
    ref_losses, ref_state, ref_opt = single_process_run(recipe, tied=True, adam_eps=ORDER_ADAM_EPS)  # (bf16's)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        untied = tiny_tied_model(recipe, untied=True)
        mbs, gvt = step_data(0)
        LocalEngine(untied).forward_backward(mbs, gvt)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got["first_grad"], untied.model.embed_tokens.weight.grad + untied.lm_head.weight.grad)

    assert got["losses"][0] == ref_losses[0]  # the same forward, bit for bit
    assert got["losses"] == pytest.approx(ref_losses, rel=1e-4)
    stage_0, stage_1 = got["ranks"]
    # every step (and the first after a resume) the last stage's lm_head is stage 0's embedding as it then was
    assert len(stage_0["head"]) == STEPS + 2 and all(map(torch.equal, stage_0["head"], stage_1["head"]))
    assert "model.embed_tokens.weight" in stage_0["held"] and "lm_head.weight" not in stage_0["held"] + stage_1["held"]

    ref = {k: _as_float(v) for k, v in ref_state.items()}
    assert got["state"].keys() == ref.keys()
    for k, want in ref.items():
        have = got["state"][k]
        if recipe == "nvfp4":  # BF16 sums: where a Lion sign is near zero it may flip, and move a value a code
            assert float((have != want).float().mean()) < 0.1, k  # (measured: at most 4.5 % of a tensor's values)
        elif k == "model.embed_tokens.weight":  # FP32 sums: the tied matrix to their rounding,
            torch.testing.assert_close(have, want, rtol=1e-6, atol=1e-8, msg=k)
        else:
            assert torch.equal(have, want), k  # every other tensor bit for bit
    saved = read_model_tensors(tmp_path / "pipeline.safetensors")  # the matrix once, as one process writes it
    assert saved.keys() == ref.keys() and "model.embed_tokens.weight" in saved and "lm_head.weight" not in saved
    opt = read_optimizer_state(tmp_path / "optimizer.st")
    assert opt["ida"]["param_order"] == ref_opt["ida"]["param_order"] and opt["state"].keys() == ref_opt["state"].keys()

    assert stage_0["again"][0] == stage_0["again"][1] and stage_0["resumed_differ"] == stage_1["resumed_differ"] == []

    # ida_trainer.memory counts what each stage holds: the matrix, its optimizer state on stage 0 alone, and the
    # last stage's borrowed copy (bf16: with autocast's BF16 copy of it, held for backward)
    count = stage_memory(tiny_config("qwen3", 256), PrecisionConfig(recipe=recipe), stages=2)
    autocast_copy = 0 if recipe == "nvfp4" else 2 * untied.lm_head.weight.numel()
    assert [c.weights_bytes for c in count] == [stage_0["weights"], stage_1["weights"] + autocast_copy]
    assert [c.optimizer_bytes for c in count] == [stage_0["state"], stage_1["state"]]


@pytest.mark.slow
def test_fsdp_bf16_equals_single_process(tmp_path: Path) -> None:
    _fork_two(fsdp_worker, str(tmp_path))
    got = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    ref_losses, ref_state, ref_opt = single_process_run("bf16", vocab=FSDP_VOCAB, adam_eps=ORDER_ADAM_EPS)
    # Same computation; only the order of float32 gradient sums differs (two ranks' partial sums are
    # reduce-scattered instead of accumulated in sequence), so results agree to float32 rounding (ORDER_ADAM_EPS).
    assert got["losses"] == pytest.approx(ref_losses, rel=1e-6)
    ref = flat_state(ref_state)
    assert got["state"].keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got["state"][k], ref[k], rtol=1e-5, atol=2e-6, msg=k)
    assert 129 in got["local_rows"]  # rank 0's share of the 257 embedding rows: uneven shards were tested

    # A checkpoint is written one full tensor at a time: each sharded tensor is gathered once, as it is written,
    # and none accumulate: when the next is gathered, at most the previous one is still held (the collective's
    # work handle lets it go on a backend thread a moment later: 1 under load, 0 on an idle machine); before
    # 2026-12-07 rank 0 gathered all of them before writing
    assert got["gathers"] == got["dtensors"] > 0
    assert got["full_tensors_alive"] <= 1

    # The optimizer file holds a single-process run's state: same layout, full tensors, same values
    opt = got["optimizer"]
    assert not holds_shards(opt)
    assert opt["param_groups"] == ref_opt["param_groups"] and opt["state"].keys() == ref_opt["state"].keys()
    for i, entry in ref_opt["state"].items():
        assert entry.keys() == opt["state"][i].keys()
        for k, v in entry.items():
            torch.testing.assert_close(opt["state"][i][k], v, rtol=1e-4, atol=1e-9, msg=f"state {i} {k}")
    exact, ref_exact = opt["ida"].pop("exact_params"), ref_opt["ida"].pop("exact_params")
    assert opt["ida"] == ref_opt["ida"] and exact.keys() == ref_exact.keys()
    for n, v in ref_exact.items():
        torch.testing.assert_close(exact[n], v, rtol=1e-5, atol=2e-6, msg=n)
    # ... and loading it into a fresh FSDP model and optimizer restores every bit
    assert got["masters_differ"] == []
    again = got["optimizer_again"]
    again["ida"].pop("exact_params")
    assert again["ida"] == opt["ida"] and again["param_groups"] == opt["param_groups"]
    for i, entry in opt["state"].items():
        for k, v in entry.items():
            assert torch.equal(again["state"][i][k], v), (i, k)


def fill_worker(rank: int, port: int, ckpt: str, out: str, rank_1_ckpt: str, mode: str) -> None:
    """Rank 0 loads ``ckpt`` (load_model), rank 1 builds ``rank_1_ckpt`` empty (empty_model), as the trainer does;
    both shard it (``mode`` "fsdp": apply_fsdp, bf16 recipe) or prune it to their stage ("pipeline": PipelineEngine,
    nvfp4 recipe); each saves what it then holds, full, or the error it raised."""
    from ida_eval import load_model
    from ida_eval.loader import empty_model
    from ida_trainer.sharded import named_tensors

    _init(rank, 2, port)
    pipeline = mode == "pipeline"
    parallel = ParallelConfig(pipeline_stages=2, microbatches=2) if pipeline else ParallelConfig(data_parallel="fsdp")
    info = init_distributed(parallel)
    dtype = torch.bfloat16 if pipeline else torch.float32
    try:
        m, _ = load_model(ckpt, dtype=dtype) if rank == 0 else empty_model(rank_1_ckpt, dtype=dtype)
        apply_recipe(m, PrecisionConfig(recipe="nvfp4" if pipeline else "bf16"))  # as the trainer
        if rank == 0:
            torch.save({n: t.clone() for n, t in named_tensors(m).items()}, Path(out) / "loaded.pt")
        try:
            held = PipelineEngine(m, parallel, info).stage_module if pipeline else apply_fsdp(m, info)
        except ValueError as exc:
            (Path(out) / f"error{rank}.txt").write_text(str(exc))
            return
        full = {n: (t.full_tensor() if isinstance(t, DTensor) else t).clone() for n, t in named_tensors(held).items()}
        torch.save(full, Path(out) / f"held{rank}.pt")
        (Path(out) / f"exported{rank}.txt").write_text("\n".join(export_sources(held)))  # what a save writes
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Qwen3 with tied embeddings, the same untied, and untied with 4 layers instead of 2."""
    from tests.ida_eval.support import SMALL_PROBLEMS, tiny_model, train_tokenizer

    tok = train_tokenizer([p["prompt"] for p in SMALL_PROBLEMS], vocab_size=300)
    out = {}
    for name, kw in (("tied", {"tie": True}), ("untied", {"tie": False}), ("deeper", {"tie": False, "layers": 4})):
        out[name] = tmp_path_factory.mktemp(name) / "qwen3"
        tiny_model("qwen3", len(tok), **kw).to(torch.bfloat16).save_pretrained(out[name])
        tok.save_pretrained(out[name])
    return out


@pytest.mark.parametrize("mode", ["fsdp", "pipeline"])
def test_ranks_but_0_build_the_model_empty_and_get_rank_0s_weights(
    mode: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """One host copy of the base per machine: rank 1 builds the model on the meta device and, once sharded (FSDP2)
    or pruned to its stage (pipeline), holds exactly rank 0's loaded weights and buffers: the rotary inv_freq,
    which no state dict carries, tied weights (FSDP2), the nvfp4 recipe's MXFP8 masters (pipeline: untied, as
    pipelines take them). A rank whose model differs is named, on every rank, before anything is sent: untied
    (FSDP2), 4 layers (pipeline: rank 1, the last stage, holds layers 2 and 3, which rank 0's 2 layers lack)."""
    main = str(checkpoints["untied" if mode == "pipeline" else "tied"])
    _fork_two(fill_worker, main, str(tmp_path), main, mode)
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert {"model.rotary_emb.inv_freq", "lm_head.weight", "model.embed_tokens.weight"} <= set(loaded)
    if mode == "pipeline":
        assert any(n.endswith("weight_payload") for n in loaded) and not any(n.endswith("proj.weight") for n in loaded)
    names = set()
    for rank in (0, 1):
        held = torch.load(tmp_path / f"held{rank}.pt", weights_only=True)
        assert set(held) <= set(loaded) and (mode == "pipeline" or set(held) == set(loaded))
        bad = [n for n in held if not torch.equal(held[n], loaded[n]) or held[n].dtype != loaded[n].dtype]
        assert not bad, f"rank {rank}: {bad}"
        names |= set(held)
    assert names == set(loaded)  # every tensor is somewhere
    if mode == "pipeline":
        assert "lm_head.weight" in held and "model.embed_tokens.weight" not in held  # rank 1: the last stage
    else:  # FSDP2 keeps the tie as one parameter: a save writes the matrix once, under the embedding's name
        for rank in (0, 1):
            exported = (tmp_path / f"exported{rank}.txt").read_text().split()
            assert "model.embed_tokens.weight" in exported and "lm_head.weight" not in exported, rank
    (tmp_path / "odd").mkdir()
    odd = checkpoints["deeper" if mode == "pipeline" else "untied"]
    _fork_two(fill_worker, main, str(tmp_path / "odd"), str(odd), mode)
    want = (
        "(('model.layers.2.self_attn.q_norm.weight',), (16,), torch.bfloat16) there, None on rank 0"
        if mode == "pipeline"
        else "(('model.embed_tokens.weight',), (300, 64), torch.float32) there, "
        "(('model.embed_tokens.weight', 'lm_head.weight'), (300, 64), torch.float32) on rank 0"  # tied there
    )
    for rank in (0, 1):
        line = (tmp_path / "odd" / f"error{rank}.txt").read_text()
        assert (
            line
            == f"rank 1's model differs from rank 0's: {want} (names, shape, dtype); every rank must build the same model"
        )


def test_fsdp_refuses_nvfp4_with_the_reason() -> None:
    m = tiny_model("nvfp4")
    with pytest.raises(ValueError, match="bf16 recipe only.*uint8"):
        apply_fsdp(m, DistInfo(data_parallel="fsdp"))


def verify_once_worker(rank: int, port: int, ckpts: list[str], out: str, local_world: str) -> None:
    """Both ranks run the trainer's resume check (``Ranks.once_per_machine`` of ``verify_checkpoint``) of each of
    ``ckpts`` as torchrun starts them (``LOCAL_WORLD_SIZE``); each saves what it hashed and what it was told."""
    import ida_common.checksums as checksums
    from ida_common.launch import launch_env
    from ida_eval.parallel import Ranks
    from ida_trainer.checkpoint import verify_checkpoint

    _init(rank, 2, port)
    os.environ["LOCAL_WORLD_SIZE"] = local_world
    hashed: list[str] = []
    plain = checksums._hash_all

    def counting(directory: Path, names: Any) -> dict[str, str]:
        names = list(names)
        hashed.extend(names)
        return plain(directory, names)

    checksums._hash_all = counting
    init_distributed(ParallelConfig(data_parallel="fsdp"))
    try:
        seen = []
        for ckpt in ckpts:
            hashed.clear()
            try:
                verdict: Any = Ranks(launch_env()).once_per_machine(partial(verify_checkpoint, ckpt))
            except ValueError as exc:
                verdict = str(exc)
            seen.append({"hashed": list(hashed), "verdict": verdict})
        torch.save(seen, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_resume_hashes_the_checkpoint_once_per_machine(tmp_path: Path) -> None:
    """``--resume`` checks a checkpoint's ~50 GB (Qwen3-4B under FSDP2) against its SHA256SUMS: on one machine rank 0
    reads it for every rank (ida_eval.parallel.Ranks.once_per_machine, which ida_eval.mbxp's describe_checkpoint
    goes through too), and a damaged file is the same one line on every rank; across machines (torchrun's
    LOCAL_WORLD_SIZE below WORLD_SIZE) each rank checks the copy it reads."""
    from ida_common.checksums import write_sums

    good, damaged = tmp_path / "good" / "ckpt-000002", tmp_path / "damaged" / "ckpt-000002"
    for ckpt in (good, damaged):
        ckpt.mkdir(parents=True)
        for name, size in (("model.safetensors", 3000), ("optimizer.st", 5000), ("trainer_state.json", 10)):
            (ckpt / name).write_bytes(bytes(range(256)) * (size // 256))
        write_sums(ckpt)
    flip_bit(damaged / "optimizer.st", 4321)
    runs = {"one machine": "2", "two machines": "1"}
    for what, local_world in runs.items():
        (tmp_path / what).mkdir()
        _fork_two(verify_once_worker, [str(good), str(damaged)], str(tmp_path / what), local_world)
    got = {what: [torch.load(tmp_path / what / f"rank{r}.pt") for r in (0, 1)] for what in runs}
    weights = ["model.safetensors", "optimizer.st"]  # trainer_state.json is checked as it is read
    assert [g[0]["hashed"] for g in got["one machine"]] == [weights, []]
    assert [g[0]["hashed"] for g in got["two machines"]] == [weights, weights]  # each rank its own copy
    assert all(g[0]["verdict"] is None for run in got.values() for g in run)  # verify_checkpoint's None, everywhere
    for run in got.values():  # the damaged file: the same line on every rank
        lines = [g[1]["verdict"] for g in run]
        assert lines[0] == lines[1] and lines[0].startswith(f"{damaged / 'optimizer.st'} is damaged (its bytes")


def test_init_distributed_checks_the_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="needs exactly 2 processes.*torchrun --nproc-per-node 2"):
        init_distributed(ParallelConfig(pipeline_stages=2, microbatches=2))
    with pytest.raises(ValueError, match="launched with 3 processes"):
        init_distributed(ParallelConfig())
    monkeypatch.delenv("WORLD_SIZE")
    assert init_distributed(ParallelConfig()) == DistInfo()


def test_pipeline_engine_rejects_bad_setups() -> None:
    m = tiny_model("nvfp4")
    with pytest.raises(ValueError, match="2 stages configured but the process group has 1 ranks"):
        PipelineEngine(m, ParallelConfig(pipeline_stages=2, microbatches=2), DistInfo())
    with pytest.raises(ValueError, match="needs a transformers causal LM"):
        PipelineEngine(
            torch.nn.Linear(2, 2),
            ParallelConfig(pipeline_stages=2, microbatches=2),
            DistInfo(world_size=2, pipeline_stages=2),
        )


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 64), stages=st.integers(1, 8))
def test_split_layers_covers_every_layer_once_balanced(layers: int, stages: int) -> None:
    if layers < stages:
        with pytest.raises(ValueError):
            split_layers(layers, stages)
        return
    parts = split_layers(layers, stages)
    assert [i for r in parts for i in r] == list(range(layers))
    sizes = [len(r) for r in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_split_layers() -> None:
    assert split_layers(32, 2) == [range(0, 16), range(16, 32)]
    assert split_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError, match="at least one layer"):
        split_layers(1, 2)


def gather_on_demand_worker(rank: int, port: int, out: str) -> None:
    """Rank 0 reads two of three sharded tensors, in its own order, then fails while writing; the other rank
    serves exactly those gathers, leaves the block when rank 0 does, and goes on to the next collective."""
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from ida_trainer.sharded import gather_on_demand

    _init(rank, 2, port)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a rank left waiting fails, never hangs
    try:
        mesh = init_device_mesh("cpu", (2,))
        sources = {
            n: distribute_tensor(torch.arange(6.0).reshape(3, 2) + i, mesh, [Shard(0)]) for i, n in enumerate("abc")
        }
        sources["step"] = torch.tensor(7.0)  # a plain tensor: no collective
        got, failed = {}, None
        try:
            with gather_on_demand(sources, main=rank == 0) as fetch:
                if fetch is not None:
                    got = {n: fetch(n) for n in ("c", "step", "a")}
                    raise OSError("disk full")
        except OSError as exc:
            failed = str(exc)
        after = torch.tensor([rank + 1.0])
        dist.all_reduce(after)  # every rank is past the block: no one waits for a gather that never comes
        torch.save({"got": got, "failed": failed, "after": float(after)}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_gather_on_demand_serves_rank_0s_reads_and_lets_go_when_it_fails(tmp_path: Path) -> None:
    _fork_two(gather_on_demand_worker, str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["failed"] == "disk full" and r1["failed"] is None and r0["after"] == r1["after"] == 3.0
    assert list(r0["got"]) == ["c", "step", "a"] and r1["got"] == {}
    assert torch.equal(r0["got"]["c"], torch.arange(6.0).reshape(3, 2) + 2) and float(r0["got"]["step"]) == 7.0
    assert torch.equal(r0["got"]["a"], torch.arange(6.0).reshape(3, 2))
