"""Building a :class:`~ida_trainer.config.JobConfig` from presets, a TOML file and command-line arguments.

Precedence, last wins: the defaults (the embedded demo) < ``--preset NAME`` < ``--config FILE.toml`` <
friendly flags (``--recipe bf16``, ``--pipeline-stages 2``, ``--eval-every N``, ``--resume``, ``--overwrite``,
``--out``)
and dotted overrides (``--train.steps 20``, ``--optim.lr 1e-4``, ``--precision.keep_bf16 "a.*,b.*"``).
Every key and value is checked against the dataclass field it sets (unknown sections/keys and values of
the wrong type raise ``ValueError`` naming the flag or the file); the dataclasses then validate the
combination. ``to_toml`` writes the resolved config back in the same format, so ``--config
<run>/config.toml`` reproduces a run.

``--recipe`` also switches the optimizer defaults (Lion for nvfp4, AdamW with betas (0.9, 0.95) for
bf16) unless ``--optim.*`` keys are given explicitly.
"""

from __future__ import annotations

import json
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib's PyPI original, the same parser (pyproject.toml requires it there)
    import tomli as tomllib

from ida_trainer.config import (
    ADAMW_BETAS,
    DEMO_ADAMW_LR,
    DEMO_DURATION,
    DEMO_LION_LR,
    LION_BETAS,
    SECTIONS,
    JobConfig,
)

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
        "precision": {
            "recipe": "nvfp4",
            "writeback": "stochastic",
            "keep_bf16": ("model.layers.0.*", "model.layers.31.*"),
        },
        "optim": {
            "name": "lion",
            "lr": 1e-5,
            "betas": LION_BETAS,
            "weight_decay": 0.0,
            "warmup_steps": 100,
            "min_lr_ratio": 0.1,
            "grad_clip": 1.0,
        },
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
        "optim": {
            "name": "adamw",
            "lr": 1e-5,
            "betas": ADAMW_BETAS,
            "weight_decay": 0.01,
            "warmup_steps": 100,
            "min_lr_ratio": 0.1,
            "grad_clip": 1.0,
        },
        "parallel": {"data_parallel": "fsdp", "microbatches": 4},
        "train": {"steps": 2000, "global_batch_size": 64, "log_every": 10},
        "checkpoint": {"every": 250, "keep": 3},
        "eval": {"every": 500, "num_problems": 100, "max_new_tokens": 512},
    },
}
# The qwen3-4b SFT with minitron-4b's recipe on two 16 GB GPUs: two 1F1B stages (the tied lm_head stays one
# matrix, lent by stage 0), 16 micro-batches of 2 rows of up to 4096 tokens, first/last of the 36 layers kept BF16.
PRESETS["qwen3-4b-nvfp4"] = {
    **PRESETS["qwen3-4b"],
    "": {"out": "runs/qwen3-4b-nvfp4"},
    "precision": {**PRESETS["minitron-4b"]["precision"], "keep_bf16": ("model.layers.0.*", "model.layers.35.*")},
    "optim": PRESETS["minitron-4b"]["optim"],
    "parallel": {"pipeline_stages": 2, "microbatches": 16},
    "train": {**PRESETS["qwen3-4b"]["train"], "global_batch_size": 32},
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
    "--overwrite": ("checkpoint", "overwrite"),
    "--steps": ("train", "steps"),
    "--base": ("model", "base"),
    "--data": ("data", "path"),
    "--lr": ("optim", "lr"),
}


_SWITCHES = ("--resume", "--overwrite")  # friendly flags that take no value


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
            return tuple(_coerce(section, name, a, x) for a, x in zip(args, items, strict=True))
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid setting {where} = {raw!r}: {err}") from None
    raise AssertionError(f"unsupported field type {tp!r} for {where}")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _merge(tree: dict[str, dict[str, Any]], section: str, name: str, raw: Any, origin: str) -> None:
    """Validate the key, coerce the value and record it in the nested override tree."""
    if section == "":
        if name != "out":
            raise ValueError(f"{origin}: unknown top-level setting {name!r}; known: out, {', '.join(SECTIONS)}")
        tree.setdefault("", {})["out"] = _coerce("", "out", str, raw)
        return
    if section not in SECTIONS:
        raise ValueError(f"{origin}: unknown section {section!r}; known sections: {', '.join(SECTIONS)}")
    types = _field_types(SECTIONS[section])
    if name not in types:
        raise ValueError(f"{origin}: unknown setting {section}.{name}; known: {', '.join(sorted(types))}")
    tree.setdefault(section, {})[name] = _coerce(section, name, types[name], raw)


def _build(tree: Mapping[str, Mapping[str, Any]]) -> JobConfig:
    kwargs: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
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


def _preset_tree(preset: str) -> dict[str, dict[str, Any]]:
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    tree: dict[str, dict[str, Any]] = {}
    for section, values in PRESETS[preset].items():
        for name, raw in values.items():
            _merge(tree, section, name, raw, f"preset {preset}")
    return tree


def preset_config(preset: str) -> JobConfig:
    """A preset's own settings for planning (``python -m ida_trainer.memory --preset``), its base model and data
    the placeholders ``BASE`` and ``DATA``; ``parse_args(["--preset", preset, ...])`` starts from the same.

    Example:
        >>> preset_config("qwen3-4b").parallel.data_parallel
        'fsdp'
    """
    tree = _preset_tree(preset)
    if preset != "demo":
        tree.setdefault("model", {})["base"] = "BASE"
        tree.setdefault("data", {})["path"] = "DATA"
    return _build(tree)


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
        takes_value = key not in _SWITCHES or bool(eq)
        raw: Any = True
        if takes_value and key in ("--preset", "--config", *_FRIENDLY) or key.startswith("--") and "." in key:
            if eq:
                raw = inline
            elif i + 1 >= len(args) or (args[i + 1].startswith("--") and not _is_number(args[i + 1])):
                raise ValueError(f"command line: {key} needs a value")
            else:
                i += 1
                raw = args[i]
        if key == "--preset":
            preset = raw
        elif key == "--config":
            config_file = raw
        elif key in _FRIENDLY:
            section, name = _FRIENDLY[key]
            cli.append((section, name, raw, key))
        elif key.startswith("--") and "." in key:
            section, _, name = key[2:].partition(".")
            cli.append((section, name, raw, key))
        elif key in ("-h", "--help"):
            raise SystemExit(usage())
        else:
            raise ValueError(f"command line: unknown argument {arg!r} (see python -m ida_trainer --help)")
        i += 1
    tree = _preset_tree(preset)
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
    lines = [
        "usage: python -m ida_trainer [--config FILE.toml] [--preset NAME] [--section.key VALUE ...]",
        f"  no arguments: the embedded demo (tiny Nemotron, nvfp4 on CPU, {DEMO_DURATION}; writes runs/demo)",
        f"  presets: {', '.join(PRESETS)}",
        "  --debug: full tracebacks instead of one-line errors (also IDA_DEBUG=1); exit status 0 ok, "
        "1 training diverged, 2 bad input, 3 cannot run here, 70 internal error, 130 interrupted (docs/cli.md)",
        "  flags: " + " ".join(f"{k} {'' if k in _SWITCHES else 'V'}".strip() for k in _FRIENDLY),
    ]
    for section, cls in SECTIONS.items():
        defaults = cls()
        lines.append(f"  [{section}] " + " ".join(f"{f.name}={getattr(defaults, f.name)!r}" for f in fields(cls)))
    return "\n".join(lines)


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
    for section in SECTIONS:
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
