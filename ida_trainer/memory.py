"""Training memory per parameter and per pipeline stage, counted on the meta device from the real module tree.

Bytes per parameter (weights + gradients + optimizer state; ``B`` = bytes):

=====================================  ==========  ========  ================  =========
tensor class                           weights     grads     optimizer         total
=====================================  ==========  ========  ================  =========
nvfp4: NVFP4 projection (MXFP8 master)  1 + 1/32    2 (BF16)  2 (Lion m, BF16)  5.03 B
nvfp4: + ``compensated`` write-back                           + 4 (FP32 resid.)  9.03 B
nvfp4: BF16 params (embed, lm_head,     2           2         2 (Lion m, BF16)  6 B
norms, kept layers)
bf16: every parameter (FP32 master)     4           4 (FP32)  8 (AdamW m, v)    16 B
bf16: + autocast's BF16 weight copies   2 (held from forward to backward)       18 B
=====================================  ==========  ========  ================  =========

The BF16 copies of the last row are held for backward by the GEMMs that save them: ``lm_head``'s always, a
decoder layer's only without activation checkpointing. With it (the default), a layer's copies live while it
is computed or recomputed and count as a transient of its stage: autocast's weight-cast cache, which would
keep every copy until the forward ends, is off (:func:`ida_trainer.precision.bf16_autocast`). Embedding
lookups run in FP32 and make no copy (unless the embedding is also the tied ``lm_head``). A tied embedding in
a pipeline is stage 0's; the last stage also holds it, and its gradient, as ``lm_head``'s weight (no optimizer
state: :class:`ida_trainer.distributed.PipelineEngine` lends it each step).

The weights and gradients are not taken from this table: :func:`stage_memory` applies the recipe on the
``meta`` device and sums ``numel * element_size`` of the actual parameters and buffers of each stage's
modules (an NVFP4 layer's uint8 payload and scales, its BF16 gradient, BF16 or FP32 parameters).  Only the
optimizer state per element (Lion: one BF16 momentum; AdamW: two FP32 moments) and the transients are
rules, stated here:

* **Activations** (per stage, 1F1B, activation checkpointing of every decoder layer): stage ``s`` of
  ``S`` holds up to ``S - s`` micro-batches in flight, each keeping every layer's input
  ([tokens, hidden] in the boundary dtype: BF16 for nvfp4, FP32 for bf16's autocast residual stream).
  One layer at a time is recomputed; its working set is estimated per token as
  ``2 B x (4 hidden + 2 q + 2 kv + 3 intermediate)`` (norm outputs, residual, q/k/v/attention output,
  MLP up/activation/down inputs), doubled for the gradients flowing through it (attention itself is
  SDPA/flash: no [tokens x tokens] matrix).
* **Logits** (last stage): ``tokens x vocab x 14 B``: BF16 lm_head output (2), the FP32 copy the stage
  returns (4), cross-entropy's FP32 log-softmax (4) and FP32 gradient (4).  Above
  ``LOGITS_CHUNK_ENTRIES`` (2**27) every engine computes lm_head + loss in token chunks recomputed in
  backward (:func:`ida_trainer.engine.chunked_loss_sum`): then only one chunk's logits count, plus the
  final hidden states and their gradient (``tokens x hidden x 2 x boundary bytes``).
* **NVFP4 transients** (nvfp4, the largest layer): its MXFP8 master decoded to FP32 while quantizing
  (4 B/param) and the two quantized weight layouts (2 x 0.5625 B/param). **bf16 transients**: the BF16
  copies of the largest layer's weights (with activation checkpointing; see above).
* **Runtime**: 0.75 GiB for the CUDA context, cuBLAS workspace and allocator fragmentation.

The 4B preset is Minitron-4B (hidden 3072, intermediate 9216, 32 layers, 24 heads, 8 KV heads, head
dim 128, vocabulary 256000, untied embeddings: 4.19 B parameters).  With two pipeline stages and
1024 tokens per micro-batch, the nvfp4 recipe needs about 11-15 GiB per stage (below 16 GiB: two 16 GB
cards), the bf16 recipe 33-36 GiB per stage (it does not fit).

**FSDP2** (``--data-parallel fsdp``, the bf16 recipe, the ``qwen3-4b`` preset): :func:`fsdp_memory` counts one
rank: its shard of the 16 B/param (exact, from the meta model's shapes and FSDP2's dim-0 chunks), the root's
parameters gathered for the whole step, one or two gathered layers, and the rank's micro-batch. The
``qwen3-4b`` preset on 2 ranks (8 rows of up to 4096 tokens per micro-batch) needs about 56 GiB per rank
(``python -m ida_trainer.memory --model qwen3-4b --recipe bf16 --data-parallel fsdp --ranks 2 --tokens 32768``).

Example:
    >>> from ida_trainer.config import PrecisionConfig
    >>> report = stage_memory(minitron_4b_config(), PrecisionConfig(recipe="nvfp4"), stages=2)
    >>> all(s.total_bytes < 16 * 2**30 for s in report)
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ida_common.cli import ArgumentParser, Run, run_main

if TYPE_CHECKING:  # torch and the trainer's modules are imported where the counting starts: --help needs neither
    import torch
    import torch.nn as nn

    from ida_trainer.config import JobConfig, PrecisionConfig

__all__ = [
    "ActivationSpec",
    "StageMemory",
    "build_meta_model",
    "fsdp_memory",
    "job_memory",
    "main",
    "memory_warning",
    "minitron_4b_config",
    "qwen3_4b_config",
    "stage_memory",
]

GIB = 2**30
LION_STATE_BYTES = 2  # one BF16 momentum per element
COMPENSATION_BYTES = 4  # FP32 residual per master element (writeback="compensated")
ADAMW_STATE_BYTES = 8  # two FP32 moments per element
AUTOCAST_COPY_BYTES = 2  # BF16 copy of an FP32 weight made by autocast for a GEMM
LOGIT_BYTES = 14  # per token x vocab entry: BF16 logits 2 + FP32 copy 4 + log-softmax 4 + grad 4
NVFP4_TRANSIENT_BYTES = 4 + 2 * 0.5625  # per param of the largest layer: FP32 decode + W and W^T in NVFP4
RUNTIME_BYTES = int(0.75 * GIB)  # CUDA context, cuBLAS workspace, allocator fragmentation
# FSDP2, per element of the largest decoder layer: gathered + prefetched FP32 params (2 x 4), its unsharded FP32
# gradient and the previous layer's in its reduce-scatter (2 x 4), its BF16 autocast copies (2)
FSDP_LAYER_TRANSIENT_BYTES = 18
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class ActivationSpec:
    """The activation side of the estimate.

    Attributes:
        tokens_per_microbatch: micro-batch size x sequence length.
        checkpointing: activation checkpointing of every decoder layer (without it every layer's working
            set is kept for each micro-batch in flight).
    """

    tokens_per_microbatch: int = 1024
    checkpointing: bool = True


@dataclass(frozen=True)
class StageMemory:
    """Bytes one pipeline stage needs (all fields in bytes, except ``params`` and ``layers``)."""

    stage: int
    layers: range
    params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    transient_bytes: int
    activation_bytes: int
    logits_bytes: int
    runtime_bytes: int

    @property
    def total_bytes(self) -> int:
        """Everything above."""
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.transient_bytes
            + self.activation_bytes
            + self.logits_bytes
            + self.runtime_bytes
        )

    def row(self) -> str:
        """One Markdown table row in GiB."""
        f = [
            self.weights_bytes,
            self.grads_bytes,
            self.optimizer_bytes,
            self.transient_bytes,
            self.activation_bytes,
            self.logits_bytes,
            self.runtime_bytes,
            self.total_bytes,
        ]
        return (
            f"| {self.stage} | {self.layers.start}-{self.layers.stop - 1} | {self.params / 1e9:.3f} B | "
            + " | ".join(f"{v / GIB:.2f}" for v in f)
            + " |"
        )


def minitron_4b_config() -> Any:
    """The Minitron-4B architecture as a ``transformers.NemotronConfig`` (no weights)."""
    from transformers import NemotronConfig

    return NemotronConfig(
        vocab_size=256000,
        hidden_size=3072,
        intermediate_size=9216,
        num_hidden_layers=32,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    )


def qwen3_4b_config() -> Any:
    """The Qwen3-4B architecture as a ``transformers.Qwen3Config`` (no weights): the ``qwen3-4b`` preset's."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )


ARCHITECTURES = {"minitron-4b": ("Minitron-4B", minitron_4b_config), "qwen3-4b": ("Qwen3-4B", qwen3_4b_config)}
PRESET_ARCHITECTURES = {"minitron-4b": "minitron-4b", "qwen3-4b": "qwen3-4b", "qwen3-4b-nvfp4": "qwen3-4b"}
"""The architecture of each trainer preset but the demo (:data:`ida_trainer.cli.PRESETS`)."""


def build_meta_model(config: Any, precision: PrecisionConfig) -> nn.Module:
    """The causal LM of ``config`` on the meta device (no memory), with the recipe applied."""
    import torch
    from transformers import AutoModelForCausalLM

    from ida_trainer.precision import apply_recipe

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    apply_recipe(model, precision)
    return model


def _stage_of(name: str, bounds: list[range]) -> int:
    m = _LAYER_RE.search(name)
    if m:
        layer = int(m.group(1))
        return next(s for s, r in enumerate(bounds) if layer in r)
    if "embed_tokens" in name:
        return 0
    return len(bounds) - 1  # final norm, lm_head


def _logits_bytes(tokens: int, vocab: int, hidden: int, boundary: int) -> int:
    """Last-stage logits memory: whole micro-batch, or one chunk (+ hidden states) when chunked."""
    from ida_trainer.engine import LOGITS_CHUNK_ENTRIES

    if tokens * vocab <= LOGITS_CHUNK_ENTRIES:
        return tokens * vocab * LOGIT_BYTES
    chunk = max(1, LOGITS_CHUNK_ENTRIES // vocab)
    return chunk * vocab * LOGIT_BYTES + tokens * hidden * 2 * boundary


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _layer_working_bytes(config: Any, tokens: int) -> int:
    """One decoder layer's recompute working set for ``tokens`` tokens, gradients included (module docstring)."""
    hidden = int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or hidden // int(config.num_attention_heads))
    q_width = int(config.num_attention_heads) * head_dim
    kv_width = int(getattr(config, "num_key_value_heads", config.num_attention_heads)) * head_dim
    return 2 * tokens * 2 * (4 * hidden + 2 * q_width + 2 * kv_width + 3 * int(config.intermediate_size))


def stage_memory(
    config: Any, precision: PrecisionConfig, *, stages: int = 2, activations: ActivationSpec = ActivationSpec()
) -> list[StageMemory]:
    """Per-stage training memory of ``config`` under ``precision``, counted on the meta device.

    Args:
        config: a transformers config of a causal LM with ``model.layers`` (e.g. :func:`minitron_4b_config`).
        precision: the recipe (``keep_bf16`` and ``writeback`` are honoured).
        stages: pipeline stages (1 = the whole model on one device).
        activations: tokens per micro-batch and checkpointing.

    Returns:
        One :class:`StageMemory` per stage.

    Example:
        >>> from ida_trainer.config import PrecisionConfig
        >>> from transformers import LlamaConfig
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        ...                   num_attention_heads=2)
        >>> [s.layers for s in stage_memory(cfg, PrecisionConfig(recipe="nvfp4"), stages=2)]
        [range(0, 1), range(1, 2)]
    """
    from ida_trainer.distributed import split_layers
    from ida_trainer.precision import nvfp4_modules

    model = build_meta_model(config, precision)
    recipe = precision.recipe
    n_layers = int(config.num_hidden_layers)
    bounds = split_layers(n_layers, stages)
    weights = [0] * stages
    grads = [0] * stages
    optim = [0] * stages
    params = [0] * stages
    largest = [0] * stages
    masters = dict(nvfp4_modules(model))
    tied = bool(getattr(config, "tie_word_embeddings", False))
    layer_copies: dict[tuple[int, int], int] = {}  # (stage, layer) -> BF16 copies of its weights (bf16 recipe)
    anchors = {id(m.weight) for m in masters.values()}
    for name, mod in masters.items():
        s = _stage_of(name + ".", bounds)
        n = mod.in_features * mod.out_features
        weights[s] += _bytes(mod.weight_payload) + _bytes(mod.weight_scales)
        grads[s] += n * mod.weight.element_size()  # the BF16 gradient the anchor receives
        optim[s] += n * (LION_STATE_BYTES + (COMPENSATION_BYTES if precision.writeback == "compensated" else 0))
        params[s] += n
        largest[s] = max(largest[s], n)
    embedding = model.get_input_embeddings().weight
    for name, p in model.named_parameters():
        if id(p) in anchors:
            continue
        s = _stage_of(name, bounds)
        weights[s] += _bytes(p)
        grads[s] += _bytes(p)
        params[s] += p.numel()
        head_stage = s  # where lm_head computes with it
        if tied and p is embedding and stages > 1:  # the last stage borrows it as lm_head's weight, with a gradient
            head_stage = stages - 1
            weights[head_stage] += _bytes(p)
            grads[head_stage] += _bytes(p)
        if recipe == "nvfp4":
            optim[s] += p.numel() * LION_STATE_BYTES
        else:
            optim[s] += p.numel() * ADAMW_STATE_BYTES
            if p.dim() >= 2 and ("embed_tokens" not in name or tied):  # embedding lookups run in FP32: no copy
                layer = _LAYER_RE.search(name)
                if layer and activations.checkpointing:  # a recomputed layer's copies live for its GEMMs only
                    key = (s, int(layer.group(1)))
                    layer_copies[key] = layer_copies.get(key, 0) + p.numel() * AUTOCAST_COPY_BYTES
                else:  # saved for backward: lm_head's, and every layer's without checkpointing
                    weights[head_stage] += p.numel() * AUTOCAST_COPY_BYTES
    for name, b in model.named_buffers():
        if not any(name.startswith(n + ".") for n in masters):
            if "rotary_emb" in name and not _LAYER_RE.search(name):  # the model's rotary tables: every stage's
                for s in range(stages):
                    weights[s] += _bytes(b)
            else:
                weights[_stage_of(name, bounds)] += _bytes(b)
    hidden = int(config.hidden_size)
    tokens = activations.tokens_per_microbatch
    boundary = 2 if recipe == "nvfp4" else 4
    layer_working = _layer_working_bytes(config, tokens)
    out = []
    for s, layers in enumerate(bounds):
        in_flight = stages - s
        if activations.checkpointing:
            act = in_flight * len(layers) * tokens * hidden * boundary + layer_working
        else:
            act = in_flight * len(layers) * layer_working
        logits = _logits_bytes(tokens, int(config.vocab_size), hidden, boundary) if s == stages - 1 else 0
        if recipe == "nvfp4":
            transient = int(largest[s] * NVFP4_TRANSIENT_BYTES)
        else:  # the layer being computed (or recomputed): its weights' BF16 copies
            transient = max((b for (st, _), b in layer_copies.items() if st == s), default=0)
        out.append(
            StageMemory(
                stage=s,
                layers=layers,
                params=params[s],
                weights_bytes=weights[s],
                grads_bytes=grads[s],
                optimizer_bytes=optim[s],
                transient_bytes=transient,
                activation_bytes=act,
                logits_bytes=logits,
                runtime_bytes=RUNTIME_BYTES,
            )
        )
    return out


def fsdp_memory(
    config: Any, precision: PrecisionConfig, *, ranks: int, activations: ActivationSpec = ActivationSpec()
) -> StageMemory:
    """Training memory of one FSDP2 rank (``--data-parallel fsdp``: every decoder layer and the root
    ``fully_shard``-ed, FP32 masters gathered in FP32, gradients reduce-scattered in FP32), counted on the meta
    device; rank 0, which holds the largest shard (dim 0 is split in chunks of ``ceil(rows / ranks)``).

    * **Sharded** (``weights``, ``grads``, ``optimizer``): 4 + 4 + 8 B per element of the rank's shard (FP32
      master, FP32 gradient, AdamW's two FP32 moments); buffers (rotary ``inv_freq``) are whole on every rank.
    * **Gathered** (``transients``): the root's parameters (embeddings, final norm, ``lm_head``) stay gathered
      from the forward to the end of the backward (FSDP2 does not reshard its root after the forward), with
      their unsharded FP32 gradients before the reduce-scatter (4 + 4 B per element) and ``lm_head``'s BF16
      autocast copy (2 B); plus :data:`FSDP_LAYER_TRANSIENT_BYTES` per element of the largest layer: the layer
      being computed gathered and the next one prefetched (2 x 4 B), its unsharded gradient and the previous
      layer's in its reduce-scatter (2 x 4 B), and its BF16 autocast copies (2 B).
    * **Activations** and **logits** of the rank's micro-batch, as for one pipeline stage holding every layer
      (the residual stream is FP32 under autocast; above ``LOGITS_CHUNK_ENTRIES`` one chunk's logits).

    Rules, not a measurement on a GPU: the sharded part is exact (tested against a 2-process FSDP2 run's own
    shards), the gathered part follows FSDP2's documented prefetch and reshard behaviour.

    Raises:
        ValueError: the nvfp4 recipe (FSDP shards the bf16 recipe only: :func:`ida_trainer.distributed.apply_fsdp`),
            or ``ranks`` < 1.
    """
    if precision.recipe != "bf16":
        raise ValueError("fsdp_memory: --data-parallel fsdp runs the bf16 recipe only; use --stages for nvfp4")
    if ranks < 1:
        raise ValueError(f"fsdp_memory: ranks must be >= 1, got {ranks}")
    model = build_meta_model(config, precision)
    shard = 0
    root = 0
    layers: dict[int, int] = {}
    for name, p in model.named_parameters():  # a tied lm_head is the embedding: counted once
        rows = p.shape[0] if p.dim() else 1
        shard += -(-rows // ranks) * (p.numel() // max(rows, 1))
        layer = _LAYER_RE.search(name)
        if layer:
            layers[int(layer.group(1))] = layers.get(int(layer.group(1)), 0) + p.numel()
        else:
            root += p.numel()
    buffers = sum(_bytes(b) for _, b in model.named_buffers())
    lm_head = model.get_output_embeddings().weight.numel()
    tokens = activations.tokens_per_microbatch
    hidden = int(config.hidden_size)
    working = _layer_working_bytes(config, tokens)
    n_layers = int(config.num_hidden_layers)
    act = (n_layers * tokens * hidden * 4 + working) if activations.checkpointing else n_layers * working
    return StageMemory(
        stage=0,
        layers=range(n_layers),
        params=shard,
        weights_bytes=4 * shard + buffers,
        grads_bytes=4 * shard,
        optimizer_bytes=ADAMW_STATE_BYTES * shard,
        transient_bytes=root * 8 + lm_head * AUTOCAST_COPY_BYTES + max(layers.values()) * FSDP_LAYER_TRANSIENT_BYTES,
        activation_bytes=act,
        logits_bytes=_logits_bytes(tokens, int(config.vocab_size), hidden, 4),
        runtime_bytes=RUNTIME_BYTES,
    )


def job_memory(config: Any, job: JobConfig, *, world_size: int = 1) -> list[StageMemory]:
    """The count for a trainer job (its recipe, parallelism, checkpointing and largest micro-batch): one row per
    pipeline stage, or one FSDP2 rank's (``world_size`` ranks). A micro-batch holds ``global_batch_size /
    (microbatches x data-parallel ranks)`` rows of at most ``data.max_len`` tokens (packed rows are that long;
    the trainer pads every micro-batch of a step to its longest row).

    Example:
        >>> from ida_trainer.cli import preset_config
        >>> [round(s.total_bytes / GIB, 1) for s in job_memory(minitron_4b_config(), preset_config("minitron-4b"))]
        [14.5, 15.5]
    """
    spec = ActivationSpec(_rows_per_microbatch(job, world_size) * job.data.max_len, job.model.activation_checkpointing)
    if job.parallel.data_parallel == "fsdp":
        return [fsdp_memory(config, job.precision, ranks=world_size, activations=spec)]
    return stage_memory(config, job.precision, stages=job.parallel.pipeline_stages, activations=spec)


def _rows_per_microbatch(job: JobConfig, world_size: int) -> int:
    ranks = world_size if job.parallel.data_parallel == "fsdp" else 1
    return max(1, job.train.global_batch_size // (job.parallel.microbatches * ranks))


def memory_warning(config: Any, job: JobConfig, *, world_size: int, device_bytes: int) -> str | None:
    """One line when :func:`job_memory`'s count for the largest stage or rank exceeds ``device_bytes`` (a GPU's
    memory), saying what to change; None when it fits. A count, not a measurement: the trainer warns, it does
    not refuse."""
    need = max(s.total_bytes for s in job_memory(config, job, world_size=world_size))
    if need <= device_bytes:
        return None
    return (
        f"this run needs about {need / GIB:.1f} GiB per GPU by ida_trainer.memory's count and the GPU has "
        f"{device_bytes / GIB:.1f} GiB: expect it to run out of memory; lower --train.global_batch_size or raise "
        "--microbatches (fewer rows per micro-batch), or train on more GPUs "
        "(python -m ida_trainer.memory shows where the memory goes)"
    )


TABLE_HEADER = (
    "| stage | layers | params | weights | grads | optimizer | transients | activations | logits | "
    "runtime | total (GiB) |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ida_trainer.memory [--model minitron-4b|qwen3-4b] [--recipe nvfp4] [--stages 2 | --data-parallel
    fsdp --ranks 2] [--tokens 1024]`` or ``--preset NAME [--ranks 2]`` (a trainer preset): print the table."""
    return run_main("ida_trainer.memory", _run, argv)


def _run(run: Run) -> int:
    from ida_trainer.config import PrecisionConfig

    ap = ArgumentParser(
        prog="python -m ida_trainer.memory", short_prog="ida_trainer.memory", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--preset",
        choices=sorted(PRESET_ARCHITECTURES),
        help="a trainer preset as configured: its architecture, recipe, parallelism and largest micro-batch "
        "(FSDP over --ranks); the flags below are then ignored",
    )
    ap.add_argument(
        "--model", choices=sorted(ARCHITECTURES), default="minitron-4b", help="architecture (default minitron-4b)"
    )
    ap.add_argument("--recipe", choices=("nvfp4", "bf16"), default="nvfp4", help="precision recipe (default nvfp4)")
    ap.add_argument(
        "--writeback",
        choices=("stochastic", "rne", "compensated"),
        default="stochastic",
        help="MXFP8 master write-back of the nvfp4 recipe (default stochastic)",
    )
    ap.add_argument("--stages", type=int, default=2, help="pipeline stages (default 2)")
    ap.add_argument(
        "--data-parallel",
        choices=("none", "fsdp"),
        default="none",
        help="fsdp: one FSDP2 rank's memory instead of pipeline stages (bf16 recipe)",
    )
    ap.add_argument("--ranks", type=int, default=2, help="FSDP ranks (default 2)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per micro-batch (default 1024)")
    ap.add_argument("--no-checkpointing", action="store_true", help="activation checkpointing off")
    args = ap.parse_args(run.argv)
    if args.preset:
        return _print_preset(args.preset, args.ranks)
    prec = PrecisionConfig(recipe=args.recipe, writeback=args.writeback)
    title, build = ARCHITECTURES[args.model]
    config = build()
    spec = ActivationSpec(args.tokens, not args.no_checkpointing)
    fsdp = args.data_parallel == "fsdp"
    if fsdp and args.recipe != "bf16":
        ap.error("--data-parallel fsdp runs the bf16 recipe only (add --recipe bf16)")
    report = (
        [fsdp_memory(config, prec, ranks=args.ranks, activations=spec)]
        if fsdp
        else stage_memory(config, prec, stages=args.stages, activations=spec)
    )
    where = f"FSDP2 over {args.ranks} rank(s), rank 0" if fsdp else f"{args.stages} stage(s)"
    print(
        f"{title}, recipe {args.recipe} ({args.writeback if args.recipe == 'nvfp4' else 'fp32 master'}), "
        f"{where}, {args.tokens} tokens per micro-batch, checkpointing {'off' if args.no_checkpointing else 'on'}"
    )
    _print_table(report, fsdp=fsdp)
    return 0


def _print_table(report: list[StageMemory], *, fsdp: bool) -> None:
    print(TABLE_HEADER.replace("| stage |", "| rank |", 1) if fsdp else TABLE_HEADER)
    for s in report:
        print(s.row())


def _print_preset(preset: str, ranks: int) -> int:
    from ida_trainer.cli import preset_config

    job = preset_config(preset)
    title, build = ARCHITECTURES[PRESET_ARCHITECTURES[preset]]
    fsdp = job.parallel.data_parallel == "fsdp"
    report = job_memory(build(), job, world_size=ranks)
    rows = _rows_per_microbatch(job, ranks)
    where = f"FSDP2 over {ranks} rank(s), rank 0" if fsdp else f"{job.parallel.pipeline_stages} stage(s)"
    print(
        f"--preset {preset} ({title}), recipe {job.precision.recipe}, {where}, {rows} row(s) of up to "
        f"{job.data.max_len} tokens per micro-batch, checkpointing {'on' if job.model.activation_checkpointing else 'off'}"
    )
    _print_table(report, fsdp=fsdp)
    print(f"largest per GPU: {max(s.total_bytes for s in report) / GIB:.1f} GiB (a count, not a measurement)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
