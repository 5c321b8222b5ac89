"""Training data: JSONL formats, completion-only labels, packing, and a resumable step batcher.

Formats (one JSON object per line, validated line by line *before* training starts; a bad line raises
:class:`DataError` naming ``file:line`` and what is wrong: invalid UTF-8 with the byte and its column,
invalid or too deeply nested JSON, a missing or mistyped field, a lone surrogate escape that no tokenizer
can encode):

- ``plain``: ``{"text": str}``. Every token is supervised; EOS is appended (and supervised) so the model
  learns where a document ends.
- ``alpaca``: ``{"instruction": str, "input": str (optional), "output": str}``, rendered as
  ``### Instruction:\\n{instruction}\\n\\n[### Input:\\n{input}\\n\\n]### Response:\\n`` + output + EOS;
  only the output and EOS are supervised.
- ``chat``: ``{"messages": [{"role", "content"}, ...]}`` rendered with the tokenizer's chat template.
  One example per assistant turn: the prompt is the conversation before that turn with every earlier
  assistant message stripped of its ``<think>...</think>`` block (Qwen3 renders history think-free, so
  training on history that contains reasoning would teach a format the model never sees at inference),
  rendered with ``add_generation_prompt=True``; the target is the turn as the template renders it, up
  to and including the template's end-of-turn marker (e.g. ``<|im_end|>``), which therefore gets trained.

Labels are *pre-shifted*: ``labels[b, t]`` is the token the model must predict at position ``t``
(``input_ids[b, t + 1]`` when that token is supervised and in the same document, else -100). The loss is
then ``cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum", ignore_index=-100)``
with no slicing, which is what a pipeline's last stage computes too.

Packing concatenates examples into rows of at most ``max_len`` tokens. Positions restart at 0 for every
document and ``attention_mask`` becomes a block-diagonal causal boolean mask ``[B, 1, T, T]`` (True =
may attend), so no token sees another document (transformers passes 4-D masks through unchanged).
Without packing ``attention_mask`` is the usual ``[B, T]`` padding mask. Every micro-batch of one
optimizer step is padded to the same length ``T`` (the longest row of the step), so pipeline stages and
FSDP ranks always see one shape per step.

Tokenisation is bounded by ``max_len``: a line is tokenised only as far as its first ``max_len + 1``
tokens need (:func:`encode_prefix`), with exactly the tokens full tokenisation gives, so time and memory
do not grow with the length of a line.

The loss of a step is normalised by the number of supervised tokens in the *whole* global batch
(:attr:`StepBatch.global_valid_tokens`), which every rank computes locally from the same deterministic
global batch: gradient accumulation over micro-batches then equals one big batch exactly in math.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ida_common.jsonl import iter_jsonl
from ida_trainer.config import DataConfig

IGNORE_INDEX = -100  # label value that cross_entropy skips
ALPACA_INSTRUCTION = "### Instruction:\n"
ALPACA_INPUT = "### Input:\n"
ALPACA_RESPONSE = "### Response:\n"
_THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_CHAT_ROLES = ("system", "user", "assistant", "tool")
PREFIX_CHARS_PER_TOKEN = 8  # first guess of characters per token (real tokenizers: about 3-5 on code and prose)
PREFIX_MARGIN = 32  # tokens past the limit a text prefix must reach before its first tokens are trusted


class DataError(ValueError):
    """A training-data problem; the message names the file, line and reason."""


@dataclass(frozen=True)
class Example:
    """One tokenised training example.

    Attributes:
        input_ids: token ids.
        supervised: per token, True when the model must learn to produce it (completion tokens).
        source: ``file:line`` (plus ``turn k`` for chat) for error messages.
    """

    input_ids: tuple[int, ...]
    supervised: tuple[bool, ...]
    source: str

    @property
    def num_targets(self) -> int:
        """Supervised tokens that have a previous token to predict them from."""
        return sum(self.supervised[1:])


@dataclass
class DataStats:
    """What loading did to the data (reported in the run log)."""

    num_lines: int = 0
    num_examples: int = 0
    num_truncated: int = 0
    num_dropped: int = 0
    num_rows: int = 0
    num_tokens: int = 0
    num_targets: int = 0


def strip_think(text: str) -> str:
    """Remove ``<think>...</think>`` blocks (and the whitespace after them) from a message."""
    return _THINK_RE.sub("", text)


def end_of_turn_marker(tokenizer: Any) -> str:
    """The text the chat template puts right after an assistant message (e.g. ``<|im_end|>``).

    Raises:
        DataError: the tokenizer has no chat template, or the marker is not a single token.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("data.format = 'chat' needs a tokenizer with a chat template; this tokenizer has none")
    probe = "Q7ZX"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "U"}, {"role": "assistant", "content": probe}], tokenize=False
    )
    after = text[text.rindex(probe) + len(probe) :].strip()
    marker = after.split()[0] if after else ""
    if not marker:
        raise DataError(
            "the chat template puts no end-of-turn marker after an assistant message; "
            "the model could never learn to stop"
        )
    ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise DataError(f"the chat template's end-of-turn marker {marker!r} is not a single token ({ids})")
    return marker


def _check_record(rec: Any, fmt: str) -> str | None:
    """Why ``rec`` is not a valid ``fmt`` record, or None."""
    if not isinstance(rec, dict):
        return f"expected a JSON object, got {type(rec).__name__}"
    if fmt == "plain":
        if not isinstance(rec.get("text"), str):
            return 'expected {"text": string}'
        if not rec["text"]:
            return '"text" is empty'
        return None
    if fmt == "alpaca":
        for key in ("instruction", "output"):
            if not isinstance(rec.get(key), str):
                return f'field "{key}" must be a string (alpaca format: instruction, input, output)'
        if not isinstance(rec.get("input", ""), str):
            return 'field "input" must be a string'
        if not rec["output"]:
            return 'field "output" is empty: nothing to train on'
        return None
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return 'expected {"messages": [{"role": ..., "content": ...}, ...]} with at least one message'
    for k, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return f'message {k} must be an object with a string "content"'
        if m.get("role") not in _CHAT_ROLES:
            return f"message {k} has role {m.get('role')!r}; expected one of {', '.join(_CHAT_ROLES)}"
    if not any(m["role"] == "assistant" for m in msgs):
        return "no assistant message: nothing to train on"
    return None


def _used_strings(rec: dict[str, Any], fmt: str) -> list[tuple[str, str]]:
    """``(what, text)`` for every string of a validated record that gets tokenised."""
    if fmt == "plain":
        return [('field "text"', rec["text"])]
    if fmt == "alpaca":
        return [(f'field "{k}"', rec[k]) for k in ("instruction", "input", "output") if k in rec]
    return [(f'message {k} "content"', m["content"]) for k, m in enumerate(rec["messages"])]


def _check_unicode(rec: dict[str, Any], fmt: str) -> str | None:
    """Why a validated record's text cannot be tokenised (a lone surrogate from a JSON ``\\udXXX`` escape)."""
    for what, text in _used_strings(rec, fmt):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            return (
                f"{what} holds a lone surrogate (\\u{ord(text[err.start]):04x} at character {err.start + 1}), "
                "which is not Unicode text"
            )
    return None


def read_jsonl(path: str | Path, fmt: str) -> list[tuple[int, dict[str, Any]]]:
    """Read and validate every line of a JSONL file; returns ``(line_number, record)`` pairs.

    Raises:
        DataError: missing file, invalid UTF-8 or JSON (nesting too deep included), or a record that does
            not fit ``fmt`` or holds text no tokenizer can take (``file:line: why``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    records: list[tuple[int, dict[str, Any]]] = []
    with open(path, "rb") as f:
        for lineno, where, rec in iter_jsonl(f, path, DataError):
            reason = _check_record(rec, fmt) or _check_unicode(rec, fmt)
            if reason:
                raise DataError(f"{where}: {reason} ({fmt} format)")
            records.append((lineno, rec))
    if not records:
        raise DataError(f"data file {path} has no records")
    return records


def record_texts(records: Sequence[tuple[int, dict[str, Any]]], fmt: str) -> list[str]:
    """The raw text of validated records (for training a tokenizer on the data itself, as the demo does)."""
    out: list[str] = []
    for _, rec in records:
        if fmt == "plain":
            out.append(rec["text"])
        elif fmt == "alpaca":
            out.append("\n".join(rec.get(k, "") for k in ("instruction", "input", "output")))
        else:
            out.extend(m["content"] for m in rec["messages"])
    return out


def _encode_all(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prefix(tokenizer: Any, text: str, limit: int | None = None) -> list[int]:
    """``tokens(text)[:limit]``, tokenising only about as much text as ``limit`` tokens need.

    Tokenising a 50 MB line to keep its first 2048 tokens took minutes and many GB. Here a prefix of
    ``PREFIX_CHARS_PER_TOKEN * (limit + PREFIX_MARGIN)`` characters is tokenised instead. Only the last
    few tokens of a prefix can differ from the whole text's tokens (the cut splits the last word; a
    normaliser sees a cut combining sequence), so the prefix must reach ``PREFIX_MARGIN`` tokens past
    ``limit``, and a second, 1.5x longer prefix must give the same first ``limit`` tokens: a boundary
    effect that reached back over the margin would have to be identical at two different cuts. When a
    check fails the prefix doubles; a prefix that covers the whole text is the whole text, so the result
    always equals ``tokens(text)[:limit]`` and memory and time depend on ``limit``, not on the line.
    Texts shorter than the first prefix (every normal line) are tokenised whole, exactly as before.
    """
    if limit is None:
        return _encode_all(tokenizer, text)
    if limit <= 0:
        return []
    n = PREFIX_CHARS_PER_TOKEN * (limit + PREFIX_MARGIN)
    while n < len(text):
        ids = _encode_all(tokenizer, text[:n])
        if len(ids) >= limit + PREFIX_MARGIN:
            longer = n + n // 2
            check = _encode_all(tokenizer, text[:longer])
            if check[:limit] == ids[:limit]:
                return ids[:limit]
            if longer >= len(text):
                return check[:limit]
        n *= 2
    return _encode_all(tokenizer, text)[:limit]


def _bos(tokenizer: Any) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None else []


def _prompt_target(prompt_ids: list[int], target_ids: list[int], source: str) -> Example:
    ids = prompt_ids + target_ids
    sup = [False] * len(prompt_ids) + [True] * len(target_ids)
    return Example(tuple(ids), tuple(sup), source)


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


def encode_record(
    rec: dict[str, Any],
    fmt: str,
    tokenizer: Any,
    *,
    source: str,
    end_marker: str | None = None,
    max_tokens: int | None = None,
) -> list[Example]:
    """Tokenise one validated record into one example (plain, alpaca) or one per assistant turn (chat).

    ``max_tokens``: tokenise only as far as the first ``max_tokens`` tokens of each example need
    (:func:`encode_prefix`); an example longer than that comes back with at least ``max_tokens`` tokens,
    whose first ``max_tokens`` equal the unbounded result's. None: tokenise everything.
    """
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if fmt == "plain":
        bos = _bos(tokenizer)
        return [
            _prompt_target([], bos + encode_prefix(tokenizer, rec["text"], _left(max_tokens, len(bos))) + eos, source)
        ]
    if fmt == "alpaca":
        prompt = ALPACA_INSTRUCTION + rec["instruction"] + "\n\n"
        if rec.get("input"):
            prompt += ALPACA_INPUT + rec["input"] + "\n\n"
        prompt += ALPACA_RESPONSE
        bos = _bos(tokenizer)
        prompt_ids = bos + encode_prefix(tokenizer, prompt, _left(max_tokens, len(bos)))
        return [
            _prompt_target(
                prompt_ids, encode_prefix(tokenizer, rec["output"], _left(max_tokens, len(prompt_ids))) + eos, source
            )
        ]
    assert end_marker is not None
    msgs = [{"role": m["role"], "content": m["content"]} for m in rec["messages"]]
    out: list[Example] = []
    for k, msg in enumerate(msgs):
        if msg["role"] != "assistant":
            continue
        history = [dict(m, content=strip_think(m["content"])) if m["role"] == "assistant" else m for m in msgs[:k]]
        prompt = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(history + [msg], tokenize=False)
        where = f"{source} (assistant turn {k})"
        if not full.startswith(prompt):
            raise DataError(
                f"{where}: the chat template does not render the conversation so far as a prefix "
                "of the conversation with this turn; cannot separate prompt from completion"
            )
        target = full[len(prompt) :]
        cut = target.find(end_marker)
        if cut < 0:
            raise DataError(f"{where}: the rendered turn lacks the end-of-turn marker {end_marker!r}")
        target = target[: cut + len(end_marker)]
        prompt_ids = encode_prefix(tokenizer, prompt, max_tokens)
        out.append(
            _prompt_target(prompt_ids, encode_prefix(tokenizer, target, _left(max_tokens, len(prompt_ids))), where)
        )
    return out


def load_examples(data: DataConfig, tokenizer: Any, *, path: str | Path) -> tuple[list[Example], DataStats]:
    """Read, validate and tokenise a whole JSONL file (fails on the first bad line, before any training).

    Examples longer than ``data.max_len`` are truncated; examples left without a supervised target are
    dropped. Both are counted in the returned stats.
    """
    records = read_jsonl(path, data.format)
    marker = end_of_turn_marker(tokenizer) if data.format == "chat" else None
    stats = DataStats(num_lines=len(records))
    examples: list[Example] = []
    for lineno, rec in records:
        # max_len + 1 tokens tell "fits" from "truncated" without tokenising a huge line whole
        for ex in encode_record(
            rec, data.format, tokenizer, source=f"{path}:{lineno}", end_marker=marker, max_tokens=data.max_len + 1
        ):
            if len(ex.input_ids) > data.max_len:
                stats.num_truncated += 1
                ex = Example(ex.input_ids[: data.max_len], ex.supervised[: data.max_len], ex.source)
            if ex.num_targets == 0:
                stats.num_dropped += 1
                continue
            examples.append(ex)
    if not examples:
        raise DataError(f"{path}: no example has a supervised token within max_len={data.max_len}")
    stats.num_examples = len(examples)
    stats.num_tokens = sum(len(e.input_ids) for e in examples)
    stats.num_targets = sum(e.num_targets for e in examples)
    return examples, stats


Row = tuple[Example, ...]  # one sequence of the batch: one example, or several packed documents


def pack_examples(examples: Sequence[Example], max_len: int) -> list[Row]:
    """Greedily pack examples, in order, into rows of at most ``max_len`` tokens."""
    rows: list[Row] = []
    cur: list[Example] = []
    used = 0
    for ex in examples:
        n = len(ex.input_ids)
        if cur and used + n > max_len:
            rows.append(tuple(cur))
            cur, used = [], 0
        cur.append(ex)
        used += n
    if cur:
        rows.append(tuple(cur))
    return rows


def collate(rows: Sequence[Row], *, pad_id: int, length: int, packed: bool) -> dict[str, torch.Tensor]:
    """Build one micro-batch: ``input_ids``, pre-shifted ``labels``, ``position_ids``, ``attention_mask``.

    Args:
        rows: sequences of the micro-batch.
        pad_id: token id used for padding (never supervised).
        length: padded length ``T`` (>= the longest row).
        packed: build the ``[B, 1, T, T]`` block-causal mask instead of the ``[B, T]`` padding mask.
    """
    b = len(rows)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    labels = torch.full((b, length), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((b, length), dtype=torch.long)
    doc = torch.full((b, length), -1, dtype=torch.long)  # document index per token; -1 = padding
    for i, row in enumerate(rows):
        t = 0
        for d, ex in enumerate(row):
            n = len(ex.input_ids)
            assert t + n <= length, "row longer than the padded length"
            seg = torch.tensor(ex.input_ids, dtype=torch.long)
            ids[i, t : t + n] = seg
            sup = torch.tensor(ex.supervised[1:], dtype=torch.bool)
            labels[i, t : t + n - 1] = torch.where(sup, seg[1:], torch.full_like(seg[1:], IGNORE_INDEX))
            pos[i, t : t + n] = torch.arange(n)
            doc[i, t : t + n] = d
            t += n
        pos[i, t:] = torch.arange(length - t)
    if packed:
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        mask = (doc[:, :, None] == doc[:, None, :]) & causal  # padding is one causal block of its own
        return {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": mask[:, None]}
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": (doc >= 0).long()}


@dataclass
class StepBatch:
    """Everything one optimizer step consumes on this rank.

    Attributes:
        microbatches: this rank's micro-batch dicts (see :func:`collate`).
        global_valid_tokens: supervised tokens in the whole global batch (all ranks, all micro-batches).
        sources: ``file:line`` of every example in the global batch (named when a loss is not finite).
        num_tokens: non-padding tokens in the global batch (for tokens/s).
    """

    microbatches: list[dict[str, torch.Tensor]]
    global_valid_tokens: int
    sources: list[str] = field(default_factory=list)
    num_tokens: int = 0


class StepBatcher:
    """Deterministic, resumable source of optimizer-step batches.

    Rows are visited in a permutation drawn from ``torch.Generator(seed + epoch)`` (or in file order
    without shuffling); a global batch takes the next ``global_batch_size`` rows, wrapping into the
    next epoch. The cursor ``(epoch, position)`` is the whole state, so a resumed run draws exactly the
    batches the interrupted run would have drawn.

    Example:
        >>> rows = [(Example((1, 2, 3), (True,) * 3, "x:1"),)] * 4
        >>> sb = StepBatcher(rows, global_batch_size=2, microbatches=2, seed=0, pad_id=0)
        >>> step = sb.next_step()
        >>> len(step.microbatches), step.global_valid_tokens
        (2, 4)
    """

    def __init__(
        self,
        rows: Sequence[Row],
        *,
        global_batch_size: int,
        microbatches: int,
        seed: int,
        pad_id: int,
        shuffle: bool = True,
        packed: bool = False,
        dp_rank: int = 0,
        dp_size: int = 1,
    ):
        if global_batch_size % (microbatches * dp_size):
            raise ValueError(
                f"train.global_batch_size={global_batch_size} must be a multiple of "
                f"parallel.microbatches x data-parallel ranks = {microbatches} x {dp_size}"
            )
        if not rows:
            raise ValueError("no training rows")
        self.rows = list(rows)
        self.global_batch_size = global_batch_size
        self.microbatches = microbatches
        self.seed = seed
        self.pad_id = pad_id
        self.shuffle = shuffle
        self.packed = packed
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.rows), generator=g).tolist()

    def _take(self) -> Row:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        row = self.rows[self._order[self.position]]
        self.position += 1
        return row

    def next_step(self) -> StepBatch:
        """Draw the next global batch and return this rank's share as micro-batches."""
        rows = [self._take() for _ in range(self.global_batch_size)]
        length = max(sum(len(ex.input_ids) for ex in row) for row in rows)
        valid = sum(ex.num_targets for row in rows for ex in row)
        mine = rows[self.dp_rank :: self.dp_size]
        per_mb = len(mine) // self.microbatches
        mbs = [
            collate(mine[i * per_mb : (i + 1) * per_mb], pad_id=self.pad_id, length=length, packed=self.packed)
            for i in range(self.microbatches)
        ]
        return StepBatch(
            microbatches=mbs,
            global_valid_tokens=valid,
            sources=[ex.source for row in rows for ex in row],
            num_tokens=sum(len(ex.input_ids) for row in rows for ex in row),
        )

    def state_dict(self) -> dict[str, int]:
        """The data cursor."""
        return {"epoch": self.epoch, "position": self.position, "num_rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the cursor (the rows must be the same as when it was saved)."""
        if state.get("num_rows") != len(self.rows):
            raise ValueError(
                f"cannot resume the data cursor: the checkpoint saw {state.get('num_rows')} rows, "
                f"the data now has {len(self.rows)}; resume with the same data and data.* settings"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)


def build_batcher(
    data: DataConfig,
    examples: Sequence[Example],
    *,
    global_batch_size: int,
    microbatches: int,
    seed: int,
    pad_id: int,
    dp_rank: int = 0,
    dp_size: int = 1,
) -> StepBatcher:
    """Rows from ``examples`` (packed when ``data.packing``) wrapped in a :class:`StepBatcher`."""
    rows = pack_examples(examples, data.max_len) if data.packing else [(ex,) for ex in examples]
    return StepBatcher(
        rows,
        global_batch_size=global_batch_size,
        microbatches=microbatches,
        seed=seed,
        pad_id=pad_id,
        shuffle=data.shuffle,
        packed=data.packing,
        dp_rank=dp_rank,
        dp_size=dp_size,
    )
