"""The embedded demo (``python -m ida_trainer`` with no arguments): corpus, problems, tokenizer, tiny model.

See :mod:`ida_trainer.demo.build` for what the demo shows and what it does not (model quality).
"""

from ida_trainer.config import DEMO_DURATION
from ida_trainer.demo.build import (
    CHAT_TEMPLATE,
    DEMO_DIR,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    build_demo_model,
    corpus_path,
    corpus_texts,
    problems_path,
    train_demo_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATE",
    "DEMO_DIR",
    "DEMO_DURATION",
    "EOS_TOKEN",
    "SPECIAL_TOKENS",
    "build_demo_model",
    "corpus_path",
    "corpus_texts",
    "problems_path",
    "train_demo_tokenizer",
]
