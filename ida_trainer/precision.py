"""Precision recipes: the NVFP4 linear layer, the MXFP8 master, and the two optimizers.

Recipe ``nvfp4`` (the original engine's numerics, made to learn):

* Every projection ``nn.Linear`` (``q/k/v/o/gate/up/down_proj``) except the ``keep_bf16`` patterns
  becomes an :class:`NVFP4Linear`.  Its master weight is MXFP8 (E4M3 payload + one UE8M0 scale per
  32 values, 1.03 B/param) kept in the native ``[in, out]`` orientation, byte-identical to what the
  checkpoint stores.  Its three GEMMs run in NVFP4 through :mod:`nvfp4_cuda` (see
  :class:`NVFP4LinearFunction` for the operands).
* Embeddings, ``lm_head``, norms, the kept layers and attention (softmax, QK/PV) stay BF16.
* Gradients are BF16.  The optimizer is Lion with BF16 momentum.  An MXFP8 value has a spacing of
  6.7-12.5 % of its magnitude, so a Lion step of lr = 1e-5 on a weight of 0.02 (~1 % of half a spacing)
  vanishes under round-to-nearest.  The master is therefore written back with stochastic rounding
  (unbiased: E[w_new] = w - lr*sign(c)) by :func:`nvfp4_cuda.lion_step_mxfp8_`; ``rne`` (reproduces the
  original frozen-weight failure) and ``compensated`` (a residual buffer) are selectable.  BF16
  parameters have the same problem at lr 1e-5 (half a BF16 ulp at 0.02 is 6.1e-5), so they are written
  back with :func:`nvfp4_cuda.stochastic_round_to_bf16_` too (plain RNE only under ``writeback="rne"``).

Recipe ``bf16`` (the comparison): FP32 master parameters, BF16 compute through ``torch.autocast``
around the model's forward, AdamW with betas (0.9, 0.95).

Stochastic rounding is keyed by ``(seed, optimizer step, tensor id)`` with tensor ids derived from the
parameter's global (transformers) name, so a resumed run, a pipelined run and a single-process run draw
the same random bits.  :class:`MXFP8Lion` and :class:`MasterAdamW` ``state_dict()`` carry that step
counter and an exact copy of every parameter whose checkpoint form is lossy (the bf16 recipe's FP32
masters; BF16 projection weights that the MXFP8 writer will quantize), so ``load_state`` of the
checkpoint followed by ``optimizer.load_state_dict`` restores the run bit for bit.

Example:
    >>> import torch.nn as nn
    >>> from ida_trainer.config import OptimConfig, PrecisionConfig
    >>> class Toy(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.q_proj = nn.Linear(32, 64, bias=False)
    ...     def forward(self, x):
    ...         return self.q_proj(x)
    >>> m = Toy()
    >>> apply_recipe(m, PrecisionConfig(recipe="nvfp4"))
    >>> type(m.q_proj).__name__
    'NVFP4Linear'
    >>> opt = build_optimizer(m, OptimConfig(name="lion", lr=1e-3), PrecisionConfig(recipe="nvfp4"))
    >>> m(torch.randn(16, 32, dtype=torch.bfloat16)).float().sum().backward()
    >>> opt.step()
"""

from __future__ import annotations

import fnmatch
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

import nvfp4_cuda
from ida_trainer.nvfp4_linear import NVFP4_BLOCK, NVFP4Linear, NVFP4LinearFunction, nvfp4_modules, tensor_id
from ida_trainer.sharded import names_per_tensor, shard_like, shard_optimizer_state
from mxfp8_codec import PROJECTION_NAMES, CheckpointLayout, MXFP8Tensor, decode_mxfp8, is_projection_weight

if TYPE_CHECKING:
    from ida_trainer.config import OptimConfig, PrecisionConfig

__all__ = [
    "MXFP8Lion",
    "MasterAdamW",
    "NVFP4Linear",
    "NVFP4LinearFunction",
    "EXPORT_LAYOUT",
    "PROJECTION_NAMES",
    "apply_recipe",
    "bf16_autocast",
    "build_optimizer",
    "count_parameters",
    "export_state",
    "load_state",
    "model_recipe",
    "nvfp4_modules",
    "tensor_id",
]

# How the trainer stores a checkpoint (mxfp8_codec.layout): projections in the native [in, out]
# orientation (the MXFP8 master's own layout), norm weights as the transformers parameters.
EXPORT_LAYOUT = CheckpointLayout(orientation="in_out", norm_convention="zero_centered")
ADAMW_BETAS = (0.9, 0.95)  # bf16 recipe (the second seed's AdamW)
RECIPE_ATTR = "ida_recipe"  # attribute set on the model by apply_recipe ("nvfp4" | "bf16")
PIPELINE_ATTR = "ida_pipeline_stage"  # set by the pipeline engine on a model pruned to one stage
PIPELINE_STATES_KEY = "ida_pipeline_stages"  # older ida: the stages' optimizer states side by side (a list)


def _as_bf16(g: torch.Tensor) -> torch.Tensor:
    return g if g.dtype == torch.bfloat16 else g.to(torch.bfloat16)


def _is_projection(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTION_NAMES


def model_recipe(model: nn.Module) -> str:
    """The recipe ``apply_recipe`` put on ``model`` (``"nvfp4"`` or ``"bf16"``)."""
    recipe = getattr(model, RECIPE_ATTR, None)
    if recipe is None:
        raise ValueError(f"{type(model).__name__}: no precision recipe applied; call apply_recipe(model, ...) first")
    return str(recipe)


def bf16_autocast(device_type: str) -> torch.autocast:
    """The bf16 recipe's autocast region: BF16 GEMMs on FP32 masters, with autocast's weight-cast cache off.

    The cache keeps the BF16 copy of every FP32 weight cast inside the region until the region ends: for a
    forward, a copy of the whole model (2 B per parameter; under FSDP2, of every gathered layer, unsharded),
    even where activation checkpointing saves nothing for backward (measured on the CPU with a tracking
    dispatch mode: all of a checkpointed model's weight casts alive at the end of its forward with the cache,
    none without). A forward uses each weight once, so without the cache it casts the same number of times,
    to the same bits; the copies are freed after their GEMM, or kept by autograd where it needs them.
    """
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, cache_enabled=False)


def _autocast_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The model class's forward under BF16 autocast (bound to the instance by the bf16 recipe).

    A bound method (not a closure over the original model) so that ``copy.deepcopy`` rebinds it to the
    copy; the device type is read from the instance at call time (it follows ``model.to``).
    """
    device_type = next((p.device.type for p in self.parameters()), "cpu")
    with bf16_autocast(device_type):
        return type(self).forward(self, *args, **kwargs)


def apply_recipe(model: nn.Module, precision: PrecisionConfig) -> None:
    """Apply a precision recipe to ``model`` in place.

    ``nvfp4``: all parameters become BF16 (floating buffers such as rotary ``inv_freq`` keep their
    dtype); projection ``nn.Linear``s not matching ``precision.keep_bf16`` become :class:`NVFP4Linear`
    (their weight encoded once, RNE, into the MXFP8 master).  ``bf16``: parameters become FP32 masters
    and the model's forward runs under ``torch.autocast(dtype=bfloat16)``.  Works on the meta device.

    Args:
        model: a transformers causal LM (or any module tree with ``*_proj`` linears).
        precision: the recipe and its options.

    A ``keep_bf16`` pattern that matches no projection is warned about (a preset's last layer on a model with
    fewer layers would otherwise run in NVFP4 without a word).

    Raises:
        ValueError: unknown recipe, or the recipe was already applied.

    Example:
        >>> import torch.nn as nn
        >>> from ida_trainer.config import PrecisionConfig
        >>> m = nn.Sequential()
        >>> m.add_module("up_proj", nn.Linear(32, 32))
        >>> apply_recipe(m, PrecisionConfig(recipe="nvfp4", keep_bf16=("up_proj",)))
        >>> m.up_proj.weight.dtype
        torch.bfloat16
    """
    if getattr(model, RECIPE_ATTR, None) is not None:
        raise ValueError(f"apply_recipe: recipe {getattr(model, RECIPE_ATTR)!r} is already applied to this model")
    if precision.recipe == "bf16":
        for p in model.parameters():
            p.data = p.data.to(torch.float32)
        model.forward = types.MethodType(_autocast_forward, model)  # type: ignore[method-assign]
        setattr(model, RECIPE_ATTR, "bf16")
        return
    if precision.recipe != "nvfp4":
        raise ValueError(f"apply_recipe: unknown recipe {precision.recipe!r}; choose 'nvfp4' or 'bf16'")
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    targets = []
    kept: set[str] = set()  # the keep_bf16 patterns that matched
    for name, mod in model.named_modules():
        if not _is_projection(name, mod):
            continue
        matched = {pat for pat in precision.keep_bf16 if fnmatch.fnmatchcase(name, pat)}
        if matched:
            kept |= matched
            continue
        if mod.in_features % NVFP4_BLOCK or mod.out_features % NVFP4_BLOCK:
            warnings.warn(
                f"apply_recipe: {name} ({mod.in_features}->{mod.out_features}) is kept BF16: NVFP4 "
                f"needs both dimensions to be multiples of {NVFP4_BLOCK}",
                stacklevel=2,
            )
            continue
        targets.append(name)
    unmatched = [pat for pat in precision.keep_bf16 if pat not in kept]
    if unmatched:  # e.g. a preset's last layer on a model with fewer layers: that layer would run NVFP4 unsaid
        warnings.warn(
            f"apply_recipe: precision.keep_bf16 pattern(s) {unmatched} match no projection of this "
            f"{type(model).__name__}; nothing is kept BF16 for them (names look like "
            f"{next((n for n, m in model.named_modules() if _is_projection(n, m)), 'model.layers.0.mlp.up_proj')!r})",
            stacklevel=2,
        )
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        setattr(parent, child, NVFP4Linear.from_linear(linear, global_name=name, precision=precision))
    setattr(model, RECIPE_ATTR, "nvfp4")


# --------------------------------------------------------------------------------------------------
# Checkpoint state: global HF names, native [in, out] projections
# --------------------------------------------------------------------------------------------------


def _owned_entries(model: nn.Module) -> set[str]:
    owned = set()
    for name, _ in nvfp4_modules(model):
        prefix = f"{name}." if name else ""
        owned.update({prefix + "weight", prefix + "weight_payload", prefix + "weight_scales"})
    return owned


def tied_aliases(state: Mapping[str, torch.Tensor]) -> set[str]:
    """The names under which ``model.state_dict(keep_vars=True)`` lists a tensor it has listed before under
    another name: a tied ``lm_head.weight`` (Qwen3), the embedding's matrix. A checkpoint holds such a tensor
    once, under its first name, as transformers' ``save_pretrained`` does; ``config.json``'s
    ``tie_word_embeddings`` ties it again at load."""
    return {name for _, *others in names_per_tensor(state.items()) for name in others}


def export_sources(model: nn.Module) -> dict[str, MXFP8Tensor | torch.Tensor]:
    """:func:`export_state`'s entries as the model holds them, before the checkpoint layout is applied: NVFP4
    masters as :class:`mxfp8_codec.MXFP8Tensor`, every other tensor under its transformers layout (an FSDP2
    shard as the DTensor it is: :func:`ida_trainer.checkpoint.streamed_state` gathers each as it is written), a
    tied one once (:func:`tied_aliases`). Detached views, not copies."""
    out: dict[str, MXFP8Tensor | torch.Tensor] = {}
    owned = _owned_entries(model)
    for name, mod in nvfp4_modules(model):
        out[f"{name}.weight"] = MXFP8Tensor(mod.weight_payload.detach(), mod.weight_scales.detach())
    state = model.state_dict(keep_vars=True)
    aliases = tied_aliases(state)
    for key, t in state.items():
        if key not in owned and key not in out and key not in aliases:
            out[key] = t.detach()
    return out


def export_state(model: nn.Module) -> dict[str, MXFP8Tensor | torch.Tensor]:
    """The model's weights for a checkpoint, under transformers names.

    NVFP4 masters are returned as :class:`mxfp8_codec.MXFP8Tensor` (the live payload/scale bytes, stored
    byte for byte by the writer); other projection weights (bf16 recipe, kept-BF16 layers) as float
    tensors transposed to the native ``[in, out]`` orientation (the writer quantizes them); everything
    else (embeddings, norms, lm_head, biases, persistent buffers) as is.  Tensors are detached views,
    not copies: write them before the next optimizer step. An FSDP2 model's are streamed instead
    (:func:`ida_trainer.checkpoint.streamed_state`).

    Example:
        >>> import torch.nn as nn
        >>> m = nn.Sequential(); m.add_module("o_proj", nn.Linear(16, 32, bias=False))
        >>> tuple(export_state(m)["o_proj.weight"].shape)
        (16, 32)
    """
    return {
        k: v if isinstance(v, MXFP8Tensor) else EXPORT_LAYOUT.from_transformers(k, v)
        for k, v in export_sources(model).items()
    }


def _as_float(value: MXFP8Tensor | torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(value, MXFP8Tensor):
        payload, scales = (torch.as_tensor(v) for v in value)
        return decode_mxfp8(payload, scales, dtype=torch.float32)
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value)
    if not value.is_floating_point():
        raise ValueError(f"load_state: tensor {name!r} has dtype {value.dtype}, expected a float tensor")
    return value


@torch.no_grad()
def load_state(model: nn.Module, tensors: Mapping[str, MXFP8Tensor | torch.Tensor]) -> None:
    """Load a checkpoint dict (as from :func:`export_state` or the codec reader) into ``model``.

    The exact inverse of :func:`export_state` for the nvfp4 recipe (MXFP8 bytes copied, BF16 tensors
    copied).  Projection weights are expected in ``[in, out]`` orientation; MXFP8 values for a plain
    ``nn.Linear`` are decoded, float values for an :class:`NVFP4Linear` are encoded (RNE).  Every model
    entry must be present and no extra entry may appear (strict).

    Raises:
        ValueError: a missing/unexpected tensor or a shape mismatch, naming the tensor.
    """
    owned = _owned_entries(model)
    modules = dict(nvfp4_modules(model))
    sd = model.state_dict(keep_vars=True)
    aliases = tied_aliases(sd)  # loaded under their first name; an older ida's checkpoints hold them too
    expected = {k for k in sd if k not in owned and k not in aliases} | {f"{n}.weight" for n in modules}
    missing = sorted(expected - set(tensors))
    # A pipeline stage holds only its layers: the other stages' tensors are not errors there.
    extra = [] if getattr(model, PIPELINE_ATTR, None) is not None else sorted(set(tensors) - expected - aliases)
    if missing or extra:
        more_m = " ..." if len(missing) > 8 else ""
        more_e = " ..." if len(extra) > 8 else ""
        raise ValueError(
            f"load_state: checkpoint does not match the model: missing {missing[:8]}{more_m}, "
            f"unexpected {extra[:8]}{more_e}"
        )
    # one tensor at a time, each let go before the next is looked up (a checkpoint's are read from the file then)
    for name, mod in modules.items():
        _load_nvfp4_weight(mod, f"{name}.weight", tensors[f"{name}.weight"])
    for key, target in sd.items():
        if key not in owned and key not in aliases:
            _load_entry(target, key, tensors[key])


def _load_nvfp4_weight(mod: NVFP4Linear, key: str, value: MXFP8Tensor | torch.Tensor) -> None:
    if isinstance(value, MXFP8Tensor):
        payload, scales = (torch.as_tensor(v) for v in value)
        if tuple(payload.shape) != tuple(mod.weight_payload.shape) or tuple(scales.shape) != tuple(
            mod.weight_scales.shape
        ):
            raise ValueError(
                f"load_state: {key}: MXFP8 payload {list(payload.shape)} / scales "
                f"{list(scales.shape)}, expected {list(mod.weight_payload.shape)} / "
                f"{list(mod.weight_scales.shape)} ([in, out] orientation)"
            )
        mod.weight_payload.copy_(payload)
        mod.weight_scales.copy_(scales)
        return
    w = _as_float(value, key)
    if tuple(w.shape) != (mod.in_features, mod.out_features):
        raise ValueError(
            f"load_state: {key}: shape {list(w.shape)}, expected "
            f"{[mod.in_features, mod.out_features]} ([in, out] orientation)"
        )
    mod.set_weight_(w.t())


def _load_entry(target: torch.Tensor, key: str, value: MXFP8Tensor | torch.Tensor) -> None:
    value = (
        _as_float(value, key)
        if (isinstance(value, MXFP8Tensor) or target.is_floating_point())
        else torch.as_tensor(value)
    )
    value = EXPORT_LAYOUT.to_transformers(key, value)
    if tuple(value.shape) != tuple(target.shape):
        raise ValueError(f"load_state: {key}: shape {list(value.shape)}, expected {list(target.shape)}")
    # an FSDP2 shard takes this rank's slice; a plain tensor converts as it copies (no full-size temporary)
    target.copy_(shard_like(value, target) if isinstance(target, DTensor) else value)


# --------------------------------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------------------------------


def _lossy_in_checkpoint(name: str, p: torch.Tensor, anchors: set[int]) -> bool:
    """True when the checkpoint file cannot hold ``p`` exactly (needs a copy in the optimizer state)."""
    if id(p) in anchors:
        return False
    return p.dtype != torch.bfloat16 or (is_projection_weight(name) and p.dim() == 2)


class _ExactStateMixin:
    """state_dict additions shared by both optimizers: SR step counter + exact copies of lossy params."""

    _names: dict[int, str]
    _exact: dict[str, torch.Tensor]

    def _group_names(self) -> list[list[str]]:
        return [[self._names[id(p)] for p in g["params"]] for g in self.param_groups]  # type: ignore[attr-defined]

    def _extra_state(self) -> dict[str, Any]:
        return {
            "exact_params": {n: p.detach() for n, p in self._exact.items()},  # references, as torch's own state
            "param_names": sorted(self._names.values()),
            "param_order": [n for g in self._group_names() for n in g],  # the state's indices, by name
        }

    def _own_part(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """This optimizer's state_dict out of a checkpoint's: the same parameters in the same order as they
        are (a single-process checkpoint, or an older one), else picked by name (:func:`select_state`)."""
        if PIPELINE_STATES_KEY in state_dict:  # older ida: the pipeline stages' states side by side
            mine = sorted(self._names.values())
            for part in state_dict[PIPELINE_STATES_KEY]:
                if part.get("ida", {}).get("param_names") == mine:
                    return dict(part)
            raise ValueError(
                "optimizer state: none of the pipeline stages' states holds exactly this stage's parameters "
                "(an older ida wrote this checkpoint: resume it with the number of stages it was written with)"
            )
        order = state_dict.get("ida", {}).get("param_order")
        groups = self._group_names()
        if order is None or order == [n for g in groups for n in g]:
            return dict(state_dict)
        return select_state(state_dict, groups)

    @torch.no_grad()
    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        saved = extra.get("exact_params", {})
        missing = sorted(set(self._exact) - set(saved))
        if missing:
            raise ValueError(f"optimizer state: exact parameter copies missing for {missing[:8]}")
        for n, p in self._exact.items():
            if tuple(saved[n].shape) != tuple(p.shape):
                raise ValueError(
                    f"optimizer state: parameter {n} has shape {list(saved[n].shape)}, expected {list(p.shape)}"
                )
            p.copy_(shard_like(saved[n], p))


def merge_stage_states(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One optimizer state_dict out of the pipeline stages' (in stage order), laid out as a single-process
    run's: group by group, each stage's parameters after the previous stage's (its layers follow them in the
    model), the state re-indexed, the exact copies and the names merged. A checkpoint holding it resumes
    with any number of stages (:func:`select_state` picks each stage's part) or in one process.

    Raises:
        ValueError: the stages disagree on what is one value for the run (parameter groups, SR step, ...).
    """
    kept = ("exact_params", "param_names", "param_order")
    extras = [part["ida"] for part in parts]
    run = {k: v for k, v in extras[0].items() if k not in kept}
    differ = sorted({k for e in extras for k in e if k not in kept and e.get(k) != run.get(k)})
    if differ:
        raise ValueError(
            f"optimizer state: the pipeline stages disagree on {differ}: {[{k: e.get(k) for k in differ} for e in extras]}"
        )
    if len({len(part["param_groups"]) for part in parts}) != 1:
        raise ValueError("optimizer state: the pipeline stages have different numbers of parameter groups")
    order: list[str] = []
    state: dict[int, Any] = {}
    groups = []
    for g in range(len(parts[0]["param_groups"])):
        hyper = [{k: v for k, v in part["param_groups"][g].items() if k != "params"} for part in parts]
        if any(h != hyper[0] for h in hyper):
            raise ValueError(f"optimizer state: the pipeline stages' parameter group {g} differ: {hyper}")
        ids = []
        for part, extra in zip(parts, extras, strict=True):
            for i in part["param_groups"][g]["params"]:
                if i in part["state"]:
                    state[len(order)] = part["state"][i]
                ids.append(len(order))
                order.append(extra["param_order"][i])
        groups.append({**hyper[0], "params": ids})
    exact = {n: t for e in extras for n, t in e["exact_params"].items()}
    return {
        "state": state,
        "param_groups": groups,
        "ida": {**run, "exact_params": exact, "param_names": sorted(order), "param_order": order},
    }


def select_state(state_dict: Mapping[str, Any], groups: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The part of a checkpoint's optimizer state_dict (with ``ida.param_order``) that belongs to the
    parameters named in ``groups`` (an optimizer's groups, in its order), indexed as that optimizer's own.

    Raises:
        ValueError: a parameter has no entry, or sits in another parameter group there.
    """
    index = {n: i for i, n in enumerate(state_dict["ida"]["param_order"])}
    missing = [n for g in groups for n in g if n not in index]
    if missing:
        raise ValueError(
            f"optimizer state: the checkpoint holds no state for {missing[:8]}: a checkpoint of another model?"
        )
    if len(groups) != len(state_dict["param_groups"]):
        raise ValueError(
            f"optimizer state: {len(state_dict['param_groups'])} parameter groups in the checkpoint, {len(groups)} here"
        )
    state: dict[int, Any] = {}
    out_groups = []
    k = 0
    for g, names in enumerate(groups):
        saved = state_dict["param_groups"][g]
        members = set(saved["params"])
        ids = []
        for n in names:
            if index[n] not in members:
                raise ValueError(f"optimizer state: parameter {n} is in another parameter group in the checkpoint")
            if index[n] in state_dict["state"]:
                state[k] = state_dict["state"][index[n]]
            ids.append(k)
            k += 1
        out_groups.append({**{key: v for key, v in saved.items() if key != "params"}, "params": ids})
    mine = [n for g in groups for n in g]
    names = set(mine)
    extra = dict(state_dict["ida"])
    extra.update(
        exact_params={n: t for n, t in extra["exact_params"].items() if n in names},
        param_names=sorted(mine),
        param_order=mine,
    )
    return {"state": state, "param_groups": out_groups, "ida": extra}


def _named_trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _param_groups(named: list[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only (embeddings, projections, lm_head); none on norms and biases."""
    decay = [p for _, p in named if p.dim() >= 2]
    no_decay = [p for _, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


class MXFP8Lion(_ExactStateMixin, torch.optim.Optimizer):
    """Lion (Chen et al. 2023) for the nvfp4 recipe: BF16 momentum, MXFP8 masters, SR write-back.

    Per element, with ``c = b1*m + (1-b1)*g``: ``w <- w*(1 - lr*wd) - lr*sign(c)``, then
    ``m <- b2*m + (1-b2)*g``.  For :class:`NVFP4Linear` gradient anchors the fused
    :func:`nvfp4_cuda.lion_step_mxfp8_` updates the MXFP8 master (payload + scales) in place with the
    configured write-back; other (BF16) parameters by :func:`nvfp4_cuda.lion_step_bf16_` (float32 math,
    written back with stochastic rounding, RNE under ``writeback="rne"``; one fused kernel on CUDA).  The SR key is
    ``(seed, optimizer step, tensor_id(global name, "lion"))``.  The learning rate is read from
    ``param_groups[i]["lr"]`` at every step.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        writeback: str = "stochastic",
        seed: int = 0,
    ) -> None:
        if writeback not in ("stochastic", "rne", "compensated"):
            raise ValueError(f"MXFP8Lion: writeback {writeback!r}; choose 'stochastic', 'rne' or 'compensated'")
        named = _named_trainable(model)
        self._masters = {id(mod.weight): mod for _, mod in nvfp4_modules(model)}
        self._names = {id(p): n for n, p in named}
        self._exact = {n: p for n, p in named if _lossy_in_checkpoint(n, p, set(self._masters))}
        for n, p in named:
            if id(p) not in self._masters and p.dtype != torch.bfloat16:
                raise ValueError(
                    f"MXFP8Lion: parameter {n} is {p.dtype}; the nvfp4 recipe keeps non-master "
                    "parameters in bfloat16 (call apply_recipe first)"
                )
        self.writeback = writeback
        self.seed = seed
        self.sr_step = 0
        defaults = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay}
        super().__init__(_param_groups(named, weight_decay), defaults)

    def _sync_modules(self) -> None:
        for mod in self._masters.values():
            mod.set_sr_step(self.sr_step)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One Lion step over every parameter with a gradient; advances the SR step counter."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t = self.sr_step
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                name = self._names[id(p)]
                state = self.state[p]
                mod = self._masters.get(id(p))
                if mod is not None:
                    if "momentum" not in state:
                        state["momentum"] = torch.zeros(
                            mod.weight_payload.shape, dtype=torch.bfloat16, device=mod.weight_payload.device
                        )
                        if self.writeback == "compensated":
                            state["compensation"] = torch.zeros(
                                mod.weight_payload.shape, dtype=torch.float32, device=mod.weight_payload.device
                            )
                    nvfp4_cuda.lion_step_mxfp8_(
                        mod.weight_payload,
                        mod.weight_scales,
                        _as_bf16(p.grad).contiguous(),
                        state["momentum"],
                        lr=lr,
                        beta1=b1,
                        beta2=b2,
                        weight_decay=wd,
                        writeback=self.writeback,
                        compensation=state.get("compensation"),
                        seed=self.seed,
                        step=t,
                        tensor_id=tensor_id(name, "lion"),
                    )
                    continue
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(p, dtype=torch.bfloat16)
                nvfp4_cuda.lion_step_bf16_(
                    p.data,
                    p.grad,
                    state["momentum"],
                    lr=lr,
                    beta1=b1,
                    beta2=b2,
                    weight_decay=wd,
                    writeback=self.writeback,
                    seed=self.seed,
                    step=t,
                    tensor_id=tensor_id(name, "lion"),
                )
        self.sr_step = t + 1
        self._sync_modules()
        return loss

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        sd = super().state_dict()
        sd["ida"] = {
            "kind": "mxfp8_lion",
            "sr_step": self.sr_step,
            "seed": self.seed,
            "writeback": self.writeback,
            **self._extra_state(),
        }
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        sd = self._own_part(state_dict)
        extra = sd.pop("ida", None)
        if extra is None or extra.get("kind") != "mxfp8_lion":
            raise ValueError("MXFP8Lion.load_state_dict: not an MXFP8Lion state (was it saved by the bf16 recipe?)")
        if extra["writeback"] != self.writeback:
            warnings.warn(
                f"optimizer state was saved with writeback={extra['writeback']!r}, continuing with {self.writeback!r}",
                stacklevel=2,
            )
        # torch casts floating state to the parameter's dtype (BF16 for a gradient anchor); the float32
        # compensation buffers are taken out first and put back untouched.
        comp = {}
        sd["state"] = {k: dict(v) for k, v in sd["state"].items()}
        for k, v in sd["state"].items():
            if "compensation" in v:
                comp[k] = v.pop("compensation")
        super().load_state_dict(sd)
        flat = [p for g in self.param_groups for p in g["params"]]
        for k, v in comp.items():
            self.state[flat[int(k)]]["compensation"] = v.to(device=flat[int(k)].device, dtype=torch.float32).clone()
        self.sr_step = int(extra["sr_step"])
        self.seed = int(extra["seed"])
        self._sync_modules()
        self._load_extra_state(extra)


class MasterAdamW(_ExactStateMixin, torch.optim.AdamW):
    """AdamW for the bf16 recipe on FP32 master parameters; state_dict also holds the exact masters.

    Under FSDP2 its state_dict holds this rank's shards (:func:`ida_trainer.checkpoint.streamed_state` writes
    the checkpoint's full state of it); load_state_dict takes full tensors and keeps each rank's shard.
    """

    def __init__(
        self, model: nn.Module, *, lr: float, betas: tuple[float, float] = ADAMW_BETAS, weight_decay: float = 0.0
    ) -> None:
        named = _named_trainable(model)
        for n, p in named:
            if p.dtype != torch.float32:
                raise ValueError(
                    f"MasterAdamW: parameter {n} is {p.dtype}; the bf16 recipe keeps FP32 masters "
                    "(call apply_recipe first)"
                )
        self._names = {id(p): n for n, p in named}
        self._exact = {n: p for n, p in named if _lossy_in_checkpoint(n, p, set())}
        super().__init__(
            _param_groups(named, weight_decay), lr=lr, betas=tuple(betas), weight_decay=weight_decay, foreach=False
        )

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        sd = super().state_dict()
        sd["ida"] = {"kind": "master_adamw", **self._extra_state()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        sd = self._own_part(state_dict)
        extra = sd.pop("ida", None)
        if extra is None or extra.get("kind") != "master_adamw":
            raise ValueError("MasterAdamW.load_state_dict: not a MasterAdamW state (was it saved by the nvfp4 recipe?)")
        super().load_state_dict(shard_optimizer_state(sd, self.param_groups))  # full tensors -> FSDP2 shards
        self._load_extra_state(extra)


def build_optimizer(model: nn.Module, optim: OptimConfig, precision: PrecisionConfig) -> torch.optim.Optimizer:
    """The optimizer of the recipe: :class:`MXFP8Lion` (nvfp4) or :class:`MasterAdamW` (bf16).

    Only the parameters present in ``model`` are optimized (a pipeline stage passes its own layers).

    Raises:
        ValueError: the optimizer does not match the recipe, or the recipe was not applied.

    Example:
        >>> import torch.nn as nn
        >>> from ida_trainer.config import OptimConfig, PrecisionConfig
        >>> m = nn.Linear(4, 4); apply_recipe(m, PrecisionConfig(recipe="bf16"))
        >>> type(build_optimizer(m, OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.95)),
        ...                      PrecisionConfig(recipe="bf16"))).__name__
        'MasterAdamW'
    """
    recipe = model_recipe(model)
    if recipe != precision.recipe:
        raise ValueError(f"build_optimizer: model has recipe {recipe!r} but precision.recipe is {precision.recipe!r}")
    if recipe == "nvfp4":
        if optim.name != "lion":
            raise ValueError(
                f"build_optimizer: the nvfp4 recipe trains with Lion (MXFP8 master update); got "
                f"optim.name={optim.name!r}"
            )
        return MXFP8Lion(
            model,
            lr=optim.lr,
            betas=optim.betas,
            weight_decay=optim.weight_decay,
            writeback=precision.writeback,
            seed=precision.seed,
        )
    if optim.name != "adamw":
        raise ValueError(
            f"build_optimizer: the bf16 recipe trains with AdamW (FP32 master); got optim.name={optim.name!r}"
        )
    return MasterAdamW(model, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)


def count_parameters(model: nn.Module) -> int:
    """Logical parameter count (an NVFP4 master counts in_features*out_features, the anchor not at all)."""
    anchors = {id(m.weight) for _, m in nvfp4_modules(model)}
    n = sum(p.numel() for p in model.parameters() if id(p) not in anchors)
    return n + sum(m.in_features * m.out_features for _, m in nvfp4_modules(model))
