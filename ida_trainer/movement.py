"""How much of the MXFP8 master one optimizer step moved: ``master_moved`` and ``master_step_kept`` in
``train_log.jsonl``.

The nvfp4 recipe keeps its master weights in MXFP8, whose spacing is 6.7-12.5 % of a value. An update
smaller than half a spacing is lost to round-to-nearest, so a run can train for days on a master that
never changes while its loss, computed from that master, looks alive (docs/trainer_precision.md, "The
master update problem"). Stochastic write-back (the default) moves a value by one spacing with
probability update / spacing, so on average the master moves by the whole step. Lion's step is ``lr``
per value (its update is a sign; weight decay adds ``lr * wd * |w|``), which gives two numbers for each
step the console prints (``train.log_every``; the first and last steps too):

* ``master_moved``: the share of the master's values that changed (a few % at lr 1e-5);
* ``master_step_kept``: their mean absolute change over ``lr``, the share of Lion's step that reached the
  master: about 1.0 with stochastic write-back, 0.01 with ``writeback="rne"`` at lr 1e-5 on N(0, 0.02)
  weights, where only values near zero (whose spacing is finer than the step) move
  (tests/ida_trainer/test_movement.py).

:class:`MasterMovement` measures both on a fixed sample of every master: :data:`SAMPLE_PER_TENSOR` values
of each :class:`~ida_trainer.nvfp4_linear.NVFP4Linear` at positions drawn once, keyed by its global name
(the same in every process and every step; a smaller master is watched whole). A value moved when its
decoded value changed (+-0 being one value). Its E4M3 code and UE8M0 scale are not enough: the optimizer
re-encodes each block with the scale its new maximum calls for, and one value can be written under two
scales (``0x38`` at scale ``2^1`` and ``0x30`` at ``2^2`` are both 2.0), so a step that changes nothing
re-scales a few % of the blocks. The cost: two small gathers per master and one decode of the watched
values, on the master's device, before and after the step.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ida_trainer.nvfp4_linear import NVFP4Linear, tensor_id
from mxfp8_codec import decode_mxfp8
from mxfp8_codec.constants import BLOCK_SIZE

__all__ = ["SAMPLE_PER_TENSOR", "MasterMovement"]

SAMPLE_PER_TENSOR = 1024  # master values watched per projection (drawn with replacement; all of a smaller one)


class MasterMovement:
    """The share of the sampled master values that an optimizer step changed.

    Call :meth:`before` just before ``optimizer.step()`` and :meth:`moved` just after: it returns
    ``(changed, watched, total absolute change)`` of the watched values (a pipeline stage sums them with
    the other stages'). The modules' buffers are read at each call, so a master loaded or moved to
    another device since is the one measured.

    Example:
        >>> import torch
        >>> from ida_trainer.nvfp4_linear import NVFP4Linear
        >>> lin = NVFP4Linear(32, 32)  # a master of 1024 values: watched whole
        >>> watch = MasterMovement([lin])
        >>> _ = lin.weight_scales.fill_(127)  # blocks of scale 2^0
        >>> watch.before()
        >>> lin.weight_payload[0, :8] = 0x38  # eight values 0 -> 1.0
        >>> watch.moved()
        (8, 1024, 8.0)
    """

    def __init__(self, modules: Iterable[NVFP4Linear]) -> None:
        self._modules = list(modules)
        self._positions: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self._before: torch.Tensor | None = None

    def _watched(self, i: int, mod: NVFP4Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat positions of module ``i``'s watched values in its payload and in its scales."""
        key = (i, mod.weight_payload.device)
        if key not in self._positions:
            rows, cols = mod.weight_payload.shape
            n = rows * cols
            if n <= SAMPLE_PER_TENSOR:
                flat = torch.arange(n, dtype=torch.int64)
            else:  # drawn, not strided: a stride would line up with the rows and blocks
                g = torch.Generator().manual_seed(tensor_id(mod.global_name or str(i), "watch"))
                flat = torch.randint(0, n, (SAMPLE_PER_TENSOR,), generator=g).sort().values
            scale_flat = (flat // cols) * mod.weight_scales.shape[1] + (flat % cols) // BLOCK_SIZE
            self._positions[key] = (flat.to(key[1]), scale_flat.to(key[1]))
        return self._positions[key]

    def _values(self) -> torch.Tensor:
        """The watched values, decoded (float32, on the host), concatenated over the masters."""
        parts: dict[torch.device, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for i, mod in enumerate(self._modules):
            at, scale_at = self._watched(i, mod)
            codes, scales = parts.setdefault(mod.weight_payload.device, ([], []))
            codes.append(mod.weight_payload.view(-1)[at])
            scales.append(mod.weight_scales.view(-1)[scale_at])
        decoded = [torch.zeros(0)]  # (no master: nothing watched)
        for codes, scales in parts.values():  # each value a block of one, with its own block's scale
            one = decode_mxfp8(torch.cat(codes).view(-1, 1), torch.cat(scales).view(-1, 1), dtype=torch.float32)
            decoded.append(one.view(-1).cpu())
        return torch.cat(decoded)

    def before(self) -> None:
        """Remember the watched values (call right before the optimizer step)."""
        self._before = self._values()

    def moved(self) -> tuple[int, int, float]:
        """``(changed, watched, sum of |change|)`` of the watched values since :meth:`before`."""
        if self._before is None:
            raise RuntimeError("MasterMovement.moved() called without before()")
        old, new = self._before, self._values()
        self._before = None
        change = (new.double() - old.double()).abs()  # exact in float64 for the nearby values a step writes
        return int((old != new).sum()), int(new.numel()), float(change.sum())  # (-0.0 == 0.0)
