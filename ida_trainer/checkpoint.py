"""Checkpoint directories: atomic save, keep-last-K, exact resume, and the publishable export.

Layout of ``<out>/checkpoints/ckpt-000120/``:

- ``model.safetensors``: the MXFP8 format (docs/format.md) written by
  :func:`mxfp8_codec.write_mxfp8_safetensors` from :func:`ida_trainer.precision.export_state`: nvfp4
  masters stored byte-for-byte as the trainer holds them (native ``[in, out]`` orientation), everything
  else BF16. Loadable by ``ida_eval.load_model`` like any published checkpoint.
- ``config.json``, ``generation_config.json``, tokenizer files: a complete transformers directory.
- ``optimizer.st``: ``optimizer.state_dict()`` (momenta, SR step counter, exact copies of whatever the
  safetensors file cannot hold bit-exactly, e.g. the bf16 recipe's FP32 masters) in the safetensors format
  (:func:`write_optimizer_state`): every tensor in its own dtype under its path in the state (``state.3.exp_avg``,
  ``ida.exact_params.model.norm.weight``), the rest of the state as JSON in the header's metadata. Read without
  unpickling anything, mapped rather than read, and written one tensor at a time (an FSDP2 run gathers each full
  tensor as it is written: :func:`ida_trainer.sharded.gather_on_demand`); full tensors, so the file does not
  depend on the process count. Not named ``*.safetensors``: vLLM and others load every ``*.safetensors`` of a
  directory without an index as weights. Checkpoints of ida before 2026-12-07 hold ``optimizer.pt`` (a torch
  pickle) instead, read with torch's weights-only unpickler.
- ``trainer_state.json``: step, data cursor, RNG states (torch CPU/CUDA, python), config digest (and the
  digest without the pipeline stage count, which ``--resume`` compares).
- ``SHA256SUMS``: the sha256 of every file above, written last (:mod:`ida_common.checksums`, the format of
  coreutils' ``sha256sum -c``). :func:`load_checkpoint` (``--resume``), :func:`export_checkpoint` and
  ``ida_eval`` check the files they read against it, so a byte damaged on disk or in a copy is named instead
  of loading as another number; checkpoints of an older ida have none and are read as they are.

Atomicity: the directory is written by :func:`ida_common.files.atomic_directory` (the one place the
project makes durable directories): into a hidden, locked ``.ckpt-000120.XXXXXXXX.tmp/``, every file
and the directory fsynced, then moved to ``ckpt-000120`` (a re-save of the same step: an atomic
exchange with the old one). A crash at any point leaves either the previous complete checkpoints
untouched plus a temporary (swept on the next start, :func:`remove_partial`) or the new complete
checkpoint: resume only ever sees complete checkpoints, because only a complete directory carries the
final name. After a successful save all but the newest
``keep`` checkpoints *of the same run* are deleted: every checkpoint records its run's id
(``trainer_state.json`` ``run_id``), and a checkpoint of another run is never pruned or resumed.
Kill points (:mod:`ida_common.killpoint`): ``checkpoint.files_written`` (before the move) and
``checkpoint.renamed`` (before pruning).

Export (:func:`export_checkpoint`): the publishable directory is produced with the codec's header-only
rename (:func:`mxfp8_codec.rename_tensors`: new JSON header, data section copied byte for byte, a
sha256 per tensor before and after compared), so the published weights are provably the trained
bytes; the rename report is stored as ``export_manifest.json``, and the export directory has its own ``SHA256SUMS``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import pickle
import random
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ida_common.checksums import SUMS_FILE, ChecksumError, verify_sums, write_sums
from ida_common.files import atomic_directory, atomic_write_text, sweep_stale, temp_owner
from ida_common.killpoint import kill_point
from ida_trainer.sharded import OnDemand, gather_on_demand, holds_shards

CKPT_PREFIX = "ckpt-"
TMP_SUFFIX = ".tmp"  # every temporary (ours: ida_common.files.temp_pattern) and those of older versions
OLD_SUFFIX = ".old" + TMP_SUFFIX  # older versions: a complete checkpoint being replaced by a re-save of its step
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.st"
LEGACY_OPTIM_FILE = "optimizer.pt"  # ida before 2026-12-07: torch.save of the state_dict
OPTIM_STATE_KEY = "ida_optimizer_state"  # the header metadata entry: the state's structure, as JSON
MAPPED_MIN_BYTES = 1 << 16  # optimizer state files: smaller tensors are copied out of the map (_unmapped_if_small)
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "export_manifest.json"


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint after ``step`` optimizer steps (``ckpt-000120``)."""
    return f"{CKPT_PREFIX}{step:06d}"


def _first_sentence(why: object) -> str:
    text = str(why).strip()
    return text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(why).__name__


def _damaged(path: Path, name: str, why: object) -> ValueError:
    """The error for a checkpoint file that cannot be read: names it, says why and what to do."""
    return ValueError(
        f"{path / name} is damaged ({_first_sentence(why)}); move {path.name} out of {path.parent} to resume from "
        "the checkpoint before it"
    )


def _verify(path: Path, only: Callable[[str], bool] | None = None) -> None:
    """Check a checkpoint's files against its ``SHA256SUMS`` (every listed file, or those ``only`` selects);
    checkpoints of an older ida have none and are read as they are."""
    try:
        verify_sums(path, only=only)
    except ChecksumError as exc:  # the codec's and ida_eval's lines say the same of an edit on purpose
        damaged = _damaged(path, exc.path.relative_to(path).as_posix(), exc.why)
        raise ValueError(f"{damaged}; changed on purpose? delete {path / SUMS_FILE}") from None


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.json``.

    Raises:
        ValueError: the file differs from its sha256 in ``SHA256SUMS`` or is not a JSON object (:func:`_damaged`).
    """
    path = Path(path)
    _verify(path, lambda n: n == STATE_FILE)
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(path, STATE_FILE, exc) from exc
    if not isinstance(state, dict):
        raise _damaged(path, STATE_FILE, f"a JSON {type(state).__name__}, not an object")
    return state


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_resume_state(path: str | Path, state: Mapping[str, Any]) -> None:
    """What ``--resume`` takes from ``trainer_state.json`` has the types and values :func:`save_checkpoint` writes:
    the step of the directory's name, a data cursor inside its rows, RNG states (loaded by :func:`set_rng_state`).

    Raises:
        ValueError: names ``trainer_state.json`` as damaged and says which field (:func:`_damaged`).
    """
    path = Path(path)
    step, cursor = state.get("step"), state.get("data_cursor")
    named = path.name[len(CKPT_PREFIX) :] if path.name.startswith(CKPT_PREFIX) else ""
    if not _is_count(step) or (named.isdigit() and step != int(named)):
        raise _damaged(path, STATE_FILE, f"its step {step!r} is not the step {path.name} was saved at")
    if not (
        isinstance(cursor, dict)
        and all(_is_count(cursor.get(k)) for k in ("epoch", "position", "num_rows"))
        and cursor["position"] <= cursor["num_rows"]
    ):
        raise _damaged(path, STATE_FILE, f"its data cursor {cursor!r} is not epoch, position <= num_rows")
    if not isinstance(state.get("rng"), dict):
        raise _damaged(path, STATE_FILE, "it holds no RNG states")


def state_run_id(state: Mapping[str, Any]) -> str | None:
    """The run id a ``trainer_state.json`` records (None: none, as in checkpoints of older versions)."""
    run_id = state.get("run_id")
    return run_id if isinstance(run_id, str) else None


def checkpoint_run_id(path: str | Path) -> str | None:
    """The run id recorded in a checkpoint's ``trainer_state.json`` (None: none recorded or unreadable)."""
    try:
        return state_run_id(read_trainer_state(path))
    except (OSError, ValueError):
        return None


def list_checkpoints(root: str | Path, *, run_id: str | None = None) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first (``.tmp`` ones excluded).

    Args:
        root: the checkpoints directory.
        run_id: only the checkpoints of this run (see :func:`checkpoint_run_id`); None = all.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if not p.is_dir() or not p.name.startswith(CKPT_PREFIX) or p.name.endswith(TMP_SUFFIX):
            continue
        try:
            step = int(p.name[len(CKPT_PREFIX) :])
        except ValueError:
            continue
        if (p / STATE_FILE).is_file() and (p / MODEL_FILE).is_file():
            if run_id is None or checkpoint_run_id(p) == run_id:
                out.append((step, p))
    return sorted(out)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    ckpts = list_checkpoints(root)
    return ckpts[-1][1] if ckpts else None


def remove_partial(root: str | Path) -> list[Path]:
    """Delete the temporaries a crash left under ``root``; returns what was removed.

    Temporaries of :func:`save_checkpoint` (``.ckpt-N.XXXXXXXX.tmp``) are swept only when their writer
    is gone (:func:`ida_common.files.sweep_stale`). Directories of older versions of this module,
    ``ckpt-N.tmp``, are removed; their ``ckpt-N.old.tmp`` whose ``ckpt-N`` is missing is a complete
    checkpoint caught between the two renames of a re-save and is moved back to its name instead.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    for p in sorted(root.glob(f"{CKPT_PREFIX}*{OLD_SUFFIX}")):
        final = root / p.name[: -len(OLD_SUFFIX)]
        if p.is_dir() and not final.exists():
            os.replace(p, final)
    removed = [p for p in root.glob(f"{CKPT_PREFIX}*{TMP_SUFFIX}") if p.is_dir()]
    for p in removed:
        shutil.rmtree(p)
    owners = {temp_owner(p.name) for p in root.iterdir()}
    for name in sorted(n for n in owners if n is not None and n.startswith(CKPT_PREFIX)):
        removed += sweep_stale(root, name)
    return sorted(removed)


def rng_state() -> dict[str, Any]:
    """Every RNG state the run uses, JSON-serialisable (torch states as base64 bytes)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch_cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
        "python": [version, list(internal), gauss],
        "numpy": {
            "name": name,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode("ascii") for s in torch.cuda.get_rng_state_all()
        ]
    return state


def _bytes_tensor(b64: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(b64), dtype=np.uint8).copy())


def set_rng_state(state: Mapping[str, Any], *, checkpoint: str | Path | None = None) -> None:
    """Restore what :func:`rng_state` captured.

    Raises:
        ValueError: with ``checkpoint`` (where ``state`` was read), states that do not load name its
            ``trainer_state.json`` as damaged (:func:`_damaged`) instead of a KeyError or IndexError deep in torch
            or numpy.
    """
    try:
        torch.set_rng_state(_bytes_tensor(state["torch_cpu"]))
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        n = state["numpy"]
        np.random.set_state((n["name"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"]))
        if "torch_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in state["torch_cuda"]])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, binascii.Error) as exc:
        if checkpoint is None:
            raise
        raise _damaged(
            Path(checkpoint), STATE_FILE, f"its RNG states do not load: {type(exc).__name__}: {exc}"
        ) from exc


def flatten_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """An optimizer state_dict as JSON data and its tensors by path: ``(skeleton, {path: tensor})``.

    Dicts (str or int keys, in order), lists, tuples, numbers, strings, booleans and None are kept in the
    skeleton (a dict as ``{"dict": [[key, value], ...]}``, a tuple as ``{"tuple": [...]}``, so that both come
    back as they were); a tensor as ``{"tensor": PATH}``, its keys joined by dots (``state.3.exp_avg``). The
    inverse of :func:`unflatten_state`; every rank of an FSDP2 run gets the same paths.

    Raises:
        ValueError: a value of another type, a key neither str nor int, or two tensors with one path.

    Example:
        >>> skeleton, tensors = flatten_state({"state": {0: {"m": torch.ones(1)}}, "betas": (0.9, 0.95)})
        >>> skeleton["dict"][0][1], skeleton["dict"][1], list(tensors)
        ({'dict': [[0, {'dict': [['m', {'tensor': 'state.0.m'}]]}]]}, ['betas', {'tuple': [0.9, 0.95]}], ['state.0.m'])
    """
    tensors: dict[str, torch.Tensor] = {}
    return _encode(state, "", tensors), tensors


def _encode(x: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """:func:`flatten_state` of ``x`` at ``path``, its tensors added to ``tensors``. (Not a closure: a recursive
    closure is a reference cycle, which kept the tensors, and a mapped file with them, until a garbage
    collection.)"""
    if isinstance(x, torch.Tensor):
        if path in tensors:
            raise ValueError(f"optimizer state: two tensors at {path!r}")
        tensors[path] = x
        return {"tensor": path}
    if isinstance(x, dict):
        bad = [k for k in x if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            raise ValueError(f"optimizer state: key {bad[0]!r} at {path or 'the top'!r} is neither str nor int")
        return {"dict": [[k, _encode(v, f"{path}.{k}" if path else str(k), tensors)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
        items = [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(x)]
        return {"tuple": items} if isinstance(x, tuple) else items
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise ValueError(f"optimizer state: {path or 'the state'} is a {type(x).__name__}, not a tensor, number or string")


def unflatten_state(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The inverse of :func:`flatten_state`.

    Raises:
        ValueError: the skeleton is not one :func:`flatten_state` makes, or names a tensor ``tensors`` lacks.
    """
    return _decode(skeleton, tensors)


def _decode(x: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """:func:`unflatten_state` of ``x`` (not a closure, as :func:`_encode`)."""
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError(f"not an optimizer state: an object with keys {sorted(x)[:4]}")
    ((tag, v),) = x.items()
    if tag == "tensor" and isinstance(v, str):
        if v not in tensors:
            raise ValueError(f"the state names a tensor {v!r} the file does not hold")
        return tensors[v]
    if tag == "tuple" and isinstance(v, list):
        return tuple(_decode(i, tensors) for i in v)
    if tag == "dict" and isinstance(v, list) and all(isinstance(kv, list) and len(kv) == 2 for kv in v):
        return {k: _decode(val, tensors) for k, val in v}
    raise ValueError(f"not an optimizer state: an object {{{tag!r}: ...}}")


def write_optimizer_state(
    path: str | Path, state: Mapping[str, Any], *, fetch: Callable[[str], torch.Tensor] | None = None
) -> None:
    """Write an optimizer state_dict as a safetensors file (:func:`flatten_state`), atomically, one tensor at a
    time. ``fetch(path)`` gives each tensor as it is written (an FSDP2 run: the full tensor of a DTensor shard,
    :func:`ida_trainer.sharded.gather_on_demand`); without it the state's own tensors are written.

    Raises:
        ValueError: the state holds FSDP2 shards and no ``fetch``, or a value :func:`flatten_state` refuses.
    """
    from mxfp8_codec import write_safetensors

    skeleton, tensors = flatten_state(dict(state))
    if fetch is None and holds_shards(tensors):
        raise ValueError("write_optimizer_state: the state holds FSDP2 shards; gather them (fetch=)")
    meta = {OPTIM_STATE_KEY: json.dumps(skeleton, separators=(",", ":"))}
    write_safetensors(path, tensors if fetch is None else OnDemand(tensors, fetch), metadata=meta, progress=False)


def _unmapped_if_small(t: torch.Tensor) -> torch.Tensor:
    """``t``, or under :data:`MAPPED_MIN_BYTES` a copy of it: a small tensor an optimizer keeps on the CPU (AdamW's
    ``step``) must not keep a whole mapped optimizer file alive (:func:`read_optimizer_state`)."""
    return t if t.nbytes >= MAPPED_MIN_BYTES else t.clone()


def read_optimizer_state(path: str | Path) -> dict[str, Any]:
    """What :func:`write_optimizer_state` wrote. The tensors are copy-on-write views of the mapped file: its pages
    are shared in the page cache by the ranks of a resumed FSDP2 run, each of which keeps its own shard, instead of
    one private copy per rank (48 GB: a 4B model's AdamW state). Tensors under :data:`MAPPED_MIN_BYTES` are
    copied out instead: torch's optimizers keep a CPU ``step`` tensor as they are given it, and a view would keep
    the whole file mapped for the rest of the run, and its disk space in use after the checkpoint is pruned.

    Raises:
        ValueError: the file is not a safetensors file, or not an optimizer state (names the file).
    """
    from mxfp8_codec import MXFP8Error, open_mxfp8
    from mxfp8_codec.convert import numpy_to_torch

    try:
        with open_mxfp8(path, copy_on_write=True) as reader:
            if OPTIM_STATE_KEY not in reader.metadata:
                raise ValueError(f"its header has no {OPTIM_STATE_KEY!r} entry: not an optimizer state")
            skeleton = json.loads(reader.metadata[OPTIM_STATE_KEY])
            tensors = {name: _unmapped_if_small(numpy_to_torch(reader.raw_view(name))) for name in reader.keys()}
        state = unflatten_state(skeleton, tensors)
    except MXFP8Error as exc:  # names the file itself
        raise ValueError(str(exc)) from exc
    except ValueError as exc:  # json.JSONDecodeError is one
        raise ValueError(f"{path}: {exc}") from exc
    except RecursionError as exc:  # what torch's optimizers never make
        raise ValueError(f"{path}: not an optimizer state: its structure is nested too deeply") from exc
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not an optimizer state (a JSON {type(state).__name__} at the top)")
    return state


@contextmanager
def streamed_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, main: bool
) -> Iterator[tuple[Mapping[str, Any], dict[str, Any], Callable[[str], torch.Tensor]] | None]:
    """What :func:`save_checkpoint` writes of an FSDP2 model and its optimizer, gathered one full tensor at a
    time as it is written (:func:`ida_trainer.sharded.gather_on_demand`): rank 0 holds the one being written
    and, for a moment, the previous gather's (on its device and its CPU) beyond its own shards, never the whole
    state. A collective: every rank enters it.

    Yields, on rank 0 (``main``), ``(tensors, optimizer_state, optimizer_fetch)`` for ``save_checkpoint``'s
    ``tensors``, ``optimizer_state`` and ``optimizer_fetch`` (to be written inside the block); on every other
    rank None, once rank 0 has written everything.
    """
    from ida_trainer.precision import EXPORT_LAYOUT, export_sources

    weights = export_sources(model)
    state = optimizer.state_dict()
    sources = {f"model/{k}": v for k, v in weights.items()}
    sources.update({f"optimizer/{k}": v for k, v in flatten_state(state)[1].items()})
    with gather_on_demand(sources, main=main) as fetch:
        if fetch is None:
            yield None
            return
        tensors = OnDemand(weights, lambda n: fetch(f"model/{n}"), EXPORT_LAYOUT.from_transformers)
        yield tensors, state, lambda n: fetch(f"optimizer/{n}")


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    tensors: Mapping[str, Any],
    model_config: Any,
    generation_config: Any,
    tokenizer: Any,
    optimizer_state: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    metadata: Mapping[str, str],
    keep: int,
    optimizer_fetch: Callable[[str], torch.Tensor] | None = None,
    before_rename: Callable[[Path], None] | None = None,
) -> Path:
    """Write one checkpoint directory atomically and prune to the newest ``keep``.

    Args:
        root: the checkpoints directory (created if needed).
        step: optimizer steps done.
        tensors: :func:`ida_trainer.precision.export_state` output (HF names, native orientation), or a mapping
            that reads each tensor when it is written (:class:`ida_trainer.sharded.OnDemand`).
        model_config: the transformers ``PretrainedConfig`` (written as ``config.json``).
        generation_config: the ``GenerationConfig`` (``generation_config.json``).
        tokenizer: saved with ``save_pretrained``.
        optimizer_state: ``optimizer.state_dict()``.
        optimizer_fetch: how to read its tensors as they are written (:func:`write_optimizer_state`).
        trainer_state: JSON data (step, data cursor, RNG, ...).
        metadata: provenance strings for the safetensors header.
        keep: how many checkpoints to keep (this one included).
        before_rename: test hook called with the temporary directory just before the rename.

    Returns:
        The final checkpoint directory.

    Example:
        >>> save_checkpoint(run / "checkpoints", 100, tensors=export_state(model), ...)  # doctest: +SKIP
    """
    from ida_trainer.precision import EXPORT_LAYOUT
    from mxfp8_codec import write_mxfp8_safetensors
    from mxfp8_codec.hf_config import write_config_json

    root = Path(root)
    final = root / checkpoint_name(step)
    with atomic_directory(final, overwrite=True) as tmp:  # a re-save of a step replaces it atomically
        write_mxfp8_safetensors(
            tmp / MODEL_FILE,
            tensors,
            metadata=dict(metadata),
            progress=False,
            orientation=EXPORT_LAYOUT.orientation,
            norm_convention=EXPORT_LAYOUT.norm_convention,
        )
        # config.json names our quantization method (orientation, norm convention from the file's metadata)
        write_config_json(tmp, tmp / MODEL_FILE, config=json.loads(model_config.to_json_string(use_diff=False)))
        atomic_write_text(tmp / "generation_config.json", generation_config.to_json_string(use_diff=True))
        tokenizer.save_pretrained(tmp)
        write_optimizer_state(tmp / OPTIM_FILE, optimizer_state, fetch=optimizer_fetch)
        atomic_write_text(tmp / STATE_FILE, json.dumps(dict(trainer_state), indent=1, sort_keys=True) + "\n")
        write_sums(tmp, sync=True)  # last: every file's sha256, checked by --resume, the export and ida_eval
        if before_rename is not None:
            before_rename(tmp)
        kill_point("checkpoint.files_written")
    kill_point("checkpoint.renamed")
    run_id = trainer_state.get("run_id")
    for _, path in list_checkpoints(root, run_id=run_id)[:-keep]:
        shutil.rmtree(path)
    return final


class ModelTensors(Mapping[str, Any]):
    """A checkpoint's ``model.safetensors`` as name -> tensor, undecoded, each read from the file when it is
    looked up: :class:`mxfp8_codec.MXFP8Tensor` (torch uint8 payload and scales) for an MXFP8 tensor, else a
    torch tensor in its stored dtype; copies that own their memory (positional reads: no file page joins the
    process), nothing cached. So a resume holds one tensor beyond the model, and a pipeline stage reads only its
    own layers (until 2026-12-07 every rank read the whole file into a dict first: 4.5 GB for Qwen3-4B).

    The file stays open until :meth:`close` or the end of a ``with`` block. Opening reads and validates its
    header (the codec's reader names a damaged file).
    """

    def __init__(self, path: str | Path) -> None:
        from mxfp8_codec import open_mxfp8

        self._reader = open_mxfp8(path)

    def __getitem__(self, name: str) -> Any:
        from mxfp8_codec import MXFP8Tensor

        if name not in self._reader:
            raise KeyError(name)
        if self._reader.is_quantized(name):
            payload, scales = self._reader.get_raw(name)
            return MXFP8Tensor(torch.from_numpy(payload), torch.from_numpy(scales))
        return self._reader.get(name, framework="pt")

    def __contains__(self, name: object) -> bool:  # from the header (Mapping's would read the tensor)
        return name in self._reader

    def __iter__(self) -> Iterator[str]:
        return iter(self._reader.keys())  # logical names (payloads without their .scale), header order

    def __len__(self) -> int:
        return len(self._reader)

    def close(self) -> None:
        """Release the file (what was read stays valid)."""
        self._reader.close()

    def __enter__(self) -> ModelTensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` returns; a context manager that closes its model file.

    Attributes:
        path: the checkpoint directory.
        tensors: its model tensors, read on lookup (:class:`ModelTensors`).
        optimizer_state: the saved ``optimizer.state_dict()`` (tensors mapped from the file, read when touched).
        trainer_state: the saved JSON state.
    """

    path: Path
    tensors: ModelTensors
    optimizer_state: dict[str, Any]
    trainer_state: dict[str, Any]

    def close(self) -> None:
        """Close the model file (tensors already looked up stay valid)."""
        self.tensors.close()

    def __enter__(self) -> LoadedCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_model_tensors(path: str | Path) -> dict[str, Any]:
    """All tensors of a checkpoint's ``model.safetensors`` in one dict, undecoded (as :class:`ModelTensors`
    looks each up)."""
    with ModelTensors(path) as tensors:
        return dict(tensors.items())


def _optimizer_file(path: Path) -> str:
    """The checkpoint's optimizer file: ``optimizer.st``, or an older ida's ``optimizer.pt``.

    Raises:
        ValueError: the directory is incomplete (names the missing file).
    """
    legacy = not (path / OPTIM_FILE).is_file() and (path / LEGACY_OPTIM_FILE).is_file()
    optim = LEGACY_OPTIM_FILE if legacy else OPTIM_FILE
    for name in (MODEL_FILE, optim, STATE_FILE):
        if not (path / name).is_file():
            raise ValueError(f"checkpoint {path} is incomplete: {name} is missing")
    return optim


def verify_checkpoint(path: str | Path) -> None:
    """Check that a checkpoint directory is complete and that its model and optimizer files are the bytes
    ``SHA256SUMS`` recorded when they were written (what :func:`load_checkpoint` checks first; a multi-GB read).

    Raises:
        ValueError: the directory is incomplete, or a file is damaged (names it).
    """
    path = Path(path)
    _optimizer_file(path)
    _verify(path, lambda n: n != STATE_FILE)


def load_checkpoint(path: str | Path, *, verify: bool = True) -> LoadedCheckpoint:
    """Read a checkpoint directory written by :func:`save_checkpoint`: its state, and its model file opened for
    :class:`ModelTensors` to read each tensor when it is looked up (close it, or use it in a ``with`` block).

    ``verify=False`` skips :func:`verify_checkpoint`'s hashing of the model and optimizer files, for a caller that
    has just run it (or had rank 0 run it for the machine: :meth:`ida_eval.parallel.Ranks.once_per_machine`).

    Raises:
        ValueError: the directory is incomplete (names the missing file) or a file is damaged (names it): it
            cannot be read, or its bytes differ from the sha256 recorded in ``SHA256SUMS`` when it was written.
    """
    path = Path(path)
    legacy = _optimizer_file(path) == LEGACY_OPTIM_FILE
    if verify:
        _verify(path, lambda n: n != STATE_FILE)
    trainer_state = read_trainer_state(path)  # checks its own file
    if legacy:
        optimizer_state = _read_legacy_optimizer_state(path)
    else:
        try:
            optimizer_state = read_optimizer_state(path / OPTIM_FILE)
        except ValueError as exc:  # its line names the file: _damaged names it once
            raise _damaged(path, OPTIM_FILE, str(exc).removeprefix(f"{path / OPTIM_FILE}: ")) from exc
    tensors = ModelTensors(path / MODEL_FILE)  # the codec's reader names a damaged file itself
    return LoadedCheckpoint(path, tensors, optimizer_state, trainer_state)


def _read_legacy_optimizer_state(path: Path) -> dict[str, Any]:
    """``optimizer.pt`` of an ida before 2026-12-07."""
    try:
        # tensors, numbers, strings and containers only (torch's weights-only unpickler: no code runs from the
        # file); mapped, not read, as read_optimizer_state's
        optimizer_state = torch.load(path / LEGACY_OPTIM_FILE, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:  # an object the weights-only unpickler does not construct
        raise ValueError(
            f"{path / LEGACY_OPTIM_FILE} holds objects other than tensors, numbers and strings "
            f"({_first_sentence(exc)}): ida never writes such a file and runs no code from one"
        ) from exc
    except (RuntimeError, EOFError, ValueError) as exc:  # zip and storage errors: a torn or damaged file
        raise _damaged(path, LEGACY_OPTIM_FILE, exc) from exc
    if holds_shards(optimizer_state):  # torch's weights-only unpickler accepts DTensors
        raise ValueError(
            f"cannot resume from {path}: its {LEGACY_OPTIM_FILE} holds one process's shard of the optimizer state "
            f"(an FSDP run of an older ida wrote it). Start a new run from its weights: --base {path}"
        )
    skeleton, leaves = flatten_state(optimizer_state)
    return unflatten_state(skeleton, {n: _unmapped_if_small(t) for n, t in leaves.items()})


def parse_prefix_mapping(spec: str) -> Callable[[str], str]:
    """``"old=new"`` -> a rename function replacing a leading ``old`` with ``new`` (identity for ``""``)."""
    from mxfp8_codec import prefix_mapping

    if not spec:
        return lambda name: name
    old, _, new = spec.partition("=")
    return prefix_mapping({old: new})


def export_checkpoint(
    ckpt_dir: str | Path, export_dir: str | Path, *, rename: Mapping[str, str] | Callable[[str], str] | None = None
) -> dict[str, Any]:
    """Publish a checkpoint: header-only rename of ``model.safetensors`` plus the transformers files.

    Args:
        ckpt_dir: a checkpoint directory.
        export_dir: the publishable directory (replaced atomically if it exists).
        rename: tensor-name mapping or function (default: identity; the header is still rewritten and
            every tensor's sha256 checked).

    Returns:
        The manifest written to ``export_manifest.json``: per tensor ``old``, ``new``, ``sha256``, and the
        whole data section's ``data_sha256``.

    Raises:
        mxfp8_codec.MXFP8Error: a weight or side file of ``ckpt_dir`` differs from the sha256 its ``SHA256SUMS``
            recorded when it was written, or a tensor's bytes differ after the rename.
    """
    from mxfp8_codec import rename_tensors
    from mxfp8_codec.checkpoint import check_sums, copy_side_files

    ckpt_dir, export_dir = Path(ckpt_dir), Path(export_dir)
    check_sums(ckpt_dir)  # the weights and side files are the bytes the trainer wrote, before copying
    with atomic_directory(export_dir, overwrite=True) as tmp:  # complete under its name, or the old one
        report = rename_tensors(ckpt_dir / MODEL_FILE, tmp / MODEL_FILE, rename or (lambda n: n))
        copy_side_files(ckpt_dir, tmp)  # the codec's side-file policy: no weights, no training state
        manifest = {
            "source": str(ckpt_dir),
            "data_sha256": report.data_sha256,
            "tensors": [{"old": old, "new": new, "sha256": sha} for old, new, sha in report.tensors],
        }
        atomic_write_text(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1) + "\n")
        write_sums(tmp, sync=True)
    return manifest
