"""ida_eval.execute and ida_eval.problems: programs, verdicts, results files, resume, CLI, the MBXP anchor."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ida_eval import execute as ex
from ida_eval.failures import ResultKind, legacy_kind, with_kind
from ida_eval.problems import ProblemsError, find_problems_file, load_problems, problem_sha256
from tests.ida_eval.support import KNOWN_FAILURES

FAST = ex.ExecutionConfig(timeout=3.0, workers=2, memory_bytes=1 << 30)

PROMPT_ADD = '\n\ndef add(a, b):\n\t"""Add two numbers.\n\t>>> add(1, 2)\n\t3\n\t"""\n'
TEST_ADD = (
    "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
)


def _problem(tid: str, entry: str, prompt: str, test: str, canonical: str) -> dict[str, str]:
    return {
        "task_id": tid,
        "language": "python",
        "prompt": prompt,
        "canonical_solution": canonical,
        "test": test,
        "entry_point": entry,
        "description": "",
    }


TOY = [
    _problem("T/0", "add", PROMPT_ADD, TEST_ADD, "\treturn a + b\n"),
    _problem(
        "T/1",
        "double",
        '\n\ndef double(x):\n    """Twice x."""\n',
        "\n\ndef check(candidate):\n    assert candidate(2) == 4\n",
        "    return 2 * x\n",
    ),
    _problem(
        "T/2",
        "neg",
        '\n\ndef neg(x):\n  """Minus x."""\n',
        "\n\ndef check(candidate):\n    assert candidate(2) == -2\n",
        "  return -x\n",
    ),
]


@pytest.fixture
def toy_file(tmp_path: Path) -> Path:
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in TOY), encoding="utf-8")
    return path


@pytest.fixture
def toy(toy_file: Path) -> dict:
    return load_problems(toy_file)


# ------------------------------------------------------------------ problems


def test_load_problems_keeps_text_byte_for_byte(toy: dict) -> None:
    assert list(toy) == ["T/0", "T/1", "T/2"]
    assert toy["T/0"]["prompt"] == PROMPT_ADD  # tabs intact


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"toy\.jsonl:2: not valid JSON"),
        ('{"task_id": "X", "prompt": "", "test": ""}', r"toy\.jsonl:2: missing key 'entry_point'"),
        ('{"task_id": "X", "prompt": 1, "test": "", "entry_point": "f"}', r"toy\.jsonl:2: 'prompt' must be a string"),
        (
            '{"task_id": "T/0", "prompt": "", "test": "", "entry_point": "f"}',
            r"toy\.jsonl:2: duplicate task_id 'T/0' \(first on line 1\)",
        ),
        ('{"task_id": "X", "prompt": "", "test": "", "entry_point": "no pe"}', r"toy\.jsonl:2: task X: entry_point"),
        ("[1, 2]", r"toy\.jsonl:2: expected a JSON object"),
    ],
)
def test_load_problems_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "toy.jsonl"
    path.write_text(json.dumps(TOY[0]) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ProblemsError, match=message):
        load_problems(path)


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path: Path, toy: dict, gz: bool) -> None:
    """Issue 23 item 8: a byte that is not UTF-8 is reported with its file and line, in a problems
    file (plain or gzipped) and in a samples file."""
    import gzip

    good, bad = json.dumps(TOY[0]).encode(), json.dumps(TOY[1]).encode().replace(b"def", b"d\xffef", 1)
    problems = tmp_path / ("p.jsonl.gz" if gz else "p.jsonl")
    data = good + b"\n" + bad + b"\n"
    problems.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(
        ProblemsError, match=r"p\.jsonl(\.gz)?:2: not valid JSON \(invalid UTF-8 \(byte 0xff at byte column \d+\)\)"
    ):
        load_problems(problems)
    samples = tmp_path / "s.jsonl"
    samples.write_bytes(
        json.dumps({"task_id": "T/0", "completion": ""}).encode()
        + b"\n"
        + b'{"task_id": "T/1", "completion": "\xc3("}\n'
    )
    with pytest.raises(
        ex.ResultsFileError, match=r"s\.jsonl:2: not valid JSON \(invalid UTF-8 \(byte 0xc3 at byte column 35\)\)"
    ):
        ex.load_samples(samples, toy)


def test_load_problems_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ProblemsError, match="not found"):
        load_problems(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ProblemsError, match="no problems"):
        load_problems(tmp_path / "empty.jsonl")


def test_find_problems_file(tmp_path: Path, toy_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_problems_file(toy_file) == toy_file
    with pytest.raises(ProblemsError, match="not found"):
        find_problems_file(tmp_path / "missing.jsonl")
    # an installed mxeval checkout (package dir beside data/) is found
    checkout = tmp_path / "mxeval_checkout"
    (checkout / "mxeval").mkdir(parents=True)
    (checkout / "mxeval" / "__init__.py").write_text("")
    (checkout / "data" / "mbxp").mkdir(parents=True)
    data = checkout / "data" / "mbxp" / "mbpp_release_v1.jsonl"
    data.write_text(toy_file.read_text())
    monkeypatch.syspath_prepend(str(checkout))
    assert find_problems_file() == data
    data.unlink()
    with pytest.raises(ProblemsError, match=r"amazon-science/mxeval.*--problems|--problems.*amazon-science/mxeval"):
        find_problems_file()


# ------------------------------------------------------------------ programs and verdicts


def test_build_program_is_mxevals_rule(toy: dict) -> None:
    prog = ex.build_program(toy["T/0"], "\treturn a + b\n")
    assert prog == PROMPT_ADD + "\treturn a + b\n" + "\n" + TEST_ADD + "\n" + "check(add)"


def test_execute_samples_verdicts(toy: dict, tmp_path: Path) -> None:
    samples = [
        {"task_id": "T/0", "completion": "\treturn a + b\n", "extra": 7},
        {"task_id": "T/0", "completion": "\treturn a - b\n"},
        {"task_id": "T/1", "completion": "    return 2 *\n"},
        {"task_id": "T/1", "completion": "    while True:\n        pass\n"},
        {"task_id": "T/2", "completion": "  import sys\n  sys.exit(0)\n"},
        {"task_id": "T/2", "completion": "  return undefined_name\n"},
    ]
    config = ex.ExecutionConfig(timeout=2.0, workers=2, memory_bytes=1 << 30)
    res = ex.execute_samples(toy, samples, config=config, progress=False, out_path=tmp_path / "r.jsonl")
    assert [r["task_id"] for r in res] == [s["task_id"] for s in samples]
    assert [r["completion_id"] for r in res] == [0, 1, 0, 1, 0, 1]
    assert [r["passed"] for r in res] == [True, False, False, False, False, False]
    assert res[0]["result"] == "passed" and res[0]["extra"] == 7
    assert res[1]["result"] == "failed: AssertionError" and res[1]["exception"] == "AssertionError"
    assert res[2]["result"].startswith("failed: SyntaxError")
    assert res[3]["result"] == "timed out"
    assert res[4]["result"] == "failed: exited with status 0 before check() returned"
    assert res[5]["result"] == "failed: NameError: name 'undefined_name' is not defined"
    for r in res:
        assert isinstance(r["time_elapsed"], float) and r["isolation"] in ex.ISOLATION_LEVELS
        assert r["toolchain"] == f"Python {platform.python_version()}"  # this interpreter ran them
    assert ex.summarize(res)["toolchains"] == [f"Python {platform.python_version()}"]
    assert ex.pass_at_1(res) == pytest.approx((0.5 + 0 + 0) / 3)
    assert [r["kind"] for r in res] == ["passed", "exception", "exception", "timeout", "early_exit", "exception"]
    assert [ex.result_class(r) for r in res] == [
        "passed",
        "AssertionError",
        "SyntaxError",
        "timeout",
        "early_exit",
        "NameError",
    ]
    # the one legacy parser reads every text the verdicts write as the kind written with it
    assert [legacy_kind(r["result"]) for r in res] == [(ResultKind(r["kind"]), r["exception"]) for r in res]
    # the results file holds the same records, one JSON line each
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["completion"] for x in lines) == sorted(s["completion"] for s in samples)


def test_canonical_mode(toy: dict) -> None:
    res = ex.execute_samples(toy, canonical=True, config=FAST, progress=False)
    assert [r["passed"] for r in res] == [True, True, True]
    with pytest.raises(ValueError, match="not both"):
        ex.execute_samples(toy, [{"task_id": "T/0", "completion": ""}], canonical=True, config=FAST)


def test_unknown_task_and_bad_samples_are_errors(toy: dict) -> None:
    with pytest.raises(ValueError, match="sample 1: unknown task_id 'T/99'"):
        ex.execute_samples(
            toy, [{"task_id": "T/0", "completion": ""}, {"task_id": "T/99", "completion": ""}], config=FAST
        )
    with pytest.raises(ValueError, match="sample 0: 'completion' missing"):
        ex.execute_samples(toy, [{"task_id": "T/0"}], config=FAST)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="workers"):
        ex.ExecutionConfig(workers=0)
    with pytest.raises(ValueError, match="timeout"):
        ex.ExecutionConfig(timeout=-1)
    with pytest.raises(ValueError, match="isolation"):
        ex.ExecutionConfig(isolation="chroot")
    with pytest.raises(ValueError, match="open_files"):
        ex.ExecutionConfig(open_files=2)
    assert ex.ExecutionConfig().timeout == 30.0
    assert ex.ExecutionConfig().workers == len(os.sched_getaffinity(0))


# ------------------------------------------------------------------ results file: resume and crash safety


def test_resume_skips_finished_tasks(toy: dict, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    # pre-seed: T/0 recorded as passed with a *wrong* completion's text; if it ran again it would fail
    wrong = "\treturn 0\n"
    seeded = {"task_id": "T/0", "completion": wrong, "completion_id": 0, "passed": True, "result": "passed", "seed": 1}
    out.write_text(json.dumps(seeded) + "\n")
    samples = [{"task_id": "T/0", "completion": wrong}, {"task_id": "T/1", "completion": "    return 2 * x\n"}]
    res = ex.execute_samples(toy, samples, out_path=out, config=FAST, progress=False)
    assert res[0] == {**seeded, "kind": "passed"}  # returned from the file, not executed; its kind read once
    assert res[1]["kind"] == "passed"
    assert res[1]["passed"] and "seed" not in res[1]
    assert len(out.read_text().splitlines()) == 2
    # a third run executes nothing and returns the same records
    again = ex.execute_samples(toy, samples, out_path=out, config=FAST, progress=False)
    assert again == res
    assert len(out.read_text().splitlines()) == 2


def test_resume_rejects_different_completion_and_malformed_lines(toy: dict, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    rec = {"task_id": "T/0", "completion": "\treturn 0\n", "completion_id": 0, "passed": False, "result": "failed: x"}
    out.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ex.ResultsFileError, match=r"r\.jsonl:1: T/0 sample 0 was executed with a different completion"):
        ex.execute_samples(toy, [{"task_id": "T/0", "completion": "\treturn a + b\n"}], out_path=out, config=FAST)
    out.write_text(json.dumps(rec) + "\n{garbage\n" + json.dumps(rec) + "\n")
    with pytest.raises(ex.ResultsFileError, match=r"r\.jsonl:2: malformed results line"):
        ex.execute_samples(toy, [{"task_id": "T/0", "completion": "\treturn 0\n"}], out_path=out, config=FAST)
    out.write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(ex.ResultsFileError, match=r"r\.jsonl:2: duplicate result for T/0 sample 0 \(also line 1\)"):
        ex.execute_samples(toy, [{"task_id": "T/0", "completion": "\treturn 0\n"}], out_path=out, config=FAST)
    out.write_text(json.dumps({k: v for k, v in rec.items() if k != "passed"}) + "\n")
    with pytest.raises(ex.ResultsFileError, match=r"r\.jsonl:1: 'passed' missing"):
        ex.execute_samples(toy, [{"task_id": "T/0", "completion": "\treturn 0\n"}], out_path=out, config=FAST)


def test_resume_rejects_a_result_made_against_other_tests(toy: dict, tmp_path: Path) -> None:
    """Each record carries its problem's sha256: a resume whose problems changed a task's tests (same id) is
    refused, naming the line; a change nothing executed depends on is not."""
    out = tmp_path / "r.jsonl"
    samples = [{"task_id": "T/0", "completion": "\treturn a + b\n"}]
    (first,) = ex.execute_samples(toy, samples, out_path=out, config=FAST, progress=False)
    assert first["passed"] and first["problem_sha256"] == problem_sha256(toy["T/0"])
    stricter = {**toy, "T/0": {**toy["T/0"], "test": toy["T/0"]["test"] + "\n    assert candidate(0, 0) == 1\n"}}
    with pytest.raises(ex.ResultsFileError, match=r"r\.jsonl:1: T/0 sample 0 was executed against another problem"):
        ex.execute_samples(stricter, samples, out_path=out, config=FAST, progress=False)
    described = {**toy, "T/0": {**toy["T/0"], "description": "adds", "canonical_solution": None}}
    assert ex.execute_samples(described, samples, out_path=out, config=FAST, progress=False) == [first]


def test_resume_drops_a_torn_last_line(toy: dict, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    good = {
        "task_id": "T/1",
        "completion": "    return 2 * x\n",
        "completion_id": 0,
        "passed": True,
        "result": "passed",
    }
    out.write_text(json.dumps(good) + "\n" + '{"task_id": "T/0", "compl')  # crash mid-write
    samples = [
        {"task_id": "T/0", "completion": "\treturn a + b\n"},
        {"task_id": "T/1", "completion": good["completion"]},
    ]
    with pytest.warns(RuntimeWarning, match="incomplete last line"):
        res = ex.execute_samples(toy, samples, out_path=out, config=FAST, progress=False)
    assert [r["passed"] for r in res] == [True, True]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["task_id"] for r in lines] == ["T/1", "T/0"]


# records as the executor wrote them before the "kind" field: (result text, exception) -> result class
OLD_RECORDS = [
    ("passed", None, "passed"),
    ("failed: AssertionError", "AssertionError", "AssertionError"),
    ("failed: NameError: name 'y' is not defined", "NameError", "NameError"),
    ("failed: OSError: [Errno 28] No space left on device (disk limit reached)", "OSError", "OSError"),
    ("timed out", None, "timeout"),
    ("failed: output limit exceeded (over 16777216 bytes)", None, "output_limit"),
    ("failed: killed by SIGKILL (out of memory: cgroup limit)", None, "killed"),
    ("failed: exited with status 0 before check() returned", None, "early_exit"),
    ("failed: exit status 3 after check() returned", "ValueError", "exit_status"),
    ("failed: exit status 1 without a traceback", None, "exit_status"),
    ("failed: (nothing we know)", None, "other"),
    ("timed out (compile)", None, "compile_timeout"),
    ("failed: compile error: Main.java:3: error: ';' expected", None, "compile_error"),
    ("failed: wrong answer: Exception -- test case 2 did not pass", None, "wrong_answer"),
    ("failed: runtime error: exit status 1: TypeError: x", None, "runtime_error"),
    ("failed: exited with status 0 before the test driver finished", None, "early_exit"),
    ("toolchain missing: swift not found (swift)", None, "toolchain_missing"),
    ("failed: bad input: unknown language 'cobol'", None, "bad_input"),
]


def test_an_old_results_file_resumes_with_the_same_classes(toy: dict, tmp_path: Path) -> None:
    """Records written before the "kind" field: read once by the legacy parser, never executed again,
    counted as they were (the summary of an old run is the same)."""
    out = tmp_path / "r.jsonl"
    old = [
        {
            "task_id": "T/0",
            "completion": f"#{i}\n",
            "completion_id": i,
            "passed": text == "passed",
            "result": text,
            "exit_status": None,
            "exception": exc,
            "isolation": "rlimits",
        }
        for i, (text, exc, _) in enumerate(OLD_RECORDS)
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in old))
    samples = [{"task_id": "T/0", "completion": r["completion"]} for r in old]
    res = ex.execute_samples(toy, samples, out_path=out, config=FAST, progress=False)
    assert [ex.result_class(r) for r in res] == [cls for _, _, cls in OLD_RECORDS]
    assert [{k: v for k, v in r.items() if k != "kind"} for r in res] == old  # nothing else changed
    assert out.read_text() == "".join(json.dumps(r) + "\n" for r in old)  # the file is left as it was
    s = ex.summarize(res)
    assert s["result_classes"] == dict(Counter(cls for _, _, cls in OLD_RECORDS).most_common())
    assert (s["timed_out"], s["timed_out_compile"], s["toolchain_missing"]) == (1, 1, 1)
    # an mxeval record without "exception" gets the name from its text; an unknown kind names its line
    assert ex.result_class(with_kind({"result": "failed: KeyError: 3"})) == "KeyError"
    out.write_text(json.dumps({**old[0], "kind": "exploded"}) + "\n")
    with pytest.raises(ex.ResultsFileError, match=r"r\.jsonl:1: .*unknown kind 'exploded'"):
        ex.execute_samples(toy, samples[:1], out_path=out, config=FAST, progress=False)
    with pytest.raises(ValueError, match="has no 'kind'.*with_kind"):
        ex.summarize(old)


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ida_eval.execute", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


@pytest.mark.slow
def test_killed_run_resumes_without_reexecuting(tmp_path: Path) -> None:
    n = 12
    problems = [
        _problem(
            f"S/{i}",
            "f",
            "\n\ndef f():\n",
            "\n\ndef check(c):\n    assert c() == 1\n",
            "    import time; time.sleep(0.4); return 1\n",
        )
        for i in range(n)
    ]
    pfile = tmp_path / "p.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in problems))
    out = tmp_path / "r.jsonl"
    proc = _cli(
        "--problems", str(pfile), "--canonical", "--out", str(out), "--workers", "1", "--no-progress", "--timeout", "10"
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    killed_pid = proc.pid
    before = out.read_text()
    k = len(before.splitlines())
    assert 3 <= k < n, "the run was not interrupted midway"
    proc = _cli("--problems", str(pfile), "--canonical", "--out", str(out), "--workers", "2", "--no-progress")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    after = out.read_text()
    assert after.startswith(before.rstrip("\n").rsplit("\n", 1)[0])  # finished lines untouched
    recs = [json.loads(x) for x in after.splitlines()]
    assert sorted(r["task_id"] for r in recs) == sorted(p["task_id"] for p in problems)  # each exactly once
    assert all(r["passed"] for r in recs)
    assert "pass@1 = 1.0000" in stdout
    tag = f"ida-exec-{killed_pid}-"  # the killed run's work dir was swept by the rerun
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(tag)]


def test_ctrl_c_stops_running_programs_and_keeps_finished_results(tmp_path: Path) -> None:
    marker = f"0.{os.getpid():08d}{int(time.time() * 1000) % 10**6:06d}3"  # a unique `sleep` argument
    problems = {
        f"L/{i}": _problem(
            f"L/{i}",
            "f",
            "\n\ndef f():\n",
            "\n\ndef check(c):\n    assert c() == 1\n",
            "    return 1\n"
            if i == 0
            else f"    import subprocess; subprocess.run(['sleep', '300', '{marker}']); return 1\n",
        )
        for i in range(6)
    }
    out = tmp_path / "r.jsonl"
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ex.execute_samples(
            problems,
            canonical=True,
            out_path=out,
            progress=False,
            config=ex.ExecutionConfig(timeout=60.0, workers=2, memory_bytes=1 << 30),
        )
    assert time.monotonic() - t0 < 10.0  # not the 60 s timeout: the running programs were killed
    done = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["task_id"] for r in done] == ["L/0"]
    deadline = time.monotonic() + 3.0
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(marker) == []


def _alive(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_cli_reports_pass_rate_classes_missing_tasks_and_isolation(
    toy_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        json.dumps({"task_id": "T/0", "completion": "\treturn a + b\n"})
        + "\n"
        + json.dumps({"task_id": "T/1", "completion": "    return 3 * x\n"})
        + "\n"
    )
    summary = tmp_path / "summary.json"
    code = ex.main(
        [
            "--problems",
            str(toy_file),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "r.jsonl"),
            "--workers",
            "2",
            "--timeout",
            "5",
            "--summary",
            str(summary),
            "--no-progress",
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "pass@1 = 0.5000" in stdout
    assert "no sample for 1 of 3 tasks (e.g. T/2)" in stdout
    assert "AssertionError: 1" in stdout and "passed: 1" in stdout
    assert "isolation:" in stderr
    assert stdout.splitlines()[-1].endswith(f"; toolchains: Python {platform.python_version()}")
    data = json.loads(summary.read_text())
    assert data["passed"] == 1 and data["missing_tasks_count"] == 1 and data["missing_tasks_first"] == ["T/2"]


def test_summary_counts_missing_tasks_and_lists_the_first_few() -> None:
    problems = {f"P/{i}": {} for i in range(3 + ex.MAX_LISTED_TASKS + 7)}  # file order, not sorted order
    results = [
        {
            "task_id": f"P/{i}",
            "passed": i == 0,
            "result": "passed" if i == 0 else "timed out",
            "kind": "passed" if i == 0 else "timeout",
            "isolation": "rlimits",
        }
        for i in range(3)
    ]
    s = ex.summarize(results, problems)
    assert s["missing_tasks_count"] == ex.MAX_LISTED_TASKS + 7
    assert s["missing_tasks_first"] == [f"P/{i}" for i in range(3, 3 + ex.MAX_LISTED_TASKS)]
    assert s["isolation"] == ["rlimits"] and s["pass@1_all_problems"] == pytest.approx(1 / len(problems))
    empty = ex.summarize([], problems)
    assert empty["isolation"] == [] and empty["missing_tasks_count"] == len(problems)
    assert ex.summarize([])["missing_tasks_count"] == 0


def test_cli_sandbox_failure_and_ctrl_c(
    toy_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--problems", str(toy_file), "--canonical", "--out", str(tmp_path / "r.jsonl"), "--no-progress"]
    out = tmp_path / "r.jsonl"
    for exc, status, line in (
        (ex.SandboxError("no sandbox here"), 3, "ida_eval.execute: error: sandbox: no sandbox here"),
        (
            KeyboardInterrupt(),
            130,
            f"ida_eval.execute: interrupted; finished results are kept in {out}: "
            "rerun the same command (same --out) to resume",
        ),
    ):

        def fail(level: str, exc: BaseException = exc) -> None:
            raise exc

        monkeypatch.setattr(ex, "probe_isolation", fail)
        assert ex.main(args) == status
        assert capsys.readouterr().err == line + "\n"  # one line, no traceback


def test_cli_input_errors_name_the_line(toy_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        json.dumps({"task_id": "T/0", "completion": ""})
        + "\n"
        + json.dumps({"task_id": "Z/9", "completion": ""})
        + "\n"
    )
    assert ex.main(["--problems", str(toy_file), "--samples", str(samples), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "s.jsonl:2: unknown task_id 'Z/9'" in capsys.readouterr().err
    samples.write_text(json.dumps({"task_id": "T/0", "completion": ""}) + "\n{oops\n")
    assert ex.main(["--problems", str(toy_file), "--samples", str(samples), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "s.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert ex.main(["--problems", str(toy_file), "--out", str(tmp_path / "r.jsonl")]) == 2  # neither option
    assert capsys.readouterr().err == (
        "ida_eval.execute: error: give exactly one of --samples or --canonical "
        "(see python -m ida_eval.execute --help)\n"
    )


@pytest.mark.parametrize(
    "flag",
    [
        ["--timeout", "inf"],
        ["--timeout", "1e300"],
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--timeout", "-1"],
        ["--run-timeout", "all=inf"],
        ["--compile-timeout", "java=1e300"],
        ["--run-timeout", "java=ten"],
    ],
)
def test_cli_refuses_unusable_time_limits_before_any_work(
    flag: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23 item 4: inf / huge / non-positive limits are one line at parse time, rc 2 (were rc 70 / rc 3)."""
    out = tmp_path / "r.jsonl"
    assert ex.main(["--canonical", "--problems", str(tmp_path / "absent.jsonl"), "--out", str(out), *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ida_eval.execute: error: ") and err.count("\n") == 1 and "seconds" in err, err
    assert not out.exists()


def test_largest_time_limit_is_one_the_sandbox_can_run() -> None:
    """The bound check_seconds accepts (a week) is expressible: config and sandbox limits take it."""
    from ida_eval.sandbox_types import MAX_TIMEOUT_S, SandboxLimits, check_seconds

    cfg = ex.ExecutionConfig(
        timeout=MAX_TIMEOUT_S, run_timeouts=(("all", MAX_TIMEOUT_S),), compile_timeouts=(("java", MAX_TIMEOUT_S),)
    )
    assert cfg.limits().timeout == MAX_TIMEOUT_S == check_seconds(MAX_TIMEOUT_S, "t")
    for bad in (float("inf"), MAX_TIMEOUT_S * 2, 0, True, "30"):
        with pytest.raises(ValueError, match="seconds"):
            SandboxLimits(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="run_timeouts: all must be a number of seconds"):
            ex.ExecutionConfig(run_timeouts=(("all", bad),))  # type: ignore[arg-type]


# ------------------------------------------------------------------ the MBXP anchor


@pytest.mark.slow
def test_mbxp_canonical_anchor(mbxp_problems_file: Path) -> None:
    problems = load_problems(mbxp_problems_file)
    assert len(problems) == 974
    res = ex.execute_samples(problems, canonical=True, config=ex.ExecutionConfig(), progress=False)
    failed = {r["task_id"] for r in res if not r["passed"]}
    assert sum(r["passed"] for r in res) == 959
    assert failed == KNOWN_FAILURES, {r["task_id"]: r["result"] for r in res if r["task_id"] in failed ^ KNOWN_FAILURES}
    assert not any(r["result"] == "timed out" for r in res)


def test_a_lone_surrogate_completion_gets_a_verdict_and_the_run_goes_on(
    toy_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23 item 3: '\\udcff' in a completion (valid JSON) killed the results writer, on every resume."""
    samples = tmp_path / "s.jsonl"
    bad = "\treturn a + b  # \udcff\n"
    samples.write_text(
        json.dumps({"task_id": "T/0", "completion": bad})
        + "\n"
        + json.dumps({"task_id": "T/1", "completion": "    return 2 * x\n"})
        + "\n"
    )
    out = tmp_path / "r.jsonl"
    argv = [
        "--problems",
        str(toy_file),
        "--samples",
        str(samples),
        "--out",
        str(out),
        "--workers",
        "1",
        "--timeout",
        "10",
        "--no-progress",
    ]
    assert ex.main(argv) == 0, capsys.readouterr().err
    records = {r["task_id"]: r for r in map(json.loads, out.read_bytes().decode("utf-8").splitlines())}
    assert set(records) == {"T/0", "T/1"} and records["T/1"]["passed"]
    assert records["T/0"]["completion"] == bad  # kept losslessly (as a \\u escape in the file)
    assert ex.main(argv) == 0  # a rerun resumes: nothing left to do, no error
    assert len(out.read_bytes().splitlines()) == 2
