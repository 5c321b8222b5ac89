"""What generation is asked to do and what it returns, without torch: :class:`DecodingConfig` (the settings
recorded with every run), the default stop strings, the sampling and truncation rules as recorded, and
:class:`Generation` (one completion). :mod:`ida_eval.generate` carries them out.

Kept apart from the generation code so that ``python -m ida_eval.mbxp`` checks its arguments, prints its help
and compares finished runs without importing torch or transformers (seconds of imports on a small machine).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ida_eval.languages import LANGUAGES

STOP_STRINGS: tuple[str, ...] = LANGUAGES["python"].stop_sequences
"""Stop strings (bigcode MBPP set plus markdown fence and comment; deliberately no ``"\\ndef"``).
Other languages' sets are in :data:`ida_eval.languages.LANGUAGES` (``stop_sequences``)."""

DEFAULT_BATCH_SIZE = 8  # prompts per generate() call
DEFAULT_MAX_NEW_TOKENS = 256  # canonical MBXP solutions: median 117 chars, max 1231 chars

CACHES = ("dynamic", "static")  # DecodingConfig.cache
SAMPLING_RULE = (
    "per row: logits / temperature in float32, softmax, keep the most probable tokens (stable sort, "
    "descending) until their cumulative probability reaches top_p, then the first kept token whose "
    "cumulative probability exceeds u * (kept total), u = sample_uniform(seed, task_id, completion_id, step)"
)

TRUNCATION_RULE = (
    "cut at the first stop string; if prompt+completion does not ast.parse, keep the longest "
    "non-empty line prefix that does; if none does, keep the cut text"
)


@dataclass(frozen=True)
class DecodingConfig:
    """How completions are generated (frozen: it is recorded with the results).

    Attributes:
        batch_size: rows per ``generate`` call (>= 1).
        max_new_tokens: generation budget per completion (>= 1).
        stop_strings: strings that end a completion (besides end-of-sequence).
        samples_per_task: completions per task (>= 1; more than one needs sampling).
        temperature: 0 for greedy (the default), > 0 to sample (:data:`SAMPLING_RULE`).
        top_p: nucleus filter of sampling, in (0, 1]; 1 keeps every token.
        seed: the sampling seed (a task's samples depend on it, the task id and their number only).
        cache: ``"dynamic"`` (transformers' default KV cache) or ``"static"``: a preallocated KV cache,
            every batch left-padded to the longest prompt of the call and a short last batch filled up
            with copies of its last row (their completions dropped) so all batches have one shape, which
            lets transformers compile the decoding step (``torch.compile``, CUDA graphs) on a GPU once
            (:data:`CACHES`).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop_strings: tuple[str, ...] = field(default=STOP_STRINGS)
    samples_per_task: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    cache: str = "dynamic"

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"DecodingConfig.batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"DecodingConfig.max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"DecodingConfig.stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if not _is_int(self.samples_per_task) or self.samples_per_task < 1:
            raise ValueError(f"samples per task must be an integer >= 1, got {self.samples_per_task!r}")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise ValueError(f"the sampling seed must be an integer in [0, 2^63), got {self.seed!r}")
        if (
            not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {self.cache!r}")
        if not self.sampling:
            if self.samples_per_task > 1:
                raise ValueError(
                    f"{self.samples_per_task} samples per task need a temperature > 0: greedy decoding gives "
                    "the same completion every time"
                )
            if self.top_p != 1:
                raise ValueError(f"top_p {self.top_p} needs a temperature > 0 (greedy decoding does not sample)")

    @property
    def sampling(self) -> bool:
        """True when completions are sampled (``temperature > 0``), False for greedy."""
        return self.temperature > 0

    def describe(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict, including the fixed rules (greedy runs: the same dict as
        before sampling existed, so their run directories resume unchanged)."""
        d = asdict(self)
        d["stop_strings"] = list(self.stop_strings)
        sampling = {k: d.pop(k) for k in ("samples_per_task", "temperature", "top_p", "seed")}
        if d["cache"] == "dynamic":  # the default: runs written before the field describe the same
            del d["cache"]
        if self.sampling:
            d.update(sampling, strategy="sample", do_sample=True, sampling=SAMPLING_RULE)
        else:
            d.update(strategy="greedy", do_sample=False)
        d.update(
            num_beams=1,
            repetition_penalty=1.0,
            prompt="raw MBXP prompt, zero-shot, no chat template, whitespace untouched",
            padding="left, length-sorted batches (longest first)",
            truncation=TRUNCATION_RULE,
        )
        return d


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Generation:
    """One generated completion.

    Attributes:
        task_id: the problem id.
        completion: the truncated completion that gets executed.
        raw: the decoded text before truncation (kept for degenerate-output analysis).
        n_tokens: generated tokens (up to and including the stopping token; padding excluded).
        stop_reason: ``"eos"``, ``"stop_string"`` or ``"length"``.
        completion_id: the sample's number within its task (0 for greedy).
    """

    task_id: str
    completion: str
    raw: str
    n_tokens: int
    stop_reason: str
    completion_id: int = 0
