"""Batched generation for MBXP (greedy, or sampled per task), with stop strings and parse-aware truncation.

What a score means depends on exactly how completions were produced, so every rule here is explicit
and recorded in ``summary.json`` (:meth:`DecodingConfig.describe`; the settings and the rules as recorded are
:mod:`ida_eval.decoding`'s):

* **Prompt**: the raw MBXP ``prompt`` (signature + docstring), zero-shot, no chat template; tabs and
  indentation are passed through untouched (116 MBXP prompts are tab-indented).
* **Decoding**: greedy (``do_sample=False``, one beam, no repetition penalty). The call runs with a
  pristine :class:`transformers.GenerationConfig` swapped in as the model's default, because
  ``generate`` fills every unset field from ``model.generation_config`` — a checkpoint's
  ``generation_config.json`` could otherwise inject sampling or a repetition penalty that would hide
  the repetition collapse this harness exists to expose.
* **Sampling** (``temperature > 0``, :data:`~ida_eval.decoding.SAMPLING_RULE`): ``samples_per_task``
  completions per task, numbered ``completion_id`` 0..N-1. Each row draws its token from its own stream
  of uniforms, a hash of ``(seed, task_id, completion_id, step)`` (:func:`sample_uniform`), after
  temperature and nucleus (top-p) filtering in float32 (:class:`PerRowSampler`): a sample depends on the
  seed, the task and its number, never on the batch size, its batch-mates or the number of processes.
  The draw is made by a logits processor that leaves one finite logit, so ``generate`` itself runs
  greedy and transformers' global random state is never used.
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
import hashlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ida_eval.decoding import STOP_STRINGS, DecodingConfig, Generation


def sample_uniform(seed: int, task_id: str, completion_id: int, step: int) -> float:
    """The uniform in [0, 1) that picks token ``step`` of sample ``completion_id`` of ``task_id``.

    A hash (BLAKE2b, 53 bits) of the four values: no state, the same on every device and process.

    Example:
        >>> u = sample_uniform(0, "MBPP/2", 3, 0)
        >>> 0.0 <= u < 1.0 and u == sample_uniform(0, "MBPP/2", 3, 0) != sample_uniform(1, "MBPP/2", 3, 0)
        True
    """
    key = f"{seed}\0{task_id}\0{completion_id}\0{step}".encode("utf-8", "surrogatepass")
    word = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return (word >> 11) / float(1 << 53)


class PerRowSampler:
    """A logits processor that samples one token per row (:data:`~ida_eval.decoding.SAMPLING_RULE`) and returns scores
    with only that token finite, so greedy ``generate`` picks it.

    Args:
        rows: ``(task_id, completion_id)`` of each batch row.
        prompt_len: the padded prompt length (the step is the number of tokens generated so far).
        temperature, top_p, seed: as in :class:`DecodingConfig`.
    """

    def __init__(
        self, rows: Sequence[tuple[str, int]], prompt_len: int, temperature: float, top_p: float, seed: int
    ) -> None:
        self.rows, self.prompt_len = list(rows), prompt_len
        self.temperature, self.top_p, self.seed = float(temperature), float(top_p), seed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len
        u = torch.tensor(
            [sample_uniform(self.seed, t, j, step) for t, j in self.rows], dtype=torch.float64, device=scores.device
        )
        chosen = sample_tokens(scores, u, self.temperature, self.top_p)
        out = torch.full_like(scores, -math.inf)
        out.scatter_(1, chosen[:, None], 0.0)
        return out


NUCLEUS_CANDIDATES = 256
"""With ``top_p < 1`` a row first sorts only its ``NUCLEUS_CANDIDATES`` most probable tokens (``torch.topk``);
when they hold its nucleus, the draw is the full sort's, bit for bit, at a fraction of the cost. Other rows
sort their whole vocabulary (docs/eval.md, "Sampling")."""


def sample_tokens(
    scores: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float, *, candidates: int = NUCLEUS_CANDIDATES
) -> torch.Tensor:
    """Token index per row of ``scores`` [B, V] for uniforms ``u`` [B] (:data:`~ida_eval.decoding.SAMPLING_RULE`).

    ``candidates``: how many of a row's most probable tokens to try before sorting the whole row (0: always
    sort the whole row; the result is the same).
    """
    probs = torch.softmax(scores.float() / temperature, dim=-1)
    u = u.to(device=probs.device, dtype=torch.float64)
    if top_p >= 1.0 or not 0 < candidates < probs.shape[1]:
        return _draw(*torch.sort(probs, dim=-1, descending=True, stable=True), u, top_p)
    # the candidates in the full sort's order: by value, descending, ties by index (topk's tie order is unspecified)
    vals, idx = torch.topk(probs, candidates, dim=-1)
    idx, perm = torch.sort(idx, dim=-1)
    vals, perm = torch.sort(vals.gather(1, perm), dim=-1, descending=True, stable=True)
    idx = idx.gather(1, perm)
    # where tokens outside tie with the smallest candidate, only the candidates above it are the full sort's
    # first entries; the nucleus lies among those when their cumulative probability reaches top_p
    edge = vals[:, -1:]
    exact = torch.where((probs >= edge).sum(dim=-1) > candidates, (vals > edge).sum(dim=-1), candidates)
    cum = torch.cumsum(vals.double(), dim=-1)
    held = (exact > 0) & (cum.gather(1, (exact - 1).clamp(min=0)[:, None]).squeeze(1) >= top_p)
    if bool(held.all()):
        return _draw(vals, idx, u, top_p)
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    out[held] = _draw(vals[held], idx[held], u[held], top_p)
    rest = ~held
    out[rest] = _draw(*torch.sort(probs[rest], dim=-1, descending=True, stable=True), u[rest], top_p)
    return out


def _draw(sorted_p: torch.Tensor, order: torch.Tensor, u: torch.Tensor, top_p: float) -> torch.Tensor:
    """The draw of :data:`~ida_eval.decoding.SAMPLING_RULE` from probabilities sorted as the rule sorts them
    (``order``: their token ids), or from the first entries of that order when they hold the nucleus."""
    cum = torch.cumsum(sorted_p.double(), dim=-1)
    kept = (cum - sorted_p) < top_p  # the tokens before this one had not yet reached top_p
    kept[:, 0] = True
    kept_p = torch.where(kept, sorted_p.double(), 0.0)
    cdf = torch.cumsum(kept_p, dim=-1)
    target = u[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=sorted_p.shape[1] - 1)
    # never land on a filtered token (a rounding at the kept total's edge): step back to the last kept one
    last_kept = kept.sum(dim=-1, keepdim=True) - 1
    idx = torch.minimum(idx, last_kept)
    return order.gather(1, idx).squeeze(1)


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
    """Apply the truncation rule (:data:`~ida_eval.decoding.TRUNCATION_RULE`) to one generated text.

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


def static_compile_config() -> Any:
    """How transformers compiles a ``--cache static`` decoding step (it does so on a GPU): a
    ``transformers.CompileConfig`` with CUDA graphs (``reduce-overhead``'s one Inductor option) and
    ``emulate_precision_casts``, which makes Inductor round every intermediate to the model's dtype where
    eager rounds it. Without it a fused BF16 norm or activation keeps float32 between its operations and
    greedy tokens drift from eager's (tests/ida_eval/test_generate.py: bit-identical completions, BF16
    and MXFP8-resident, compiled with Inductor on the CPU)."""
    from transformers import CompileConfig

    return CompileConfig(mode=None, options={"triton.cudagraphs": True, "emulate_precision_casts": True})


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
    completion_ids: Mapping[str, Sequence[int]] | None = None,
) -> list[Generation]:
    """Generate completions (greedy, or sampled) in length-sorted left-padded batches.

    Args:
        model: a transformers causal LM (eval mode is set here).
        tokenizer: its tokenizer; needs a pad or an eos token.
        prompts: task_id -> raw prompt text.
        config: decoding settings.
        progress: show a tqdm bar (completions done, generated tokens/s, ETA).
        on_batch: called with each finished batch's generations (the harness appends them to
            ``samples.jsonl`` so an interrupted run resumes).
        completion_ids: per task, which samples to generate (default ``range(config.samples_per_task)``;
            a resumed run asks only for the missing ones). Sample ``j`` of a task is the same whichever
            others are generated with it.

    Returns:
        Generations in the order of ``prompts``, each task's by ``completion_id``.

    Example:
        >>> gens = generate_completions(model, tok, {"MBPP/2": prompt}, DecodingConfig(batch_size=4))  # doctest: +SKIP
        >>> gens[0].completion  # doctest: +SKIP
    """
    from transformers import CompileConfig, GenerationConfig, LogitsProcessorList

    units = [
        (t, j)
        for t in prompts
        for j in (completion_ids[t] if completion_ids is not None else range(config.samples_per_task))
    ]
    if not units:
        return []
    eos = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else None)
    if pad_id is None:
        raise ValueError("generate_completions: the tokenizer has neither a pad token nor an eos token")
    gen_config = GenerationConfig(
        do_sample=False,  # sampling is PerRowSampler's: generate itself stays greedy
        num_beams=1,
        max_new_tokens=config.max_new_tokens,
        repetition_penalty=1.0,
        pad_token_id=pad_id,
        eos_token_id=eos or None,
        stop_strings=list(config.stop_strings) or None,
        **({"cache_implementation": "static"} if config.cache == "static" else {}),
    )
    device = _input_device(model)
    if config.cache == "static" and (device.type != "cpu" or getattr(CompileConfig, "_compile_all_devices", None)):
        # only where transformers compiles (an accelerator, or everywhere when its own switch says so: the
        # tests): elsewhere a compile_config makes it warn that it will not compile
        gen_config.compile_config = static_compile_config()
    encoded = {tid: tokenizer(prompts[tid])["input_ids"] for tid in {t for t, _ in units}}
    order = sorted(units, key=lambda u: -len(encoded[u[0]]))  # stable: a task's samples stay together
    # a static cache: one padded length for every batch, so a compiled decoding step is compiled once
    longest = max(len(encoded[t]) for t, _ in units)
    padding: dict[str, Any] = (
        {"padding": "max_length", "max_length": longest} if config.cache == "static" else {"padding": True}
    )
    model.eval()
    out: dict[tuple[str, int], Generation] = {}
    unit = "task" if not config.sampling else "sample"
    bar = tqdm(total=len(order), desc="generate", unit=unit, disable=not progress)
    t0, n_tokens = time.perf_counter(), 0
    try:
        with _pristine_generation_defaults(model), _left_padding(tokenizer, pad_id), torch.inference_mode():
            for start in range(0, len(order), config.batch_size):
                rows = order[start : start + config.batch_size]
                # a static cache: a short last batch is filled up with copies of its last row (their
                # completions dropped), so that every call has one shape and nothing is compiled again
                fill = config.batch_size - len(rows) if config.cache == "static" and start > 0 else 0
                run_rows = rows + rows[-1:] * fill
                batch = tokenizer([prompts[t] for t, _ in run_rows], return_tensors="pt", **padding)
                batch = {k: v.to(device) for k, v in batch.items()}
                prompt_len = batch["input_ids"].shape[1]
                extra: dict[str, Any] = {}
                if config.sampling:
                    sampler = PerRowSampler(run_rows, prompt_len, config.temperature, config.top_p, config.seed)
                    extra["logits_processor"] = LogitsProcessorList([sampler])
                seqs = model.generate(**batch, generation_config=gen_config, tokenizer=tokenizer, **extra)
                new = seqs[: len(rows), prompt_len:].tolist()
                done = [
                    _finish_row(tokenizer, t, j, prompts[t], encoded[t], row, eos, pad_id, config)
                    for (t, j), row in zip(rows, new, strict=True)
                ]
                for g in done:
                    out[(g.task_id, g.completion_id)] = g
                if on_batch is not None:
                    on_batch(done)
                n_tokens += sum(g.n_tokens for g in done)
                bar.set_postfix_str(f"{n_tokens / max(time.perf_counter() - t0, 1e-9):.1f} tok/s", refresh=False)
                bar.update(len(rows))
    finally:
        bar.close()
    return [out[u] for u in units]


def _finish_row(
    tokenizer: Any,
    task_id: str,
    completion_id: int,
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
    return Generation(
        task_id=task_id,
        completion=completion,
        raw=raw,
        n_tokens=n,
        stop_reason=stop_reason,
        completion_id=completion_id,
    )


def tokens_per_second(generations: Sequence[Generation], seconds: float) -> float:
    """Generated tokens per wall-clock second (0.0 when nothing was timed)."""
    return sum(g.n_tokens for g in generations) / seconds if seconds > 0 else 0.0


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``fn`` and return ``(result, seconds)``."""
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0
