"""One frozen dataclass config tree for ``python -m ida_trainer``: sections, defaults, validation.

A run is described by a single :class:`JobConfig`; :mod:`ida_trainer.cli` builds it from (in order of
precedence, last wins):

1. the defaults below (which *are* the embedded demo: a tiny Nemotron trained on the shipped code
   corpus with the ``nvfp4`` recipe),
2. a preset (``--preset minitron-4b`` / ``qwen3-4b`` / ``demo``),
3. a TOML file (``--config run.toml``; sections named like the dataclass fields: ``[train]``,
   ``[optim]``, ...),
4. friendly flags (``--recipe bf16``, ``--pipeline-stages 2``, ``--eval-every 50``, ``--resume``, ``--out``),
5. dotted overrides (``--train.steps 20``, ``--optim.lr 1e-4``, ``--precision.keep_bf16 "*.0.*,*.31.*"``).

Every section is ``@dataclass(frozen=True, kw_only=True)`` and validates itself in ``__post_init__``
with a ``ValueError`` that names the setting and says what to do; cross-section rules live in
:meth:`JobConfig.__post_init__`. Settings that a run will ignore (for example ``model.hidden_size`` when a
base checkpoint directory is given) produce a :class:`UserWarning` from :func:`ignored_settings`.
The resolved tree is written to the run directory as ``config.toml`` and ``config.json`` so a run can be
reproduced with ``--config <run>/config.toml``.

The recipe couples to the optimizer (torchtitan-style explicit coupling, no hidden magic): ``nvfp4``
trains with Lion (BF16 momentum, MXFP8 master), ``bf16`` with AdamW (FP32 master, betas (0.9, 0.95)).
``--recipe bf16`` switches the optimizer defaults accordingly; an explicit ``--optim.name`` that
contradicts the recipe is an error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Recipe = Literal["nvfp4", "bf16"]
Writeback = Literal["stochastic", "rne", "compensated"]
OptimName = Literal["lion", "adamw"]
DataParallel = Literal["none", "fsdp"]
DataFormat = Literal["plain", "alpaca", "chat"]

LION_BETAS = (0.9, 0.99)  # Lion paper defaults (Chen et al. 2023)
ADAMW_BETAS = (0.9, 0.95)  # the bf16 comparison recipe's betas (LLM-SFT convention)
# How long `python -m ida_trainer` (the demo) takes; README.md, --help and docs/trainer.md quote this string
# (tests/ida_trainer/test_docs_trainer.py). Measured: docs/cli.md, "Set-up and durations". Here, not in
# ida_trainer.demo, so that --help imports no torch.
DEMO_DURATION = "about 1 min on 2 idle CPU cores"
DEMO_LION_LR = 3e-3  # demo: tiny model, few hundred steps; Lion wants ~3-10x smaller lr than AdamW
DEMO_ADAMW_LR = 1e-2  # demo: AdamW lr for the same tiny model


def _fail(section: str, name: str, value: Any, why: str) -> None:
    raise ValueError(f"invalid setting {section}.{name} = {value!r}: {why}")


def _check_choice(section: str, name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        _fail(section, name, value, f"choose one of {', '.join(map(repr, choices))}")


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig:
    """Numerics of the training step.

    Attributes:
        recipe: ``nvfp4`` (NVFP4 GEMMs for projections, MXFP8 master, BF16 everything else, Lion) or
            ``bf16`` (BF16 compute, FP32 master, AdamW) for comparison.
        writeback: how an updated master value is rounded back to MXFP8 (``stochastic`` is unbiased
            and the default; ``rne`` reproduces the original lost-update failure; ``compensated``
            keeps a residual buffer). Only used by ``nvfp4``.
        keep_bf16: fnmatch patterns of module names kept in BF16 under ``nvfp4``
            (e.g. ``"model.layers.0.*"``).
        hadamard_wgrad: 16-point random Hadamard transform on the weight-gradient GEMM operands.
        stochastic_grad: stochastic rounding when gradients are quantized to NVFP4.
        seed: seed of the counter-based RNG used for every stochastic rounding.
    """

    recipe: Recipe = "nvfp4"
    writeback: Writeback = "stochastic"
    keep_bf16: tuple[str, ...] = ()
    hadamard_wgrad: bool = True
    stochastic_grad: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _check_choice("precision", "recipe", self.recipe, typing.get_args(Recipe))
        _check_choice("precision", "writeback", self.writeback, typing.get_args(Writeback))
        if not isinstance(self.keep_bf16, tuple) or not all(isinstance(p, str) and p for p in self.keep_bf16):
            _fail("precision", "keep_bf16", self.keep_bf16, "give a tuple of non-empty fnmatch patterns")
        if self.seed < 0:
            _fail("precision", "seed", self.seed, "use a non-negative integer")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warmup, then cosine to ``lr * min_lr_ratio``).

    Attributes:
        name: ``lion`` (nvfp4 recipe) or ``adamw`` (bf16 recipe).
        lr: peak learning rate.
        betas: (beta1, beta2).
        weight_decay: decoupled weight decay.
        warmup_steps: linear warmup steps from ``lr / (warmup_steps + 1)`` to ``lr``.
        min_lr_ratio: final lr of the cosine as a fraction of ``lr``; 0 decays to zero, and a non-zero
            ratio must leave ``lr * min_lr_ratio`` a normal positive float (no underflow).
        grad_clip: max global gradient norm; 0 disables clipping (the norm is still logged).
    """

    name: OptimName = "lion"
    lr: float = DEMO_LION_LR
    betas: tuple[float, float] = LION_BETAS
    weight_decay: float = 0.0
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        _check_choice("optim", "name", self.name, typing.get_args(OptimName))
        if not (math.isfinite(self.lr) and self.lr > 0):
            _fail("optim", "lr", self.lr, "the learning rate must be a finite number > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            _fail("optim", "betas", self.betas, "give two values in [0, 1), e.g. 0.9,0.99")
        if self.weight_decay < 0:
            _fail("optim", "weight_decay", self.weight_decay, "must be >= 0")
        if self.warmup_steps < 0:
            _fail("optim", "warmup_steps", self.warmup_steps, "must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            _fail("optim", "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        if 0.0 < self.min_lr_ratio and self.lr * self.min_lr_ratio < sys.float_info.min:
            # A ratio so small that the final lr is 0.0 or subnormal is not a floor at all: say 0.
            _fail(
                "optim",
                "min_lr_ratio",
                self.min_lr_ratio,
                f"the final lr lr * min_lr_ratio = {self.lr * self.min_lr_ratio!r} underflows; use 0 to decay to zero",
            )
        if self.grad_clip < 0:
            _fail("optim", "grad_clip", self.grad_clip, "must be >= 0 (0 disables clipping)")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How the run is spread over processes (launch with ``torchrun`` when > 1).

    Attributes:
        pipeline_stages: number of 1F1B pipeline stages (one process each); 1 = no pipelining.
        data_parallel: ``none`` or ``fsdp`` (FSDP2 ``fully_shard`` over all processes).
        microbatches: micro-batches per optimizer step per data-parallel rank (gradient accumulation
            steps; with a pipeline, the number of micro-batches in the 1F1B schedule).
    """

    pipeline_stages: int = 1
    data_parallel: DataParallel = "none"
    microbatches: int = 1

    def __post_init__(self) -> None:
        if self.pipeline_stages < 1:
            _fail("parallel", "pipeline_stages", self.pipeline_stages, "must be >= 1")
        _check_choice("parallel", "data_parallel", self.data_parallel, typing.get_args(DataParallel))
        if self.microbatches < 1:
            _fail("parallel", "microbatches", self.microbatches, "must be >= 1")
        if self.pipeline_stages > 1 and self.data_parallel != "none":
            _fail(
                "parallel",
                "data_parallel",
                self.data_parallel,
                "pipeline stages and FSDP cannot be combined yet; use one of them",
            )
        if self.pipeline_stages > 1 and self.microbatches < self.pipeline_stages:
            _fail(
                "parallel",
                "microbatches",
                self.microbatches,
                f"a {self.pipeline_stages}-stage 1F1B pipeline needs at least {self.pipeline_stages} micro-batches",
            )


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model to fine-tune.

    Attributes:
        base: local directory with a transformers checkpoint (BF16 safetensors or our MXFP8 format);
            empty = build the tiny demo NemotronForCausalLM from the size fields below.
        hidden_size, num_layers, num_heads, intermediate_size: demo model size (ignored with ``base``).
        activation_checkpointing: recompute each decoder layer in backward to save memory.
    """

    base: str = ""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                _fail("model", name, getattr(self, name), "must be >= 1")
        if self.hidden_size % self.num_heads:
            _fail("model", "num_heads", self.num_heads, f"must divide hidden_size={self.hidden_size}")
        # NVFP4 blocks are 16 wide along K and 2-D weight tiles 16x16: every projection dim must be a multiple of 16.
        for name in ("hidden_size", "intermediate_size"):
            if getattr(self, name) % 16:
                _fail("model", name, getattr(self, name), "must be a multiple of 16 (NVFP4 block size)")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Training data.

    Attributes:
        path: JSONL file; empty = the demo code corpus shipped with the package.
        format: ``plain`` ({"text"}: every token supervised), ``alpaca`` (instruction/input/output;
            loss on the response), ``chat`` ({"messages"}: the tokenizer's chat template, one example
            per assistant turn, loss on that turn).
        max_len: maximum tokens per example (longer examples are truncated, with a warning count).
        packing: concatenate examples into ``max_len`` rows; positions restart per document and
            attention never crosses a document boundary.
        shuffle: reshuffle every epoch (seeded by ``train.seed`` and the epoch).
    """

    path: str = ""
    format: DataFormat = "plain"
    max_len: int = 256
    packing: bool = False
    shuffle: bool = True

    def __post_init__(self) -> None:
        _check_choice("data", "format", self.format, typing.get_args(DataFormat))
        if self.max_len < 8:
            _fail("data", "max_len", self.max_len, "must be >= 8 tokens")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Loop length and batch shape.

    Attributes:
        steps: optimizer steps.
        global_batch_size: sequences per optimizer step over all data-parallel ranks.
        seed: seed for model init, data order and dropout.
        log_every: console line every N steps (``train_log.jsonl`` gets every step).
        progress: show a tqdm progress bar.
    """

    steps: int = 300
    global_batch_size: int = 4
    seed: int = 1234
    log_every: int = 10
    progress: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1:
            _fail("train", "steps", self.steps, "must be >= 1")
        if self.global_batch_size < 1:
            _fail("train", "global_batch_size", self.global_batch_size, "must be >= 1")
        if self.log_every < 1:
            _fail("train", "log_every", self.log_every, "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Checkpoint directories ``<out>/checkpoints/step-N`` and the final export.

    Attributes:
        every: save every N steps (0 = only at the end).
        keep: keep the last K checkpoints.
        resume: continue from the newest complete checkpoint in ``<out>/checkpoints``.
        overwrite: replace a previous run in ``<out>`` (without it or ``resume`` such a directory is refused;
            see :mod:`ida_trainer.rundir`).
        export: after training, publish ``<out>/export`` with the codec's header-only rename.
        export_prefix: optional ``old=new`` tensor-name prefix change applied by the export rename.
    """

    every: int = 0
    keep: int = 2
    resume: bool = False
    overwrite: bool = False
    export: bool = True
    export_prefix: str = ""

    def __post_init__(self) -> None:
        if self.every < 0:
            _fail("checkpoint", "every", self.every, "must be >= 0 (0 = only at the end)")
        if self.keep < 1:
            _fail("checkpoint", "keep", self.keep, "must be >= 1")
        if self.resume and self.overwrite:
            _fail(
                "checkpoint",
                "overwrite",
                self.overwrite,
                "--resume continues the run in --out, --overwrite replaces it: give one of them",
            )
        if self.export_prefix and "=" not in self.export_prefix:
            _fail("checkpoint", "export_prefix", self.export_prefix, "write it as OLD=NEW, e.g. 'model.=backbone.'")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Execution-based evaluation with ``ida_eval`` (in training and at the end).

    Attributes:
        every: score the current weights every N steps (0 = never during training).
        final: score the exported checkpoint after training.
        problems: mxeval-format JSONL; empty = the demo problem set shipped with the package.
        num_problems: evaluate only the first N problems (0 = all).
        max_new_tokens: generation budget per problem.
        batch_size: generation batch size.
    """

    every: int = 0
    final: bool = True
    problems: str = ""
    num_problems: int = 0
    max_new_tokens: int = 96
    batch_size: int = 8

    def __post_init__(self) -> None:
        for name in ("every", "num_problems"):
            if getattr(self, name) < 0:
                _fail("eval", name, getattr(self, name), "must be >= 0")
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                _fail("eval", name, getattr(self, name), "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """The whole run. Example:

    >>> from ida_trainer.cli import parse_args
    >>> cfg = parse_args(["--recipe", "bf16", "--train.steps", "5"])
    >>> cfg.optim.name, cfg.train.steps
    ('adamw', 5)
    """

    out: str = "runs/demo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if not self.out:
            _fail("job", "out", self.out, "give a run directory with --out DIR")
        if self.precision.recipe == "nvfp4" and self.optim.name != "lion":
            _fail(
                "optim",
                "name",
                self.optim.name,
                "the nvfp4 recipe updates its MXFP8 master with Lion; use --optim.name lion or --recipe bf16",
            )
        if self.precision.recipe == "bf16" and self.optim.name != "adamw":
            _fail(
                "optim",
                "name",
                self.optim.name,
                "the bf16 comparison recipe uses AdamW; use --optim.name adamw or --recipe nvfp4",
            )
        per_step = self.parallel.microbatches
        if self.train.global_batch_size % per_step:
            _fail(
                "train",
                "global_batch_size",
                self.train.global_batch_size,
                f"must be a multiple of parallel.microbatches={per_step}",
            )
        if self.data.path == "" and self.data.format != "plain":
            _fail(
                "data",
                "format",
                self.data.format,
                "the demo corpus is plain text; give your data file with --data FILE.jsonl",
            )

    @property
    def is_demo(self) -> bool:
        """True when the run builds the tiny demo model (no ``model.base``)."""
        return self.model.base == ""


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "precision": PrecisionConfig,
    "optim": OptimConfig,
    "parallel": ParallelConfig,
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "eval": EvalConfig,
}


def ignored_settings(cfg: JobConfig) -> list[str]:
    """Settings the run will not use, as messages (the trainer emits each as a ``UserWarning``)."""
    notes: list[str] = []
    default_model = ModelConfig()
    if not cfg.is_demo:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(cfg.model, name) != getattr(default_model, name):
                notes.append(f"model.{name} is ignored: the size comes from {cfg.model.base}/config.json")
    if cfg.precision.recipe == "bf16":
        default_p = PrecisionConfig()
        for name in ("writeback", "keep_bf16", "hadamard_wgrad", "stochastic_grad"):
            if getattr(cfg.precision, name) != getattr(default_p, name):
                notes.append(f"precision.{name} is ignored by the bf16 recipe (it only applies to nvfp4)")
    if not cfg.data.packing and cfg.data.format == "chat" and cfg.data.max_len > 32768:
        notes.append("data.max_len above 32768 is unusual; check it")
    if cfg.eval.every and cfg.eval.every > cfg.train.steps:
        notes.append(f"eval.every={cfg.eval.every} exceeds train.steps={cfg.train.steps}: no in-training eval will run")
    if cfg.checkpoint.every and cfg.checkpoint.every > cfg.train.steps:
        notes.append(
            f"checkpoint.every={cfg.checkpoint.every} exceeds train.steps: only the final checkpoint is written"
        )
    return notes


def warn_ignored(cfg: JobConfig) -> None:
    """Emit one ``UserWarning`` per ignored setting."""
    for note in ignored_settings(cfg):
        warnings.warn(note, UserWarning, stacklevel=2)


def to_dict(cfg: JobConfig) -> dict[str, Any]:
    """The config as plain JSON-compatible data (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def with_overrides(cfg: JobConfig, *, out: str | None = None, **sections: Mapping[str, Any]) -> JobConfig:
    """A copy of ``cfg`` with ``out`` and/or some fields of some sections replaced (validated again).

    Example:
        >>> with_overrides(JobConfig(), train={"steps": 3}).train.steps
        3
    """
    kwargs: dict[str, Any] = {s: replace(getattr(cfg, s), **dict(v)) for s, v in sections.items()}
    if out is not None:
        kwargs["out"] = out
    return replace(cfg, **kwargs)
