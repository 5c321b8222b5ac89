"""Untrained special-token embeddings: detection, re-initialisation, and the end-of-turn EOS.

Why: a base model whose pretraining never used a token (ChatML ``<|im_start|>`` / ``<|im_end|>`` in some
base checkpoints) still has an embedding row and an lm_head row for it, but those rows are whatever the
initialiser or a vocabulary resize left there: often *identical* to each other (resized vocabularies
repeat one vector) or *near zero*. Fine-tuning on chat data with such rows starts every conversation
marker from the same point; at a small SFT learning rate the rows barely move, the marker tokens stay
indistinguishable, and the model never learns to emit the end-of-turn token (generation runs on, the
repetition-collapse signature of the failed runs).

Detection (only among token ids the training data actually uses, in the input embedding and, when not
tied, the lm_head):

- **duplicate**: the row's bytes equal another row's bytes (exact equality of FP32/BF16 rows essentially
  never happens for trained vectors);
- **low norm**: the row's L2 norm is below ``LOW_NORM_RATIO`` (1e-3) times the median row norm.

Re-initialisation: every flagged row becomes the FP32 mean of the *trained* rows (all rows not
flagged and not part of any duplicate group) plus Gaussian noise with ``NOISE_RATIO`` (0.02) times the
trained rows' per-element std, so re-initialised markers are distinguishable from each other. The noise
comes from a seeded generator, so runs are reproducible. Which ids were changed is returned (and logged
by the trainer).

The EOS fix: for chat data the generation config's EOS is set to the template's end-of-turn marker (and
the tokenizer's ``eos_token``), so ``generate`` stops where the training data taught the model to stop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

LOW_NORM_RATIO = 1e-3  # a row below 0.001 x median norm counts as untrained
NOISE_RATIO = 0.02  # re-init noise std as a fraction of the trained rows' element std


@dataclass
class UntrainedReport:
    """What :func:`fix_untrained_tokens` found and changed.

    Attributes:
        duplicate_ids: used token ids whose row equals another row (per matrix name).
        low_norm_ids: used token ids with near-zero rows (per matrix name).
        reinitialised: token ids that were re-initialised (union over matrices), sorted.
        tokens: the token strings of ``reinitialised``.
    """

    duplicate_ids: dict[str, list[int]] = field(default_factory=dict)
    low_norm_ids: dict[str, list[int]] = field(default_factory=dict)
    reinitialised: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)


def duplicate_rows(weight: torch.Tensor) -> set[int]:
    """Indices of rows whose exact bytes occur more than once in ``weight`` ([V, H])."""
    w = weight.detach().to("cpu").contiguous()
    groups: dict[bytes, list[int]] = defaultdict(list)
    # bytes of each row; V x H x itemsize bytes total, one pass
    raw = w.view(torch.uint8).reshape(w.shape[0], -1).numpy() if w.dtype != torch.bool else w.numpy()
    for i in range(raw.shape[0]):
        groups[raw[i].tobytes()].append(i)
    return {i for ids in groups.values() if len(ids) > 1 for i in ids}


def low_norm_rows(weight: torch.Tensor, *, ratio: float = LOW_NORM_RATIO) -> set[int]:
    """Indices of rows whose L2 norm is below ``ratio`` times the median row norm."""
    norms = weight.detach().float().norm(dim=-1)
    threshold = ratio * norms.median()
    return set(torch.nonzero(norms <= threshold).flatten().tolist())


def find_untrained(weight: torch.Tensor, used_ids: Iterable[int]) -> tuple[list[int], list[int]]:
    """Used ids with duplicate rows, and used ids with near-zero rows, in ``weight`` ([V, H])."""
    used = {i for i in used_ids if 0 <= i < weight.shape[0]}
    return sorted(used & duplicate_rows(weight)), sorted(used & low_norm_rows(weight))


@torch.no_grad()
def reinit_rows_(weight: torch.Tensor, ids: Sequence[int], *, seed: int, noise_ratio: float = NOISE_RATIO) -> None:
    """Set ``weight[ids]`` to mean(trained rows) + small noise, in place (statistics in FP32)."""
    if not ids:
        return
    bad = set(duplicate_rows(weight)) | low_norm_rows(weight) | set(ids)
    trained = torch.tensor([i for i in range(weight.shape[0]) if i not in bad], dtype=torch.long)
    if trained.numel() == 0:
        raise ValueError("every embedding row looks untrained; refusing to re-initialise from nothing")
    rows = weight.detach().float()[trained]
    mean = rows.mean(dim=0)
    std = rows.std().item()
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn((len(ids), weight.shape[1]), generator=g) * (noise_ratio * std)
    weight[torch.tensor(list(ids))] = (mean + noise).to(weight.dtype).to(weight.device)


def fix_untrained_tokens(model: Any, tokenizer: Any, used_ids: Iterable[int], *, seed: int) -> UntrainedReport:
    """Detect untrained embedding / lm_head rows among ``used_ids`` and re-initialise them in place.

    Args:
        model: a transformers causal LM (``get_input_embeddings`` / ``get_output_embeddings``).
        tokenizer: for naming the changed tokens.
        used_ids: token ids that occur in the training data (or the chat template).
        seed: seed of the re-init noise.

    Returns:
        An :class:`UntrainedReport` (empty lists when nothing was wrong).

    Example:
        >>> import torch, types
        >>> emb = torch.nn.Embedding(6, 4); emb.weight.data[4] = emb.weight.data[5] = 0
        >>> m = types.SimpleNamespace(get_input_embeddings=lambda: emb, get_output_embeddings=lambda: None)
        >>> tok = types.SimpleNamespace(convert_ids_to_tokens=lambda ids: [str(i) for i in ids])
        >>> fix_untrained_tokens(m, tok, [1, 4, 5], seed=0).reinitialised
        [4, 5]
    """
    used = sorted({int(i) for i in used_ids})
    report = UntrainedReport()
    matrices: list[tuple[str, torch.Tensor]] = [("embed_tokens", model.get_input_embeddings().weight)]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != matrices[0][1].data_ptr():
        matrices.append(("lm_head", head.weight))
    flagged: set[int] = set()
    for name, w in matrices:
        dup, low = find_untrained(w, used)
        report.duplicate_ids[name] = dup
        report.low_norm_ids[name] = low
        flagged |= set(dup) | set(low)
    ids = sorted(flagged)
    for k, (_, w) in enumerate(matrices):
        reinit_rows_(w.data, ids, seed=seed + k)
    report.reinitialised = ids
    report.tokens = list(tokenizer.convert_ids_to_tokens(ids)) if ids else []
    return report


def set_end_of_turn(model: Any, tokenizer: Any, marker: str) -> int:
    """Make ``marker`` (e.g. ``<|im_end|>``) the EOS of the tokenizer, model config and generation config.

    The previous EOS stays in ``generation_config.eos_token_id`` as a second stop token.

    Returns:
        The marker's token id.
    """
    marker_id = tokenizer.convert_tokens_to_ids(marker)
    if marker_id is None or marker_id == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"end-of-turn marker {marker!r} is not in the tokenizer's vocabulary")
    old = model.generation_config.eos_token_id
    old_ids = [] if old is None else ([old] if isinstance(old, int) else list(old))
    tokenizer.eos_token = marker
    model.config.eos_token_id = marker_id
    model.generation_config.eos_token_id = [marker_id] + [i for i in old_ids if i != marker_id]
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else marker_id
        )
    return marker_id
