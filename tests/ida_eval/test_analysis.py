"""ida_eval.analysis: degenerate-output detection, failure classes, run comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ida_eval import (
    FAILURE_CLASSES,
    classify_failure,
    compare_runs,
    degeneration_reason,
    format_comparison,
    is_degenerate,
)
from ida_eval.analysis import WORD_REPEAT_MIN, degenerate_report, load_run, score_results
from ida_eval.failures import with_kind
from ida_eval.reports import compare_dirs, format_compare_dirs
from ida_eval.stats import bootstrap_interval, pass_at_k, wilson_interval
from tests.ida_eval.support import read_problems

PROMPT = '\n\ndef f(x):\n  """\n  Doc.\n  """\n'


@pytest.mark.parametrize(
    "text, kind",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("\t" * 20, "whitespace flood"),
        ("\n" * 12, "whitespace flood"),
        ("  return 1" + " " * 300, "whitespace flood"),
        ("  x = 1\n" + "  \n" * 30 + "  return x", "whitespace flood"),
        (" the" * 9, "repeated word"),
        ("  return x\n" * 5, "repeated line"),
        ("  return " + "foo" * 15, "repeated unit"),
        ("((((((((((((((((((((((((((((((((((((((((((((", "repeated unit"),
        ("  n = n + 1; " * 10, "repeated"),
    ],
)
def test_collapse_signatures_are_detected(text, kind):
    reason = degeneration_reason(text)
    assert reason is not None and reason.startswith(kind), (text, reason)
    assert is_degenerate(text) is True


@pytest.mark.parametrize(
    "text",
    [
        "  return a + b",
        "\tR = 3\n\tC = 3\n\ttc = [[0 for x in range(C)] for x in range(R)]\n\treturn tc[2][2]",
        "  if n == 0:\n    return 1\n  else:\n    return n * f(n - 1)",
        "  s = '-' * 30\n  return s",
        "  a = 0\n  a += 1\n  a += 1\n  a += 1\n  return a",  # 3 identical lines: legitimate
    ],
)
def test_ordinary_code_is_not_degenerate(text):
    assert degeneration_reason(text) is None
    assert is_degenerate(text) is False


def test_no_canonical_solution_is_degenerate(mbxp_problems_file):
    flagged = {p["task_id"]: degeneration_reason(p["canonical_solution"]) for p in read_problems(mbxp_problems_file)}
    assert {k: v for k, v in flagged.items() if v} == {}


@settings(max_examples=50, deadline=None)
@given(
    word=st.from_regex(r"[A-Za-z_]{1,8}", fullmatch=True),
    n=st.integers(WORD_REPEAT_MIN, 40),
    head=st.sampled_from(["", "  x = 1\n  ", "\treturn "]),
)
@pytest.mark.slow
def test_any_repeated_word_run_is_degenerate(word, n, head):
    assert is_degenerate(head + " ".join([word] * n)) is True


def _result(passed, result, completion="  return 1", exception=None, kind=None):
    kind = kind or ("passed" if passed else "exception" if exception else "other")
    return {
        "task_id": "MBPP/1",
        "passed": passed,
        "result": result,
        "kind": kind,
        "completion": completion,
        "exception": exception,
    }


def test_classify_failure():
    assert classify_failure(_result(True, "passed")) == "passed"
    assert (
        classify_failure(_result(False, "failed: AssertionError", exception="AssertionError"), PROMPT) == "wrong_answer"
    )
    assert classify_failure(_result(False, "timed out", kind="timeout"), PROMPT) == "timeout"
    assert (
        classify_failure(_result(False, "failed: NameError: name 'y' is not defined", exception="NameError"), PROMPT)
        == "runtime_error"
    )
    assert (
        classify_failure(
            _result(False, "failed: exited with status 0 before check() returned", kind="early_exit"), PROMPT
        )
        == "runtime_error"
    )
    # syntax errors found independently of the executor's verdict
    assert classify_failure(_result(False, "failed: something", completion="  return ((("), PROMPT) == "syntax_error"
    assert (
        classify_failure(_result(False, "failed: IndentationError: unexpected indent", exception="IndentationError"))
        == "syntax_error"
    )
    # collapse wins over the symptom it causes
    flood = _result(False, "failed: AssertionError", completion="  return 1 1 1 1 1 1 1 1 1 1 1")
    assert classify_failure(flood, PROMPT) == "degenerate"
    # a collapse cut away by truncation is still seen through the raw generation
    assert (
        classify_failure(_result(False, "failed: AssertionError", completion=""), PROMPT, raw="\n#\n#\n#\n#\n#")
        == "degenerate"
    )
    assert set(FAILURE_CLASSES) == {
        "degenerate",
        "timeout",
        "syntax_error",
        "wrong_answer",
        "runtime_error",
        "toolchain_missing",
    }
    # other languages: the executor's kinds map onto these; no Python parse of a Java prompt
    java = {"language": "java", "completion": "        return a + b;\n    }\n}", "passed": False}
    for kind, cls in [
        ("compile_error", "syntax_error"),
        ("wrong_answer", "wrong_answer"),
        ("runtime_error", "runtime_error"),
        ("compile_timeout", "timeout"),
        ("toolchain_missing", "toolchain_missing"),
        ("bad_input", "runtime_error"),
    ]:
        assert classify_failure({**java, "result": "failed: x", "kind": kind}, "class A {") == cls, kind
    # the kind decides, never the text
    assert classify_failure({**java, "result": "timed out", "kind": "runtime_error"}, "class A {") == "runtime_error"
    with pytest.raises(ValueError, match="has no 'kind'"):
        classify_failure({"passed": False, "result": "failed: AssertionError", "completion": "  return 1"})


def test_old_records_classify_as_before_through_the_legacy_parser():
    """Records written before the "kind" field, read through with_kind (as the results file reader
    does): the classes the text-reading classifier gave them."""
    old = [
        ({"result": "failed: AssertionError"}, "wrong_answer"),  # mxeval's own record: no "exception"
        ({"result": "failed: SyntaxError: invalid syntax", "exception": "SyntaxError"}, "syntax_error"),
        ({"result": "timed out"}, "timeout"),
        ({"result": "failed: killed by SIGKILL"}, "runtime_error"),
        ({"result": "failed: compile error: x", "language": "java"}, "syntax_error"),
        ({"result": "failed: wrong answer: test case 1", "language": "java"}, "wrong_answer"),
        ({"result": "failed: runtime error: exit status 1", "language": "java"}, "runtime_error"),
        ({"result": "timed out (compile)", "language": "java"}, "timeout"),
        ({"result": "toolchain missing: javac not found (java)", "language": "java"}, "toolchain_missing"),
    ]
    for rec, cls in old:
        got = classify_failure(with_kind({"passed": False, "completion": "  return 1", **rec}), PROMPT)
        assert got == cls, rec


def test_degenerate_report_counts_and_examples():
    samples = [
        {"task_id": f"MBPP/{i}", "completion": c, "raw": c}
        for i, c in enumerate(["  return 1", "", "\t" * 30, " ok" * 12, "  return 2"] * 3)
    ]
    rep = degenerate_report(samples)
    assert rep["count"] == 9 and len(rep["examples"]) == 5
    assert rep["kinds"] == {"empty": 3, "whitespace flood": 3, "repeated word": 3}


def _write_run(path, per_task):
    """A summary.json of per-task classes: one per task, or a list of each task's samples' classes."""
    path.mkdir()
    counts = {k: 0 for k in ("passed", *FAILURE_CLASSES)}
    for v in per_task.values():
        for c in [v] if isinstance(v, str) else v:
            counts[c] += 1
    summary = {
        "pass@1": counts["passed"] / sum(counts.values()),
        "n_tasks": len(per_task),
        "counts": counts,
        "per_task": per_task,
        "degenerate": {"count": counts["degenerate"]},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_compare_runs(tmp_path):
    a = _write_run(tmp_path / "a", {"MBPP/1": "passed", "MBPP/2": "degenerate", "MBPP/10": "wrong_answer"})
    b = _write_run(
        tmp_path / "b", {"MBPP/1": "wrong_answer", "MBPP/2": "passed", "MBPP/10": "wrong_answer", "MBPP/3": "passed"}
    )
    cmp = compare_runs(a, b)
    assert cmp["gained"] == ["MBPP/2"] and cmp["lost"] == ["MBPP/1"]
    assert cmp["changed_class"] == {"MBPP/1": ["passed", "wrong_answer"], "MBPP/2": ["degenerate", "passed"]}
    assert cmp["only_in_b"] == ["MBPP/3"]
    text = format_comparison(cmp)
    assert "pass@1" in text and "0.3333" in text and "0.5000" in text
    assert "(gained) (1): MBPP/2" in text and "(lost) (1): MBPP/1" in text


def test_a_class_changes_when_its_share_of_the_samples_does(tmp_path):
    """Sampled runs' samples are not paired one by one: the same classes in another order, or four samples of
    one class against a greedy run's one, are no change; other shares are."""

    def run(name: str, per_task: dict[str, list[str] | str]) -> Path:
        d = tmp_path / name
        d.mkdir()
        classes = [c for v in per_task.values() for c in ([v] if isinstance(v, str) else v)]
        counts = {k: classes.count(k) for k in ("passed", *FAILURE_CLASSES)}
        summary = {"pass@1": 0.0, "n_tasks": len(per_task), "counts": counts, "per_task": per_task}
        (d / "summary.json").write_text(json.dumps(summary))
        return d

    e, s, p = "wrong_answer", "syntax_error", "passed"
    a = run("a", {"T/1": [s, e, s, s], "T/2": [s, s, s, s], "T/3": [s, s, e, e], "T/4": [e, e, e, p]})
    b = run("b", {"T/1": [e, s, s, s], "T/2": [s, s, s, s], "T/3": [s, e, e, e], "T/4": [e, e, p, e]})
    assert compare_runs(a, b)["changed_class"] == {"T/3": [[s, s, e, e], [s, e, e, e]]}
    greedy = run("g", {"T/1": s, "T/2": s, "T/3": e, "T/4": e})
    assert list(compare_runs(a, greedy)["changed_class"]) == ["T/1", "T/3", "T/4"]  # T/2: all of one class


def test_a_sampled_comparison_tests_the_tasks_that_moved(tmp_path):
    """Four samples per task, 60 tasks: where 4 tasks gain a passing sample and none loses one, the paired
    permutation test gives McNemar's p for 4 flips, 2 / 2^4, although the bootstrap interval of the mean
    difference excludes 0 (the bootstrap seldom draws none of the four); 8 such tasks are real."""
    e, p = "wrong_answer", "passed"

    def tasks(gained: int) -> dict[str, list[str]]:
        return {f"T/{i}": [p if i < gained else e, e, e, e] for i in range(60)}

    a = _write_run(tmp_path / "a", tasks(0))
    cmp = compare_runs(a, _write_run(tmp_path / "b4", tasks(4)))
    paired = cmp["paired"]
    assert paired["p_value"] == 0.125 and paired["interval"][0] > 0
    assert paired["test"] == "paired permutation test of the per-task pass@1 differences (exact), two-sided"
    assert "p = 0.125: not distinguishable from chance at the 0.05 level" in format_comparison(cmp)
    eight = compare_runs(a, _write_run(tmp_path / "b8", tasks(8)))
    assert eight["paired"]["p_value"] == 2 / 2**8
    assert "p = 0.00781: a real difference at the 0.05 level" in format_comparison(eight)
    greedy = compare_runs(_write_run(tmp_path / "g", dict.fromkeys(tasks(0), e)), _write_run(tmp_path / "s", tasks(8)))
    assert greedy["paired"]["p_value"] == 2 / 2**8 and "approximate" in greedy["paired"]["test"]


def test_runs_of_several_languages_are_also_compared_on_all_their_tasks(tmp_path):
    """Two languages, 4 tasks each; B gains 2 tasks in each: McNemar's p is 0.5 per language, 0.125 on the 8
    tasks together, and the three tests are read together (Holm: 0.375, 1, 1)."""
    e, p = "wrong_answer", "passed"
    for name, gained in (("a", 0), ("b", 2)):
        run = tmp_path / name
        run.mkdir()
        for lang, prefix in (("python", "MBPP"), ("javascript", "MBJSP")):
            _write_run(run / lang, {f"{prefix}/{i}": p if i < gained else e for i in range(4)})
        (run / "languages.json").write_text(json.dumps({"languages": {"python": {}, "javascript": {}}}))
    result = compare_dirs([tmp_path / "a", tmp_path / "b"])
    (overall,) = result["overall"]
    assert overall["languages"] == ["python", "javascript"] and overall["pass@1"] == [0.0, 0.5]
    assert overall["paired"]["n"] == 8 and overall["paired"]["b_only"] == 4 and overall["paired"]["p_value"] == 0.125
    assert overall["paired"]["p_holm"] == 0.375 and overall["paired"]["tests_in_family"] == 3
    per_language = [e["comparisons"][0]["paired"] for e in result["languages"].values()]
    assert [(q["p_value"], q["p_holm"]) for q in per_language] == [(0.5, 1.0), (0.5, 1.0)]
    text = format_compare_dirs(result)
    assert "=== all 2 languages together (python, javascript)" in text
    assert "pass@1 over the 8 tasks: A 0.0000, B 0.5000" in text
    assert "p = 0.125 (Holm-adjusted for the 3 tests read together: 0.375)" in text
    table = text.split("=== summary (each run against the first; p from the paired test, adjusted by Holm's method)\n")[
        1
    ]
    assert [line.split() for line in table.splitlines()] == [
        ["language", "A", "pass@1", "B", "pass@1", "B", "-", "A", "p", "p", "(Holm)", "+/-"],
        ["python", "0.0000", "0.5000", "+0.5000", "0.5", "1", "2/0"],
        ["javascript", "0.0000", "0.5000", "+0.5000", "0.5", "1", "2/0"],
        ["all", "0.0000", "0.5000", "+0.5000", "0.125", "0.375"],
    ]
    assert "overall" not in compare_dirs([tmp_path / "a" / "python", tmp_path / "b" / "python"])  # one language


def test_a_comparison_says_when_the_runs_ran_under_other_toolchains(tmp_path):
    a = _write_run(tmp_path / "a", {"MBPP/1": "passed", "MBPP/2": "wrong_answer"})
    b = _write_run(tmp_path / "b", {"MBPP/1": "passed", "MBPP/2": "passed"})
    assert "toolchains" not in format_comparison(compare_runs(a, b))  # older runs record none: nothing said
    for d, version in ((a, "Python 3.11.7"), (b, "Python 3.12.1")):
        summary = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**summary, "executor": {"toolchains": [version]}}))
    cmp = compare_runs(a, b)
    assert cmp["a"]["toolchains"] == ["Python 3.11.7"] and cmp["b"]["toolchains"] == ["Python 3.12.1"]
    assert "other toolchains (A: Python 3.11.7; B: Python 3.12.1): a difference may come from them" in (
        format_comparison(cmp)
    )


def test_a_language_that_ran_in_neither_run_is_not_tested(tmp_path):
    """Swift without its toolchain in both runs: no p-value (so no place in Holm's family), one line saying so."""
    missing = {f"MBSWP/{i}": ["toolchain_missing"] * 2 for i in range(3)}
    cmp = compare_runs(_write_run(tmp_path / "a", missing), _write_run(tmp_path / "b", missing))
    assert cmp["paired"] == {"n": 3, "not_run": 3}
    assert "nothing ran on these 3 tasks in either run (toolchain missing): no difference to test" in (
        format_comparison(cmp)
    )


def test_a_comparison_says_which_tasks_had_other_problems_in_each_run(tmp_path):
    a = _write_run(tmp_path / "a", {"MBPP/1": "passed", "MBPP/2": "wrong_answer", "MBPP/3": "passed"})
    b = _write_run(tmp_path / "b", {"MBPP/1": "passed", "MBPP/2": "passed", "MBPP/3": "passed"})
    assert compare_runs(a, b)["other_problems"] == []  # no run.json: nothing known, nothing said
    pins = {"MBPP/1": "1" * 64, "MBPP/2": "2" * 64}
    (a / "run.json").write_text(json.dumps({"problems_sha256": pins}))
    (b / "run.json").write_text(json.dumps({"problems_sha256": {**pins, "MBPP/2": "f" * 64, "MBPP/3": "3" * 64}}))
    cmp = compare_runs(a, b)
    assert cmp["other_problems"] == ["MBPP/2"]  # MBPP/3: pinned in b only, so not known to differ
    assert "1 of the 3 tasks had another prompt or other tests in each run" in format_comparison(cmp)
    (b / "run.json").write_text("[1]")
    with pytest.raises(ValueError, match="run.json: not a run.json"):
        compare_runs(a, b)


def test_load_run_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="summary.json: not valid JSON"):
        load_run(tmp_path)


def test_ceiling_report():
    from ida_eval.analysis import UNPASSABLE_TASKS, ceiling_report

    per_task = {"MBPP/1": "passed", "MBPP/2": "wrong_answer", "MBPP/56": "runtime_error", "MBPP/596": "passed"}
    rep = ceiling_report(per_task)
    assert rep["unpassable_tasks_in_run"] == ["MBPP/56"] and rep["version_dependent_tasks_in_run"] == ["MBPP/596"]
    assert rep["max_pass@1"] == 0.75 and rep["pass@1_excluding_unpassable"] == pytest.approx(2 / 3)
    assert len(UNPASSABLE_TASKS) == 8


def test_unpassable_tasks_fail_with_their_canonical_solutions(mbxp_problems_file):
    """The ceiling's task list agrees with the data: those canonical programs fail in the executor."""
    from ida_eval import ExecutionConfig, execute_samples, load_problems
    from ida_eval.analysis import UNPASSABLE_TASKS

    problems = load_problems(mbxp_problems_file)
    chosen = {t: problems[t] for t in sorted(UNPASSABLE_TASKS)}
    results = execute_samples(chosen, canonical=True, config=ExecutionConfig(workers=2, timeout=20), progress=False)
    assert [r["task_id"] for r in results if r["passed"]] == []


def _records(per_task: list[tuple[int, int]]) -> list[dict[str, object]]:
    """Result records of tasks T/0, T/1, ... with (samples, passed) each."""
    return [{"task_id": f"T/{i}", "passed": j < c} for i, (n, c) in enumerate(per_task) for j in range(n)]


def test_score_intervals_keep_their_width_where_every_task_scores_the_same():
    """A bootstrap of identical per-task values is a point: a sampled run where every task failed (the seeds'
    pass@1 = 0.0) would read [0, 0], a zero claimed as certain. There the interval is Wilson's over the tasks;
    elsewhere the bootstrap's, and pass@1 of one sample per task stays Wilson's over the samples."""
    failed = score_results(_records([(4, 0)] * 100), [1, 4])
    for name in ("pass@1", "pass@4"):
        assert failed["pass@k"][name] == 0.0 and failed["intervals"][name] == list(wilson_interval(0, 100))
        assert failed["interval_method"][name].startswith("wilson 95 % over tasks")
    assert 0.03 < failed["intervals"]["pass@1"][1] < 0.04  # about 3.84 / 103.84, the "rule of three"'s kin
    passed = score_results(_records([(4, 4)] * 100), [1, 4])
    assert passed["intervals"]["pass@4"] == list(wilson_interval(100, 100))
    mixed = score_results(_records([(4, 0)] * 50 + [(4, 1)] * 50), [1])
    assert mixed["intervals"]["pass@1"] == list(bootstrap_interval([0.0] * 50 + [0.25] * 50))
    assert mixed["interval_method"]["pass@1"].startswith("percentile bootstrap")
    greedy = score_results(_records([(1, 0)] * 100), [1])
    assert greedy["interval_method"]["pass@1"] == "wilson 95 %"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5)), min_size=1, max_size=30), st.integers(1, 5))
def test_every_score_interval_holds_its_score_and_has_a_width(table, k):
    """Property: each pass@k lies in its interval, which has a width unless every task has the same score
    strictly between 0 and 1 (a bootstrap of identical values; docs/eval.md says so)."""
    table = [(n, min(c, n)) for n, c in table]
    k = min(k, *(n for n, _ in table))
    s = score_results(_records(table), [k])
    (lo, hi), value = s["intervals"][f"pass@{k}"], s["pass@k"][f"pass@{k}"]
    assert lo <= value <= hi
    scores = {pass_at_k(n, c, k) for n, c in table}
    assert hi > lo or (len(scores) == 1 and 0 < scores.pop() < 1 and any(n > 1 for n, _ in table))
