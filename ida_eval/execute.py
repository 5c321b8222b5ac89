"""Execute MBXP completions in the sandbox and write mxeval-compatible results, crash-safely.

The program for one sample is mxeval's: ``prompt + completion + "\\n" + test + "\\n" +
f"check({entry_point})"`` (texts untouched, tabs intact). Each program runs in its own sandboxed
interpreter (:mod:`ida_eval.sandbox`); ``workers`` run at once, each in its own slot (uid, cgroup).

Results are mxeval's records — the sample plus ``passed`` (bool) and ``result`` (``"passed"``,
``"timed out"`` or ``"failed: <reason>"``; for an exception the reason is the traceback's last
line, e.g. ``"failed: AssertionError"`` or ``"failed: NameError: name 'root' is not defined"``) —
plus ``kind`` (the :class:`~ida_eval.failures.ResultKind` decided with the verdict, e.g.
``"exception"``, ``"early_exit"``, ``"compile_timeout"``: what summaries and failure analysis read;
the text is for mxeval compatibility and is never parsed back), ``completion_id`` (the sample's
ordinal among its task's samples), ``exit_status``,
``exception`` (type name or None), ``time_elapsed`` (ms), ``stderr_tail`` (last bytes of stderr),
``output_bytes``, ``isolation`` and ``toolchain`` (the version line of what ran it,
:func:`ida_eval.toolchains.toolchain_version`, e.g. ``"Python 3.11.7"``, ``"javac 17.0.15"``).

Crash safety: each record is appended to ``out_path`` as one JSON line (one ``write``, then
``fsync``) the moment its program finishes; rerunning with the same ``out_path`` reads the file
back, skips every ``(task_id, completion_id)`` already there and executes only the rest. A line
cut short by a crash (no trailing newline) is dropped with a warning; any other malformed line is
an error naming the file and line. Records written before the ``kind`` field existed get theirs from
:func:`ida_eval.failures.with_kind` as the file is read (the one legacy reader of result texts).

pass@1 with ``n`` samples per task is the unbiased estimator ``mean_task(c / n)``; with one greedy
sample per task it is the fraction of tasks passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import queue
import re
import signal
import sys
import threading
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ida_common.cli import ArgumentParser, CannotRunHere, Run, check_output_file, run_main
from ida_common.files import atomic_write_text
from ida_common.jsonl import dumps_utf8, iter_jsonl, repair_torn_tail
from ida_eval.analysis import task_counts
from ida_eval.failures import EXCEPTION_LINE, ResultKind, Verdict, record_kind, result_class, with_kind
from ida_eval.isolation import ISOLATION_LEVELS, isolation_description, probe_isolation
from ida_eval.languages import LANGUAGES, Language, LanguageError, assemble, environment, language_of, missing_tools
from ida_eval.precompiled import compile_command
from ida_eval.problems import ProblemsError, find_problems_file, load_problems, problem_sha256
from ida_eval.sandbox import close_job_servers, run_program, sweep_stale
from ida_eval.sandbox_types import (
    DEFAULT_LIMITS,
    MiB,
    ProgramJob,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    check_seconds,
)
from ida_eval.stats import mean_pass_at_k
from ida_eval.toolchains import toolchain_version

__all__ = [
    "ExecutionConfig",
    "ProblemsError",
    "ResultsFileError",
    "SandboxError",
    "build_program",
    "execute_samples",
    "isolation_in_force",
    "load_problems",
    "load_samples",
    "main",
    "pass_at_1",
    "result_class",
    "seconds_arg",
    "summarize",
]

DEFAULT_TIMEOUT_S = 30.0  # MBPP/123 takes up to 18 s on two busy cores
REASON_CHARS = 300  # longest "failed: <reason>" text kept
MAX_LISTED_TASKS = 20  # task ids listed in a summary (the rest are only counted)
COMPILE_ERROR_LINES = 5  # compiler output lines kept in a "compile error" result
# the messages MBXP / HumanEval tests raise on a wrong value, in every language ("Exception -- test
# case 2 did not pass", "Error at 3th assert statement", JavaScript's failing message builder, whose
# JSON.stringify(x) of an undefined x throws "x is not defined")
_ERROR_LINE = re.compile(
    r"Error\b|Exception\b|^panic:|error:|Uncaught|terminate called|^what\(\)|Fatal"
)  # a crash's message
_JVM_WARNING = re.compile(r"\S.* VM warning: ")  # e.g. kotlinc 1.3 on JDK 17 (deprecated -noverify), before any error
_TEST_FAILURE = re.compile(
    r"test case \d+|\d+th assert statement|\bx is not defined|Error at test case|assertion failed"
)


class ResultsFileError(ValueError):
    """A results (resume) or samples file is malformed or belongs to different samples."""


def _nproc() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class ExecutionConfig:
    """How samples are executed (validated on construction).

    Attributes:
        timeout: wall-clock seconds per program (default 30: MBPP/123 needs up to 18 s under load).
        workers: programs run at once (default: the CPUs this process may use).
        memory_bytes: address-space limit per process (``RLIMIT_AS``).
        max_processes: processes per program (pids cgroup and/or ``RLIMIT_NPROC``).
        open_files: ``RLIMIT_NOFILE``.
        file_size_bytes: largest file a program may write (``RLIMIT_FSIZE``).
        disk_bytes: all a program may write together (its private tmpfs; namespaces only).
        max_output_bytes: stdout + stderr bytes after which a program is killed and failed.
        tail_bytes: stderr bytes kept in each result record.
        isolation: ``"auto"`` (strongest available) or one of ``namespaces``, ``setuid``, ``rlimits``.
        hash_seed: ``PYTHONHASHSEED`` for reproducible runs (None: a literal ``python -I``).
        site_packages: let programs import site-packages (default: standard library only).
        tmp_root: directory for the per-program work directories (default: system temp).
    """

    timeout: float = DEFAULT_TIMEOUT_S
    workers: int = dataclasses.field(default_factory=_nproc)
    memory_bytes: int = DEFAULT_LIMITS.memory_bytes
    max_processes: int = DEFAULT_LIMITS.max_processes
    open_files: int = DEFAULT_LIMITS.open_files
    file_size_bytes: int = DEFAULT_LIMITS.file_size_bytes
    disk_bytes: int = DEFAULT_LIMITS.disk_bytes
    max_output_bytes: int = DEFAULT_LIMITS.max_output_bytes
    tail_bytes: int = DEFAULT_LIMITS.tail_bytes
    isolation: str = "auto"
    hash_seed: int | None = DEFAULT_LIMITS.hash_seed
    site_packages: bool = DEFAULT_LIMITS.site_packages
    tmp_root: str | None = None
    compile_timeouts: tuple[tuple[str, float], ...] = ()
    run_timeouts: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for what, pairs in (("compile_timeouts", self.compile_timeouts), ("run_timeouts", self.run_timeouts)):
            for lang, seconds in pairs:
                if lang != "all" and lang not in LANGUAGES:
                    raise ValueError(f"{what}: unknown language {lang!r} (known: all, {', '.join(LANGUAGES)})")
                check_seconds(seconds, f"{what}: {lang}")
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or not 1 <= self.workers <= 256:
            raise ValueError(f"workers must be an int in [1, 256], got {self.workers!r}")
        if self.isolation != "auto" and self.isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation must be 'auto' or one of {ISOLATION_LEVELS}, got {self.isolation!r}")
        if self.tmp_root is not None and not Path(self.tmp_root).is_dir():
            raise ValueError(f"tmp_root {self.tmp_root!r} is not a directory")
        self.limits()  # validates the resource limits

    def limits(self) -> SandboxLimits:
        """The per-program :class:`~ida_eval.sandbox.SandboxLimits` of this config (Python)."""
        return SandboxLimits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SandboxLimits)})

    def compile_timeout(self, lang: Language) -> float:
        """Compile seconds for ``lang``: its ``compile_timeouts`` entry, else ``all``'s, else its default."""
        given = dict(self.compile_timeouts)
        return float(given.get(lang.name, given.get("all", lang.compile_timeout)))

    def run_timeout(self, lang: Language) -> float:
        """Run seconds for ``lang``: its ``run_timeouts`` entry, else ``all``'s, else its default
        (Python: ``timeout``)."""
        given = dict(self.run_timeouts)
        default = self.timeout if lang.name == "python" else lang.run_timeout
        return float(given.get(lang.name, given.get("all", default)))

    def language_limits(self, lang: Language) -> SandboxLimits:
        """The limits of one ``lang`` program: this config's, with the language's run timeout and
        its needs where they exceed the config's (a JVM or ``go build`` runs dozens of threads)."""
        return dataclasses.replace(
            self.limits(),
            timeout=self.run_timeout(lang),
            max_processes=max(self.max_processes, lang.max_processes),
            memory_bytes=(
                max(self.memory_bytes, lang.memory_bytes)
                if self.memory_bytes == DEFAULT_LIMITS.memory_bytes
                else self.memory_bytes  # a limit the user chose applies to every language
            ),
            open_files=max(self.open_files, 1024),
        )


def isolation_in_force(isolation: str = "auto") -> str:
    """Describe the isolation programs get on this machine, e.g.
    ``"namespaces: unshare(net,pid,mount)+read-only fs+..."`` (probed once per process)."""
    return isolation_description(probe_isolation(isolation))


def build_program(problem: Mapping[str, Any], completion: str) -> str:
    """mxeval's program: ``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"``."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


# ---------------------------------------------------------------------------------------------
# Verdicts


def _exception_line(stderr: str) -> str | None:
    start = stderr.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    for line in reversed(stderr[start:].splitlines()):
        if line and not line[0].isspace() and EXCEPTION_LINE.match(line) and not line.startswith("Traceback"):
            return line
    return None


def _verdict(res: SandboxResult, max_output: int) -> Verdict:
    """The verdict of a Python program run: its kind, mxeval's result text and the exception's type name."""
    if res.timed_out:
        return Verdict(ResultKind.TIMEOUT, "timed out")  # mxeval's text
    if res.output_exceeded:
        return Verdict(ResultKind.OUTPUT_LIMIT, f"failed: output limit exceeded (over {max_output} bytes)")
    if res.passed:
        return Verdict(ResultKind.PASSED, "passed")
    exc = _exception_line(res.stderr_tail)
    exc_name = EXCEPTION_LINE.match(exc).group(1) if exc else None  # type: ignore[union-attr]
    if res.finished:
        kind, reason = ResultKind.EXIT_STATUS, f"exit status {res.exit_status} after check() returned"
    elif exc and res.disk_full:
        kind, reason = ResultKind.EXCEPTION, f"{exc} (disk limit reached)"
    elif exc:
        kind, reason = ResultKind.EXCEPTION, exc
    elif res.exit_status is not None and res.exit_status < 0:
        kind, reason = ResultKind.KILLED, _killed_by(res)
    elif res.exit_status == 0:
        kind, reason = ResultKind.EARLY_EXIT, "exited with status 0 before check() returned"
    else:
        kind, reason = ResultKind.EXIT_STATUS, f"exit status {res.exit_status} without a traceback"
    return Verdict(kind, "failed: " + reason[:REASON_CHARS], exc_name)


def _killed_by(res: SandboxResult) -> str:
    try:
        name = signal.Signals(-res.exit_status).name  # type: ignore[operator]
    except ValueError:
        name = f"signal {-res.exit_status}"  # type: ignore[operator]
    return f"killed by {name}" + (" (out of memory: cgroup limit)" if res.oom_killed else "")


def _job_verdict(lang: Language, res: SandboxResult, max_output: int) -> Verdict:
    """The verdict of a :class:`~ida_eval.sandbox.ProgramJob` run (another language; no exception name)."""
    if res.compile_timed_out:
        return Verdict(ResultKind.COMPILE_TIMEOUT, "timed out (compile)")
    if lang.compiled and res.compile_ok is False:
        lines = [ln for ln in res.compile_output.strip().splitlines() if not _JVM_WARNING.match(ln)]
        head = "\n".join(lines[:COMPILE_ERROR_LINES])
        status = f"exit status {res.compile_status}" if res.compile_status is not None else "no status"
        return Verdict(ResultKind.COMPILE_ERROR, ("failed: compile error: " + (head or status))[:REASON_CHARS])
    if res.timed_out:
        return Verdict(ResultKind.TIMEOUT, "timed out")  # mxeval's text
    if res.output_exceeded:
        return Verdict(ResultKind.OUTPUT_LIMIT, f"failed: output limit exceeded (over {max_output} bytes)")
    if res.passed:
        return Verdict(ResultKind.PASSED, "passed")
    lines = [ln.strip() for ln in res.stderr_tail.splitlines() if ln.strip()]
    failed_check = next((ln for ln in lines if _TEST_FAILURE.search(ln)), None)
    if res.exit_status == 0:
        return Verdict(ResultKind.EARLY_EXIT, "failed: exited with status 0 before the test driver finished")
    if failed_check is not None:
        return Verdict(ResultKind.WRONG_ANSWER, f"failed: wrong answer: {failed_check}"[:REASON_CHARS])
    if res.exit_status is not None and res.exit_status < 0:
        status = _killed_by(res)
    else:
        status = f"exit status {res.exit_status}"
    error = next((ln for ln in lines if _ERROR_LINE.search(ln)), lines[-1] if lines else "")
    text = f"failed: runtime error: {status}" + (f": {error}" if error else "")
    return Verdict(ResultKind.RUNTIME_ERROR, text[:REASON_CHARS])


# ---------------------------------------------------------------------------------------------
# Samples and results files


def load_samples(path: str | Path, problems: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Read an mxeval samples JSONL file (``task_id``, ``completion``; other keys kept).

    Raises:
        ResultsFileError: bad JSON, missing/mistyped keys or a task id not in ``problems``,
            naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultsFileError(f"{path}: samples file not found")
    samples: list[dict[str, Any]] = []
    with open(path, "rb") as f:  # bytes: iter_jsonl decodes each line, so bad UTF-8 names its line
        for _, where, obj in iter_jsonl(f, path, ResultsFileError):
            _check_sample(obj, problems, where)
            samples.append(obj)
    return samples


def _check_sample(obj: Mapping[str, Any], problems: Mapping[str, Any], where: str) -> None:
    for key in ("task_id", "completion"):
        if not isinstance(obj.get(key), str):
            raise ResultsFileError(f"{where}: {key!r} missing or not a string")
    if obj["task_id"] not in problems:
        raise ResultsFileError(f"{where}: unknown task_id {obj['task_id']!r} (not in the problems file)")


def read_results(path: Path) -> dict[tuple[str, int], tuple[int, dict[str, Any]]]:
    """Existing records of a results file, keyed by (task_id, completion_id) -> (line, record); an
    absent file has none."""
    done: dict[tuple[str, int], tuple[int, dict[str, Any]]] = {}
    data = repair_torn_tail(path)
    for lineno, where, rec in iter_jsonl(data.splitlines(), path, ResultsFileError, what="results line"):
        for key, typ in (("task_id", str), ("completion", str), ("passed", bool), ("result", str)):
            if not isinstance(rec.get(key), typ):
                raise ResultsFileError(f"{where}: {key!r} missing or not a {typ.__name__}")
        cid = rec.get("completion_id")
        if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
            raise ResultsFileError(f"{where}: 'completion_id' missing or not a non-negative int")
        try:
            rec = with_kind(rec)  # records written before the "kind" field: read by the one legacy parser
        except ValueError as e:
            raise ResultsFileError(f"{where}: {e}") from None
        key_ = (rec["task_id"], cid)
        if key_ in done:
            raise ResultsFileError(f"{where}: duplicate result for {key_[0]} sample {cid} (also line {done[key_][0]})")
        done[key_] = (lineno, rec)
    return done


def _append(fd: int, record: Mapping[str, Any]) -> None:
    line = (dumps_utf8(record) + "\n").encode("utf-8")
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


# ---------------------------------------------------------------------------------------------
# The API


def _run_one(
    problem: Mapping[str, Any],
    sample: Mapping[str, Any],
    config: ExecutionConfig,
    slots: queue.SimpleQueue[int],
    cancel: threading.Event,
) -> dict[str, Any]:
    record = {**sample, "problem_sha256": problem_sha256(problem)}  # what the verdict was made against
    try:
        lang = LANGUAGES[language_of(sample, problem)]
        if not isinstance(problem.get("test"), str):
            raise LanguageError(f"task {sample['task_id']} has no test")
        job = None
        if lang.name != "python":
            missing = _missing_tools(lang)
            if missing:
                text = f"toolchain missing: {', '.join(missing)} not found ({lang.name})"
                record.update(_not_run(lang.name, Verdict(ResultKind.TOOLCHAIN_MISSING, text)))
                return record
            compile_argv, read_only = compile_command(lang, probe_isolation(config.isolation), config.tmp_root)
            job = ProgramJob(
                files=assemble(lang, problem, sample["completion"]),
                run=lang.run,
                compile=compile_argv,
                compile_timeout=config.compile_timeout(lang) if lang.compiled else 0.0,
                compile_ok=lang.compile_ok,
                compile_output_file=lang.compile_output_file,
                env=environment(lang),
                read_only=read_only,
            )
    except LanguageError as e:
        language = str(sample.get("language") or problem.get("language") or "unknown")
        record.update(_not_run(language, Verdict(ResultKind.BAD_INPUT, f"failed: bad input: {e}")))
        return record
    record["language"] = lang.name
    slot = slots.get()
    try:
        iso = probe_isolation(config.isolation)
        res = run_program(
            build_program(problem, sample["completion"]) if job is None else job,
            config.limits() if job is None else config.language_limits(lang),
            isolation=iso,
            slot=slot,
            tmp_root=config.tmp_root,
            cancel=cancel,
        )
    finally:
        slots.put(slot)
    if job is None:
        verdict = _verdict(res, config.max_output_bytes)
    else:
        verdict = _job_verdict(lang, res, config.max_output_bytes)
    fields = verdict.fields()
    record.update(
        passed=fields["passed"],
        result=fields["result"],
        kind=fields["kind"],
        exit_status=res.exit_status,
        exception=fields["exception"],
        time_elapsed=round(res.elapsed_s * 1000.0, 1),
        stderr_tail=res.stderr_tail,
        output_bytes=res.output_bytes,
        isolation=iso.level,
        toolchain=toolchain_version(lang),
    )
    if job is not None and lang.compiled:
        record.update(compile_status=res.compile_status, compile_time=round(res.compile_s * 1000.0, 1))
    return record


def _not_run(language: str, verdict: Verdict) -> dict[str, Any]:
    """The result fields of a sample that was not run (no toolchain, bad input)."""
    fields = verdict.fields()
    return {
        "language": language,
        "passed": fields["passed"],
        "result": fields["result"],
        "kind": fields["kind"],
        "exit_status": None,
        "exception": fields["exception"],
        "time_elapsed": None,
        "stderr_tail": "",
        "output_bytes": 0,
        "isolation": None,
        "toolchain": None,
    }


def _languages_that_run(samples: Sequence[Mapping[str, Any]], problems: Mapping[str, Any]) -> set[Language]:
    """The languages of ``samples`` whose toolchain is here (a sample of an unknown language is left to its
    worker, which records it as bad input)."""
    out = set()
    for s in samples:
        try:
            lang = LANGUAGES[language_of(s, problems.get(s["task_id"], {}))]
        except LanguageError:
            continue
        if lang.name == "python" or not _missing_tools(lang):
            out.add(lang)
    return out


@functools.cache
def _missing_tools(lang: Language) -> tuple[str, ...]:
    return tuple(missing_tools(lang))


def canonical_samples(problems: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One sample per problem that has a ``canonical_solution`` (file order): the anchors' input.
    Samples-only files (go, perl, scala) give an empty list."""
    return [
        {
            "task_id": tid,
            "completion": p["canonical_solution"],
            **({"language": p["language"]} if p.get("language") else {}),
        }
        for tid, p in problems.items()
        if isinstance(p.get("canonical_solution"), str)
    ]


def execute_samples(
    problems: Mapping[str, Mapping[str, Any]],
    samples: Sequence[Mapping[str, Any]] | None = None,
    *,
    out_path: str | Path | None = None,
    config: ExecutionConfig | None = None,
    canonical: bool = False,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Execute samples against their problems' tests, each program in its own sandbox.

    Args:
        problems: ``{task_id: problem}`` as returned by :func:`load_problems`.
        samples: dicts with ``task_id`` and ``completion`` (other keys are kept in the results).
        out_path: results JSONL; records are appended as they finish, and a rerun with the same
            path resumes (finished ``(task_id, completion_id)`` pairs are not executed again).
        config: limits, workers, isolation (default :class:`ExecutionConfig()`).
        canonical: execute every problem's ``canonical_solution`` instead (``samples`` must be None).
        progress: show a tqdm progress bar.

    Returns:
        One result record per sample, in the order of ``samples`` (see the module docstring).

    Raises:
        ValueError (ResultsFileError, ProblemsError): a sample with an unknown task id or missing
            keys, a problem without ``canonical_solution`` in canonical mode, a malformed results
            file or one recorded for different completions.
        SandboxError: the sandbox cannot be set up on this machine.

    Example:
        >>> problems = load_problems("../shared/mbxp/mbpp_release_v1.jsonl")  # doctest: +SKIP
        >>> res = execute_samples(problems, [{"task_id": "MBPP/2", "completion": "    return 1\\n"}])  # doctest: +SKIP
        >>> res[0]["passed"], res[0]["result"]  # doctest: +SKIP
        (False, 'failed: AssertionError')
    """
    config = config if config is not None else ExecutionConfig()
    if canonical:
        if samples:
            raise ValueError("pass either samples or canonical=True, not both")
        samples = canonical_samples(problems)
        if not samples:
            raise ProblemsError("no problem has a canonical_solution to execute (samples-only file)")
    if samples is None:
        raise ValueError("samples is required unless canonical=True")

    items: list[dict[str, Any]] = []
    per_task: Counter[str] = Counter()
    seen: set[tuple[str, int]] = set()
    for i, s in enumerate(samples):
        _check_sample(s, problems, f"sample {i}")
        rec = dict(s)
        cid = s.get("completion_id")  # a sample's own number, else the next of its task (mxeval's order)
        if cid is None:
            cid = per_task[s["task_id"]]
        elif not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
            raise ResultsFileError(f"sample {i}: 'completion_id' must be a non-negative int, got {cid!r}")
        if (s["task_id"], cid) in seen:
            raise ResultsFileError(f"sample {i}: {s['task_id']} sample {cid} appears twice among the samples")
        seen.add((s["task_id"], cid))
        per_task[s["task_id"]] = max(per_task[s["task_id"]], cid + 1)
        rec["completion_id"] = cid
        items.append(rec)

    results: list[dict[str, Any] | None] = [None] * len(items)
    todo: list[int] = []
    path = Path(out_path) if out_path is not None else None
    if path is not None:
        done = read_results(path)
        digests: dict[str, str] = {}  # task_id -> problem_sha256, as needed
        wanted = {(r["task_id"], r["completion_id"]): i for i, r in enumerate(items)}
        for key, (lineno, rec) in done.items():
            i = wanted.get(key)
            if i is None:
                warnings.warn(
                    f"{path}:{lineno}: {key[0]} sample {key[1]} is not among the samples; ignored", stacklevel=2
                )
                continue
            if rec["completion"] != items[i]["completion"]:
                raise ResultsFileError(
                    f"{path}:{lineno}: {key[0]} sample {key[1]} was executed with a different completion; "
                    "use a fresh results file"
                )
            if key[0] not in digests:
                digests[key[0]] = problem_sha256(problems[key[0]])
            if rec.get("problem_sha256", digests[key[0]]) != digests[key[0]]:  # (older records carry none)
                raise ResultsFileError(
                    f"{path}:{lineno}: {key[0]} sample {key[1]} was executed against another problem (its prompt "
                    "or tests differ from the ones given now); use a fresh results file"
                )
            results[i] = rec
    todo = [i for i, r in enumerate(results) if r is None]
    if path is not None and len(todo) < len(items):
        print(
            f"resumed: {len(items) - len(todo)} of {len(items)} already done (execution, {path})",
            file=sys.stderr,
            flush=True,
        )
    if not todo:
        return [r for r in results if r is not None]

    probe_isolation(config.isolation)  # probe (and warn) once, before the workers start
    for lang in _languages_that_run([items[i] for i in todo], problems):
        toolchain_version(lang)  # each version command once, before the workers ask (kotlinc's starts a JVM)
    sweep_stale(config.tmp_root)  # work dirs / cgroups of runners that were killed
    slots: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(config.workers):
        slots.put(slot)
    fd = -1
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="execute", unit="prog", disable=not progress)
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="ida-exec")
    cancel = threading.Event()
    try:
        pending: dict[Future[dict[str, Any]], int] = {}
        queued = iter(todo)
        for i in queued:  # keep at most 2 x workers submitted, so an interrupt loses little
            pending[pool.submit(_run_one, problems[items[i]["task_id"]], items[i], config, slots, cancel)] = i
            if len(pending) >= 2 * config.workers:
                break
        n_passed = 0
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = pending.pop(fut)
                rec = fut.result()
                results[i] = rec
                n_passed += rec["passed"]
                if fd >= 0:
                    _append(fd, rec)
                bar.update(1)
                bar.set_postfix(passed=n_passed, refresh=False)
                nxt = next(queued, None)
                if nxt is not None:
                    pending[
                        pool.submit(_run_one, problems[items[nxt]["task_id"]], items[nxt], config, slots, cancel)
                    ] = nxt
    except BaseException:  # Ctrl-C, a sandbox failure: stop the other programs at once
        cancel.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        close_job_servers()  # and their cgroups
        bar.close()
        if fd >= 0:
            os.close(fd)
    return [r for r in results if r is not None]


# ---------------------------------------------------------------------------------------------
# Summaries and the CLI


def pass_at_1(results: Sequence[Mapping[str, Any]]) -> float:
    """Unbiased pass@1 over tasks (:func:`ida_eval.stats.mean_pass_at_k` with k = 1: the mean of
    passed samples / samples, the number mxeval reports); 0.0 without results."""
    counts = task_counts(results)
    return mean_pass_at_k(counts, 1) if counts else 0.0


def summarize(results: Sequence[Mapping[str, Any]], problems: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """pass@1, counts per result class, the tasks without a sample and the isolation used.

    ``isolation`` is always a list: the sorted mode names the results ran under (``"unknown"`` for a
    record without one), empty when there are no results (no program ran, so none was isolated).
    ``toolchains`` likewise lists the toolchain version lines the results ran under (more than one per
    language: a results file resumed on a machine with other versions), leaving out records without one
    (not run, or written before 2026-12-08).
    ``missing_tasks_count`` counts the tasks of ``problems`` without any sample and
    ``missing_tasks_first`` lists the first :data:`MAX_LISTED_TASKS` of them in ``problems`` order.
    ``pass@1_all_problems`` counts those tasks as failed.

    Samples whose language has no toolchain here (``toolchain missing``) are no model failure:
    ``toolchain_missing`` counts them, ``pass@1_runnable`` is pass@1 over the other samples'
    tasks (None when no sample could run: there is no score to give; ``pass@1`` stays over all, as
    mxeval's), and ``languages`` gives pass@1, samples, passed and toolchain-missing counts per language
    (records without a ``language`` are python's).
    """
    tasks = {r["task_id"] for r in results}
    missing = [t for t in problems if t not in tasks] if problems is not None else []
    p1 = pass_at_1(results)
    out: dict[str, Any] = {
        "pass@1": p1,
        "samples": len(results),
        "tasks": len(tasks),
        "passed": sum(bool(r["passed"]) for r in results),
        "timed_out": sum(record_kind(r) is ResultKind.TIMEOUT for r in results),
        "result_classes": dict(Counter(result_class(r) for r in results).most_common()),
        "isolation": sorted(
            {str(r.get("isolation", "unknown")) for r in results if r.get("isolation", "") is not None}
        ),
        "toolchains": sorted({str(r["toolchain"]) for r in results if r.get("toolchain")}),
        "missing_tasks_count": len(missing),
        "missing_tasks_first": missing[:MAX_LISTED_TASKS],
    }
    if problems is not None and problems:
        out["pass@1_all_problems"] = p1 * len(tasks) / len(problems)
    runnable = [r for r in results if record_kind(r) is not ResultKind.TOOLCHAIN_MISSING]
    out["toolchain_missing"] = len(results) - len(runnable)
    out["pass@1_runnable"] = pass_at_1(runnable) if runnable else None
    out["timed_out_compile"] = sum(record_kind(r) is ResultKind.COMPILE_TIMEOUT for r in results)
    by_lang: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        by_lang[str(r.get("language") or "python")].append(r)
    out["languages"] = {
        lang: {
            "pass@1": pass_at_1(rs),
            "samples": len(rs),
            "passed": sum(bool(r["passed"]) for r in rs),
            "toolchain_missing": sum(record_kind(r) is ResultKind.TOOLCHAIN_MISSING for r in rs),
        }
        for lang, rs in sorted(by_lang.items())
    }
    return out


def seconds_arg(text: str) -> float:
    """argparse type of a time limit: :func:`ida_eval.sandbox_types.check_seconds` on the number (``inf``, ``nan``,
    ``0`` and ``1e300`` are refused at parse time, in one line, before any work)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        return check_seconds(value, "a time limit")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(
        prog="python -m ida_eval.execute",
        short_prog=PROG,
        description="Execute MBXP completions (or canonical solutions) in a sandbox; print pass@1. "
        "Exit status: 0 done, 2 bad input, 3 no sandbox here, 130 interrupted (docs/cli.md).",
    )
    ap.add_argument("--problems", help="problems JSONL (default: an installed mxeval's MBXP Python data)")
    ap.add_argument("--samples", help="samples JSONL (task_id, completion)")
    ap.add_argument("--out", required=True, help="results JSONL (appended; a rerun resumes)")
    ap.add_argument("--canonical", action="store_true", help="execute each problem's canonical_solution")
    ap.add_argument("--workers", type=int, default=None, help="programs at once (default: nproc)")
    ap.add_argument(
        "--timeout", type=seconds_arg, default=DEFAULT_TIMEOUT_S, help="seconds per Python program (default 30)"
    )
    ap.add_argument(
        "--run-timeout",
        action="append",
        default=[],
        metavar="LANG=S",
        help="run seconds for a language (or all), e.g. java=60; repeatable (defaults: ida_eval.languages)",
    )
    ap.add_argument(
        "--compile-timeout",
        action="append",
        default=[],
        metavar="LANG=S",
        help="compile seconds for a language (or all), e.g. kotlin=200; repeatable",
    )
    ap.add_argument(
        "--memory-mb",
        type=int,
        default=DEFAULT_LIMITS.memory_bytes // MiB,
        help="address-space limit per process in MiB",
    )
    ap.add_argument(
        "--isolation",
        default="auto",
        choices=("auto", *ISOLATION_LEVELS),
        help="sandbox isolation (default auto: the strongest this machine allows)",
    )
    ap.add_argument("--summary", help="also write the summary as JSON to this path")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.canonical == bool(args.samples):
        ap.error("give exactly one of --samples or --canonical")
    for flag in ("run_timeout", "compile_timeout"):
        pairs = []
        for item in getattr(args, flag):
            lang, _, value = item.partition("=")
            try:
                pairs.append((lang.strip(), seconds_arg(value)))
            except argparse.ArgumentTypeError as err:
                ap.error(f"--{flag.replace('_', '-')} wants LANG=SECONDS, got {item!r}: {err}")
        setattr(args, flag, tuple(pairs))
    return args


PROG = "ida_eval.execute"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit code (0 ok, 2 bad input, 3 the sandbox cannot run here,
    130 interrupted: :mod:`ida_common.cli`, docs/cli.md)."""
    return run_main(PROG, _main, argv)


def sandbox_unavailable(err: SandboxError) -> CannotRunHere:
    """The CLI error for a sandbox that cannot run here (status 3): ``sandbox: <reason>``."""
    return CannotRunHere(f"sandbox: {err}")


def _main(run: Run) -> int:
    args = _parse_args(run.argv)
    run.kept = f"finished results are kept in {args.out}: rerun the same command (same --out) to resume"
    check_output_file(args.out, "--out")
    problems = load_problems(find_problems_file(args.problems))
    samples = None if args.canonical else load_samples(args.samples, problems)
    cfg_kwargs: dict[str, Any] = {"timeout": args.timeout, "memory_bytes": args.memory_mb * MiB}
    if args.workers is not None:
        cfg_kwargs["workers"] = args.workers
    config = ExecutionConfig(
        isolation=args.isolation, run_timeouts=args.run_timeout, compile_timeouts=args.compile_timeout, **cfg_kwargs
    )
    try:
        print(f"isolation: {isolation_in_force(args.isolation)}", file=sys.stderr)
        results = execute_samples(
            problems, samples, out_path=args.out, config=config, canonical=args.canonical, progress=not args.no_progress
        )
    except SandboxError as e:
        raise sandbox_unavailable(e) from None
    summary = summarize(results, problems)
    print(
        f"pass@1 = {summary['pass@1']:.4f}  ({summary['passed']}/{summary['samples']} samples passed, {summary['tasks']} tasks)"
    )
    if summary["missing_tasks_count"]:
        print(
            f"no sample for {summary['missing_tasks_count']} of {len(problems)} tasks "
            f"(e.g. {', '.join(summary['missing_tasks_first'][:5])}); "
            f"pass@1 over all problems = {summary['pass@1_all_problems']:.4f}"
        )
    if summary["toolchain_missing"]:
        print(
            f"toolchain missing for {summary['toolchain_missing']} samples (not run); "
            + (
                f"pass@1 over the runnable ones = {summary['pass@1_runnable']:.4f}"
                if summary["pass@1_runnable"] is not None
                else "none could run"
            )
        )
    if len(summary["languages"]) > 1:
        print(
            "by language: "
            + ", ".join(
                f"{k} {v['pass@1']:.4f} ({v['passed']}/{v['samples']})" for k, v in summary["languages"].items()
            )
        )
    print("results by class: " + ", ".join(f"{k}: {v}" for k, v in summary["result_classes"].items()))
    isolation = ", ".join(summary["isolation"]) or "none (nothing ran)"
    ran_by = f"; toolchains: {', '.join(summary['toolchains'])}" if summary["toolchains"] else ""
    print(
        f"timed out: {summary['timed_out']} (compile: {summary['timed_out_compile']}); isolation: {isolation}{ran_by}"
    )
    if args.summary:
        atomic_write_text(args.summary, json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
