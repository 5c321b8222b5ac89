"""What finished MBXP runs show: the printed summary and language table, the figures' data, comparisons.

Everything here reads what a run wrote (``summary.json``, ``languages.json``: :mod:`ida_eval.rundir`) and
needs neither torch nor a model, so ``python -m ida_eval.mbxp --compare A B ...`` answers at once.

* :func:`format_summary` / :func:`format_language_table`: the text the CLI prints after a run.
* :func:`figure_data` / :func:`languages_figure_data` / :func:`comparison_figure_data`: what
  :func:`ida_eval.figures.plot_runs` draws, taken from the JSON beside the figure (nothing drawn that is
  not also there).
* :func:`compare_dirs` / :func:`format_compare_dirs`: finished run directories (one language each, or
  ``--language all`` runs) against the first, per language they share
  (:func:`ida_eval.analysis.compare_runs`: pass rates with intervals, McNemar's exact test, flipped
  tasks, failure-class shifts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ida_eval.analysis import (
    compare_runs,
    format_comparison,
    load_run,
    paired_difference,
    significance_line,
    task_classes,
)
from ida_eval.failures import FailureClass
from ida_eval.rundir import LANGUAGES_FILE, SUMMARY_FILE
from ida_eval.stats import holm_adjust, mean_pass_at_k

__all__ = [
    "compare_dirs",
    "comparison_figure_data",
    "figure_data",
    "format_compare_dirs",
    "format_language_table",
    "format_summary",
    "languages_figure_data",
]


def format_summary(s: Mapping[str, Any], out: Path) -> str:
    """The lines ``python -m ida_eval.mbxp`` prints for a finished run: pass@k with their 95 % intervals,
    the failure classes (and, where a toolchain is missing here, what did not run), the degenerate
    completions, speed, isolation and the toolchain that ran the programs; ``out``: the run directory."""
    c = s["counts"]
    n = s.get("samples_per_task", 1)
    lo, hi = s["intervals"].get("pass@1", (0.0, 1.0))
    what = f"{s['passed']}/{s['n_tasks']} tasks" if n == 1 else f"{s['passed']}/{s['n_tasks'] * n} samples"
    lines = [f"pass@1 = {s['pass@1']:.4f} [95 % {lo:.4f}, {hi:.4f}]  ({what})  -> {out / SUMMARY_FILE}"]
    for name, value in s["pass@k"].items():
        if name != "pass@1":
            lo, hi = s["intervals"][name]
            lines.append(f"{name} = {value:.4f} [95 % {lo:.4f}, {hi:.4f}]")
    lines.append("classes: " + ", ".join(f"{k}: {v}" for k, v in c.items()))
    missing = c.get(FailureClass.TOOLCHAIN_MISSING.value, 0)
    if missing:
        runnable = s["executor"]["pass@1_runnable"]
        lines.append(
            f"toolchain missing here: {missing} samples not run, counted as failed (as mxeval counts them); "
            + ("none could run" if runnable is None else f"pass@1 over the runnable ones = {runnable:.4f}")
        )
    d = s["degenerate"]
    lines.append(
        f"degenerate completions: {d['count']}"
        + (f" (e.g. {d['examples'][0]['task_id']}: {d['examples'][0]['reason']})" if d["examples"] else "")
    )
    t = s["timings"]
    tokens = f"{t['tokens_per_s']} tokens/s" if t["tokens_per_s"] is not None else "nothing generated"
    programs = f"{t['programs_per_s']} programs/s" if t["programs_per_s"] is not None else "nothing executed"
    toolchains = s["executor"].get("toolchains", [])
    ran_by = ""
    if toolchains:  # one language per run directory: two versions are results of two machines (or upgrades)
        mixed = " (more than one: these results came from different toolchains)" if len(toolchains) > 1 else ""
        ran_by = f"; toolchain: {', '.join(toolchains)}{mixed}"
    lines.append(
        f"generation {t['generation_s']} s ({tokens}), execution {t['execution_s']} s ({programs}); "
        f"isolation: {', '.join(s['isolation']) or 'none (nothing ran)'}{ran_by}"
    )
    return "\n".join(lines)


def figure_data(summary: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What :func:`ida_eval.figures.plot_runs` draws for one run: per language its pass@1, the 95 %
    interval and the classes of its samples, all read from ``summary`` (summary.json)."""
    langs = list(summary.get("languages") or {}) or ["python"]
    return {
        "name": name,
        "languages": {
            lang: {
                "rate": summary["pass@1"],
                "interval": summary["intervals"]["pass@1"],
                "classes": dict(summary["counts"]),
            }
            for lang in langs[:1]  # one language per run directory (stop_strings_for)
        },
    }


def languages_figure_data(table: Mapping[str, Any], name: str) -> dict[str, Any]:
    """:func:`figure_data` for a ``--language all`` run, read from ``languages.json``."""
    return {
        "name": name,
        "languages": {
            lang: {"rate": r["pass@1"], "interval": r["intervals"]["pass@1"], "classes": dict(r["counts"])}
            for lang, r in table["languages"].items()
        },
    }


def format_language_table(table: Mapping[str, Mapping[str, Any]], overall: Mapping[str, Any] | None = None) -> str:
    """One line per language: pass@1 with its 95 % interval, passed/tasks (samples, with several per
    task), every other pass@k, runnable pass@1 (``n/a`` where nothing could run) and the toolchain-missing
    count; then the ``overall`` pass@k of ``languages.json`` over all tasks when given, and over the tasks
    that ran where some could not (their toolchain missing here)."""
    w = max([len(k) for k in table] + [8])
    extra = sorted({k for r in table.values() for k in r.get("pass@k", {})} - {"pass@1"}, key=lambda k: int(k[5:]))
    lines = [
        f"{'language':<{w}}  pass@1  95 % interval     passed/total  "
        + "".join(f"{k:>9}" for k in extra)
        + "  runnable pass@1  toolchain missing"
    ]
    for lang, r in table.items():
        lo, hi = r.get("intervals", {}).get("pass@1", (float("nan"), float("nan")))
        ks = "".join(f"{r.get('pass@k', {}).get(k, float('nan')):>9.4f}" for k in extra)
        runnable = "   n/a" if r["pass@1_runnable"] is None else f"{r['pass@1_runnable']:.4f}"
        lines.append(
            f"{lang:<{w}}  {r['pass@1']:.4f}  [{lo:.4f}, {hi:.4f}]  {r['passed']:>6}/{r['n_tasks'] * r.get('samples_per_task', 1):<6}"
            f"{ks}  {runnable}           {r['toolchain_missing']}"
        )
    if overall and overall.get("pass@k"):
        lines.append(
            f"overall over {overall['n_tasks']} tasks of {overall['languages']} languages: "
            + ", ".join(f"{k} {v:.4f}" for k, v in overall["pass@k"].items())
        )
        ran = overall.get("runnable")  # (absent from languages.json files written before 2026-12-07)
        if ran and ran["n_tasks"] < overall["n_tasks"]:
            not_run = f"; not run: {', '.join(overall['not_run'])}" if overall.get("not_run") else ""
            scores = ", ".join(f"{k} {v:.4f}" for k, v in ran["pass@k"].items()) or "nothing ran"
            lines.append(
                f"overall over the {ran['n_tasks']} tasks that ran ({ran['languages']} languages; "
                f"{overall['n_tasks'] - ran['n_tasks']} tasks' toolchain missing here{not_run}): {scores}"
            )
    return "\n".join(lines)


def _run_languages(run_dir: Path) -> dict[str, Path]:
    """language -> run directory: the per-language directories of a ``--language all`` run, or the
    directory itself (its summary's language)."""
    table = run_dir / LANGUAGES_FILE
    if table.is_file():
        langs = json.loads(table.read_text())["languages"]
        return {lang: run_dir / lang for lang in langs if (run_dir / lang / SUMMARY_FILE).is_file()}
    langs = list(load_run(run_dir).get("languages") or {}) or ["python"]
    return {langs[0]: run_dir}


def compare_dirs(dirs: Sequence[Path]) -> dict[str, Any]:
    """Compare finished runs with the first, per language they all have (:func:`compare_runs` each).

    Returns the JSON written to ``comparison.json``: ``{"baseline", "runs", "languages": {language:
    {"runs": [pass rates, intervals, class counts of each run], "comparisons": [compare_runs(first,
    other) for each other run]}}}``; for runs of several languages also ``"overall": [{"a", "b",
    "languages", "pass@1": [a, b], "paired"} for each other run]``, on all their tasks together. Where it
    holds more than one paired test, each ``paired`` also holds ``p_holm``, its p-value adjusted for all of
    them (:func:`ida_eval.stats.holm_adjust`), and ``tests_in_family``.

    Raises:
        ValueError: a directory that is not a finished run, or runs without a language in common.
    """
    per_run = [_run_languages(d) for d in dirs]
    common = [lang for lang in per_run[0] if all(lang in r for r in per_run[1:])]
    if not common:
        raise ValueError(
            "--compare: the runs have no language in common ("
            + "; ".join(f"{d}: {', '.join(r) or 'none'}" for d, r in zip(dirs, per_run, strict=True))
            + ")"
        )
    languages: dict[str, Any] = {}
    for lang in common:
        comparisons = [compare_runs(per_run[0][lang], r[lang]) for r in per_run[1:]]
        runs = [comparisons[0]["a"]] + [c["b"] for c in comparisons]
        languages[lang] = {"runs": runs, "comparisons": comparisons}
    overall = (
        _pooled_comparisons(dirs, [{lang: r[lang] for lang in common} for r in per_run]) if len(common) > 1 else []
    )
    tested = [c["paired"] for e in languages.values() for c in e["comparisons"]] + [c["paired"] for c in overall]
    tested = [t for t in tested if t.get("p_value") is not None]
    if len(tested) > 1:  # read together: each verdict from Holm's adjusted p (ida_eval.stats.holm_adjust)
        for paired, p in zip(tested, holm_adjust([t["p_value"] for t in tested]), strict=True):
            paired.update(p_holm=p, tests_in_family=len(tested))
    result = {"baseline": str(dirs[0]), "runs": [str(d) for d in dirs], "languages": languages}
    return {**result, "overall": overall} if overall else result


def _pooled_comparisons(dirs: Sequence[Path], runs: Sequence[Mapping[str, Path]]) -> list[dict[str, Any]]:
    """Each run against the first on the tasks of all their common languages together (``runs``: each run's
    language directories), with pass@1 pooled over those tasks as mxeval pools it."""
    per_task = [
        {t: task_classes(c) for d in langs.values() for t, c in load_run(d)["per_task"].items()} for langs in runs
    ]

    def pooled(tasks: Mapping[str, Sequence[str]]) -> float:
        return mean_pass_at_k({t: (len(c), c.count(FailureClass.PASSED.value)) for t, c in tasks.items()}, 1)

    out = []
    for d, tasks in zip(dirs[1:], per_task[1:], strict=True):
        common = sorted(set(per_task[0]) & set(tasks))
        a, b = {t: per_task[0][t] for t in common}, {t: tasks[t] for t in common}
        paired = paired_difference(a, b)
        out.append(
            {
                "a": str(dirs[0]),
                "b": str(d),
                "languages": list(runs[0]),
                "pass@1": [pooled(a), pooled(b)],
                "paired": paired,
            }
        )
    return out


def format_compare_dirs(result: Mapping[str, Any]) -> str:
    """The text of :func:`compare_dirs`: per language, each run against the baseline; then, for runs of
    several languages, each against the baseline on all their tasks together."""
    blocks = []
    for lang, entry in result["languages"].items():
        for cmp in entry["comparisons"]:
            blocks.append(f"=== {lang}\n{format_comparison(cmp)}")
    for cmp in result.get("overall", []):
        (a, b), langs = cmp["pass@1"], cmp["languages"]
        blocks.append(
            f"=== all {len(langs)} languages together ({', '.join(langs)})\nA = {cmp['a']}\nB = {cmp['b']}\n"
            f"pass@1 over the {cmp['paired']['n']} tasks: A {a:.4f}, B {b:.4f}\n{significance_line(cmp['paired'])}"
        )
    rows = _summary_rows(result)
    if len(rows) > 1:  # several tests: the table a reader looks at first, last on the screen
        blocks.append("=== summary (each run against the first; p from the paired test, adjusted by Holm's method)")
        blocks.append(_table(rows))
    return "\n".join(blocks)


def _summary_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """One row per paired comparison of :func:`compare_dirs`' result: pass@1 of each run, B - A, p, Holm's p,
    tasks gained and lost."""
    several = len(result["runs"]) > 2

    def row(name: str, b_dir: str, a: float, b: float, paired: Mapping[str, Any], moved: str) -> list[str]:
        if paired.get("not_run") == paired.get("n"):
            return [name, *([Path(b_dir).name] if several else []), f"{a:.4f}", f"{b:.4f}", "", "not run", "", ""]
        p, holm = paired.get("p_value"), paired.get("p_holm", paired.get("p_value"))
        return [
            name,
            *([Path(b_dir).name] if several else []),
            f"{a:.4f}",
            f"{b:.4f}",
            f"{paired.get('difference', 0.0):+.4f}",
            "" if p is None else f"{p:.3g}",
            "" if holm is None else f"{holm:.3g}",
            moved,
        ]

    rows = [["language", *(["run"] if several else []), "A pass@1", "B pass@1", "B - A", "p", "p (Holm)", "+/-"]]
    for lang, entry in result["languages"].items():
        for cmp in entry["comparisons"]:
            moved = f"{len(cmp['gained'])}/{len(cmp['lost'])}"
            rows.append(row(lang, cmp["b"]["dir"], cmp["a"]["pass@1"], cmp["b"]["pass@1"], cmp["paired"], moved))
    for cmp in result.get("overall", []):
        rows.append(row("all", cmp["b"], cmp["pass@1"][0], cmp["pass@1"][1], cmp["paired"], ""))
    return rows if len(rows) > 2 else []


def _table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as left-aligned columns (the first) and right-aligned ones (the rest)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    )


def comparison_figure_data(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the comparison figure draws, read from :func:`compare_dirs`' result (comparison.json)."""
    names = [Path(d).name or d for d in result["runs"]]
    if len(set(names)) < len(names):
        names = list(result["runs"])
    return [
        {
            "name": name,
            "languages": {
                lang: {
                    "rate": e["runs"][i]["pass@1"],
                    "interval": e["runs"][i]["interval"],
                    "classes": e["runs"][i]["counts"],
                }
                for lang, e in result["languages"].items()
            },
        }
        for i, name in enumerate(names)
    ]
