"""Every command line speaks with one voice (docs/cli.md): each bad input of issue 9 ends in ONE line
``PROG: error: ...`` naming what is wrong, with the documented exit status, no traceback, and nothing
created.

Most checks run the command IN-PROCESS through the :func:`cli` fixture: it calls the module's
``main(argv)`` (the function its ``python -m`` entry point hands to ``raise SystemExit(main())``) in the
given working directory, with ``IDA_DEBUG`` and ``RANK`` removed from the environment, captures what it
writes to ``sys.stdout`` / ``sys.stderr``, and turns an escaping ``SystemExit`` or exception into the
status and traceback the interpreter would give. Every CLI goes through ``ida_common.cli.run_main``, so
the line and the status are decided in-process; starting a Python that imports torch for each of ~30
inputs only made this file slow. The rank-silence (``RANK=1``) and ``--debug`` / ``IDA_DEBUG=1`` checks
run in-process too: both are read from ``os.environ`` / the arguments when the command runs, not when a
process starts.

Real processes remain where the process is the point:

* one ``python -m X`` per command module (:func:`cli_process`), so that each ``__main__`` wiring and
  the exit status a shell sees are proven: the first case of ``mxfp8_codec``, ``ida_eval.mbxp``,
  ``nvfp4_cuda`` (``build`` with no nvcc on ``PATH``: status 3); for ``ida_trainer`` and
  ``ida_eval.execute`` that one process is their Ctrl-C check (status 130); ``ida_trainer.memory``'s are
  its cases in ``CHEAP_ANSWERS`` (help and a bad flag, answered before torch is imported);
* Ctrl-C: SIGINT is delivered to a running process and its handling (one line, status 130, what was
  kept) is checked there, for ``ida_eval.execute`` and ``ida_trainer``;
* ``scripts/dev.py``: it runs before any environment exists, under the system ``python3``.

A process starts with this checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from ida_common.cli import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from tests.conftest import HEAVY_MODULES, run_noting_imports

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 300
UNSET = ("IDA_DEBUG", "RANK")  # removed from every command's environment: a test sets them when it means to


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def cli_process(module: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args...`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(**env),
        timeout=TIMEOUT,
        check=False,
    )


@dataclass
class Ran:
    """What an in-process command left: the fields of ``subprocess.CompletedProcess`` that the checks read."""

    returncode: int
    stdout: str
    stderr: str


# ``python -m NAME`` -> the module whose ``main(argv)`` it runs (mxfp8_codec/__main__.py exits when imported)
MAIN_MODULE = {"mxfp8_codec": "mxfp8_codec.cli", "nvfp4_cuda": "nvfp4_cuda.cli", "ida_trainer": "ida_trainer.__main__"}


def _exit_status(code: object) -> int:
    """The status of a process that ends with ``raise SystemExit(code)`` (a non-int is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code % 256
    print(code, file=sys.stderr)
    return 1


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """``cli(module, *args, cwd=DIR, **env)``: ``python -m module args...`` run in-process (module docstring)."""

    def call(module: str, *args: str, cwd: Path, **env: str) -> Ran:
        main = importlib.import_module(MAIN_MODULE.get(module, module)).main
        capsys.readouterr()  # what ran before is not this command's output
        streams = sys.stdout, sys.stderr
        with monkeypatch.context() as mp:
            mp.chdir(cwd)
            for name in UNSET:
                mp.delenv(name, raising=False)
            for name, value in env.items():
                mp.setenv(name, value)
            try:
                status = _exit_status(main(list(args)))
            except SystemExit as e:  # as `raise SystemExit(main())` would end
                status = _exit_status(e.code)
            except Exception:  # noqa: BLE001 - as the interpreter ends on an escaping exception: traceback, 1
                traceback.print_exc()
                status = 1
            finally:
                sys.stdout, sys.stderr = streams  # run_main may replace sys.stdout (a broken pipe)
        out = capsys.readouterr()
        return Ran(returncode=status, stdout=out.out, stderr=out.err)

    return call


def assert_one_line(res: subprocess.CompletedProcess[str] | Ran, status: int, prefix: str) -> str:
    """The run ended with ``status`` and exactly one error line starting with ``prefix``; returns it."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ": error: " in ln or ": internal error: " in ln]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(prefix), (lines[0], prefix)
    assert res.returncode == status, (res.returncode, res.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def base_without_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with config and weights but no tokenizer files."""
    d = tmp_path_factory.mktemp("base")
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    from mxfp8_codec import write_safetensors

    write_safetensors(d / "model.safetensors", {"lm_head.weight": np.zeros((4, 4), np.float32)})
    return d


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("data") / "sft.jsonl"
    f.write_text(json.dumps({"instruction": "x", "output": "y"}) + "\n")
    return f


# ------------------------------------------------------------------------------------------ cheap answers

# (module, arguments, status, the error line's start): help, and bad input that the arguments or a path
# show, are answered before torch or transformers is imported (~0.1-0.5 s instead of 4-8 s of imports)
CHEAP_ANSWERS = [
    ("ida_trainer", ["--help"], 0, None),
    ("ida_trainer", ["--preset", "bogus"], EXIT_USAGE, "ida_trainer: error: --preset 'bogus' is unknown"),
    ("ida_trainer", ["--steps", "-1"], EXIT_USAGE, "ida_trainer: error: "),
    ("ida_trainer.memory", ["--help"], 0, None),
    (
        "ida_trainer.memory",
        ["--stages", "x"],
        EXIT_USAGE,
        "ida_trainer.memory: error: argument --stages: invalid int value: 'x'",
    ),
    ("ida_eval.mbxp", ["--help"], 0, None),
    (
        "ida_eval.mbxp",
        ["--checkpoint", "ckpt", "--samples-per-task", "3"],
        EXIT_USAGE,
        "ida_eval.mbxp: error: 3 samples per task need a temperature > 0",
    ),
    (
        "ida_eval.mbxp",
        ["--checkpoint", "nockpt", "--problems", "p.jsonl", "--out", "run"],
        EXIT_USAGE,
        "ida_eval.mbxp: error: --checkpoint nockpt: no such directory",
    ),
    ("ida_eval.mbxp", ["--compare", ".", "."], EXIT_USAGE, "ida_eval.mbxp: error: "),
    ("ida_eval.execute", ["--help"], 0, None),
    ("mxfp8_codec", ["--help"], 0, None),
    ("nvfp4_cuda", ["--help"], 0, None),
    ("nvfp4_cuda", ["bogus"], EXIT_USAGE, "nvfp4_cuda: error: argument {build,info}: invalid choice: 'bogus'"),
]


@pytest.mark.parametrize(("module", "args", "status", "error"), CHEAP_ANSWERS, ids=lambda v: str(v)[:30])
def test_help_and_bad_arguments_answer_before_torch_is_imported(
    module: str, args: list[str], status: int, error: str | None, tmp_path: Path
) -> None:
    (tmp_path / "p.jsonl").write_text(
        json.dumps({"task_id": "T/0", "prompt": "def f():\n", "entry_point": "f", "test": ""}) + "\n"
    )
    res, imported = run_noting_imports(module, *args, cwd=tmp_path, env=_env())
    if error is None:
        assert res.returncode == status and res.stdout.startswith("usage: "), res.stderr[-2000:]
    else:
        assert_one_line(res, status, error)
    heavy = HEAVY_MODULES | ({"numpy"} if module.startswith("ida_trainer") else set())  # its config needs no numpy
    assert module.split(".")[0] in imported and not imported & heavy, sorted(imported)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # nothing created


# ------------------------------------------------------------------------------------------ mxfp8_codec


def test_codec(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    res = cli_process("mxfp8_codec", "demo", "/proc/x", cwd=tmp_path)  # the one real `python -m mxfp8_codec`
    assert_one_line(res, EXIT_USAGE, "mxfp8_codec: error: OUT_DIR /proc/x: cannot create a directory in /proc")
    res = cli("mxfp8_codec", "verify", str(tmp_path / "nope.safetensors"), cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, f"mxfp8_codec: error: {tmp_path / 'nope.safetensors'}: no such file")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    res = cli("mxfp8_codec", "verify", str(bad), cwd=tmp_path)  # verify ran and the file failed it: 1
    assert_one_line(res, EXIT_FAILED, f"mxfp8_codec: error: {bad}: ")
    res = cli("mxfp8_codec", "inspect", str(bad), cwd=tmp_path)  # the same file as input to inspect: 2
    assert_one_line(res, EXIT_USAGE, f"mxfp8_codec: error: {bad}: ")
    res = cli("mxfp8_codec", "rename", str(bad), str(tmp_path / "o.safetensors"), "--prefix", "novalue", cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "mxfp8_codec: error: ")
    res = cli("mxfp8_codec", "inspect", cwd=tmp_path)
    line = assert_one_line(res, EXIT_USAGE, "mxfp8_codec: error: the following arguments are required: path")
    assert line.endswith("(see python -m mxfp8_codec inspect --help)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


def test_every_positional_and_flag_has_help(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    """--help of every command: each positional and option carries help text; no RST backticks."""
    import argparse

    from ida_eval import execute, mbxp
    from mxfp8_codec.cli import build_parser

    def parsers(p: argparse.ArgumentParser):
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    yield from parsers(sub)

    captured = []
    for main in (mbxp.main, execute.main):
        from tests.ida_eval.support import capture_parser

        captured.append(capture_parser(main))
    res = cli("nvfp4_cuda", "--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    nvfp4_help = res.stdout
    assert "``" not in nvfp4_help and "`" not in nvfp4_help
    for top in (build_parser(), *captured):
        for p in parsers(top):
            for a in p._actions:
                if isinstance(a, argparse._HelpAction):
                    continue
                assert a.help, f"{p.prog}: {a.option_strings or a.dest} has no help text"
            assert "``" not in p.format_help(), p.prog


# ------------------------------------------------------------------------------------------ ida_trainer


def test_trainer_checks_before_work(
    tmp_path: Path, base_without_tokenizer: Path, data_file: Path, cli: Callable[..., Ran]
) -> None:
    res = cli("ida_trainer", "--out", "/proc/x", cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "ida_trainer: error: --out /proc/x: cannot create a directory in /proc")
    res = cli("ida_trainer", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r1"), cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, f"ida_trainer: error: --data {tmp_path / 'nope.jsonl'}: no such file")
    real = ["--preset", "minitron-4b", "--base", str(base_without_tokenizer)]
    res = cli("ida_trainer", *real, "--data", str(data_file), "--out", str(tmp_path / "r2"), cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, f"ida_trainer: error: no tokenizer files in {base_without_tokenizer}")
    # the data file is checked before the model directory
    res = cli("ida_trainer", *real, "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r3"), cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, f"ida_trainer: error: --data {tmp_path / 'nope.jsonl'}: no such file")
    res = cli("ida_trainer", "--bogus", cwd=tmp_path)
    line = assert_one_line(res, EXIT_USAGE, "ida_trainer: error: command line: unknown argument '--bogus'")
    assert line.endswith("(see python -m ida_trainer --help)")
    res = cli("ida_trainer", "--train.steps", "zero", cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "ida_trainer: error: invalid setting train.steps = 'zero'")
    assert list(tmp_path.iterdir()) == []  # no run directory, no config.toml, nothing


def test_trainer_non_zero_rank_is_silent(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    """Under torchrun every rank fails the same check; only rank 0 prints it."""
    res = cli("ida_trainer", "--out", "/proc/x", cwd=tmp_path, RANK="1", WORLD_SIZE="2")
    assert res.returncode == EXIT_USAGE and res.stderr == ""
    res = cli("ida_trainer", "--out", "/proc/x", cwd=tmp_path, RANK="0", WORLD_SIZE="2")
    assert_one_line(res, EXIT_USAGE, "ida_trainer: error: --out /proc/x")


def test_debug_shows_the_traceback(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    res = cli("ida_trainer", "--out", "/proc/x", "--debug", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" in res.stderr and "ValueError: --out /proc/x" in res.stderr
    res = cli("mxfp8_codec", "verify", str(tmp_path / "nope"), cwd=tmp_path, IDA_DEBUG="1")
    assert "Traceback" in res.stderr


# ------------------------------------------------------------------------------------------ ida_eval


def test_eval_checks_before_work(tmp_path: Path, base_without_tokenizer: Path, cli: Callable[..., Ran]) -> None:
    problems = tmp_path / "p.jsonl"
    problems.write_text(
        json.dumps(
            {
                "task_id": "T/0",
                "prompt": "def f():\n",
                "entry_point": "f",
                "canonical_solution": "    return 1\n",
                "test": "def check(c):\n    assert c() == 1\n",
            }
        )
        + "\n"
    )
    res = cli_process(  # the one real `python -m ida_eval.mbxp`
        "ida_eval.mbxp",
        "--checkpoint",
        str(base_without_tokenizer),
        "--problems",
        str(problems),
        "--out",
        "/proc/x",
        cwd=tmp_path,
    )
    assert_one_line(res, EXIT_USAGE, "ida_eval.mbxp: error: --out /proc/x: cannot create a directory in /proc")
    res = cli(
        "ida_eval.mbxp",
        "--checkpoint",
        str(base_without_tokenizer),
        "--problems",
        str(problems),
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert_one_line(res, EXIT_USAGE, f"ida_eval.mbxp: error: no tokenizer files in {base_without_tokenizer}")
    res = cli(
        "ida_eval.mbxp",
        "--checkpoint",
        str(tmp_path / "nockpt"),
        "--problems",
        str(problems),
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert_one_line(res, EXIT_USAGE, f"ida_eval.mbxp: error: --checkpoint {tmp_path / 'nockpt'}: no such directory")
    res = cli("ida_eval.mbxp", "--compare", str(tmp_path), str(tmp_path), cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "ida_eval.mbxp: error: ")
    res = cli("ida_eval.mbxp", cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "ida_eval.mbxp: error: give --checkpoint DIR")
    res = cli("ida_eval.execute", "--problems", str(problems), "--canonical", "--out", "/proc/x/r.jsonl", cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "ida_eval.execute: error: --out /proc/x/r.jsonl: cannot create a directory")
    res = cli(
        "ida_eval.execute",
        "--problems",
        str(tmp_path / "nope.jsonl"),
        "--canonical",
        "--out",
        str(tmp_path / "r.jsonl"),
        cwd=tmp_path,
    )
    assert_one_line(res, EXIT_USAGE, f"ida_eval.execute: error: {tmp_path / 'nope.jsonl'}")
    res = cli("ida_eval.execute", "--problems", str(problems), "--out", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "ida_eval.execute: error: give exactly one of --samples or --canonical")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # no run directory, no results file


def test_load_model_names_missing_tokenizer_files(base_without_tokenizer: Path) -> None:
    from ida_eval import CheckpointLoadError, load_model

    with pytest.raises(CheckpointLoadError, match=f"^no tokenizer files in {base_without_tokenizer} "):
        load_model(base_without_tokenizer)


@pytest.mark.slow
def test_execute_resumes_and_says_so_and_ctrl_c_is_one_line(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    problems = tmp_path / "p.jsonl"
    rows = [
        {
            "task_id": f"T/{i}",
            "language": "python",
            "prompt": "def f():\n",
            "entry_point": "f",
            "canonical_solution": "    return 1\n",
            "test": "def check(c):\n    assert c() == 1\n",
        }
        for i in range(3)
    ]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.jsonl"
    args = ("--problems", str(problems), "--canonical", "--out", str(out), "--no-progress", "--workers", "1")
    assert cli("ida_eval.execute", *args, cwd=tmp_path).returncode == 0
    assert [json.loads(line)["passed"] for line in out.read_text().splitlines()] == [True] * 3
    res = cli("ida_eval.execute", *args, cwd=tmp_path)
    assert res.returncode == 0 and f"resumed: 3 of 3 already done (execution, {out})" in res.stderr.splitlines()

    samples = tmp_path / "s.jsonl"  # a program that runs long enough to be interrupted
    samples.write_text(
        json.dumps({"task_id": "T/0", "completion": "    import time; time.sleep(60); return 1\n"}) + "\n"
    )
    out2 = tmp_path / "r2.jsonl"
    proc = subprocess.Popen(  # the one real `python -m ida_eval.execute`: SIGINT goes to a process
        [
            sys.executable,
            "-m",
            "ida_eval.execute",
            "--problems",
            str(problems),
            "--samples",
            str(samples),
            "--out",
            str(out2),
            "--no-progress",
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + TIMEOUT
    assert proc.stderr is not None
    first = proc.stderr.readline()  # "isolation: ..." is printed just before the programs start
    assert first.startswith("isolation: "), first
    time.sleep(2.0)
    assert time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"ida_eval.execute: interrupted; finished results are kept in {out2}: "
        "rerun the same command (same --out) to resume"
    )


def test_cannot_run_here_is_status_3(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    res = cli_process(  # the one real `python -m nvfp4_cuda`: no nvcc on PATH, in CUDA_HOME or in the cache
        "nvfp4_cuda",
        "build",
        cwd=tmp_path,
        PATH=str(tmp_path),
        HOME=str(tmp_path),
        NVFP4_CUDA_CACHE_DIR=str(tmp_path / "c"),
        IDA_CACHE_DIR=str(tmp_path / "c"),
        CUDA_HOME=str(tmp_path / "none"),
    )
    assert_one_line(res, EXIT_CANNOT_RUN, "nvfp4_cuda: error: ")
    res = cli("nvfp4_cuda", "bogus", cwd=tmp_path)
    assert_one_line(res, EXIT_USAGE, "nvfp4_cuda: error: argument")


@pytest.mark.slow
def test_trainer_ctrl_c_is_one_line_and_resume_warning_is_in_the_voice(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(  # the one real `python -m ida_trainer`: SIGINT goes to a process
        [
            sys.executable,
            "-m",
            "ida_trainer",
            "--out",
            str(out),
            "--train.progress",
            "false",
            "--train.log_every",
            "1",
            "--eval.final",
            "false",
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until training runs (the NVFP4 kernels of issue 9's traceback)
        if line.startswith("step "):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        "ida_trainer: interrupted; no checkpoint was written yet (checkpoint.every sets "
        "how often): rerun the same command with --overwrite to start again"
    )

    res = cli(
        "ida_trainer",
        "--out",
        str(tmp_path / "fresh"),
        "--resume",
        "--steps",
        "1",
        "--train.progress",
        "false",
        "--eval.final",
        "false",
        "--checkpoint.export",
        "false",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    warning = f"ida_trainer: warning: --resume: no complete checkpoint in {tmp_path / 'fresh' / 'checkpoints'}"
    assert any(ln.startswith(warning) for ln in res.stderr.splitlines()), res.stderr
    assert "UserWarning" not in res.stderr and "warnings.warn(" not in res.stderr


# ------------------------------------------------------------------------------------------ set-up commands


def test_readme_commands_and_ci_agree() -> None:
    """README's first two commands are the demo and the tests through scripts/dev.py; .ci/run runs the second."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    commands = [line.split("#", 1)[0].strip() for line in block]
    assert commands[:2] == ["python3 scripts/dev.py demo", "python3 scripts/dev.py test"]
    assert "Python >= 3.10" in readme and "--index-url https://download.pytorch.org/whl/cpu" in readme
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert 'scripts/dev.py test "$@"' in ci
    from ida_trainer.cli import tomllib  # the standard library's from 3.11, tomli on 3.10

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.10"


def test_no_source_needs_a_newer_python_than_requires_python() -> None:
    """README and pyproject.toml promise Python >= 3.10 where CI runs 3.11: vermin (a static finder of the oldest
    Python a module runs on) reads the packages, scripts, benchmarks and tests against 3.10.  It found the
    trainer's ``import tomllib`` (3.11), now ``tomli`` on 3.10."""
    vermin = Path(sys.executable).with_name("vermin")  # the test extra's console script
    dirs = ["ida_common", "mxfp8_codec", "nvfp4_cuda", "ida_trainer", "ida_eval", "scripts", "benchmarks", "tests"]
    res = subprocess.run(
        [str(vermin), "-q", "--no-tips", "-t=3.10-", "--violations", "--eval-annotations", *dirs],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_dev_script_errors_are_one_line(tmp_path: Path) -> None:
    dev = [sys.executable, str(REPO / "scripts" / "dev.py")]
    res = subprocess.run([*dev, "bogus"], capture_output=True, text=True, env=_env(), timeout=TIMEOUT, check=False)
    assert_one_line(res, EXIT_USAGE, "dev.py: error: unknown command 'bogus': use demo, test, lint or setup")
    res = subprocess.run(
        [*dev, "setup"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=_env(IDA_PYTHON=str(tmp_path / "nope" / "python")),
    )
    assert_one_line(res, EXIT_USAGE, f"dev.py: error: IDA_PYTHON={tmp_path / 'nope' / 'python'}: no such interpreter")
    res = subprocess.run([*dev, "--help"], capture_output=True, text=True, env=_env(), timeout=TIMEOUT, check=False)
    assert res.returncode == 0 and "usage: python3 scripts/dev.py {demo,test,lint,setup}" in res.stdout
