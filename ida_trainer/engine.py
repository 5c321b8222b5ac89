"""The math of one optimizer step: token-normalised loss, the engine interface, schedule, clipping.

Loss (one place, :func:`causal_lm_loss_sum`): for every micro-batch,
``cross_entropy(logits, labels, reduction="sum", ignore_index=-100) / global_valid_tokens`` where
``labels`` are pre-shifted (see :mod:`ida_trainer.data`) and ``global_valid_tokens`` is the number of
supervised tokens in the whole optimizer step (all micro-batches, all data-parallel ranks). Gradients
accumulate over micro-batches, so the step's gradient is the gradient of the mean token loss of the
global batch, whatever the split: 4 micro-batches of 1 sequence equal 1 micro-batch of 4 (never a mean
of per-micro-batch means, which would over-weight short sequences).

Schedule (:func:`lr_at`, for 0-based step ``s`` of ``S``, warmup ``W``): ``lr * (s + 1) / (W + 1)`` while
``s < W``, then cosine from ``lr`` to ``lr * min_lr_ratio`` over the remaining ``S - W`` steps. The
optimizer reads ``param_groups[i]["lr"]``, which the loop sets before every step.

Logits: a micro-batch of T tokens over a vocabulary of V makes T x V logits, ~14 B each with their FP32
copy, log-softmax and gradient (27 GiB for 8192 tokens of Minitron's 256000; 65 GiB for 32768 of Qwen3's
151936). Above :data:`LOGITS_CHUNK_ENTRIES` both engines take the final-norm hidden states instead and run
``lm_head`` + cross-entropy over token chunks, each recomputed in backward (:func:`chunked_loss_sum`): one
chunk's logits alive at a time, the same loss to float32 rounding.

Engines: :class:`LocalEngine` (whole model on this rank; also used under FSDP) and
``ida_trainer.distributed.PipelineEngine`` share ``forward_backward(microbatches, global_valid_tokens) ->
float`` and ``parameters()``. Gradient clipping (:func:`grad_norm_and_clip`) returns the global norm
*before* clipping (what the logs report); across pipeline stages the squared norms are summed with one
``all_reduce``.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from ida_trainer.config import OptimConfig
from ida_trainer.data import IGNORE_INDEX
from ida_trainer.precision import RECIPE_ATTR, bf16_autocast

__all__ = [
    "LOGITS_CHUNK_ENTRIES",
    "LocalEngine",
    "NonFiniteError",
    "causal_lm_loss_sum",
    "chunked_loss_sum",
    "enable_activation_checkpointing",
    "grad_norm_and_clip",
    "logits_are_chunked",
    "lr_at",
]


class NonFiniteError(FloatingPointError):
    """The loss or the gradient norm became NaN/Inf; the message names the step and the batch."""


def lr_at(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Learning rate of 0-based optimizer step ``step`` (linear warmup, then cosine to ``min_lr_ratio``).

    Example:
        >>> o = OptimConfig(lr=1.0, warmup_steps=1, min_lr_ratio=0.0)
        >>> [round(lr_at(s, o, 3), 3) for s in range(3)]
        [0.5, 1.0, 0.0]
    """
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / (optim.warmup_steps + 1)
    decay_steps = max(1, total_steps - optim.warmup_steps - 1)
    progress = min(1.0, (step - optim.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return optim.lr * (optim.min_lr_ratio + (1.0 - optim.min_lr_ratio) * cosine)


def causal_lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies over supervised positions (``labels`` pre-shifted, -100 = skip).

    Computed in FP32 whatever the logits' dtype. Divide by the step's global supervised-token count.
    """
    return F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten().to(logits.device), reduction="sum", ignore_index=IGNORE_INDEX
    )


LOGITS_CHUNK_ENTRIES = 2**27  # above this many tokens x vocab logits in a micro-batch, lm_head + loss run in chunks


def logits_are_chunked(tokens: int, vocab: int) -> bool:
    """Whether a micro-batch of ``tokens`` tokens runs ``lm_head`` + loss in chunks (:func:`chunked_loss_sum`)."""
    return tokens * vocab > LOGITS_CHUNK_ENTRIES


def chunked_loss_sum(
    hidden: torch.Tensor, labels: torch.Tensor, lm_head: torch.nn.Module, autocast_device: str | None
) -> torch.Tensor:
    """:func:`causal_lm_loss_sum` of ``lm_head(hidden)``, over chunks of ``LOGITS_CHUNK_ENTRIES // vocab`` tokens,
    each recomputed in backward: one chunk's logits (and their FP32 copies) alive at a time, not the micro-batch's.

    The same math; its float32 sums run in another order (equal to float32 rounding, not bit for bit), and
    ``lm_head``'s weight gradient is a sum of per-chunk products. ``autocast_device``: run ``lm_head`` under the
    bf16 recipe's autocast on that device type (None: as it is).
    """
    from torch.utils.checkpoint import checkpoint

    h = hidden.flatten(0, 1)
    y = labels.flatten().to(h.device)
    chunk = max(1, LOGITS_CHUNK_ENTRIES // lm_head.out_features)

    def piece(hc: torch.Tensor, yc: torch.Tensor) -> torch.Tensor:
        with bf16_autocast(autocast_device) if autocast_device else nullcontext():
            logits = lm_head(hc)
        return F.cross_entropy(logits.float(), yc, reduction="sum", ignore_index=IGNORE_INDEX)

    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, h.shape[0], chunk):
        total = total + checkpoint(piece, h[start : start + chunk], y[start : start + chunk], use_reentrant=False)
    return total


def _chunked_causal_lm_loss_sum(
    self: torch.nn.Module, inputs: dict[str, torch.Tensor], labels: torch.Tensor
) -> torch.Tensor:
    """The whole model's :func:`causal_lm_loss_sum` through :func:`chunked_loss_sum`: the decoder's final-norm
    hidden states, then ``lm_head`` + loss in chunks. Bound to the model by :class:`LocalEngine` as a method that
    FSDP2 treats as a forward (its root gathers the embeddings, final norm and ``lm_head`` around it)."""
    device_type = None
    if getattr(self, RECIPE_ATTR, None) == "bf16":  # the recipe's forward runs under autocast: so does this one
        device_type = next(p.device.type for p in self.parameters())
    with bf16_autocast(device_type) if device_type else nullcontext():
        hidden = self.get_decoder()(**inputs, use_cache=False).last_hidden_state
    return chunked_loss_sum(hidden, labels, self.get_output_embeddings(), device_type)


def _model_inputs(mb: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: mb[k].to(device) for k in ("input_ids", "attention_mask", "position_ids") if k in mb}


class LocalEngine:
    """Single-process (or FSDP data-parallel) engine: the whole model on this rank.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> mb = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[2, 3, -100]])}
        >>> loss = LocalEngine(m).forward_backward([mb], global_valid_tokens=2)
        >>> loss > 0
        True
    """

    def __init__(self, model: torch.nn.Module, *, device: torch.device | str = "cpu"):
        from torch.distributed.fsdp import register_fsdp_forward_method

        self.model = model
        self.device = torch.device(device)
        self._vocab = model.get_output_embeddings().out_features
        model.ida_chunked_loss_sum = types.MethodType(_chunked_causal_lm_loss_sum, model)  # type: ignore[assignment]
        register_fsdp_forward_method(model, "ida_chunked_loss_sum")  # a no-op unless model is FSDP2's root

    def forward_backward(self, microbatches: Sequence[dict[str, torch.Tensor]], global_valid_tokens: int) -> float:
        """Forward + backward over the micro-batches (gradients accumulate); returns the step's mean token loss.

        Args:
            microbatches: dicts with ``input_ids``, pre-shifted ``labels`` and optionally ``attention_mask``,
                ``position_ids``.
            global_valid_tokens: supervised tokens in the whole optimizer step (all micro-batches, all ranks).
        """
        if global_valid_tokens <= 0:
            raise ValueError("forward_backward: the step has no supervised tokens")
        total = 0.0
        for mb in microbatches:
            inputs = _model_inputs(mb, self.device)
            if logits_are_chunked(mb["input_ids"].numel(), self._vocab):
                loss = self.model.ida_chunked_loss_sum(inputs, mb["labels"]) / global_valid_tokens
            else:
                out = self.model(**inputs, use_cache=False)
                loss = causal_lm_loss_sum(out.logits, mb["labels"]) / global_valid_tokens
            loss.backward()
            total += float(loss.detach())
        return total

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters held (and updated) by this rank."""
        return [p for p in self.model.parameters() if p.requires_grad]


def grad_norm_and_clip(params: Iterable[torch.nn.Parameter], max_norm: float, *, group: Any = None) -> float:
    """Global L2 norm of the gradients (before clipping); scales them down to ``max_norm`` when > 0.

    The norm is computed in float32 from per-parameter squared norms summed in the model's parameter
    order, whatever the gradients' dtype (BF16 for the nvfp4 recipe). ``group``: a process group whose
    ranks hold *disjoint*, consecutive slices of that order (pipeline stages, rank 0 first); the
    per-parameter values are all-gathered and summed in the same order, so a pipelined run computes the
    same norm and clip factor, bit for bit, as a single process. FSDP gradients (DTensors) are handled by
    ``torch.nn.utils.clip_grad_norm_``.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    if any(hasattr(p.grad, "full_tensor") for p in params):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)
    per_param = torch.stack([p.grad.detach().float().pow(2).sum() for p in params])
    if group is not None:
        import torch.distributed as dist

        parts: list[Any] = [None] * dist.get_world_size(group)
        # on the CPU: a pickled CUDA tensor unpickles on its own GPU, so every stage would open a CUDA context
        # on every other stage's GPU (hundreds of MB each) at the first step
        dist.all_gather_object(parts, per_param.cpu(), group=group)
        per_param = torch.cat([t.to(per_param.device) for t in parts])
    norm = per_param.sum().sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in params:
            p.grad.detach().mul_(coef.to(p.grad.dtype))
    return float(norm)


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute every decoder layer in backward (non-reentrant torch.utils.checkpoint via transformers)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
