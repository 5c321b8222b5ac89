"""The files of an MBXP run directory: their names, the samples file, rank shards and the pin of a run.

A run directory (``python -m ida_eval.mbxp --out DIR``, :func:`ida_eval.harness.evaluate_model`) holds:

* ``samples.jsonl``: mxeval samples (``task_id``, ``completion``; ``completion_id`` in a sampling run) plus
  ``raw`` (the generation before truncation), ``n_tokens`` and ``stop_reason``. Appended batch by batch
  (one write + fsync, :func:`append_samples`), so an interrupted run resumes: samples already there are
  not generated again (a torn last line is dropped, :func:`read_samples`).
* ``samples.rank<R>.jsonl``: under torchrun, what rank R generated, until rank 0 moves it into
  ``samples.jsonl`` (:func:`merge_shards`, idempotent).
* ``results.jsonl``: the executor's mxeval results (:func:`ida_eval.execute.execute_samples`, which resumes
  its own file and never re-executes a finished sample).
* ``summary.json`` and ``summary.png``: the scores, written atomically (:mod:`ida_eval.harness`).
* ``run.json``: the decoding settings, checkpoint hashes and problems this directory holds
  (:func:`run_record`; a problem as the sha256 of what its samples and verdicts depend on,
  :func:`ida_eval.problems.problem_sha256`). Resuming with other settings, another checkpoint or a
  problem whose prompt or tests changed is refused (:func:`check_run_file`) rather than mixing two runs'
  samples; new problems (a larger ``--limit``) join the pins. It is written (:func:`pin_run`) once the
  inputs are validated and work starts, so a call that fails before pins nothing.

A ``--language all`` run has one such directory per language under ``DIR/<language>/`` and
``languages.json`` / ``languages.png`` beside them; ``--compare ... --out DIR`` writes ``comparison.json``
and ``comparison.png``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ida_common.files import atomic_write_text
from ida_common.jsonl import dumps_utf8, iter_jsonl, repair_torn_tail
from ida_eval.decoding import DecodingConfig, Generation
from ida_eval.parallel import shard_paths
from ida_eval.problems import problem_sha256

__all__ = [
    "COMPARISON_FIGURE_FILE",
    "COMPARISON_FILE",
    "FIGURE_FILE",
    "LANGUAGES_FIGURE_FILE",
    "LANGUAGES_FILE",
    "RESULTS_FILE",
    "RUN_FILE",
    "SAMPLES_FILE",
    "SUMMARY_FILE",
    "RunDirError",
    "append_samples",
    "check_run_file",
    "merge_shards",
    "pin_run",
    "pinned_problems",
    "read_samples",
    "run_record",
    "samples_done",
    "write_json_atomic",
]

PROBLEMS_KEY = "problems_sha256"  # run.json: task_id -> problem_sha256 of every problem the run has taken
SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
LANGUAGES_FILE = "languages.json"  # the table over languages of a --language all run
COMPARISON_FILE = "comparison.json"  # --compare ... --out DIR
COMPARISON_FIGURE_FILE = "comparison.png"
FIGURE_FILE = "summary.png"  # pass rates with intervals and failure classes, drawn from summary.json
LANGUAGES_FIGURE_FILE = "languages.png"  # the same over the languages of languages.json


class RunDirError(ValueError):
    """An output directory holds files of a different run, or a malformed samples file."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented UTF-8 JSON, atomically (complete under its name, or not there)."""
    atomic_write_text(path, dumps_utf8(obj, indent=2) + "\n")


def read_samples(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Read ``samples.jsonl`` ((task_id, completion_id) -> record) after
    :func:`~ida_common.jsonl.repair_torn_tail`. A greedy record has no ``completion_id`` (it is 0).

    Raises:
        RunDirError: a malformed complete line, or a (task, sample) pair written twice, naming the file
            and line.
    """
    data = repair_torn_tail(path)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    lines: dict[tuple[str, int], int] = {}
    for lineno, where, rec in iter_jsonl(data.splitlines(), path, RunDirError):
        if not isinstance(rec.get("task_id"), str) or not isinstance(rec.get("completion"), str):
            raise RunDirError(f"{where}: a sample needs string 'task_id' and 'completion'")
        cid = rec.get("completion_id", 0)
        if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
            raise RunDirError(f"{where}: 'completion_id' must be a non-negative integer, got {cid!r}")
        key = (rec["task_id"], cid)
        if key in out:
            raise RunDirError(
                f"{where}: {key[0]} sample {cid} is already on line {lines[key]}; a samples file holds each "
                "(task, sample) once"
            )
        out[key], lines[key] = rec, lineno
    return out


def append_samples(path: Path, gens: Sequence[Generation], *, numbered: bool) -> None:
    """Append generations; ``numbered`` records carry their ``completion_id`` (sampling runs; a greedy
    run's records stay as mxeval's)."""
    _append_records(
        path,
        [
            {
                "task_id": g.task_id,
                **({"completion_id": g.completion_id} if numbered else {}),
                "completion": g.completion,
                "raw": g.raw,
                "n_tokens": g.n_tokens,
                "stop_reason": g.stop_reason,
            }
            for g in gens
        ],
    )


def _append_records(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Append sample records as they are (one write + fsync)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(dumps_utf8(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def merge_shards(out_dir: Path) -> int:
    """Move the samples of rank shards (``samples.rank<R>.jsonl``, :mod:`ida_eval.parallel`) into
    ``samples.jsonl``; returns how many were new. Idempotent: a sample already there is skipped (a
    kill between the append and the shard's removal repeats nothing), a different text under the same
    (task, sample) is an error.

    Raises:
        RunDirError: a malformed shard, or two different samples under one (task, sample).
    """
    shards = shard_paths(out_dir)
    if not shards:
        return 0
    main_path = out_dir / SAMPLES_FILE
    have = read_samples(main_path)
    new: dict[tuple[str, int], dict[str, Any]] = {}
    for shard in shards:
        for key, rec in read_samples(shard).items():
            old = have.get(key) or new.get(key)
            if old is None:
                new[key] = rec
            elif old["completion"] != rec["completion"]:
                raise RunDirError(
                    f"{shard}: {key[0]} sample {key[1]} differs from the one already kept; use a fresh --out directory"
                )
    if new:
        _append_records(main_path, list(new.values()))
    for shard in shards:
        shard.unlink()
    return len(new)


def samples_done(out_dir: Path) -> set[tuple[str, int]]:
    """The (task, sample) pairs already generated: in ``samples.jsonl`` or a rank's shard."""
    done = set(read_samples(out_dir / SAMPLES_FILE))
    for shard in shard_paths(out_dir) if out_dir.is_dir() else []:
        done |= set(read_samples(shard))
    return done


def check_run_file(out_dir: Path, run: dict[str, Any]) -> dict[str, Any] | None:
    """Refuse a run directory that holds a different run: other decoding settings, another checkpoint, or
    a problem it holds whose prompt or tests are not the ones given now (its samples and verdicts came
    from the old ones).

    Writes nothing. Returns what the caller writes to ``run.json`` with :func:`pin_run` once its inputs are
    validated and work is about to start (so a call that fails validation leaves a fresh directory free
    for other settings): ``run`` where the directory is not pinned yet, the pinned record with this run's
    new problems added where it has some (a larger ``--limit``; a directory written before problems were
    pinned gets them now), else None.
    """
    path = out_dir / RUN_FILE
    if not path.is_file():
        if (out_dir / SAMPLES_FILE).is_file():
            raise RunDirError(f"{out_dir}: has {SAMPLES_FILE} but no {RUN_FILE}; use a fresh --out directory")
        return run
    old = json.loads(path.read_text())
    for key in ("decoding", "checkpoint_sha256"):
        if old.get(key) != run.get(key):
            raise RunDirError(
                f"{out_dir}: holds a run with different {key} ({old.get(key)!r} vs now {run.get(key)!r}); "
                "use a fresh --out directory"
            )
    pinned, now = old.get(PROBLEMS_KEY) or {}, run.get(PROBLEMS_KEY) or {}
    changed = [t for t, h in now.items() if pinned.get(t, h) != h]
    if changed:
        t = changed[0]
        raise RunDirError(
            f"{out_dir}: holds samples of other problems: {len(changed)} of the {len(now)} given now differ "
            f"in their prompt or tests ({t}: sha256 {pinned[t][:12]}... there, {now[t][:12]}... now); use a "
            "fresh --out directory, or the problems file this run started with"
        )
    added = {t: h for t, h in now.items() if t not in pinned}
    return {**old, PROBLEMS_KEY: {**pinned, **added}} if added else None


def run_record(
    decoding: DecodingConfig, checkpoint_info: Mapping[str, Any] | None, problems: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What ``run.json`` pins: the decoding settings (but the batch size and the KV cache, which do not
    change greedy output in float32 and may change between resumes), the checkpoint's file hashes and each
    problem's :func:`ida_eval.problems.problem_sha256`."""
    describe = decoding.describe()
    describe.pop("batch_size")
    describe.pop("cache", None)  # like the batch size, the cache may change between resumes
    return {
        "decoding": describe,
        "checkpoint_sha256": _sha_of(checkpoint_info),
        PROBLEMS_KEY: {t: problem_sha256(p) for t, p in problems.items()},
    }


def pinned_problems(run_dir: Path) -> dict[str, str]:
    """task_id -> :func:`problem_sha256` as ``run_dir``'s ``run.json`` pins them ({} where it pins none: no
    ``run.json``, or one written before 2026-12-08)."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text()).get(PROBLEMS_KEY) or {})
    except (AttributeError, TypeError, ValueError) as e:  # (json's decode errors are ValueErrors)
        raise RunDirError(f"{path}: not a run.json ({e})") from None


def pin_run(out_dir: Path, run: dict[str, Any]) -> None:
    """Create the run directory and write ``run.json``: from now on it holds this run only."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / RUN_FILE, run)


def _sha_of(info: Mapping[str, Any] | None) -> list[str] | None:
    if not info:
        return None
    return [f"{f['name']}:{f.get('sha256')}" for f in info.get("files", [])]
