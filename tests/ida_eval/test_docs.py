"""docs/eval.md stays true: what it says about ida_eval is checked against the code.

* every ``--flag`` it shows for ``python -m ida_eval.mbxp`` / ``python -m ida_eval.execute`` exists in
  that command's argparse parser (captured by calling ``main``), every flag of the parsers is shown,
  and the defaults in its flag tables are the parsers' defaults;
* the blocks after ``<!-- check:NAME -->`` markers (summary.json keys, results and samples fields,
  limits, stop strings, degenerate thresholds, failure classes, isolation modes, the 15 known
  canonical failures) equal what the code defines or writes; the summary and record fields come from
  a small real harness run (generation replaced by fixed completions, everything else real);
* the executor example runs and prints exactly what the guide shows (needs the MBXP data);
* every ``ida_eval.*`` name it mentions exists, and its lines fit in 110 characters.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ida_eval import analysis, decoding, execute, generate, stats
from ida_eval.isolation import ISOLATION_LEVELS
from tests.conftest import REPO_ROOT, mbxp_dir
from tests.ida_eval.support import KNOWN_FAILURES, SMALL_PROBLEMS, capture_parser

EVAL_MD = REPO_ROOT / "docs" / "eval.md"
MAX_LINE = 110
MODULES = ("ida_eval.mbxp", "ida_eval.execute")
MARKER_RE = re.compile(r"^<!-- check:([\w-]+) -->$")
SPAN_RE = re.compile(r"`([^`]+)`")
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ITEM_RE = re.compile(r"^(?:\* |\d+\. )")
UNITS = {"": 1, "s": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
Options = dict[str, dict[str, argparse.Action]]  # CLI module -> {"--flag": its argparse action}


# ------------------------------------------------------------------ reading the guide


def doc_text() -> str:
    return EVAL_MD.read_text(encoding="utf-8")


def checked_blocks(text: str) -> dict[str, list[str]]:
    """``{NAME: lines}`` for every ``<!-- check:NAME -->``: the fenced block right after it, or else
    the lines up to the next blank line."""
    lines = text.splitlines()
    blocks: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        m = MARKER_RE.match(line)
        if not m:
            continue
        assert m.group(1) not in blocks, f"marker {m.group(1)!r} appears twice"
        j, block = i + 1, []
        if lines[j].startswith("```"):
            j += 1
            while not lines[j].startswith("```"):
                block.append(lines[j])
                j += 1
        else:
            while j < len(lines) and lines[j].strip():
                block.append(lines[j])
                j += 1
        assert block, f"marker {m.group(1)!r} is followed by nothing"
        blocks[m.group(1)] = block
    return blocks


def table_rows(block: list[str]) -> list[list[str]]:
    """Cells of a markdown table's body rows (header and separator dropped)."""
    rows = [line for line in block if line.startswith("|")]
    assert len(rows) > 2, f"not a table: {block[:2]}"
    return [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows[2:]]


def list_items(block: list[str]) -> list[str]:
    """Top-level items of a markdown list, each with its continuation lines joined by spaces."""
    items: list[str] = []
    for line in block:
        if ITEM_RE.match(line):
            items.append(ITEM_RE.sub("", line, count=1))
        else:
            assert items, f"text before the first list item: {line!r}"
            items[-1] += " " + line.strip()
    return items


def first_span(text: str) -> str:
    m = SPAN_RE.search(text)
    assert m, f"no `code` in {text!r}"
    return m.group(1)


def brace_set(text: str) -> set[str] | None:
    """Names of the first ``{a, b, c}`` code span in ``text``, or None."""
    for span in SPAN_RE.findall(text):
        if span.startswith("{") and span.endswith("}"):
            return {name.strip() for name in span[1:-1].split(",")}
    return None


def blocks_or_fail(name: str) -> list[str]:
    blocks = checked_blocks(doc_text())
    assert name in blocks, f"docs/eval.md lost its <!-- check:{name} --> block"
    return blocks[name]


# ------------------------------------------------------------------ the CLIs' parsers


@pytest.fixture(scope="module")
def options() -> Options:
    """``{module: {"--flag": action}}`` of both CLIs (``--help`` and ``--debug``, common to every command and
    documented in docs/cli.md, left out)."""
    from ida_eval import mbxp

    out = {}
    for module, main in (("ida_eval.mbxp", mbxp.main), ("ida_eval.execute", execute.main)):
        parser = capture_parser(main)
        out[module] = {
            opt: action
            for action in parser._actions
            for opt in action.option_strings
            if opt.startswith("--") and opt not in ("--help", "--debug")
        }
    return out


def flags_shown(text: str) -> dict[str, set[str]]:
    """Flags the guide attributes to each CLI (key ``""``: to no CLI in particular).

    A command line (a fenced line or a code span containing ``python -m ida_eval.X``) attributes
    its flags to X. A code span that starts with ``--`` belongs to the CLI named in the enclosing
    ``## `` heading, or to none.
    """
    shown: dict[str, set[str]] = {m: set() for m in (*MODULES, "")}
    owner, fenced = "", False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and line.startswith("## "):
            owner = next((m for m in MODULES if m in line), "")
        units = [re.split(r"\s#", line, maxsplit=1)[0]] if fenced else SPAN_RE.findall(line)
        for unit in units:
            named = [m for m in MODULES if re.search(rf"python -m {re.escape(m)}(?![\w.])", unit)]
            assert len(named) <= 1, f"one command per line or span, please: {unit!r}"
            if named:
                shown[named[0]] |= set(FLAG_RE.findall(unit))
            elif not fenced and unit.startswith("--"):
                shown[owner] |= set(FLAG_RE.findall(unit))
    return shown


def test_every_flag_shown_exists_and_every_flag_is_shown(options: Options) -> None:
    shown = flags_shown(doc_text())
    for module in MODULES:
        real = set(options[module])
        extra, unshown = shown[module] - real, real - shown[module]
        assert not extra, f"docs/eval.md shows {module} flags it does not have: {extra}"
        assert not unshown, f"docs/eval.md does not show these {module} flags: {unshown}"
    every = set().union(*(set(o) for o in options.values()))
    assert shown[""] <= every, f"docs/eval.md mentions flags no CLI has: {shown[''] - every}"


@pytest.mark.parametrize("module", MODULES)
def test_flag_tables_list_every_flag_with_its_default(module: str, options: Options) -> None:
    rows = table_rows(blocks_or_fail(module.split(".")[1] + "-flags"))
    listed = []
    for cells in rows:
        flag = first_span(cells[0]).split()[0]
        listed.append(flag)
        action = options[module].get(flag)
        assert action is not None, f"docs/eval.md lists {flag} for {module}, which has no such flag"
        m = re.fullmatch(r"`([^`]+)`", cells[1])
        if m:  # a default given as code must be the parser's
            want = action.default
            got: Any = type(want)(m.group(1)) if isinstance(want, (int, float)) else m.group(1)
            assert got == want, f"docs/eval.md: {module} {flag} default {got!r}, the parser says {want!r}"
        if cells[1] == "required" and module == "ida_eval.execute":
            assert action.required, f"docs/eval.md: {flag} is not required"
    assert sorted(listed) == sorted(options[module]), f"{module} flag table vs parser: {listed}"


# ------------------------------------------------------------------ one small real harness run


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``evaluate_model`` on two of the test problems with a real checkpoint description, real
    samples writer, executor and analysis; only ``generate_completions`` returns fixed texts
    (one correct, one collapsed), so no model has to be built."""
    import torch

    from ida_eval import ExecutionConfig, describe_checkpoint, evaluate_model
    from ida_eval.decoding import Generation
    from mxfp8_codec import write_mxfp8_safetensors

    root = tmp_path_factory.mktemp("docs-run")
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    weights = {"model.layers.0.mlp.up_proj.weight": np.ones((4, 32))}
    write_mxfp8_safetensors(ckpt / "model.safetensors", weights)
    problems = {p["task_id"]: p for p in SMALL_PROBLEMS[:2]}
    texts = {"T/1": problems["T/1"]["canonical_solution"], "T/2": " the" * 12}

    def fixed_generations(model, tokenizer, prompts, config, *, progress=True, on_batch=None, completion_ids=None):
        gens = [Generation(t, texts[t], texts[t], 3, "eos") for t in prompts]
        if on_batch is not None:
            on_batch(gens)
        return gens

    saved = generate.generate_completions
    generate.generate_completions = fixed_generations
    try:
        summary = evaluate_model(
            torch.nn.Linear(2, 2),  # stands in for the model: only its parameters' dtype/device are read
            None,
            problems,
            root / "run",
            exec_config=ExecutionConfig(workers=2, timeout=20),
            progress=False,
            checkpoint_info=describe_checkpoint(ckpt),
        )
    finally:
        generate.generate_completions = saved
    read = lambda name: [json.loads(x) for x in (root / "run" / name).read_text().splitlines()]  # noqa: E731
    yield {"summary": summary, "samples": read("samples.jsonl"), "results": read("results.jsonl"), "problems": problems}


def test_summary_json_keys_are_the_ones_the_harness_writes(harness_run: dict[str, Any]) -> None:
    summary = harness_run["summary"]
    assert summary["per_task"] == {"T/1": "passed", "T/2": "degenerate"}  # the run really ran
    items = list_items(blocks_or_fail("summary-keys"))
    documented = {first_span(item): item for item in items}
    assert len(documented) == len(items), "a summary.json key is listed twice"
    assert set(documented) == set(summary), (
        f"docs/eval.md summary.json keys vs the code's: only in the doc {set(documented) - set(summary)}, "
        f"only in the code {set(summary) - set(documented)}"
    )
    for key, item in documented.items():
        names = brace_set(item)
        if names is None:
            continue
        value = summary[key]
        assert isinstance(value, dict), f"summary.json {key!r} is not an object"
        assert names == set(value), f"summary.json {key!r}: doc {sorted(names)} vs code {sorted(value)}"
    # the figures quoted for the degenerate examples
    text = documented["degenerate"]
    assert f"up to {analysis.MAX_EXAMPLES} examples" in text
    assert f"first {analysis.EXAMPLE_CHARS} characters" in text


def test_model_and_execute_summary_keys(harness_run: dict[str, Any]) -> None:
    import torch

    from ida_eval import harness

    items = {first_span(i): i for i in list_items(blocks_or_fail("summary-keys"))}
    info = harness._model_info(torch.nn.Linear(2, 2))
    assert brace_set(items["model"]) == set(info)
    assert harness_run["summary"]["model"] == info  # what the run recorded for its stand-in
    exec_summary = execute.summarize(harness_run["results"], harness_run["problems"])
    text = " ".join(blocks_or_fail("execute-summary-keys"))
    names = brace_set(text)
    assert names == set(exec_summary), f"--summary keys: doc {names} vs code {set(exec_summary)}"
    assert f"first {execute.MAX_LISTED_TASKS} of them" in text


def test_results_and_samples_fields(harness_run: dict[str, Any]) -> None:
    samples = harness_run["samples"]
    sample_fields = {first_span(r[0]) for r in table_rows(blocks_or_fail("samples-fields"))}
    # a greedy line has no completion_id (it stays mxeval's); a sampling run's lines have every field
    assert all(set(s) | {"completion_id"} == sample_fields for s in samples), (
        f"samples.jsonl: {[list(s) for s in samples]}"
    )
    assert sample_fields == {f.name for f in dataclasses.fields(decoding.Generation)}
    passed_through = set(samples[0]) - {"task_id", "completion"}  # the sample's other keys are kept
    result_fields = {first_span(r[0]) for r in table_rows(blocks_or_fail("results-fields"))}
    for rec in harness_run["results"]:
        assert set(rec) - passed_through == result_fields, f"results record {sorted(rec)}"


# ------------------------------------------------------------------ constants and lists


def test_limits_table_matches_execution_config() -> None:
    fields = {f.name: f for f in dataclasses.fields(execute.ExecutionConfig)}
    defaults = execute.ExecutionConfig()
    seen = set()
    for cells in table_rows(blocks_or_fail("limits")):
        m = re.fullmatch(r"`(\w+)`", cells[1])
        if not m:
            continue  # derived limits (CPU time, core dumps)
        name = m.group(1)
        assert name in fields, f"docs/eval.md limits table: ExecutionConfig has no field {name!r}"
        seen.add(name)
        want, cell = getattr(defaults, name), cells[2]
        if n := re.fullmatch(r"([\d.]+) ?(s|KiB|MiB|GiB)?", cell):
            assert float(n.group(1)) * UNITS[n.group(2) or ""] == want, f"{name}: doc {cell!r}, code {want!r}"
        elif c := re.fullmatch(r"`([^`]+)`", cell):
            assert c.group(1) == str(want), f"{name}: doc {cell!r}, code {want!r}"
        elif cell in ("on", "off"):
            assert want is (cell == "on"), f"{name}: doc {cell!r}, code {want!r}"
    assert seen == set(fields), f"limits table lacks ExecutionConfig fields {set(fields) - seen}"


def test_stop_strings() -> None:
    (line,) = blocks_or_fail("stop-strings")
    name, _, value = line.partition(" = ")
    assert name == "STOP_STRINGS" and ast.literal_eval(value) == decoding.STOP_STRINGS


def test_degenerate_thresholds() -> None:
    for cells in table_rows(blocks_or_fail("degenerate-thresholds")):
        name, value = first_span(cells[0]), cells[1]
        want = getattr(analysis, name, None)
        assert want is not None, f"ida_eval.analysis has no constant {name}"
        assert type(want)(value) == want, f"{name}: doc {value}, code {want}"


def test_interval_and_test_settings_are_the_code_s() -> None:
    text = " ".join(EVAL_MD.read_text().split())
    assert f"a percentile bootstrap over tasks ({stats.BOOTSTRAP_RESAMPLES} resamples, seed 0)" in text
    assert f"by Monte Carlo, {stats.PERMUTATION_RESAMPLES:,} seeded sign patterns" in text


def test_failure_classes_in_precedence_order() -> None:
    shown = tuple(first_span(item) for item in list_items(blocks_or_fail("failure-classes")))
    assert shown == analysis.FAILURE_CLASSES


def test_isolation_modes_strongest_first() -> None:
    shown = tuple(first_span(item) for item in list_items(blocks_or_fail("isolation-modes")))
    assert shown == ISOLATION_LEVELS


def test_known_canonical_failures() -> None:
    rows = table_rows(blocks_or_fail("known-failures"))
    ids = [t for cells in rows for t in re.findall(r"MBPP/\d+", cells[0])]
    assert len(ids) == len(set(ids)) == 15
    assert set(ids) == KNOWN_FAILURES, f"doc vs the anchor test: {set(ids) ^ KNOWN_FAILURES}"
    by_ceiling: dict[str, set[str]] = {}
    for cells in rows:
        by_ceiling.setdefault(cells[-1], set()).update(re.findall(r"MBPP/\d+", cells[0]))
    assert by_ceiling["unpassable"] == analysis.UNPASSABLE_TASKS
    assert by_ceiling["version-dependent"] == analysis.VERSION_DEPENDENT_TASKS


# ------------------------------------------------------------------ names, example, layout


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_ida_eval_name_exists() -> None:
    text = doc_text()
    names = set(re.findall(r"\bida_eval(?:\.[A-Za-z_]\w*)+", text))
    for module, imported in re.findall(r"from (ida_eval[\w.]*) import ([\w, ]+)", text):
        names |= {f"{module}.{n.strip()}" for n in imported.split(",")}
    assert len(names) >= 15
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"docs/eval.md names that do not exist: {missing}"


def test_executor_example_prints_what_the_guide_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    data = mbxp_dir()
    if data is None:
        pytest.skip("MBXP data not found (set IDA_MBXP_DIR or place it at ../shared/mbxp)")
    code = "\n".join(blocks_or_fail("run"))
    shown = code.split("# prints:\n", 1)[1].splitlines()
    want = [line.removeprefix("# ") for line in shown]
    monkeypatch.chdir(REPO_ROOT)
    code = code.replace("../shared/mbxp/mbpp_release_v1.jsonl", str(data / "mbpp_release_v1.jsonl"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/eval.md[check:run]", "exec"), {"__name__": "__doc_example__"})
    assert out.getvalue().splitlines() == want


def test_lines_fit() -> None:
    long = [(i, len(line)) for i, line in enumerate(doc_text().splitlines(), 1) if len(line) > MAX_LINE]
    assert not long, f"docs/eval.md lines over {MAX_LINE} characters (line, length): {long}"


def test_readme_points_to_the_guide() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `ida_eval`"))
    assert row.rstrip().endswith("[docs/eval.md](docs/eval.md) |")
