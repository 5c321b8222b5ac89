"""Training loop pieces: loss normalisation (4x1 == 1x4), schedule, clipping, NaN fail-fast, CLI errors."""

from __future__ import annotations

import itertools
import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ida_trainer.__main__ import main
from ida_trainer.cli import parse_args
from ida_trainer.config import DataConfig, ModelConfig, OptimConfig
from ida_trainer.data import Example, StepBatcher, load_examples
from ida_trainer.demo import (
    build_demo_model,
    corpus_path,
)
from ida_trainer.engine import (
    LocalEngine,
    NonFiniteError,
    causal_lm_loss_sum,
    enable_activation_checkpointing,
    grad_norm_and_clip,
    lr_at,
)
from ida_trainer.trainer import Trainer, run
from tests.conftest import flip_bit
from tests.ida_trainer.support import TINY_MODEL

TINY = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


@pytest.fixture(scope="module")
def examples(tok):
    exs, _ = load_examples(DataConfig(), tok, path=corpus_path())
    # different lengths, so a mean of per-micro-batch means would differ from the token mean
    return sorted(exs, key=lambda e: len(e.input_ids))[::12][:4]


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _run(tok, examples, microbatches, *, checkpointing=False):
    model = build_demo_model(TINY, tok, seed=0)
    if checkpointing:
        enable_activation_checkpointing(model)
        assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    batcher = StepBatcher(
        [(e,) for e in examples],
        global_batch_size=4,
        microbatches=microbatches,
        seed=0,
        pad_id=tok.eos_token_id,
        shuffle=False,
    )
    step = batcher.next_step()
    loss = LocalEngine(model).forward_backward(step.microbatches, step.global_valid_tokens)
    return loss, _grads(model), step


def test_four_microbatches_of_one_equal_one_of_four(tok, examples):
    loss4, grads4, step4 = _run(tok, examples, 4)
    loss1, grads1, step1 = _run(tok, examples, 1)
    assert step4.global_valid_tokens == step1.global_valid_tokens
    assert loss4 == pytest.approx(loss1, rel=1e-6)
    assert grads4.keys() == grads1.keys()
    for name in grads1:
        torch.testing.assert_close(grads4[name], grads1[name], rtol=1e-4, atol=1e-7, msg=name)
    # the naive alternative (mean of per-micro-batch means) is measurably different on this data
    model = build_demo_model(TINY, tok, seed=0)
    with torch.no_grad():
        means = [
            float(
                causal_lm_loss_sum(
                    model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits, mb["labels"]
                )
                / (mb["labels"] != -100).sum()
            )
            for mb in step4.microbatches
        ]
    assert abs(sum(means) / 4 - loss1) > 1e-3


def test_activation_checkpointing_changes_nothing(tok, examples):
    loss_a, grads_a, _ = _run(tok, examples, 2)
    loss_b, grads_b, _ = _run(tok, examples, 2, checkpointing=True)
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7)


def test_loss_is_mean_token_cross_entropy():
    logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[1, -100, 2], [-100, -100, 4]])
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)
    assert float(causal_lm_loss_sum(logits, labels) / 3) == pytest.approx(float(want), rel=1e-6)


def test_schedule_warmup_then_cosine():
    o = OptimConfig(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [lr_at(s, o, 20) for s in range(20)]
    assert lrs[:4] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4])
    assert lrs[4] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 500), st.integers(0, 50), st.floats(0.0, 1.0), st.floats(1e-6, 1.0))
def test_schedule_bounds(total, warmup, ratio, lr):
    if 0 < ratio and lr * ratio < sys.float_info.min:  # the final lr would underflow: refused
        with pytest.raises(ValueError, match="min_lr_ratio.*underflows"):
            OptimConfig(lr=lr, warmup_steps=warmup, min_lr_ratio=ratio)
        return
    o = OptimConfig(lr=lr, warmup_steps=warmup, min_lr_ratio=ratio)
    for s in range(total):
        v = lr_at(s, o, total)
        assert 0 < v <= lr * (1 + 1e-12) or (ratio == 0 and v >= 0)
        if s >= warmup:
            assert v >= lr * ratio * (1 - 1e-9)


@pytest.mark.parametrize("lr, ratio", [(0.5, 5e-324), (1e-6, 1e-303), (1.0, 2.0e-308)])
def test_min_lr_ratio_that_underflows_is_refused(lr, ratio):
    # found by hypothesis: ratio 5e-324 made the cosine end at lr 0.0 while claiming a non-zero floor
    with pytest.raises(ValueError, match=r"optim\.min_lr_ratio.*underflows.*use 0"):
        OptimConfig(lr=lr, min_lr_ratio=ratio)
    assert lr_at(9, OptimConfig(lr=lr, min_lr_ratio=0.0, warmup_steps=0), 10) == 0.0


@pytest.mark.parametrize("lr", [0.0, -1e-4, float("inf"), float("nan")])
def test_lr_must_be_finite_and_positive(lr):
    with pytest.raises(ValueError, match=r"optim\.lr"):
        OptimConfig(lr=lr)


def test_grad_norm_is_reported_before_clipping():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    assert grad_norm_and_clip([p], 1.0) == pytest.approx(5.0)
    assert float(p.grad.norm()) == pytest.approx(1.0, rel=1e-5)
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    assert grad_norm_and_clip([p], 0.0) == pytest.approx(5.0)  # 0 = no clipping
    assert float(p.grad.norm()) == pytest.approx(5.0)


def test_nan_loss_fails_fast_naming_step_and_batch(tmp_path):
    cfg = parse_args(
        [
            "--recipe",
            "bf16",
            "--out",
            str(tmp_path / "run"),
            "--train.global_batch_size",
            "2",
            *TINY_MODEL,
            "--train.progress",
            "false",
            "--eval.final",
            "false",
            "--checkpoint.export",
            "false",
        ]
    )
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        with torch.no_grad():
            trainer.model.get_input_embeddings().weight.fill_(float("nan"))
        with pytest.raises(NonFiniteError) as info:
            trainer.train()
    finally:
        trainer.close()
    msg = str(info.value)
    assert "at step 1" in msg and "corpus.jsonl:" in msg and "nan" in msg.lower()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cli_reports_bad_input_with_exit_code_2(capsys, tmp_path):
    assert main(["--train.steps", "zero"]) == 2
    assert "train.steps" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": 1}\n')
    assert main(["--data", str(bad), "--out", str(tmp_path / "r"), "--train.progress", "false"]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "--pipeline-stages" in capsys.readouterr().out


def test_step_batch_sources_are_named():
    ex = Example((1, 2, 3), (True, True, True), "data.jsonl:7")
    step = StepBatcher([(ex,)], global_batch_size=1, microbatches=1, seed=0, pad_id=0).next_step()
    assert step.sources == ["data.jsonl:7"] and not math.isnan(step.global_valid_tokens)


@pytest.mark.slow
def test_fine_tune_a_base_directory_with_chat_data_and_broken_marker_rows(tok, tmp_path):
    """A transformers BF16 base dir whose ChatML marker rows are identical: the run re-initialises them,
    makes <|im_end|> the EOS, and its exported MXFP8 checkpoint is itself usable as a base."""
    import json as _json

    base = tmp_path / "base"
    model = build_demo_model(TINY, tok, seed=0)
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    with torch.no_grad():
        for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            w[start] = w[end] = w[-1]
    model.to(torch.bfloat16).save_pretrained(base)
    tok.save_pretrained(base)
    data = tmp_path / "chat.jsonl"
    data.write_text(
        "".join(
            _json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"square {i}"},
                        {"role": "assistant", "content": f"<think>x</think>\n{i * i}"},
                    ]
                }
            )
            + "\n"
            for i in range(6)
        )
    )
    common = [
        "--data",
        str(data),
        "--data.format",
        "chat",
        "--steps",
        "2",
        "--train.global_batch_size",
        "2",
        "--train.progress",
        "false",
        "--eval.final",
        "false",
    ]
    report = run(parse_args([*common, "--base", str(base), "--out", str(tmp_path / "r1")]))
    assert sorted(report["untrained_tokens"]["reinitialised"]) == sorted([start, end])
    gen = _json.loads((tmp_path / "r1" / "export" / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == end
    # the exported MXFP8 directory is a valid base for the next run
    report2 = run(
        parse_args(
            [*common, "--base", str(tmp_path / "r1" / "export"), "--out", str(tmp_path / "r2"), "--recipe", "bf16"]
        )
    )
    assert report2["untrained_tokens"]["reinitialised"] == [] and math.isfinite(report2["final_loss"])
    # a base whose bytes changed since the export wrote them (its SHA256SUMS) is named before any training
    flip_bit(tmp_path / "r1" / "export" / "model.safetensors", mask=0x10)
    with pytest.raises(ValueError, match=r"export/model.safetensors: its bytes differ from the sha256 recorded"):
        run(parse_args([*common, "--base", str(tmp_path / "r1" / "export"), "--out", str(tmp_path / "r3")]))
    assert not (tmp_path / "r3" / "checkpoints").exists()
