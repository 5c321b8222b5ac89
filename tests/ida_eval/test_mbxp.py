"""ida_eval.harness and the ida_eval.mbxp CLI in-process (files, resume, run pinning, CLI errors)."""

from __future__ import annotations

import json
import platform

import pytest

from ida_eval import ExecutionConfig, compare_runs, evaluate_checkpoint, evaluate_model, generate, harness
from ida_eval import execute as ex
from ida_eval.harness import select_problems
from ida_eval.isolation import ISOLATION_LEVELS
from ida_eval.mbxp import main
from ida_eval.problems import problem_sha256, problems_sha256
from ida_eval.rundir import RunDirError, read_samples
from ida_eval.sandbox import SandboxError
from tests.ida_eval.support import (
    SMALL_PROBLEMS,
    save_mxfp8_checkpoint,
    tiny_model,
    train_tokenizer,
    write_problems,
)

EXEC = ExecutionConfig(workers=2, timeout=20)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = train_tokenizer([p["prompt"] + p["canonical_solution"] for p in SMALL_PROBLEMS] * 2, vocab_size=300)
    model = tiny_model("qwen3", len(tok), seed=1)
    path = write_problems(tmp_path_factory.mktemp("p") / "problems.jsonl", SMALL_PROBLEMS)
    return model, tok, path


def test_run_files_resume_and_pinning(setup, tmp_path):
    model, tok, problems = setup
    out = tmp_path / "run"
    kw = dict(batch_size=2, max_new_tokens=10, limit=3, exec_config=EXEC, progress=False)
    s = evaluate_model(model, tok, problems, out, **kw)
    ids = [p["task_id"] for p in SMALL_PROBLEMS[:3]]
    assert list(s["per_task"]) == ids and s["n_tasks"] == 3
    assert sum(s["counts"].values()) == 3 and s["passed"] == s["counts"]["passed"]
    assert s["pass@1"] == s["passed"] / 3
    assert s["timings"]["generated_tasks"] == 3 and s["timings"]["generated_tokens"] > 0
    assert s["model"]["class"] == "Qwen3ForCausalLM" and s["checkpoint"] is None
    assert s["isolation"] and set(s["isolation"]) <= set(ISOLATION_LEVELS)  # mode names, not descriptions
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["per_task"] == s["per_task"]
    samples = read_samples(out / "samples.jsonl")
    assert sorted(samples) == [(t, 0) for t in ids] and all(
        {"completion", "raw", "n_tokens", "stop_reason"} <= set(v) for v in samples.values()
    )
    assert len((out / "results.jsonl").read_text().splitlines()) == 3

    # crash mid-append: the last sample line is torn; a rerun regenerates exactly that task
    data = (out / "samples.jsonl").read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    (out / "samples.jsonl").write_bytes(data[: last_start + 10])
    with pytest.warns(RuntimeWarning, match="incomplete last line"):
        s2 = evaluate_model(model, tok, problems, out, **kw)
    assert s2["timings"]["generated_tasks"] == 1
    assert (out / "samples.jsonl").read_bytes() == data  # greedy: the same line again, file line-aligned
    assert s2["per_task"] == s["per_task"]

    # extending the run to more tasks generates only the new ones
    s3 = evaluate_model(model, tok, problems, out, **{**kw, "limit": 4})
    assert s3["timings"]["generated_tasks"] == 1 and s3["n_tasks"] == 4

    # different decoding settings may not be mixed into this directory
    with pytest.raises(RunDirError, match="different decoding"):
        evaluate_model(model, tok, problems, out, **{**kw, "max_new_tokens": 11})
    # nothing left to generate: no model needed
    with pytest.warns(UserWarning, match="not among the samples"):  # results.jsonl also holds T/4 now
        assert evaluate_model(None, None, problems, out, **kw)["per_task"] == s["per_task"]
    with pytest.raises(ValueError, match="no model was given"):
        evaluate_model(None, None, problems, out, **{**kw, "limit": 5})


def test_a_problem_whose_prompt_or_tests_changed_is_not_resumed_into_the_run(setup, tmp_path, capsys):
    """run.json pins each problem's sha256: a resume whose problems file changed a task the run holds is
    refused in one line (before the model loads), new tasks join the pins, and a directory written before
    problems were pinned gets them on its next resume."""
    model, tok, problems = setup
    out = tmp_path / "run"
    kw = dict(batch_size=2, max_new_tokens=6, exec_config=EXEC, progress=False)
    first = evaluate_model(model, tok, problems, out, limit=2, **kw)
    assert first["problems"]["sha256"] == problems_sha256({p["task_id"]: p for p in SMALL_PROBLEMS[:2]})
    run = json.loads((out / "run.json").read_text())
    ids = [p["task_id"] for p in SMALL_PROBLEMS]
    assert list(run["problems_sha256"]) == ids[:2]
    assert run["problems_sha256"][ids[0]] == problem_sha256(SMALL_PROBLEMS[0])

    edited = [{**SMALL_PROBLEMS[0], "test": SMALL_PROBLEMS[0]["test"] + "\n"}, *SMALL_PROBLEMS[1:]]
    edited_file = write_problems(tmp_path / "edited.jsonl", edited)
    with pytest.raises(RunDirError, match=f"1 of the 3 given now differ in their prompt or tests \\({ids[0]}: sha256"):
        evaluate_model(None, None, edited_file, out, limit=3, **kw)
    assert list(json.loads((out / "run.json").read_text())["problems_sha256"]) == ids[:2]  # nothing pinned
    cli = ["--checkpoint", str(save_mxfp8_checkpoint(model, tok, tmp_path / "ckpt")), "--out", str(tmp_path / "cli")]
    cli += ["--limit", "2", "--max-new-tokens", "6", "--device", "cpu", "--no-progress"]
    assert main([*cli, "--problems", str(problems)]) == 0
    capsys.readouterr()
    assert main([*cli, "--problems", str(edited_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 of the 2 given now differ in their prompt or tests" in err[0], err

    # only a changed field that a sample or its verdict depends on counts; new tasks join the pins
    described = [{**SMALL_PROBLEMS[0], "canonical_solution": "  pass"}, *SMALL_PROBLEMS[1:]]
    third = evaluate_model(model, tok, write_problems(tmp_path / "described.jsonl", described), out, limit=3, **kw)
    assert third["problems"]["sha256"] == problems_sha256({p["task_id"]: p for p in SMALL_PROBLEMS[:3]})
    assert third["problems"]["sha256"] != first["problems"]["sha256"]
    assert list(json.loads((out / "run.json").read_text())["problems_sha256"]) == ids[:3]
    with pytest.warns(UserWarning, match="not among the samples"):  # results.jsonl holds three tasks
        evaluate_model(None, None, problems, out, limit=1, **kw)  # a smaller --limit keeps every pin
    assert list(json.loads((out / "run.json").read_text())["problems_sha256"]) == ids[:3]

    # run.json of an older ida (no problems pinned): resumed, and pinned from now on
    (out / "run.json").write_text(json.dumps({k: v for k, v in run.items() if k != "problems_sha256"}))
    evaluate_model(None, None, problems, out, limit=3, **kw)
    assert list(json.loads((out / "run.json").read_text())["problems_sha256"]) == ids[:3]


def test_an_old_run_directory_resumes_and_compares_the_same(tmp_path, monkeypatch):
    """A run directory written before records carried "kind" (results.jsonl without it): resuming
    executes nothing and gives the same summary, and --compare against it shows no change."""
    import torch

    from ida_eval.decoding import Generation

    problems = {p["task_id"]: p for p in SMALL_PROBLEMS[:5]}
    texts = {
        "T/1": "\treturn a + b",
        "T/2": "  return n +",
        "T/3": "  return undefined_name",
        "T/4": "  return s",
        "T/5": " the" * 12,
    }  # passed, syntax, NameError, assertion, degenerate

    def fixed(model, tokenizer, prompts, config, *, progress=True, on_batch=None, completion_ids=None):
        gens = [Generation(t, texts[t], texts[t], 3, "eos") for t in prompts]
        if on_batch is not None:
            on_batch(gens)
        return gens

    monkeypatch.setattr(generate, "generate_completions", fixed)
    new, old = tmp_path / "new", tmp_path / "old"
    s_new = evaluate_model(torch.nn.Linear(2, 2), None, problems, new, exec_config=EXEC, progress=False)
    assert set(s_new["per_task"].values()) == {"passed", "syntax_error", "runtime_error", "wrong_answer", "degenerate"}
    records = [json.loads(x) for x in (new / "results.jsonl").read_text().splitlines()]
    assert all("kind" in r for r in records)
    old.mkdir()
    for name in ("run.json", "samples.jsonl", "summary.json"):
        (old / name).write_bytes((new / name).read_bytes())
    (old / "results.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n" for r in records)
    )
    s_old = evaluate_model(None, None, problems, old, exec_config=EXEC, progress=False)  # nothing to run
    for key in ("pass@1", "counts", "per_task", "ceiling", "executor", "languages", "isolation"):
        assert s_old[key] == s_new[key], key
    cmp = compare_runs(old, new)
    assert (cmp["gained"], cmp["lost"], cmp["changed_class"]) == ([], [], {})
    assert cmp["a"]["counts"] == cmp["b"]["counts"] == s_new["counts"]


def test_failed_validation_leaves_the_directory_unpinned(setup, tmp_path):
    model, tok, problems = setup
    out = tmp_path / "run"
    kw = dict(limit=1, exec_config=EXEC, progress=False)
    with pytest.raises(ValueError, match="no model was given"):
        evaluate_model(None, None, problems, out, max_new_tokens=10, **kw)
    assert not (out / "run.json").exists()
    # so the directory is still free for other settings; this run then pins it
    s = evaluate_model(model, tok, problems, out, max_new_tokens=11, **kw)
    assert s["n_tasks"] == 1
    assert json.loads((out / "run.json").read_text())["decoding"]["max_new_tokens"] == 11
    with pytest.raises(RunDirError, match="different decoding"):  # checked before anything else
        evaluate_model(None, None, problems, out, max_new_tokens=10, **{**kw, "limit": 2})


def test_a_different_run_is_refused_before_the_model_is_loaded(setup, tmp_path, monkeypatch):
    """``evaluate_checkpoint`` checks ``run.json`` before loading (a 4B load takes minutes)."""
    model, tok, problems = setup
    ckpt = save_mxfp8_checkpoint(model, tok, tmp_path / "ckpt")
    out = tmp_path / "run"
    kw = dict(problems_path=problems, out_dir=out, limit=1, device="cpu", exec_config=EXEC, progress=False)
    assert evaluate_checkpoint(ckpt, max_new_tokens=10, **kw)["n_tasks"] == 1
    loads = []
    monkeypatch.setattr(harness, "load_model", lambda *a, **k: loads.append(a))
    with pytest.raises(RunDirError, match="different decoding"):
        evaluate_checkpoint(ckpt, max_new_tokens=11, **{**kw, "limit": 2})
    assert loads == []


def test_isolation_is_a_list_of_modes_even_when_nothing_ran(tmp_path):
    s = evaluate_model(None, None, {}, tmp_path / "empty", exec_config=EXEC, progress=False)
    assert s["n_tasks"] == 0 and s["isolation"] == []
    assert json.loads((tmp_path / "empty" / "summary.json").read_text())["isolation"] == []


def test_cli_ctrl_c_and_sandbox_failure_end_in_one_line_and_resume(setup, tmp_path, monkeypatch, capsys):
    """Like ``python -m ida_eval.execute``: 130 with a resume hint that holds, 3 for a sandbox failure."""
    model, tok, problems = setup
    loads = []
    monkeypatch.setattr(harness, "describe_checkpoint", lambda d: None)
    monkeypatch.setattr(harness, "load_model", lambda *a, **k: loads.append(a) or (model, tok))
    plain_generate = generate.generate_completions

    def ctrl_c_after_first_batch(*args, on_batch, **kwargs):
        def append_then_interrupt(gens):
            on_batch(gens)
            raise KeyboardInterrupt

        return plain_generate(*args, on_batch=append_then_interrupt, **kwargs)

    out = tmp_path / "run"
    (tmp_path / "ckpt").mkdir()  # what the CLI checks before work: a config and tokenizer files
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "ckpt" / "tokenizer.json").write_text("{}")
    args = [
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--problems",
        str(problems),
        "--out",
        str(out),
        "--limit",
        "3",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "10",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--no-progress",
    ]
    monkeypatch.setattr(generate, "generate_completions", ctrl_c_after_first_batch)
    assert main(args) == 130
    err = capsys.readouterr().err  # phase lines (load, generate), then the one interruption line
    assert err.splitlines()[-1] == (
        f"ida_eval.mbxp: interrupted; finished samples and results are kept in {out}: "
        "rerun the same command (same --out) to resume"
    )
    assert "Traceback" not in err and err.splitlines()[0].startswith("load: ")
    assert len(read_samples(out / "samples.jsonl")) == 2

    def no_sandbox(level):
        raise SandboxError("no sandbox here")

    probe = ex.probe_isolation
    monkeypatch.setattr(generate, "generate_completions", plain_generate)
    monkeypatch.setattr(ex, "probe_isolation", no_sandbox)
    assert main(args) == 3
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "ida_eval.mbxp: error: sandbox: no sandbox here"
    assert "resumed: 2 of 3 already done (generation, " in err  # the rerun said it resumed
    assert len(read_samples(out / "samples.jsonl")) == 3  # the generation before it is kept

    monkeypatch.setattr(ex, "probe_isolation", probe)
    assert main(args) == 0  # the rerun resumes: nothing generated again, the model not even loaded
    assert len(loads) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["timings"]["generated_tasks"] == 0 and summary["n_tasks"] == 3
    report = capsys.readouterr().out.splitlines()  # the report says what this call did, in words
    assert report[0].startswith("pass@1 = ") and report[-1].startswith("generation ")
    assert "(nothing generated)" in report[-1] and "programs/s)" in report[-1] and "None" not in report[-1]
    assert report[-1].endswith(f"; toolchain: Python {platform.python_version()}")
    assert main(args) == 0 and "(nothing executed)" in capsys.readouterr().out.splitlines()[-1]


def test_select_problems(setup):
    _, _, problems = setup
    assert list(select_problems(problems, 2)) == ["T/1", "T/2"]
    assert len(select_problems(problems, None)) == len(SMALL_PROBLEMS)
    with pytest.raises(ValueError, match="limit"):
        select_problems(problems, 0)


def test_cli_errors(tmp_path, capsys):
    assert main([]) == 2
    assert (
        main(
            [
                "--checkpoint",
                str(tmp_path / "nope"),
                "--problems",
                str(tmp_path / "none.jsonl"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "error:" in capsys.readouterr().err
    assert main(["--compare", str(tmp_path), str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_public_api_and_docstring_examples():
    import doctest

    import ida_eval
    from ida_eval import analysis, failures, generate

    assert ida_eval.__all__ == sorted(ida_eval.__all__)
    assert all(hasattr(ida_eval, n) for n in ida_eval.__all__)
    for module in (ida_eval, analysis, failures, generate):
        failed, attempted = doctest.testmod(module)
        assert failed == 0 and attempted > 0, module.__name__


def test_language_all_scores_each_language_and_writes_the_table(setup, tmp_path, capsys):
    """``--language all`` over a benchmark directory: one run dir per language (its own stop strings
    pinned), the model loaded once, languages.json + the table; --compare walks the languages."""
    from ida_eval.languages import LANGUAGES, missing_tools
    from tests.ida_eval.support import save_mxfp8_checkpoint
    from tests.ida_eval.toys import TOYS, toy_problem

    if missing_tools(LANGUAGES["javascript"]):
        pytest.skip("javascript toolchain missing")
    model, tok, problems = setup
    ckpt = save_mxfp8_checkpoint(model, tok, tmp_path / "ckpt")
    data = tmp_path / "data"
    data.mkdir()
    write_problems(data / "py.jsonl", SMALL_PROBLEMS[:2])
    js = [toy_problem("javascript", str(i)) for i in range(2)]
    write_problems(data / "js.jsonl", js)
    (data / "metadata.json").write_text(json.dumps({"python": "py.jsonl", "javascript": "js.jsonl"}))
    out = tmp_path / "run"
    args = [
        "--checkpoint",
        str(ckpt),
        "--language",
        "all",
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--batch-size",
        "2",
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--no-progress",
    ]
    assert main(args) == 0
    table = json.loads((out / "languages.json").read_text())["languages"]
    assert list(table) == ["python", "javascript"] and all(r["n_tasks"] == 2 for r in table.values())
    for lang in table:
        run = json.loads((out / lang / "run.json").read_text())
        assert tuple(run["decoding"]["stop_strings"]) == LANGUAGES[lang].stop_sequences
        summary = json.loads((out / lang / "summary.json").read_text())
        assert summary["languages"] == {
            lang: {
                "pass@1": table[lang]["pass@1"],
                "samples": 2,
                "passed": table[lang]["passed"],
                "toolchain_missing": 0,
            }
        }
        if lang == "javascript":  # no Python syntax check on JavaScript prompts
            assert summary["counts"]["syntax_error"] == 0
    printed = capsys.readouterr().out
    assert "javascript" in printed and "languages.json" in printed
    assert main(["--compare", str(out), str(out)]) == 0
    compared = capsys.readouterr().out
    assert "=== javascript" in compared and "=== all 2 languages together (python, javascript)" in compared
    # a language the metadata does not list is bad input (status 2)
    assert main(args[:2] + ["--language", "cobol", "--data-dir", str(data), "--out", str(out)]) == 2
    assert "--language 'cobol'" in capsys.readouterr().err
    assert TOYS  # the toy problems come from the language tests


def test_language_all_scores_a_language_without_its_toolchain_apart(setup, tmp_path, capsys):
    """A language whose toolchain is missing here is not run: its runnable pass@1 is None ("n/a"), not 0, and
    the overall line of ``--language all`` says so and gives pass@k over the tasks that ran too (the number
    two machines with different toolchains can compare), beside mxeval's over every task."""
    from ida_eval.languages import LANGUAGES, missing_tools
    from tests.ida_eval.support import save_mxfp8_checkpoint

    if not missing_tools(LANGUAGES["swift"]):
        pytest.skip("swift is installed here: no language without a toolchain to test with")
    model, tok, _ = setup
    ckpt = save_mxfp8_checkpoint(model, tok, tmp_path / "ckpt")
    data = tmp_path / "data"
    data.mkdir()
    write_problems(data / "py.jsonl", SMALL_PROBLEMS[:2])
    swift = {"prompt": "func add(a: Int, b: Int) -> Int {\n", "test": "\nassert(add(a: 1, b: 2) == 3)\n"}
    write_problems(data / "sw.jsonl", [{"task_id": "MBSWP/1", "language": "swift", "entry_point": "add", **swift}])
    (data / "metadata.json").write_text(json.dumps({"python": "py.jsonl", "swift": "sw.jsonl"}))
    out = tmp_path / "run"
    args = ["--checkpoint", str(ckpt), "--language", "all", "--data-dir", str(data), "--out", str(out)]
    assert main([*args, "--max-new-tokens", "8", "--device", "cpu", "--workers", "2", "--no-progress"]) == 0
    result = json.loads((out / "languages.json").read_text())
    table, overall = result["languages"], result["overall"]
    assert table["swift"]["toolchain_missing"] == 1 and table["swift"]["pass@1_runnable"] is None
    assert table["python"]["pass@1_runnable"] == table["python"]["pass@1"]
    assert (
        table["python"]["toolchains"] == [f"Python {platform.python_version()}"] and table["swift"]["toolchains"] == []
    )
    assert overall["n_tasks"] == 3 and overall["languages"] == 2 and overall["not_run"] == ["swift"]
    python_passed = table["python"]["passed"]
    assert overall["pass@k"]["pass@1"] == pytest.approx(python_passed / 3)  # the swift task as failed
    assert overall["runnable"] == {"pass@k": {"pass@1": python_passed / 2}, "n_tasks": 2, "languages": 1}
    printed = capsys.readouterr().out.splitlines()
    assert (
        "toolchain missing here: 1 samples not run, counted as failed (as mxeval counts them); none could run"
        in printed
    )
    assert next(x for x in printed if x.startswith("swift ")).split()[-2:] == ["n/a", "1"]
    assert printed[-2].startswith("overall over the 2 tasks that ran (1 languages; 1 tasks' toolchain missing here")
    assert "not run: swift" in printed[-2]


@pytest.mark.parametrize("value", ["inf", "1e300", "0"])
def test_unusable_timeout_is_refused_before_generation(value: str, tmp_path, capsys) -> None:
    """Issue 23 item 4: ``--timeout inf`` failed after a whole generation (rc 70); now one line, rc 2, first."""
    assert main(["--checkpoint", str(tmp_path / "no-such-checkpoint"), "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ida_eval.mbxp: error: ") and "seconds" in err and err.count("\n") == 1, err
