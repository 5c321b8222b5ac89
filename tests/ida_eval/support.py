"""Test support for the ida_eval loader/generation/harness tests (no tests in this module).

Builds everything the tests need locally: tiny random transformers models of the three supported
architectures, a byte-level BPE tokenizer trained on problem text, and a small MBXP-format problem
set written for these tests (used when the real MBXP data is absent).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ARCHS: tuple[str, ...] = ("nemotron", "llama", "qwen3")

# Small MBXP-format problems written for these tests (same keys and layout as mbpp_release_v1.jsonl).
SMALL_PROBLEMS: list[dict[str, str]] = [
    {
        "task_id": "T/1",
        "prompt": '\n\ndef add(a, b):\n\t"""\n\tWrite a function to add two numbers.\n\t>>> add(1, 2)\n\t3\n\t"""\n',
        "canonical_solution": "\treturn a + b",
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(5, 7) == 12\n\n",
        "entry_point": "add",
    },
    {
        "task_id": "T/2",
        "prompt": '\n\ndef square(n):\n  """\n  Write a function to square a number.\n  >>> square(3)\n  9\n  """\n',
        "canonical_solution": "  return n * n",
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-4) == 16\n\n",
        "entry_point": "square",
    },
    {
        "task_id": "T/3",
        "prompt": (
            '\n\ndef is_even(n):\n  """\n  Write a python function to check whether a number is even.\n'
            '  >>> is_even(4)\n  True\n  """\n'
        ),
        "canonical_solution": "  return n % 2 == 0",
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(4) == True\n    assert candidate(7) == False\n\n",
        "entry_point": "is_even",
    },
    {
        "task_id": "T/4",
        "prompt": '\n\ndef rev(s):\n  """\n  Write a function to reverse a string.\n  >>> rev("ab")\n  "ba"\n  """\n',
        "canonical_solution": "  return s[::-1]",
        "test": (
            '\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate("ab") == "ba"\n'
            '    assert candidate("xyz") == "zyx"\n\n'
        ),
        "entry_point": "rev",
    },
    {
        "task_id": "T/5",
        "prompt": (
            '\n\ndef max_of_list(xs):\n\t"""\n\tWrite a function to find the largest item of a list.\n'
            '\t>>> max_of_list([1, 5, 2])\n\t5\n\t"""\n'
        ),
        "canonical_solution": "\tbest = xs[0]\n\tfor x in xs:\n\t\tif x > best:\n\t\t\tbest = x\n\treturn best",
        "test": (
            "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 5, 2]) == 5\n"
            "    assert candidate([-3, -1]) == -1\n\n"
        ),
        "entry_point": "max_of_list",
    },
    {
        "task_id": "T/6",
        "prompt": (
            '\n\ndef count_vowels(s):\n  """\n  Write a function to count the vowels in a string.\n'
            '  >>> count_vowels("hello")\n  2\n  """\n'
        ),
        "canonical_solution": '  return sum(1 for c in s if c in "aeiou")',
        "test": '\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate("hello") == 2\n    assert candidate("sky") == 0\n\n',
        "entry_point": "count_vowels",
    },
]
for _p in SMALL_PROBLEMS:
    _p.setdefault("language", "python")

# The MBXP Python tasks whose canonical solutions fail in every executor (mxeval's too): 959 of 974 pass.
KNOWN_FAILURES = {f"MBPP/{i}" for i in (56, 349, 899, 967, 367, 927, 601, 160, 596, 341, 642, 607, 631, 64, 966)}


def write_problems(path: Path, problems: list[dict[str, str]]) -> Path:
    """Write problems as MBXP JSONL."""
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path


def read_problems(path: Path, task_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Read MBXP JSONL (optionally only some task ids, in the order given)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if task_ids is None:
        return rows
    by_id = {r["task_id"]: r for r in rows}
    return [by_id[t] for t in task_ids]


def train_tokenizer(texts: list[str], vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained on ``texts``; eos ``</s>``, no pad token (like Minitron)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_config(arch: str, vocab_size: int, *, hidden: int = 64, layers: int = 2, tie: bool | None = None) -> Any:
    """A small random config of one supported architecture (head_dim 16, GQA 4:2)."""
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "nemotron":
        from transformers import NemotronConfig

        return NemotronConfig(**common, tie_word_embeddings=bool(tie))
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common, tie_word_embeddings=bool(tie))
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common, tie_word_embeddings=True if tie is None else tie)
    raise ValueError(f"unknown arch {arch!r}")


def tiny_model(arch: str, vocab_size: int, *, seed: int = 0, **kw: Any) -> Any:
    """A random float32 causal LM; norm weights/biases randomised too (so folding/tying bugs show)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab_size, **kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def native_state_dict(model: Any, *, folded: bool = False) -> dict[str, torch.Tensor]:
    """The model's tensors as the trainer stores them: projections [in, out], tied copies dropped.

    With ``folded`` the NemotronLayerNorm1P weights are stored as the effective gamma ``1 + w``.
    """
    from mxfp8_codec import is_projection_weight

    tied = model.config.tie_word_embeddings
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        if is_projection_weight(name):
            t = t.t().contiguous()
        elif folded and name.endswith("layernorm.weight") or (folded and name == "model.norm.weight"):
            if type(model.get_submodule(name.rsplit(".", 1)[0])).__name__.endswith("LayerNorm1P"):
                t = t + 1.0
        out[name] = t
    return out


def save_mxfp8_checkpoint(
    model: Any, tokenizer: Any, directory: Path, *, folded: bool = False, shards: int = 1
) -> Path:
    """Save ``model`` in our MXFP8 format (native orientation) with config and tokenizer files."""
    from mxfp8_codec import write_mxfp8_safetensors

    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    sd = native_state_dict(model, folded=folded)
    meta = {"source": "tests"}
    norm = "folded" if folded else "zero_centered"
    if shards == 1:
        write_mxfp8_safetensors(directory / "model.safetensors", sd, metadata=meta, norm_convention=norm)
        return directory
    names = list(sd)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_mxfp8_safetensors(directory / fname, {n: sd[n] for n in part}, metadata=meta, norm_convention=norm)
        from mxfp8_codec import open_mxfp8

        with open_mxfp8(directory / fname) as r:
            for n in r.keys():
                weight_map[n] = fname
                if r.is_quantized(n):
                    weight_map[n + ".scale"] = fname
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def mxfp8_reference(model: Any, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The same model with projection weights set to decode(encode(w)) directly (native orientation)."""
    from transformers import AutoModelForCausalLM

    from mxfp8_codec import decode_mxfp8, encode_mxfp8, is_projection_weight

    ref = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    sd = {}
    for name, t in model.state_dict().items():
        if is_projection_weight(name):
            payload, scales = encode_mxfp8(t.t().contiguous())
            t = decode_mxfp8(payload, scales, dtype=dtype).t().contiguous()
        else:
            t = t.to(torch.bfloat16)  # the writer stores every other float tensor as BF16
        sd[name] = t.to(dtype)
    ref.load_state_dict(sd)
    if model.config.tie_word_embeddings:
        ref.tie_weights()
    return ref.eval()


def memorise(
    model: Any,
    tokenizer: Any,
    problems: list[dict[str, Any]],
    *,
    max_steps: int = 200,
    lr: float = 5e-3,
    target_loss: float = 0.01,
) -> float:
    """Train ``model`` (in place) until it reproduces each problem's canonical solution after its prompt.

    Sequences are ``tok(prompt) + tok(solution) + eos`` (tokenised separately, as generation sees
    them), loss on the solution and eos only. Returns the final loss.
    """
    eos = tokenizer.eos_token_id
    seqs, labels = [], []
    for p in problems:
        a = tokenizer(p["prompt"])["input_ids"]
        b = tokenizer(p["canonical_solution"])["input_ids"] + [eos]
        seqs.append(a + b)
        labels.append([-100] * len(a) + b)
    n, length = len(seqs), max(map(len, seqs))
    ids = torch.full((n, length), eos)
    lab = torch.full((n, length), -100)
    att = torch.zeros((n, length), dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(s)] = torch.tensor(lb)
        att[i, : len(s)] = 1
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    loss = float("inf")
    for _ in range(max_steps):
        out = model(input_ids=ids, attention_mask=att, labels=lab)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        loss = out.loss.item()
        if loss < target_loss:
            break
    model.eval()
    return loss


def logits_of(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """``model(ids).logits`` without autograd."""
    with torch.no_grad():
        return model(ids).logits


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def capture_parser(main: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    """The parser ``main`` builds: its ``parse_args`` is intercepted, so nothing else runs."""

    def intercept(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        raise _Captured(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = intercept  # type: ignore[method-assign]
    try:
        main(["--debug"])  # --debug: the CLI wrapper lets the interception through
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError(f"{main.__module__}.main did not parse its arguments with argparse")
