"""Builders for the embedded demo: a tiny NemotronForCausalLM, a tokenizer trained on the spot, a shipped code corpus.

``python -m ida_trainer`` with no arguments trains this model on CPU (:data:`ida_trainer.config.DEMO_DURATION`) with the nvfp4
recipe, exports the MXFP8 checkpoint and scores it with ``ida_eval`` on problems whose solutions are in
the corpus. It demonstrates that every stage of the pipeline runs end to end on real components
(tokenizers BPE, transformers' Nemotron with relu^2 MLP and LayerNorm1P, NVFP4 linears, the MXFP8
codec, sandboxed execution); a model this small memorising 48 functions says nothing about model quality.

Files shipped with the package:

- ``corpus.jsonl``: 48 small MBPP-style Python functions, ``{"text": prompt + body}`` (written for
  this project, 4-space indentation, each with a docstring and two doctest examples).
- ``problems.jsonl``: the same 48 functions as mxeval problems (``task_id``, ``prompt``,
  ``canonical_solution``, ``entry_point``, ``test``); every canonical solution passes its test.

The tokenizer is a byte-level BPE (lossless on tabs, spaces and newlines, which code needs; newlines are
never merged with the indentation that follows, so a prompt ending in a newline is a clean token
boundary) with the
ChatML markers ``<|im_start|>`` / ``<|im_end|>`` and ``<think>`` / ``</think>`` as single tokens, so the
``chat`` data format and the untrained-token check run on it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from ida_trainer.config import ModelConfig

DEMO_DIR = Path(__file__).resolve().parent
EOS_TOKEN = "<|endoftext|>"  # end of document, also the pad token
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>", "<think>", "</think>")
DEMO_VOCAB_SIZE = 1024  # BPE target; the demo corpus saturates around 840 merges+bytes
VOCAB_MULTIPLE = 64  # embedding rows rounded up to a multiple of 64 (unused rows stay random)
INIT_RANGE = 0.02  # std of the demo model's normal init (HF initializer_range)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus_path() -> Path:
    """Path of the shipped demo corpus (plain JSONL, ``{"text": ...}`` per line)."""
    return DEMO_DIR / "corpus.jsonl"


def problems_path() -> Path:
    """Path of the shipped demo problems (mxeval format JSONL)."""
    return DEMO_DIR / "problems.jsonl"


def corpus_texts(path: Path | None = None) -> list[str]:
    """The ``text`` field of every line of a plain JSONL corpus (default: the demo corpus)."""
    path = path or corpus_path()
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def train_demo_tokenizer(texts: Iterable[str], *, vocab_size: int = DEMO_VOCAB_SIZE):
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it as a transformers fast tokenizer.

    Deterministic for the same texts (tokenizers' BPE trainer breaks ties by pair order). Takes
    well under a second on the demo corpus.

    Args:
        texts: training documents.
        vocab_size: target vocabulary size including the byte alphabet and special tokens.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with EOS/pad ``<|endoftext|>`` and a ChatML template.

    Example:
        >>> tok = train_demo_tokenizer(corpus_texts())
        >>> tok.decode(tok("def f(x):\\n\\treturn x\\n")["input_ids"])
        'def f(x):\\n\\treturn x\\n'
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # "\n" is always a token of its own: an MBXP prompt ends in "\n" and the completion starts with the
    # indentation, so prompt + completion must tokenize as tokens(prompt) + tokens(completion); a BPE
    # merge of "\n" with the following spaces would give the model, at generation time, a token boundary
    # it never saw in training (it then predicts EOS right away).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    return fast


def build_demo_model(model: ModelConfig, tokenizer, *, seed: int) -> torch.nn.Module:
    """Build the tiny NemotronForCausalLM described by ``model`` with a vocabulary fitting ``tokenizer``.

    Nemotron is the Minitron-4B architecture: squared-ReLU MLP (up/down projections, no gate),
    LayerNorm1P (weight stored zero-centred, +1 at run time), partial rotary embeddings, untied
    lm_head. Parameters are FP32 here; the precision recipe decides what they become.

    Args:
        model: sizes (hidden, layers, heads, intermediate).
        tokenizer: the tokenizer whose ids the model must cover.
        seed: init seed (the same seed gives bit-identical weights).

    Returns:
        The model in train mode.
    """
    from transformers import NemotronConfig, NemotronForCausalLM

    vocab = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = NemotronConfig(
        vocab_size=vocab,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_heads,
        max_position_embeddings=1024,
        initializer_range=INIT_RANGE,
        # pad_token_id stays None: with a padding_idx the EOS row (EOS doubles as pad) would get no gradient.
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = NemotronForCausalLM(config)
    net.generation_config.eos_token_id = eos
    net.generation_config.pad_token_id = eos
    return net.train()
