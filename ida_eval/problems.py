"""Read and validate an mxeval problems file (MBXP / multilingual HumanEval JSONL).

Each line is one JSON object. The executor needs ``task_id``, ``prompt``, ``test`` and
``entry_point`` (strings; ``entry_point`` an identifier); ``canonical_solution``,
``language`` and ``description`` are kept when present (``canonical_solution`` may be null: the
go, perl, scala and swift MBXP files ship samples only; a missing or null ``test`` is loaded and
its samples get a "bad input" result). The language of a task is its ``language`` field, else its
task-id prefix (:func:`ida_eval.languages.language_of`). The program executed for a completion is
``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"`` (mxeval's rule), so the
texts are kept byte-for-byte: no stripping, tabs intact.

Where the data comes from (:func:`find_problems_file`): an explicit path; else the copy inside an
installed ``mxeval`` git checkout (``<checkout>/data/mbxp/mbpp_release_v1.jsonl``: mxeval is not on
PyPI and reads its data from the checkout); else an error that says where to get it.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ida_common.jsonl import iter_jsonl

MBXP_PYTHON_FILE = "mbpp_release_v1.jsonl"  # MBXP Python problems (974 tasks) in mxeval's data/mbxp/
MXEVAL_URL = "https://github.com/amazon-science/mxeval"  # upstream of the data (CC BY 4.0)
REQUIRED_KEYS = ("task_id", "prompt", "entry_point")  # what building a program needs (and a test)
OPTIONAL_STR_KEYS = ("canonical_solution", "language", "description", "test")  # string or null when present
PROBLEM_FIELDS = ("prompt", "test", "entry_point", "language")  # what a sample and its verdict depend on
# ``test`` missing or null: loaded, and every sample of that task gets a "bad input" result (the run
# goes on); ``canonical_solution`` null: samples only (the go, perl, scala and swift MBXP files)


class ProblemsError(ValueError):
    """A problems file is missing or malformed; the message names the file and line."""


def _open_lines(path: Path):  # type: ignore[no-untyped-def]
    """The file's lines as bytes: :func:`iter_jsonl` decodes each, so invalid UTF-8 names its line."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _check_problem(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProblemsError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in REQUIRED_KEYS:
        if key not in obj:
            raise ProblemsError(f"{where}: missing key {key!r} (a problem needs {', '.join(REQUIRED_KEYS)})")
        if not isinstance(obj[key], str):
            raise ProblemsError(f"{where}: {key!r} must be a string, got {type(obj[key]).__name__}")
    for key in OPTIONAL_STR_KEYS:
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise ProblemsError(f"{where}: {key!r} must be a string or null, got {type(obj[key]).__name__}")
    if not obj["task_id"]:
        raise ProblemsError(f"{where}: empty task_id")
    if not obj["entry_point"].isidentifier():
        raise ProblemsError(f"{where}: task {obj['task_id']}: entry_point {obj['entry_point']!r} is not an identifier")
    return obj


def load_problems(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read an mxeval problems JSONL file (optionally ``.gz``) into ``{task_id: problem}``.

    Args:
        path: the problems file.

    Returns:
        Problems in file order, each the line's JSON object unchanged.

    Raises:
        ProblemsError: missing file, bad JSON, a missing or mistyped key, a duplicate task id, or
            no problems at all; the message names the file and line.

    Example:
        >>> problems = load_problems("../shared/mbxp/mbpp_release_v1.jsonl")  # doctest: +SKIP
        >>> len(problems), problems["MBPP/1"]["entry_point"]  # doctest: +SKIP
        (974, 'min_cost')
    """
    path = Path(path)
    if not path.is_file():
        raise ProblemsError(f"{path}: problems file not found")
    problems: dict[str, dict[str, Any]] = {}
    first_line: dict[str, int] = {}
    try:
        with _open_lines(path) as f:
            for lineno, where, obj in iter_jsonl(f, path, ProblemsError):
                problem = _check_problem(obj, where)
                tid = problem["task_id"]
                if tid in problems:
                    raise ProblemsError(f"{where}: duplicate task_id {tid!r} (first on line {first_line[tid]})")
                problems[tid] = problem
                first_line[tid] = lineno
    except (OSError, EOFError) as e:
        raise ProblemsError(f"{path}: cannot read: {e}") from None
    if not problems:
        raise ProblemsError(f"{path}: no problems in file")
    return problems


def problem_sha256(problem: Mapping[str, Any]) -> str:
    """sha256 of what a problem's samples and verdicts depend on: its ``PROBLEM_FIELDS`` as canonical JSON.

    Example:
        >>> problem_sha256({"prompt": "def f():\\n", "test": "assert f() == 1", "entry_point": "f"})[:12]
        '723d7a93cf78'
    """
    fields = {k: problem.get(k) for k in PROBLEM_FIELDS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def problems_sha256(problems: Mapping[str, Mapping[str, Any]]) -> str:
    """sha256 of a selection of problems, in their order: one ``task_id<TAB>problem_sha256`` line each (what a
    summary records, so two scores can be told apart by the problems they came from)."""
    lines = "".join(f"{t}\t{problem_sha256(p)}\n" for t, p in problems.items())
    return hashlib.sha256(lines.encode()).hexdigest()


def find_problems_file(explicit: str | Path | None = None) -> Path:
    """Locate the MBXP Python problems file.

    Args:
        explicit: a path given by the user; used as is (and must exist).

    Returns:
        ``explicit``, else ``data/mbxp/mbpp_release_v1.jsonl`` of an installed ``mxeval`` checkout.

    Raises:
        ProblemsError: nothing found; the message says where to get the data.

    Example:
        >>> find_problems_file("../shared/mbxp/mbpp_release_v1.jsonl")  # doctest: +SKIP
        PosixPath('../shared/mbxp/mbpp_release_v1.jsonl')
    """
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ProblemsError(f"{path}: problems file not found")
        return path
    looked: list[str] = []
    try:
        spec = importlib.util.find_spec("mxeval")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        roots = [Path(p) for p in (spec.submodule_search_locations or [])]
        if spec.origin:
            roots.append(Path(spec.origin).parent)
        for pkg_dir in roots:
            candidate = pkg_dir.parent / "data" / "mbxp" / MBXP_PYTHON_FILE
            looked.append(str(candidate))
            if candidate.is_file():
                return candidate
    where = f" (looked in {', '.join(looked)})" if looked else " (mxeval is not installed)"
    raise ProblemsError(
        f"no MBXP problems file given and none found{where}. Pass --problems PATH, or get "
        f"data/mbxp/{MBXP_PYTHON_FILE} from {MXEVAL_URL} (git clone; `pip install -e mxeval` makes it findable)"
    )


BENCHMARK_DIRS = {"mbxp": "mbxp", "humaneval": "multilingual_humaneval"}  # under an mxeval checkout's data/
DATA_DIR_ENV = {"mbxp": "IDA_MBXP_DIR", "humaneval": "IDA_HUMANEVAL_DIR"}  # environment overrides


def benchmark_dir(benchmark: str = "mbxp", explicit: str | Path | None = None) -> Path:
    """The directory holding a benchmark's per-language files and its ``metadata.json``.

    Looked for in order: ``explicit``; ``$IDA_MBXP_DIR`` / ``$IDA_HUMANEVAL_DIR``; an installed
    mxeval checkout's ``data/mbxp`` / ``data/multilingual_humaneval``.

    Raises:
        ProblemsError: an unknown benchmark, or no directory with a ``metadata.json`` found.
    """
    import os

    if benchmark not in BENCHMARK_DIRS:
        raise ProblemsError(f"unknown benchmark {benchmark!r} (known: {', '.join(BENCHMARK_DIRS)})")
    candidates = [Path(explicit)] if explicit is not None else []
    if explicit is None and os.environ.get(DATA_DIR_ENV[benchmark]):
        candidates.append(Path(os.environ[DATA_DIR_ENV[benchmark]]))
    if explicit is None:
        try:
            spec = importlib.util.find_spec("mxeval")
        except (ImportError, ValueError):
            spec = None
        for pkg_dir in [Path(p) for p in ((spec.submodule_search_locations or []) if spec else [])]:
            candidates.append(pkg_dir.parent / "data" / BENCHMARK_DIRS[benchmark])
    for c in candidates:
        if (c / "metadata.json").is_file():
            return c
    looked = ", ".join(str(c) for c in candidates) or "nowhere: give --data-dir"
    raise ProblemsError(
        f"no {benchmark} data directory with a metadata.json found (looked in {looked}); pass --data-dir DIR, "
        f"set {DATA_DIR_ENV[benchmark]}, or get data/{BENCHMARK_DIRS[benchmark]} from {MXEVAL_URL}"
    )


def language_files(benchmark: str = "mbxp", data_dir: str | Path | None = None) -> dict[str, Path]:
    """``{language: problems file}`` from the benchmark directory's ``metadata.json`` (file order)."""
    import json

    d = benchmark_dir(benchmark, data_dir)
    try:
        meta = json.loads((d / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ProblemsError(f"{d / 'metadata.json'}: cannot read ({e})") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ProblemsError(f"{d / 'metadata.json'}: expected an object mapping language -> file name")
    return {lang: d / name for lang, name in meta.items()}


def example_samples_file(problems_file: str | Path) -> Path:
    """mxeval's example samples beside an MBXP problems file: ``examples/<stem>_samples.jsonl``
    (``mbjsp_release_v1.2.jsonl`` -> ``examples/mbjsp_samples.jsonl``)."""
    path = Path(problems_file)
    return path.parent / "examples" / f"{path.name.split('_')[0]}_samples.jsonl"
