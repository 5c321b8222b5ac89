"""Batched greedy generation for MBXP, with stop strings and parse-aware truncation.

What a score means depends on exactly how completions were produced, so every rule here is explicit
and recorded in ``summary.json`` (:meth:`DecodingConfig.describe`):

* **Prompt**: the raw MBXP ``prompt`` (signature + docstring), zero-shot, no chat template; tabs and
  indentation are passed through untouched (116 MBXP prompts are tab-indented).
* **Decoding**: greedy (``do_sample=False``, one beam, no repetition penalty). The call runs with a
  pristine :class:`transformers.GenerationConfig` swapped in as the model's default, because
  ``generate`` fills every unset field from ``model.generation_config`` — a checkpoint's
  ``generation_config.json`` could otherwise inject sampling or a repetition penalty that would hide
  the repetition collapse this harness exists to expose.
* **Batching**: prompts are sorted by token length (longest first, so an out-of-memory shows up in
  the first batch) and left-padded with an attention mask. With left padding every row's last prompt
  token sits at the same position, and position ids come from the mask, so a row's greedy tokens do
  not depend on its batch-mates (tested: batched output equals unbatched output in float32).
* **Stopping**: end-of-sequence, or one of :data:`STOP_STRINGS` (the bigcode-MBPP-like set without
  ``"\\ndef"``, which keeps all 959 canonical solutions passing) via transformers'
  ``StopStringCriteria``, which matches on decoded text and so survives token-boundary splits.
* **Truncation** (:func:`truncate_completion`): the final token can overshoot a stop string, so the
  text is cut at the first occurrence of any stop string; if ``prompt + completion`` then fails to
  parse, it falls back to the longest non-empty line prefix that does (the ReCode rule). When no
  prefix parses the cut text is kept, so the failure stays visible as a syntax error.
"""

from __future__ import annotations

import ast
import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ida_eval.languages import LANGUAGES

STOP_STRINGS: tuple[str, ...] = LANGUAGES["python"].stop_sequences
"""Stop strings (bigcode MBPP set plus markdown fence and comment; deliberately no ``"\\ndef"``).
Other languages' sets are in :data:`ida_eval.languages.LANGUAGES` (``stop_sequences``)."""

DEFAULT_BATCH_SIZE = 8  # prompts per generate() call
DEFAULT_MAX_NEW_TOKENS = 256  # canonical MBXP solutions: median 117 chars, max 1231 chars

TRUNCATION_RULE = (
    "cut at the first stop string; if prompt+completion does not ast.parse, keep the longest "
    "non-empty line prefix that does; if none does, keep the cut text"
)


@dataclass(frozen=True)
class DecodingConfig:
    """How completions are generated (frozen: it is recorded with the results).

    Attributes:
        batch_size: prompts per ``generate`` call (>= 1).
        max_new_tokens: generation budget per prompt (>= 1).
        stop_strings: strings that end a completion (besides end-of-sequence).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop_strings: tuple[str, ...] = field(default=STOP_STRINGS)

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"DecodingConfig.batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"DecodingConfig.max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"DecodingConfig.stop_strings must be non-empty strings, got {self.stop_strings!r}")

    def describe(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict, including the fixed greedy rules."""
        d = asdict(self)
        d["stop_strings"] = list(self.stop_strings)
        d.update(
            strategy="greedy",
            do_sample=False,
            num_beams=1,
            repetition_penalty=1.0,
            prompt="raw MBXP prompt, zero-shot, no chat template, whitespace untouched",
            padding="left, length-sorted batches (longest first)",
            truncation=TRUNCATION_RULE,
        )
        return d


@dataclass(frozen=True)
class Generation:
    """One generated completion.

    Attributes:
        task_id: the problem id.
        completion: the truncated completion that gets executed.
        raw: the decoded text before truncation (kept for degenerate-output analysis).
        n_tokens: generated tokens (up to and including the stopping token; padding excluded).
        stop_reason: ``"eos"``, ``"stop_string"`` or ``"length"``.
    """

    task_id: str
    completion: str
    raw: str
    n_tokens: int
    stop_reason: str


def _parses(source: str) -> bool:
    try:
        with warnings.catch_warnings():  # user code: invalid escapes etc. are not our warnings
            warnings.simplefilter("ignore")
            ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def cut_at_stop(text: str, stop_strings: Sequence[str] = STOP_STRINGS) -> str:
    """Cut ``text`` at the earliest occurrence of any stop string.

    Example:
        >>> cut_at_stop("    return 1\\nprint(f())", ["\\nprint"])
        '    return 1'
    """
    cut = len(text)
    for s in stop_strings:
        i = text.find(s)
        if i != -1 and i < cut:
            cut = i
    return text[:cut]


def truncate_completion(prompt: str, text: str, stop_strings: Sequence[str] = STOP_STRINGS) -> str:
    """Apply the truncation rule (:data:`TRUNCATION_RULE`) to one generated text.

    Args:
        prompt: the problem prompt the text continues.
        text: the decoded generation (without the prompt).
        stop_strings: stop strings to cut at.

    Returns:
        The completion to execute.

    Example:
        >>> p = "def f():\\n    'doc'\\n"
        >>> truncate_completion(p, "    return 1\\n    x = (\\n")
        '    return 1'
    """
    cut = cut_at_stop(text, stop_strings)
    if _parses(prompt + cut):
        return cut
    lines = cut.split("\n")
    for n in range(len(lines) - 1, 0, -1):
        candidate = "\n".join(lines[:n])
        if candidate.strip() and _parses(prompt + candidate):
            return candidate
    return cut


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for source in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if source is None:
            continue
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if int(i) not in ids:
                ids.append(int(i))
    return ids


@contextlib.contextmanager
def _pristine_generation_defaults(model: Any) -> Iterator[None]:
    """Temporarily replace ``model.generation_config`` with library defaults (see module docstring)."""
    from transformers import GenerationConfig

    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


@contextlib.contextmanager
def _left_padding(tokenizer: Any, pad_id: int) -> Iterator[None]:
    """Left padding with ``pad_id`` for the duration (a tokenizer without a pad token borrows eos)."""
    saved_side, saved_pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if saved_pad is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    try:
        yield
    finally:
        tokenizer.padding_side = saved_side
        if saved_pad is None:
            tokenizer.pad_token = None


def _input_device(model: Any) -> torch.device:
    emb = model.get_input_embeddings()
    return emb.weight.device


def _decode_continuation(tokenizer: Any, prompt_ids: list[int], new_ids: list[int]) -> str:
    """Decode ``new_ids`` as the continuation of ``prompt_ids``.

    Decoding the full sequence and removing the decoded prompt keeps leading spaces that
    SentencePiece tokenizers drop when a slice is decoded on its own.
    """
    full = tokenizer.decode(prompt_ids + new_ids, skip_special_tokens=True)
    head = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    if full.startswith(head):
        return full[len(head) :]
    return tokenizer.decode(new_ids, skip_special_tokens=True)


def generate_completions(
    model: Any,
    tokenizer: Any,
    prompts: Mapping[str, str],
    config: DecodingConfig = DecodingConfig(),
    *,
    progress: bool = True,
    on_batch: Callable[[list[Generation]], None] | None = None,
) -> list[Generation]:
    """Generate one greedy completion per prompt, in length-sorted left-padded batches.

    Args:
        model: a transformers causal LM (eval mode is set here).
        tokenizer: its tokenizer; needs a pad or an eos token.
        prompts: task_id -> raw prompt text.
        config: decoding settings.
        progress: show a tqdm bar (prompts done).
        on_batch: called with each finished batch's generations (the harness appends them to
            ``samples.jsonl`` so an interrupted run resumes).

    Returns:
        Generations in the order of ``prompts``.

    Example:
        >>> gens = generate_completions(model, tok, {"MBPP/2": prompt}, DecodingConfig(batch_size=4))  # doctest: +SKIP
        >>> gens[0].completion  # doctest: +SKIP
    """
    from transformers import GenerationConfig

    if not prompts:
        return []
    eos = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else None)
    if pad_id is None:
        raise ValueError("generate_completions: the tokenizer has neither a pad token nor an eos token")
    gen_config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=config.max_new_tokens,
        repetition_penalty=1.0,
        pad_token_id=pad_id,
        eos_token_id=eos or None,
        stop_strings=list(config.stop_strings) or None,
    )
    encoded = {tid: tokenizer(text)["input_ids"] for tid, text in prompts.items()}
    order = sorted(encoded, key=lambda t: -len(encoded[t]))
    device = _input_device(model)
    model.eval()
    out: dict[str, Generation] = {}
    bar = tqdm(total=len(order), desc="generate", unit="task", disable=not progress)
    try:
        with _pristine_generation_defaults(model), _left_padding(tokenizer, pad_id), torch.inference_mode():
            for start in range(0, len(order), config.batch_size):
                ids = order[start : start + config.batch_size]
                batch = tokenizer([prompts[t] for t in ids], return_tensors="pt", padding=True)
                batch = {k: v.to(device) for k, v in batch.items()}
                seqs = model.generate(**batch, generation_config=gen_config, tokenizer=tokenizer)
                new = seqs[:, batch["input_ids"].shape[1] :].tolist()
                done: list[Generation] = []
                for tid, row in zip(ids, new, strict=True):
                    done.append(_finish_row(tokenizer, tid, prompts[tid], encoded[tid], row, eos, pad_id, config))
                for g in done:
                    out[g.task_id] = g
                if on_batch is not None:
                    on_batch(done)
                bar.update(len(ids))
    finally:
        bar.close()
    return [out[t] for t in prompts]


def _finish_row(
    tokenizer: Any,
    task_id: str,
    prompt: str,
    prompt_ids: list[int],
    row: list[int],
    eos: list[int],
    pad_id: int,
    config: DecodingConfig,
) -> Generation:
    """Trim one row of new tokens at eos / trailing padding and apply the truncation rule."""
    n = len(row)
    stop_reason = "length"
    for i, tok in enumerate(row):
        if tok in eos:
            n, stop_reason = i + 1, "eos"
            break
    else:
        # rows that stopped on a stop string are padded afterwards; drop trailing padding
        while n > 0 and row[n - 1] == pad_id:
            n -= 1
    raw = _decode_continuation(tokenizer, prompt_ids, row[:n])
    if cut_at_stop(raw, config.stop_strings) != raw:
        # a stop string ended the row; when pad == eos the "eos" found above was padding
        if stop_reason == "eos" and row[n - 1] == pad_id:
            n -= 1
        stop_reason = "stop_string"
    completion = truncate_completion(prompt, raw, config.stop_strings)
    return Generation(task_id=task_id, completion=completion, raw=raw, n_tokens=n, stop_reason=stop_reason)


def tokens_per_second(generations: Sequence[Generation], seconds: float) -> float:
    """Generated tokens per wall-clock second (0.0 when nothing was timed)."""
    return sum(g.n_tokens for g in generations) / seconds if seconds > 0 else 0.0


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``fn`` and return ``(result, seconds)``."""
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0
