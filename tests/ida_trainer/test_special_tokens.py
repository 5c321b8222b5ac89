"""Untrained special-token rows: detection (duplicate / near-zero) among used ids, re-init, EOS fix."""

from __future__ import annotations

import json

import pytest
import torch

from ida_trainer.config import DataConfig, ModelConfig
from ida_trainer.data import load_examples
from ida_trainer.demo import build_demo_model, corpus_texts, train_demo_tokenizer
from ida_trainer.special_tokens import (
    duplicate_rows,
    find_untrained,
    fix_untrained_tokens,
    low_norm_rows,
    reinit_rows_,
    set_end_of_turn,
)


def _model(tok):
    return build_demo_model(ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2), tok, seed=0)


def test_detectors_on_a_matrix():
    w = torch.randn(10, 8)
    w[3] = w[7]
    w[5] = 0.0
    w[6] = -1e-9  # all-negative tiny row: a max-based test would miss it, the norm test does not
    assert duplicate_rows(w) == {3, 7}
    assert low_norm_rows(w) == {5, 6}
    assert find_untrained(w, [3, 5, 6, 1]) == ([3], [5, 6])
    assert find_untrained(w, [1, 2]) == ([], [])


def test_reinit_is_mean_plus_small_noise_and_seeded():
    w = torch.randn(50, 16)
    w[[0, 1]] = 0.0
    trained_mean = w[2:].mean(0)
    a, b = w.clone(), w.clone()
    reinit_rows_(a, [0, 1], seed=1)
    reinit_rows_(b, [0, 1], seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # distinguishable
    assert (a[0] - trained_mean).norm() < 0.1 * w[2:].norm(dim=1).mean()
    assert torch.equal(a[2:], w[2:])


def test_chat_markers_with_identical_rows_are_found_and_fixed(tok, tmp_path):
    model = _model(tok)
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    with torch.no_grad():  # what a resized base vocabulary looks like: the marker rows share one vector
        for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            w[start] = w[end] = w[-1]
    p = tmp_path / "chat.jsonl"
    p.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    exs, _ = load_examples(DataConfig(path=str(p), format="chat"), tok, path=p)
    used = {i for e in exs for i in e.input_ids}
    report = fix_untrained_tokens(model, tok, used, seed=0)
    assert report.reinitialised == sorted([start, end])
    assert set(report.tokens) == {"<|im_start|>", "<|im_end|>"}
    assert report.duplicate_ids["embed_tokens"] == sorted([start, end])
    emb = model.get_input_embeddings().weight
    assert not torch.equal(emb[start], emb[end]) and not torch.equal(emb[start], emb[-1])
    # the unused last row was not touched and nothing is flagged any more
    assert fix_untrained_tokens(model, tok, used, seed=0).reinitialised == []


def test_healthy_model_is_left_alone(tok):
    model = _model(tok)
    before = model.get_input_embeddings().weight.clone()
    report = fix_untrained_tokens(model, tok, range(len(tok)), seed=0)
    assert report.reinitialised == [] and torch.equal(before, model.get_input_embeddings().weight)


def test_eos_set_to_the_end_of_turn_marker(tok):
    model = _model(tok)
    old = model.generation_config.eos_token_id
    t = train_demo_tokenizer(corpus_texts())
    marker_id = set_end_of_turn(model, t, "<|im_end|>")
    assert t.eos_token == "<|im_end|>" and model.config.eos_token_id == marker_id
    assert model.generation_config.eos_token_id == [marker_id, old]
    with pytest.raises(ValueError, match="not in the tokenizer"):
        set_end_of_turn(model, t, "<|nope|>")
