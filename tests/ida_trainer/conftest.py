"""Fixtures shared by the trainer tests."""

from __future__ import annotations

import pytest

from ida_trainer.demo import corpus_texts, train_demo_tokenizer


@pytest.fixture(scope="module")
def tok():
    """The demo's byte-level BPE tokenizer, trained on the shipped corpus (once per test module)."""
    return train_demo_tokenizer(corpus_texts())
