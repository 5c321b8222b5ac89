"""The two commands of README.md: ``python3 scripts/dev.py demo`` and ``python3 scripts/dev.py test``.

``python3 scripts/dev.py lint`` runs the lint CI runs before the tests: ``ruff check`` (pyflakes,
pycodestyle, isort, bugbear, blind except; configured in pyproject.toml) and ``ruff format --check``.

Each creates (first time) or reuses the project's virtual environment ``.venv`` beside this checkout,
installs what is missing, then runs the demo (``python -m ida_trainer``) or the tests
(``python -m pytest -q -n auto --dist loadfile``: pytest-xdist, one worker per CPU, each test file on one
worker so its module fixtures are built once) with it. Extra arguments go to that command
(``python3 scripts/dev.py test -k cli``). ``setup`` only prepares the environment.

Environment set-up, in order:

1. Python >= 3.10 runs this script; anything older stops with one line saying so.
2. ``.venv`` is created with ``python -m venv`` unless it exists (``IDA_VENV=DIR`` puts it
   elsewhere). ``IDA_PYTHON=/path/to/bin/python`` skips the venv and uses that interpreter's
   environment as it is: the way to use a CUDA build of torch you already have.
3. torch: an importable torch in the environment is kept as it is (CPU or CUDA). Otherwise the
   pinned CPU build is installed: first from a wheel on this machine if pip's configured wheel
   directory has one (``pip install --no-index torch==2.13.0``; no network), else from PyTorch's CPU
   index (``--index-url https://download.pytorch.org/whl/cpu``; a plain ``pip install torch`` on
   Linux pulls the multi-GB CUDA build). ``IDA_TORCH_INDEX=URL`` installs from another index
   instead (e.g. ``https://download.pytorch.org/whl/cu128`` for a CUDA build).
4. ``pip install -e '.[test]'`` (the project, editable, with pytest and hypothesis) when the
   environment does not have it yet or pyproject.toml changed since (a stamp in the venv).

Errors follow the project's CLI convention (docs/cli.md): one line ``dev.py: error: ...``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

MIN_PYTHON = (3, 10)
TORCH_PIN = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REPO = Path(__file__).resolve().parents[1]
STAMP = ".ida-setup"
COMMANDS = {
    "demo": ["-m", "ida_trainer"],
    "test": ["-m", "pytest", "-q", "-n", "auto", "--dist", "loadfile"],  # one worker per CPU, a file per worker
    "setup": None,
    "lint": None,
}
LINT = (["-m", "ruff", "check", "."], ["-m", "ruff", "format", "--check", "."])

if sys.version_info < MIN_PYTHON:  # before importing anything that needs a newer Python
    sys.stderr.write(
        f"dev.py: error: ida needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}; this is "
        f"{sys.version.split()[0]} ({sys.executable}): run it with a newer python3\n"
    )
    raise SystemExit(2)

sys.path.insert(0, str(REPO))  # ida_common is stdlib-only: usable before anything is installed
from ida_common.cli import CannotRunHere, Run, run_main

PROG = "dev.py"


def _say(msg: str) -> None:
    print(f"setup: {msg}", file=sys.stderr, flush=True)


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _environment() -> tuple[Path, Path | None]:
    """(python to use, venv directory or None when IDA_PYTHON names an existing interpreter)."""
    given = os.environ.get("IDA_PYTHON", "").strip()
    if given:
        py = Path(given)
        if not py.is_file():
            raise ValueError(f"IDA_PYTHON={given}: no such interpreter")
        return py, None
    venv_dir = Path(os.environ.get("IDA_VENV", "").strip() or REPO / ".venv")
    py = _venv_python(venv_dir)
    if not py.is_file():
        _say(f"creating {venv_dir} (Python {sys.version.split()[0]})")
        try:
            venv.EnvBuilder(with_pip=True, clear=venv_dir.exists()).create(venv_dir)
        except (OSError, subprocess.CalledProcessError) as e:
            raise CannotRunHere(
                f"cannot create the virtual environment {venv_dir} ({e}); on Debian/Ubuntu install the "
                "venv module (apt install python3-venv), or set IDA_PYTHON to an interpreter to use as it is"
            ) from None
    return py, venv_dir


def _probe(py: Path, code: str) -> str | None:
    """stdout of ``py -c code``, or None when it fails."""
    res = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=False)
    return res.stdout.strip() if res.returncode == 0 else None


def _pip(py: Path, args: list[str], what: str, *, quiet_fail: bool = False) -> bool:
    cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode == 0:
        return True
    if quiet_fail:
        return False
    sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
    raise CannotRunHere(f"{what} failed: {' '.join(cmd[1:])} exited {res.returncode} (pip's output above)")


def _ensure_torch(py: Path) -> str:
    have = _probe(py, "import torch; print(torch.__version__)")
    if have is not None:
        return have
    index = os.environ.get("IDA_TORCH_INDEX", "").strip()
    if index:
        _say(f"installing {TORCH_PIN} from {index}")
        _pip(py, [TORCH_PIN, "--index-url", index], "installing torch")
    elif _pip(py, ["--no-index", "--no-deps", TORCH_PIN], "", quiet_fail=True):
        _say(f"installed {TORCH_PIN} from a wheel on this machine; installing its dependencies")
        _pip(py, [TORCH_PIN], "installing torch's dependencies")
    else:
        _say(f"installing {TORCH_PIN} (CPU build) from {TORCH_CPU_INDEX} (about 200 MB)")
        _pip(py, [TORCH_PIN, "--index-url", TORCH_CPU_INDEX], "installing torch (CPU build)")
    have = _probe(py, "import torch; print(torch.__version__)")
    if have is None:
        raise CannotRunHere(f"torch was installed into {py} but does not import")
    return have


def _stamp_text(py: Path) -> str:
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return f"{digest} {py}\n"


READY_PROBE = "import torch, pytest, hypothesis, ida_common; print(ida_common.__file__)"


def _installed_here(py: Path) -> bool:
    """The environment imports torch, the test tools and this checkout's packages."""
    where = _probe(py, READY_PROBE)
    return where is not None and Path(where).resolve().is_relative_to(REPO)


def ensure_environment() -> Path:
    """Create or reuse the environment; return its python."""
    t0 = time.perf_counter()
    py, venv_dir = _environment()
    stamp = venv_dir / STAMP if venv_dir is not None else None  # IDA_PYTHON: no stamp, the imports decide
    current = stamp is None or (stamp.is_file() and stamp.read_text() == _stamp_text(py))
    if current and _installed_here(py):
        return py
    torch_version = _ensure_torch(py)
    _say("installing ida (editable) with its test tools: pip install -e '.[test]'")
    _pip(py, ["-e", f"{REPO}[test]"], "installing ida")
    if not _installed_here(py):
        raise CannotRunHere(f"ida was installed into {py} but does not import from {REPO}")
    if stamp is not None:
        stamp.write_text(_stamp_text(py))
    _say(f"ready: {venv_dir or py} (torch {torch_version}) in {time.perf_counter() - t0:.0f} s")
    return py


def _main(run: Run) -> int:
    if not run.argv or run.argv[0] in ("-h", "--help") or run.argv[0] not in COMMANDS:
        print(
            __doc__.split("\n\n")[0] + "\n\nusage: python3 scripts/dev.py {demo,test,lint,setup} [ARGS...]\n"
            "  demo   create/reuse .venv, then python -m ida_trainer ARGS (the demo: see README.md)\n"
            "  test   create/reuse .venv, then python -m pytest -q -n auto --dist loadfile ARGS\n"
            "  lint   create/reuse .venv, then ruff check . and ruff format --check . (as CI does)\n"
            "  setup  only create/update .venv\n"
            "  env: IDA_PYTHON (use this interpreter as is), IDA_VENV (venv dir), IDA_TORCH_INDEX (torch index)"
        )
        if run.argv and run.argv[0] not in ("-h", "--help"):
            raise ValueError(f"unknown command {run.argv[0]!r}: use demo, test, lint or setup")
        return 0
    command, rest = run.argv[0], run.argv[1:]
    py = ensure_environment()
    if command == "lint":  # both checks run; the status says whether either found something
        failed = [subprocess.run([str(py), *args], cwd=REPO, check=False).returncode for args in LINT]
        return 1 if any(failed) else 0
    tail = COMMANDS[command]
    if tail is None:
        return 0
    cmd = [str(py), *tail, *rest] + (["--debug"] if run.debug and command == "demo" else [])
    os.chdir(REPO)
    os.execv(str(py), cmd)  # the command's own exit status, Ctrl-C and output, unchanged
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
