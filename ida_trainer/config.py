"""One frozen dataclass config tree for ``python -m ida_trainer``: sections, validation, TOML, presets, CLI.

A run is described by a single :class:`JobConfig` built from (in order of precedence, last wins):

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
import tomllib
import typing
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

Recipe = Literal["nvfp4", "bf16"]
Writeback = Literal["stochastic", "rne", "compensated"]
OptimName = Literal["lion", "adamw"]
DataParallel = Literal["none", "fsdp"]
DataFormat = Literal["plain", "alpaca", "chat"]

LION_BETAS = (0.9, 0.99)  # Lion paper defaults (Chen et al. 2023)
ADAMW_BETAS = (0.9, 0.95)  # the bf16 comparison recipe's betas (LLM-SFT convention)
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
        min_lr_ratio: final lr of the cosine as a fraction of ``lr``.
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
        if not self.lr > 0:
            _fail("optim", "lr", self.lr, "the learning rate must be > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            _fail("optim", "betas", self.betas, "give two values in [0, 1), e.g. 0.9,0.99")
        if self.weight_decay < 0:
            _fail("optim", "weight_decay", self.weight_decay, "must be >= 0")
        if self.warmup_steps < 0:
            _fail("optim", "warmup_steps", self.warmup_steps, "must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            _fail("optim", "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
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
            _fail("parallel", "data_parallel", self.data_parallel,
                  "pipeline stages and FSDP cannot be combined yet; use one of them")
        if self.pipeline_stages > 1 and self.microbatches < self.pipeline_stages:
            _fail("parallel", "microbatches", self.microbatches,
                  f"a {self.pipeline_stages}-stage 1F1B pipeline needs at least {self.pipeline_stages} micro-batches")


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
        export: after training, publish ``<out>/export`` with the codec's header-only rename.
        export_prefix: optional ``old=new`` tensor-name prefix change applied by the export rename.
    """

    every: int = 0
    keep: int = 2
    resume: bool = False
    export: bool = True
    export_prefix: str = ""

    def __post_init__(self) -> None:
        if self.every < 0:
            _fail("checkpoint", "every", self.every, "must be >= 0 (0 = only at the end)")
        if self.keep < 1:
            _fail("checkpoint", "keep", self.keep, "must be >= 1")
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
            _fail("optim", "name", self.optim.name,
                  "the nvfp4 recipe updates its MXFP8 master with Lion; use --optim.name lion or --recipe bf16")
        if self.precision.recipe == "bf16" and self.optim.name != "adamw":
            _fail("optim", "name", self.optim.name,
                  "the bf16 comparison recipe uses AdamW; use --optim.name adamw or --recipe nvfp4")
        per_step = self.parallel.microbatches
        if self.train.global_batch_size % per_step:
            _fail("train", "global_batch_size", self.train.global_batch_size,
                  f"must be a multiple of parallel.microbatches={per_step}")
        if self.data.path == "" and self.data.format != "plain":
            _fail("data", "format", self.data.format, "the demo corpus is plain text; give your data file with --data FILE.jsonl")

    @property
    def is_demo(self) -> bool:
        """True when the run builds the tiny demo model (no ``model.base``)."""
        return self.model.base == ""


# --------------------------------------------------------------------------------------------------
# Presets: real configurations (the base directory comes from the user).

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "demo": {},
    # NVIDIA Minitron-4B (NemotronForCausalLM, 32 layers, 4.19B params) on two 16 GB GPUs: two 1F1B
    # stages, activation checkpointing, nvfp4 + Lion at SFT learning rate, first/last layer kept BF16.
    "minitron-4b": {
        "": {"out": "runs/minitron-4b"},
        "model": {"activation_checkpointing": True},
        "data": {"format": "alpaca", "max_len": 2048, "packing": True},
        "precision": {"recipe": "nvfp4", "writeback": "stochastic",
                      "keep_bf16": ("model.layers.0.*", "model.layers.31.*")},
        "optim": {"name": "lion", "lr": 1e-5, "betas": LION_BETAS, "weight_decay": 0.0,
                  "warmup_steps": 100, "min_lr_ratio": 0.1, "grad_clip": 1.0},
        "parallel": {"pipeline_stages": 2, "microbatches": 8},
        "train": {"steps": 2000, "global_batch_size": 32, "log_every": 10},
        "checkpoint": {"every": 250, "keep": 3},
        "eval": {"every": 500, "num_problems": 100, "max_new_tokens": 384},
    },
    # Qwen3-4B-Base chat SFT with the <think> format, FSDP2 over the node, bf16 recipe.
    "qwen3-4b": {
        "": {"out": "runs/qwen3-4b"},
        "model": {"activation_checkpointing": True},
        "data": {"format": "chat", "max_len": 4096, "packing": False},
        "precision": {"recipe": "bf16"},
        "optim": {"name": "adamw", "lr": 1e-5, "betas": ADAMW_BETAS, "weight_decay": 0.01,
                  "warmup_steps": 100, "min_lr_ratio": 0.1, "grad_clip": 1.0},
        "parallel": {"data_parallel": "fsdp", "microbatches": 4},
        "train": {"steps": 2000, "global_batch_size": 64, "log_every": 10},
        "checkpoint": {"every": 250, "keep": 3},
        "eval": {"every": 500, "num_problems": 100, "max_new_tokens": 512},
    },
}

_SECTIONS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "precision": PrecisionConfig, "optim": OptimConfig,
    "parallel": ParallelConfig, "train": TrainConfig, "checkpoint": CheckpointConfig, "eval": EvalConfig,
}

# Friendly flags: flag -> (section, field); a value-less flag sets a bool to True.
_FRIENDLY: dict[str, tuple[str, str]] = {
    "--out": ("", "out"),
    "--recipe": ("precision", "recipe"),
    "--writeback": ("precision", "writeback"),
    "--pipeline-stages": ("parallel", "pipeline_stages"),
    "--data-parallel": ("parallel", "data_parallel"),
    "--microbatches": ("parallel", "microbatches"),
    "--eval-every": ("eval", "every"),
    "--resume": ("checkpoint", "resume"),
    "--steps": ("train", "steps"),
    "--base": ("model", "base"),
    "--data": ("data", "path"),
    "--lr": ("optim", "lr"),
}


def _coerce(section: str, name: str, tp: Any, raw: Any) -> Any:
    """Convert a TOML or command-line value to the field's declared type (ValueError on mismatch)."""
    origin = typing.get_origin(tp)
    where = f"{section}.{name}" if section else name
    try:
        if tp is bool:
            if isinstance(raw, bool):
                return raw
            low = str(raw).strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if tp is int:
            if isinstance(raw, bool):
                raise ValueError("expected an integer")
            return int(raw)
        if tp is float:
            return float(raw)
        if tp is str or origin is Literal:
            if not isinstance(raw, str):
                raise ValueError("expected a string")
            return raw
        if origin is tuple:
            args = typing.get_args(tp)
            items = [s.strip() for s in raw.split(",") if s.strip()] if isinstance(raw, str) else list(raw)
            elem = args[0]
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_coerce(section, name, elem, x) for x in items)
            if len(items) != len(args):
                raise ValueError(f"expected {len(args)} comma-separated values")
            return tuple(_coerce(section, name, a, x) for a, x in zip(args, items))
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid setting {where} = {raw!r}: {err}") from None
    raise AssertionError(f"unsupported field type {tp!r} for {where}")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _merge(tree: dict[str, dict[str, Any]], section: str, name: str, raw: Any, origin: str) -> None:
    """Validate the key, coerce the value and record it in the nested override tree."""
    if section == "":
        if name != "out":
            raise ValueError(f"{origin}: unknown top-level setting {name!r}; known: out, {', '.join(_SECTIONS)}")
        tree.setdefault("", {})["out"] = _coerce("", "out", str, raw)
        return
    if section not in _SECTIONS:
        raise ValueError(f"{origin}: unknown section {section!r}; known sections: {', '.join(_SECTIONS)}")
    types = _field_types(_SECTIONS[section])
    if name not in types:
        raise ValueError(f"{origin}: unknown setting {section}.{name}; known: {', '.join(sorted(types))}")
    tree.setdefault(section, {})[name] = _coerce(section, name, types[name], raw)


def _build(tree: Mapping[str, Mapping[str, Any]]) -> JobConfig:
    kwargs: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        kwargs[section] = cls(**dict(tree.get(section, {})))
    if "" in tree and "out" in tree[""]:
        kwargs["out"] = tree[""]["out"]
    return JobConfig(**kwargs)


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a TOML run file into a validated override tree (top-level ``out``, one table per section).

    Raises:
        ValueError: unreadable TOML, unknown section/key or a value of the wrong type (names the file).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"config file {path}: not valid TOML: {err}") from None
    tree: dict[str, dict[str, Any]] = {}
    origin = f"config file {path}"
    try:
        for key, value in data.items():
            if isinstance(value, dict):
                for name, raw in value.items():
                    _merge(tree, key, name, raw, origin)
            else:
                _merge(tree, "", key, value, origin)
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if msg.startswith(origin) else f"{origin}: {msg}") from None
    return tree


def _recipe_defaults(recipe: str) -> dict[str, Any]:
    """Optimizer defaults that follow from a recipe chosen on the command line."""
    if recipe == "bf16":
        return {"name": "adamw", "betas": ADAMW_BETAS, "lr": DEMO_ADAMW_LR}
    return {"name": "lion", "betas": LION_BETAS, "lr": DEMO_LION_LR}


def parse_args(argv: Sequence[str] | None = None) -> JobConfig:
    """Build the validated :class:`JobConfig` from command-line arguments.

    Args:
        argv: arguments without the program name (``None`` or ``[]`` = the demo).

    Returns:
        The resolved, frozen config.

    Raises:
        ValueError: unknown flag, section or key; bad value; inconsistent settings.

    Example:
        >>> parse_args(["--pipeline-stages", "2", "--parallel.microbatches", "4"]).parallel.pipeline_stages
        2
    """
    args = list(argv or [])
    preset = "demo"
    config_file: str | None = None
    cli: list[tuple[str, str, Any, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, inline = arg.partition("=")
        def value() -> str:
            nonlocal i
            if eq:
                return inline
            if i + 1 >= len(args) or (args[i + 1].startswith("--") and not _is_number(args[i + 1])):
                raise ValueError(f"command line: {key} needs a value")
            i += 1
            return args[i]
        if key == "--preset":
            preset = value()
        elif key == "--config":
            config_file = value()
        elif key in _FRIENDLY:
            section, name = _FRIENDLY[key]
            if key == "--resume" and not eq:
                cli.append((section, name, True, key))
            else:
                cli.append((section, name, value(), key))
        elif key.startswith("--") and "." in key:
            section, _, name = key[2:].partition(".")
            cli.append((section, name, value(), key))
        elif key in ("-h", "--help"):
            raise SystemExit(usage())
        else:
            raise ValueError(f"command line: unknown argument {arg!r}\n{usage()}")
        i += 1
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    tree: dict[str, dict[str, Any]] = {}
    for section, values in PRESETS[preset].items():
        for name, raw in values.items():
            _merge(tree, section, name, raw, f"preset {preset}")
    if config_file is not None:
        for section, values in load_toml(config_file).items():
            for name, raw in values.items():
                tree.setdefault(section, {})[name] = raw
    for section, name, raw, origin in cli:
        if (section, name) == ("precision", "recipe"):
            explicit_optim = {n for s, n, _, _ in cli if s == "optim"}
            for k, v in _recipe_defaults(str(raw)).items():
                if k not in explicit_optim:
                    tree.setdefault("optim", {})[k] = v
        _merge(tree, section, name, raw, f"command line {origin}")
    if preset != "demo":
        for (section, name), flag in (((("model", "base"), "--base DIR")), (("data", "path"), "--data FILE.jsonl")):
            if not tree.get(section, {}).get(name):
                raise ValueError(f"--preset {preset} fine-tunes a real model: give {section}.{name} with {flag}")
    return _build(tree)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def usage() -> str:
    """One-screen help text listing presets, friendly flags and every dotted setting."""
    lines = ["usage: python -m ida_trainer [--config FILE.toml] [--preset NAME] [--section.key VALUE ...]",
             "  no arguments: the embedded demo (tiny Nemotron, nvfp4, a few minutes on CPU)",
             f"  presets: {', '.join(PRESETS)}",
             "  flags: " + " ".join(f"{k} {'' if k == '--resume' else 'V'}".strip() for k in _FRIENDLY)]
    for section, cls in _SECTIONS.items():
        defaults = cls()
        lines.append(f"  [{section}] " + " ".join(f"{f.name}={getattr(defaults, f.name)!r}" for f in fields(cls)))
    return "\n".join(lines)


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
        notes.append(f"checkpoint.every={cfg.checkpoint.every} exceeds train.steps: only the final checkpoint is written")
    return notes


def warn_ignored(cfg: JobConfig) -> None:
    """Emit one ``UserWarning`` per ignored setting."""
    for note in ignored_settings(cfg):
        warnings.warn(note, UserWarning, stacklevel=2)


def to_dict(cfg: JobConfig) -> dict[str, Any]:
    """The config as plain JSON-compatible data (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise AssertionError(f"cannot write {v!r} as TOML")


def to_toml(cfg: JobConfig) -> str:
    """The config as TOML text that :func:`load_toml` reads back to the same config."""
    lines = [f"out = {_toml_value(cfg.out)}"]
    for section in _SECTIONS:
        lines.append(f"\n[{section}]")
        sub = getattr(cfg, section)
        for f in fields(sub):
            lines.append(f"{f.name} = {_toml_value(getattr(sub, f.name))}")
    return "\n".join(lines) + "\n"


def from_tree(tree: Mapping[str, Mapping[str, Any]]) -> JobConfig:
    """Build a config from a nested mapping (like :func:`to_dict` output or a TOML tree)."""
    norm: dict[str, dict[str, Any]] = {}
    for section, values in tree.items():
        if not isinstance(values, Mapping):
            _merge(norm, "", section, values, "config tree")
            continue
        for name, raw in values.items():
            _merge(norm, section, name, raw, "config tree")
    return _build(norm)


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
