"""Shared test fixtures: where the MBXP data lives (../shared/mbxp beside the checkout), and the
hypothesis profiles.

Hypothesis profiles: ``ci`` (the default, for CI and README's test command) is derandomized — each
property test draws the same examples on every run and stores nothing in ``.hypothesis/`` — so a
submission is never rejected by chance. ``explore`` draws fresh random examples (and honours
``--hypothesis-seed``); run it locally or on a schedule to keep looking for counterexamples, then pin
what it finds as an explicit example or test::

    python -m pytest -q --hypothesis-profile explore --hypothesis-seed 7
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parents[1]

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("ci")  # ``--hypothesis-profile explore`` on the command line wins

# A runner that starts the suite in the background (``cmd &`` in a non-interactive shell, nohup) hands
# it SIGINT *ignored*, and an ignored signal stays ignored across fork and exec: the Ctrl-C tests (which
# send SIGINT to this process or to a command they start) would see programs run to their end. Take
# Ctrl-C back; the commands these tests start then get the default disposition and install their own.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite runs one worker per core, and each worker (and every command a test starts) has an OpenMP
# team per core (torch's, the native codec's). By default an idle OpenMP thread spins for a while before
# it sleeps, burning the core another worker needs: on 2 cores about a quarter of the suite's CPU time
# (docs/cli.md, "Set-up and durations"). PASSIVE makes idle threads sleep at once. A wait policy only:
# the same threads split the same work, the same bits come out. Read when libgomp loads, so set before
# anything imports torch; inherited by the commands the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# The longest test files, longest first (a demo run, real compilers, the MBXP anchors). pytest-xdist's
# ``--dist loadfile`` hands files to workers in collection order: started first, they no longer finish
# last on one worker while the other idles (docs/cli.md, "Set-up and durations").
LONGEST_FIRST = (  # measured 2026-12-07 (docs/cli.md): 158, 146, 60, 59, 52, 44, 44, 37 and 28 s
    "tests/ida_trainer/test_parallel_resume.py",
    "tests/ida_eval/test_languages.py",
    "tests/nvfp4_cuda/test_device_math.py",
    "tests/ida_trainer/test_kill.py",
    "tests/ida_eval/test_execute.py",
    "tests/ida_eval/test_parallel.py",
    "tests/ida_eval/test_sandbox.py",
    "tests/ida_eval/test_mbxp_e2e.py",
    "tests/ida_trainer/test_docs_trainer.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files of :data:`LONGEST_FIRST` first (stable: every other test keeps its order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.fspath)).resolve().relative_to(REPO_ROOT).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=key)


def mbxp_dir() -> Path | None:
    """The MBXP Python data directory, or None when it is not on this machine.

    ``IDA_MBXP_DIR`` overrides; otherwise ``../shared/mbxp`` beside the repository root.
    """
    env = os.environ.get("IDA_MBXP_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "mbxp")
    for c in candidates:
        if (c / "mbpp_release_v1.jsonl").is_file():
            return c
    return None


@pytest.fixture(scope="session")
def mbxp_problems_file() -> Path:
    d = mbxp_dir()
    if d is None:
        pytest.skip("MBXP data not found (set IDA_MBXP_DIR or place it at ../shared/mbxp)")
    return d / "mbpp_release_v1.jsonl"


@pytest.fixture(scope="module")
def tok():
    """A small BPE tokenizer trained on ``tests.ida_eval.support.SMALL_PROBLEMS`` (once per test module);
    tests/ida_trainer overrides it with the demo's tokenizer."""
    from tests.ida_eval.support import SMALL_PROBLEMS, train_tokenizer

    return train_tokenizer([p["prompt"] + p["canonical_solution"] for p in SMALL_PROBLEMS] * 2, vocab_size=300)


@pytest.fixture(scope="module")
def ids(tok):
    """Two prompts of ``SMALL_PROBLEMS`` as a ``[2, 40]`` batch of token ids."""
    import torch

    from tests.ida_eval.support import SMALL_PROBLEMS

    return torch.tensor([tok(p["prompt"])["input_ids"][:40] for p in SMALL_PROBLEMS[:2]])


def processes_with(marker: str) -> list[int]:
    """PIDs of this machine's processes whose command line contains ``marker`` (sandbox tests look
    for what a program left running)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
        except OSError:
            pass
    return found


def flip_bit(path: Path, offset: int | None = None, mask: int = 0x01) -> None:
    """Damage ``path`` as a bad disk or copy would: XOR the byte at ``offset`` (default: the middle) with
    ``mask``; the size stays. Calling it again restores the file."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= mask
    path.write_bytes(bytes(data))


HEAVY_MODULES = frozenset({"torch", "transformers"})  # seconds of imports per process on a small machine


def run_noting_imports(module: str, *args: str, **kwargs: Any) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``python -X importtime -m module args...`` (``kwargs``: :func:`subprocess.run`'s ``cwd``, ``env``):
    the finished process, with the interpreter's import-time lines taken out of its stderr, and the set of
    top-level packages it imported (a command that answers without torch has no ``"torch"`` there)."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kwargs,
    )
    lines = res.stderr.splitlines(keepends=True)
    timed = [x for x in lines if x.startswith("import time:")]
    imported = {x.rsplit("|", 1)[-1].strip().split(".")[0] for x in timed if "[us]" not in x}  # not the heading
    res.stderr = "".join(x for x in lines if not x.startswith("import time:"))
    return res, imported
