"""ida_common.cli: the error line, the exit-status table, Ctrl-C, --debug, warnings, rank 0."""

from __future__ import annotations

import doctest
import re
import warnings
from pathlib import Path

import pytest

import ida_common.cli as cli
from ida_common.cli import (
    EXIT_CANNOT_RUN,
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CannotRunHere,
    CheckFailed,
    Run,
    run_main,
)

REPO = Path(__file__).resolve().parents[2]


def _raiser(exc: BaseException):
    def body(run: Run) -> int:
        run.kept = "finished results are kept in r.jsonl: rerun the same command to resume"
        raise exc

    return body


@pytest.mark.parametrize(
    "exc, status, line",
    [
        (ValueError("data.jsonl:3: not JSON"), EXIT_USAGE, "p: error: data.jsonl:3: not JSON"),
        (
            FileNotFoundError(2, "No such file or directory", "/x/y"),
            EXIT_USAGE,
            "p: error: /x/y: No such file or directory",
        ),
        (OSError(28, "No space left on device", "/x/y"), EXIT_CANNOT_RUN, "p: error: /x/y: No space left on device"),
        (CheckFailed("a.safetensors: bad scale"), EXIT_FAILED, "p: error: a.safetensors: bad scale"),
        (CannotRunHere("no sandbox"), EXIT_CANNOT_RUN, "p: error: no sandbox"),
        (MemoryError(), EXIT_CANNOT_RUN, "p: error: out of memory"),
        (
            KeyboardInterrupt(),
            EXIT_INTERRUPTED,
            "p: interrupted; finished results are kept in r.jsonl: rerun the same command to resume",
        ),
        (ValueError("two\nlines"), EXIT_USAGE, "p: error: two; lines"),
    ],
)
def test_one_line_and_status(exc, status, line, capsys, monkeypatch):
    monkeypatch.delenv("IDA_DEBUG", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert run_main("p", _raiser(exc), []) == status
    assert capsys.readouterr().err == line + "\n"


def test_torch_out_of_memory_is_this_machine_cannot(capsys, monkeypatch):
    """torch's OutOfMemoryError (a RuntimeError, raised for CUDA) and its CPU allocator's failure (a plain
    RuntimeError) end with status 3 and one line, never as "internal error (a bug)"."""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("IDA_DEBUG", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    msg = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
    assert run_main("p", _raiser(torch.OutOfMemoryError(msg)), []) == EXIT_CANNOT_RUN
    assert capsys.readouterr().err == f"p: error: {msg}\n"

    def too_big(run):
        torch.empty(2**62, dtype=torch.uint8)  # the real allocator refuses: no mock

    assert run_main("p", too_big, []) == EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert err.startswith("p: error: out of memory: ") and "can't allocate memory" in err and err.count("\n") == 1


def test_bug_is_one_line_with_status_70_and_debug_reraises(capsys, monkeypatch):
    monkeypatch.delenv("IDA_DEBUG", raising=False)
    assert run_main("p", _raiser(ZeroDivisionError("x")), []) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("p: internal error: ZeroDivisionError: x (a bug") and err.count("\n") == 1
    with pytest.raises(ZeroDivisionError):
        run_main("p", _raiser(ZeroDivisionError("x")), ["--debug"])
    monkeypatch.setenv("IDA_DEBUG", "1")
    with pytest.raises(KeyboardInterrupt):
        run_main("p", _raiser(KeyboardInterrupt()), [])


def test_debug_flag_is_removed_before_the_body_sees_argv(monkeypatch):
    monkeypatch.delenv("IDA_DEBUG", raising=False)
    seen: list[Run] = []
    assert run_main("p", lambda r: seen.append(r) or 0, ["a", "--debug", "b", "--", "--debug"]) == 0
    assert seen[0].argv == ["a", "b", "--", "--debug"] and seen[0].debug


def test_codes_map_own_types_first(capsys):
    class Diverged(FloatingPointError):
        pass

    assert run_main("p", _raiser(Diverged("loss nan")), [], codes={Diverged: EXIT_FAILED}) == EXIT_FAILED
    assert capsys.readouterr().err == "p: error: loss nan\n"


def test_only_rank0_prints(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert run_main("p", _raiser(ValueError("bad")), []) == EXIT_USAGE
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert run_main("p", _raiser(ValueError("bad")), []) == EXIT_USAGE
    assert capsys.readouterr().err == "p: error: bad\n"


def test_warnings_print_in_the_voice_without_source_line(capsys, monkeypatch):
    monkeypatch.delenv("IDA_DEBUG", raising=False)

    def body(run: Run) -> int:
        warnings.warn("--resume: no complete checkpoint in runs/x; starting from step 0", UserWarning, stacklevel=2)
        return 0

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert run_main("p", body, []) == 0
    assert capsys.readouterr().err == "p: warning: --resume: no complete checkpoint in runs/x; starting from step 0\n"


def test_argument_parser_error_is_one_line(capsys):
    ap = cli.ArgumentParser(prog="python -m p", short_prog="p")
    ap.add_argument("--n", type=int, help="a number")
    with pytest.raises(SystemExit) as e:
        ap.parse_args(["--n", "x"])
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("p: error: argument --n: invalid int value: 'x'")
    assert err.rstrip().endswith("(see python -m p --help)")
    assert run_main("p", lambda r: ap.parse_args(r.argv) and 0, ["--n", "y"]) == EXIT_USAGE


def test_checks_before_work_create_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"^--out /proc/x/y: cannot create a directory in /proc"):
        cli.check_output_dir("/proc/x/y")
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        cli.check_output_dir(f / "sub")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        cli.check_output_dir(f)
    assert cli.check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing created, probe removed
    with pytest.raises(ValueError, match=r"^--data .*nope\.jsonl: no such file$"):
        cli.check_input_file(tmp_path / "nope.jsonl", "--data")
    with pytest.raises(ValueError, match="is a directory"):
        cli.check_input_file(tmp_path, "--data")


def test_docs_table_matches_the_code_and_doctests_run():
    text = (REPO / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", text, re.M))
    assert sorted(int(k) for k in rows) == sorted(cli.EXIT_CODES)
    failed, attempted = doctest.testmod(cli)
    assert failed == 0 and attempted > 0
