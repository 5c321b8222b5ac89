"""The embedded demo: shipped corpus/problems are consistent, the tokenizer is lossless on code, and the
demo pipeline (train nvfp4 -> checkpoint -> header-only export -> sandboxed eval) runs end to end."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ida_trainer.__main__ import main
from ida_trainer.config import ModelConfig
from ida_trainer.demo import (
    SPECIAL_TOKENS,
    build_demo_model,
    corpus_texts,
    problems_path,
    train_demo_tokenizer,
)
from ida_trainer.logs import read_mllog, read_train_log
from tests.ida_trainer.support import TINY_MODEL


def _problems():
    with open(problems_path()) as f:
        return [json.loads(line) for line in f]


def test_every_problem_solution_is_in_the_corpus():
    corpus = set(corpus_texts())
    problems = _problems()
    assert 30 <= len(problems) <= 60 and len(corpus) == len(problems)
    for p in problems:
        assert p["prompt"] + p["canonical_solution"] in corpus, p["task_id"]
        assert {"task_id", "prompt", "canonical_solution", "entry_point", "test"} <= set(p)


def test_canonical_solutions_pass_in_the_sandbox():
    from ida_eval.execute import ExecutionConfig, execute_samples, load_problems

    problems = load_problems(problems_path())
    results = execute_samples(problems, canonical=True, config=ExecutionConfig(timeout=20), progress=False)
    failed = [r["task_id"] for r in results if not r["passed"]]
    assert failed == []


def test_tokenizer_is_lossless_and_has_the_markers():
    tok = train_demo_tokenizer(corpus_texts())
    for text in [*corpus_texts()[:5], "\tx = 1\n\t\ty  =  '\u00e9'\n", "<|im_start|>user\nhi<|im_end|>"]:
        assert tok.decode(tok(text)["input_ids"]) == text
    for s in SPECIAL_TOKENS:
        assert len(tok(s, add_special_tokens=False)["input_ids"]) == 1
    assert tok.eos_token == "<|endoftext|>" and tok.chat_template


def test_prompts_end_on_a_token_boundary():
    """tokens(prompt) + tokens(solution) == tokens(prompt + solution) for every demo problem: generation
    continues from exactly the token sequence the model was trained on."""
    tok = train_demo_tokenizer(corpus_texts())
    for p in _problems():
        joint = tok(p["prompt"] + p["canonical_solution"])["input_ids"]
        assert tok(p["prompt"])["input_ids"] + tok(p["canonical_solution"])["input_ids"] == joint, p["task_id"]


def test_demo_model_is_a_nemotron_and_seeded():
    tok = train_demo_tokenizer(corpus_texts())
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2)
    a, b = build_demo_model(cfg, tok, seed=3), build_demo_model(cfg, tok, seed=3)
    assert type(a).__name__ == "NemotronForCausalLM" and a.config.hidden_act == "relu2"
    assert a.config.vocab_size >= len(tok) and a.config.vocab_size % 64 == 0
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.slow
def test_demo_pipeline_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(
        [
            "--out",
            str(out),
            "--steps",
            "4",
            "--eval-every",
            "2",
            "--eval.num_problems",
            "3",
            "--eval.max_new_tokens",
            "24",
            "--train.global_batch_size",
            "2",
            *TINY_MODEL,
            "--train.progress",
            "false",
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    text = captured.out
    assert text.count("says nothing about model quality") == 1  # the NOTE once, beside the score
    assert re.search(r"^demo: pass@1 \d+\.\d % \(\d/3\) on problems", text, re.M), text
    assert re.search(r"^export: \S+ckpt-\d+ -> \S+export \(header-only rename", text, re.M), text
    for phase in ("load: ", "generate: ", "execute: "):  # one line as each phase of the final eval starts
        assert any(line.startswith(phase) for line in captured.err.splitlines()), (phase, captured.err)
    assert [r["step"] for r in read_train_log(out / "train_log.jsonl")] == [1, 2, 3, 4]
    report = json.loads((out / "report.json").read_text())
    assert report["demo"] and report["precision"]["recipe"] == "nvfp4"
    assert report["final_eval"]["n_tasks"] == 3 and len(report["evals"]) == 2
    assert report["export"]["num_tensors"] > 0 and (out / "export" / "export_manifest.json").is_file()
    assert (out / "loss.png").is_file() and (out / "config.toml").is_file()
    keys = {r["key"]: r for r in read_mllog(out / "mlperf_log.txt")}
    assert keys["weight_precision"]["value"] == "mxfp8_e4m3" and keys["compute_precision"]["value"] == "nvfp4"
    assert "eval_accuracy" in keys and "train_loss" in keys and keys["run_stop"]["metadata"]["status"] == "success"
    from mxfp8_codec import open_mxfp8

    with open_mxfp8(out / "export" / "model.safetensors") as r:
        assert r.metadata["orientation"] == "in_out" and r.metadata["recipe"] == "nvfp4"
        assert r.is_quantized("model.layers.0.self_attn.q_proj.weight")
