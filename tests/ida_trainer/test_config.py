"""Config tree: defaults are the demo, CLI/TOML/preset precedence, round trips, actionable errors, warnings."""

from __future__ import annotations

import warnings

import pytest

from ida_trainer.cli import PRESETS, from_tree, load_toml, parse_args, to_toml
from ida_trainer.config import (
    ADAMW_BETAS,
    JobConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    ignored_settings,
    to_dict,
    warn_ignored,
    with_overrides,
)


def test_no_arguments_is_the_demo():
    cfg = parse_args([])
    assert cfg == JobConfig()
    assert cfg.is_demo and cfg.precision.recipe == "nvfp4" and cfg.optim.name == "lion"
    assert cfg.precision.writeback == "stochastic"


def test_friendly_flags_and_dotted_overrides():
    cfg = parse_args(
        [
            "--pipeline-stages",
            "2",
            "--parallel.microbatches",
            "4",
            "--eval-every",
            "5",
            "--resume",
            "--writeback",
            "rne",
            "--out",
            "runs/x",
            "--train.steps",
            "20",
            "--optim.lr=1e-4",
            "--precision.keep_bf16",
            "model.layers.0.*, model.layers.1.*",
            "--optim.warmup_steps",
            "-0",
        ]
    )
    assert cfg.parallel == ParallelConfig(pipeline_stages=2, microbatches=4)
    assert cfg.eval.every == 5 and cfg.checkpoint.resume and cfg.out == "runs/x"
    assert cfg.precision.writeback == "rne" and cfg.train.steps == 20 and cfg.optim.lr == 1e-4
    assert cfg.precision.keep_bf16 == ("model.layers.0.*", "model.layers.1.*")


def test_recipe_flag_switches_optimizer_defaults_but_not_explicit_ones():
    cfg = parse_args(["--recipe", "bf16"])
    assert cfg.optim.name == "adamw" and cfg.optim.betas == ADAMW_BETAS
    cfg = parse_args(["--optim.lr", "0.5", "--recipe", "bf16"])
    assert cfg.optim.lr == 0.5 and cfg.optim.name == "adamw"


def test_toml_round_trip(tmp_path):
    cfg = parse_args(
        [
            "--recipe",
            "bf16",
            "--train.steps",
            "7",
            "--precision.keep_bf16",
            "a.*",
            "--data.packing",
            "true",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    assert parse_args(["--config", str(path)]) == cfg
    assert from_tree(to_dict(cfg)) == cfg
    # CLI beats the file
    assert parse_args(["--config", str(path), "--train.steps", "9"]).train.steps == 9


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--train.steps", "0"], "train.steps"),
        (["--train.steps", "many"], "train.steps"),
        (["--optim.lr", "-1"], "optim.lr"),
        (["--optim.betas", "0.9"], "optim.betas"),
        (["--bogus.key", "1"], "unknown section 'bogus'"),
        (["--train.stepz", "1"], "unknown setting train.stepz"),
        (["--recipe", "fp8"], "precision.recipe"),
        (["--writeback", "nearest"], "precision.writeback"),
        (["--optim.name", "adamw"], "nvfp4 recipe updates its MXFP8 master with Lion"),
        (["--pipeline-stages", "2"], "needs at least 2 micro-batches"),
        (["--pipeline-stages", "2", "--microbatches", "2", "--data-parallel", "fsdp"], "cannot be combined"),
        (["--train.global_batch_size", "6", "--microbatches", "4"], "multiple of parallel.microbatches"),
        (["--model.hidden_size", "72", "--model.num_heads", "4"], "multiple of 16"),
        (["--data.format", "chat"], "--data FILE.jsonl"),
        (["--preset", "qwen3-4b"], "model.base"),
        (["--preset", "nope"], "unknown"),
        (["--steps"], "needs a value"),
        (["positional"], "unknown argument"),
    ],
)
def test_bad_settings_raise_actionable_errors(argv, needle):
    with pytest.raises(ValueError, match=None) as info:
        parse_args(argv)
    assert needle in str(info.value)


def test_bad_toml_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[train]\nsteps = 'x'\n")
    with pytest.raises(ValueError, match="bad.toml"):
        load_toml(p)
    p.write_text("[train\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_toml(p)
    with pytest.raises(ValueError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")


def test_presets_describe_the_real_configurations():
    assert set(PRESETS) == {"demo", "minitron-4b", "qwen3-4b", "qwen3-4b-nvfp4"}
    m = parse_args(["--preset", "minitron-4b", "--base", "/models/minitron", "--data", "sft.jsonl"])
    assert m.parallel.pipeline_stages == 2 and m.model.activation_checkpointing
    assert m.precision.recipe == "nvfp4" and m.optim.name == "lion" and m.optim.lr == 1e-5
    q = parse_args(["--preset", "qwen3-4b", "--base", "/models/qwen3", "--data", "chat.jsonl"])
    assert q.parallel.data_parallel == "fsdp" and q.data.format == "chat" and q.optim.name == "adamw"
    assert q.optim.betas == ADAMW_BETAS
    n = parse_args(["--preset", "qwen3-4b-nvfp4", "--base", "/models/qwen3", "--data", "chat.jsonl"])
    assert n.parallel.pipeline_stages == 2 and n.data.format == "chat" and n.precision.recipe == "nvfp4"
    assert n.precision.keep_bf16 == ("model.layers.0.*", "model.layers.35.*")  # Qwen3-4B's 36 layers


def test_frozen_and_revalidated():
    cfg = JobConfig()
    with pytest.raises(AttributeError):
        cfg.train.steps = 3  # type: ignore[misc]
    assert with_overrides(cfg, train={"steps": 3}, out="x").train.steps == 3
    with pytest.raises(ValueError):
        with_overrides(cfg, optim={"lr": 0.0})
    with pytest.raises(ValueError):
        PrecisionConfig(keep_bf16=("",))
    with pytest.raises(ValueError):
        OptimConfig(min_lr_ratio=2.0)


def test_ignored_settings_warn():
    cfg = parse_args(["--recipe", "bf16", "--writeback", "rne", "--eval-every", "1000"])
    notes = ignored_settings(cfg)
    assert any("precision.writeback is ignored" in n for n in notes)
    assert any("eval.every" in n for n in notes)
    with pytest.warns(UserWarning) as record:
        warn_ignored(cfg)
    assert len(record) == len(notes) and any("writeback" in str(w.message) for w in record)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_ignored(parse_args([]))
