"""One PNG for an MBXP run, or for a comparison of several: score per language, and how the rest failed.

:func:`plot_runs` draws only what its mappings say -- the same mappings the callers write into JSON --
so the figure and the numbers beside it cannot disagree::

    {"name": "minitron-4b-sft", "languages": {
        "python": {"rate": 0.41, "interval": [0.38, 0.44],
                   "classes": {"passed": 399, "wrong_answer": 301, "degenerate": 274}},
        ...}}

* Top panel: grouped bars per language (one bar per run, in the order given; legend with the run
  names), error bars from ``interval``, y from 0 to 1, labelled with the metric (``pass@1``).
* Bottom panel: for each language and run, the failure classes stacked as fractions of that run's
  samples in the language (the denominator is ``samples`` when the language gives it, else the sum of
  ``classes``, which then should include ``"passed"``; ``"passed"`` itself is not stacked: it is the
  top panel). A class has one colour in every run; the known classes come in the precedence order of
  :data:`ida_eval.failures.FAILURE_CLASSES`, others after them in the order met. Each stack is outlined
  in its run's colour from the top panel.

Input is validated completely before anything is drawn (one ``ValueError`` naming the run and
language). The figure is drawn with Agg on a private ``Figure`` -- no pyplot, no global backend
switch -- and written through :func:`ida_common.files.atomic_output`: the PNG appears complete under
its name, or not at all. matplotlib is imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ida_common.files import atomic_output
from ida_eval.failures import FAILURE_CLASSES, FailureClass

__all__ = ["DPI", "figure_size", "plot_runs"]

DPI = 100  # pixels per inch of the written PNG
PANEL_HEIGHT = 3.6  # inches per panel
MIN_WIDTH = 7.0  # inches
MAX_WIDTH = 40.0  # inches: a cap for very many languages x runs (labels then get small, not cut)
PASSED = FailureClass.PASSED.value


def figure_size(num_languages: int, num_runs: int) -> tuple[float, float]:
    """``(width, height)`` in inches of the figure for ``num_languages`` languages and ``num_runs`` runs.

    The width grows with the number of bars (about 0.25 inch per bar plus a gap per language, and room
    for the legends at the right); the PNG is ``round(width * DPI) x round(height * DPI)`` pixels.

    Example:
        >>> figure_size(1, 1), figure_size(12, 3)
        ((7.0, 7.2), (16.2, 7.2))
    """
    width = 3.0 + num_languages * (0.35 + 0.25 * num_runs)
    return round(min(MAX_WIDTH, max(MIN_WIDTH, width)), 2), 2 * PANEL_HEIGHT


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (bools, strings and non-finite numbers are not numbers here)."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _language(where: str, entry: Any) -> dict[str, Any]:
    """One language of one run, validated and copied to plain floats."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping with 'rate' and 'interval', got {entry!r:.80}")
    rate = _number(entry.get("rate"))
    if rate is None or not 0.0 <= rate <= 1.0:
        raise ValueError(f"{where}: 'rate' must be a number in [0, 1], got {entry.get('rate')!r}")
    interval = entry.get("interval")
    if isinstance(interval, (str, bytes)) or not isinstance(interval, Sequence) or len(interval) != 2:
        raise ValueError(f"{where}: 'interval' must be a [lo, hi] pair, got {interval!r}")
    lo, hi = _number(interval[0]), _number(interval[1])
    if lo is None or hi is None or not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"{where}: 'interval' must be numbers 0 <= lo <= hi <= 1, got {list(interval)!r}")
    if not lo <= rate <= hi:
        raise ValueError(f"{where}: interval [{lo}, {hi}] does not contain rate {rate}")
    raw = entry.get("classes", {})
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: 'classes' must map class names to counts, got {raw!r:.80}")
    classes = {}
    for name, count in raw.items():
        x = _number(count)
        if not isinstance(name, str) or x is None or x < 0:
            raise ValueError(f"{where}: class {name!r}: the count must be a number >= 0, got {count!r}")
        classes[name] = x
    total = sum(classes.values())
    samples = entry.get("samples")
    if samples is None:
        samples = total
    else:
        n = _number(samples)
        if n is None or n <= 0 or n < total:
            raise ValueError(
                f"{where}: 'samples' must be a number >= the sum of the classes ({total:g}), got {samples!r}"
            )
        samples = n
    return {"rate": rate, "lo": lo, "hi": hi, "classes": classes, "samples": samples}


def _validated(runs: Any, metric: Any) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"plot_runs: metric must be a non-empty string, got {metric!r}")
    if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Sequence):
        raise ValueError(f"plot_runs: runs must be a sequence of run mappings, got {type(runs).__name__}")
    if not runs:
        raise ValueError("plot_runs: no runs to plot")
    out = []
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            raise ValueError(f"plot_runs: run {i}: expected a mapping with 'name' and 'languages', got {run!r:.80}")
        name = run.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"plot_runs: run {i}: 'name' must be a non-empty string, got {name!r}")
        if any(name == seen for seen, _ in out):
            raise ValueError(
                f"plot_runs: run {i}: the name {name!r} is used twice; the legend could not tell them apart"
            )
        languages = run.get("languages")
        if not isinstance(languages, Mapping) or not languages:
            raise ValueError(f"plot_runs: run {name!r}: no languages (got {languages!r:.80})")
        out.append(
            (
                name,
                {
                    str(lang): _language(f"plot_runs: run {name!r}, language {lang!r}", e)
                    for lang, e in languages.items()
                },
            )
        )
    return out


def _class_order(runs: list[tuple[str, dict[str, dict[str, Any]]]]) -> list[str]:
    """The failure classes present, known ones in FAILURE_CLASSES' precedence order, then the rest as met."""
    met: dict[str, None] = {}
    for _, languages in runs:
        for entry in languages.values():
            met.update(dict.fromkeys(c for c in entry["classes"] if c != PASSED))
    return [c for c in FAILURE_CLASSES if c in met] + [c for c in met if c not in FAILURE_CLASSES]


def plot_runs(runs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, metric: str = "pass@1") -> Path:
    """Write one PNG comparing ``runs`` (one run or several) per language; returns ``Path(path)``.

    Args:
        runs: ``{"name": str, "languages": {lang: {"rate": float, "interval": [lo, hi],
            "classes": {class_name: count}, "samples": int (optional)}}}`` per run; bars follow the
            order of the runs, languages the order they are first met.
        path: the PNG to write (atomically: a temporary beside it, then ``os.replace``).
        metric: the top panel's y label (``"pass@1"``, ``"pass@10"``).

    Raises:
        ValueError: no runs, a run without a name or languages, two runs with one name, a rate outside
            ``[0, 1]``, an interval that does not contain its rate, a negative class count, ``samples``
            below the class total; one line naming the run and language.
        OSError: ``path``'s directory cannot be written.

    Example:
        >>> import tempfile, os
        >>> out = os.path.join(tempfile.mkdtemp(), "mbxp.png")
        >>> run = {"name": "base", "languages": {"python": {"rate": 0.5, "interval": [0.3, 0.7],
        ...        "classes": {"passed": 5, "wrong_answer": 3, "degenerate": 2}}}}
        >>> plot_runs([run], out).name, open(out, "rb").read(8)
        ('mbxp.png', b'\\x89PNG\\r\\n\\x1a\\n')
    """
    checked = _validated(runs, metric)
    fig = _draw(checked, metric)
    target = Path(path)
    with atomic_output(target) as f:
        fig.savefig(f, format="png", dpi=DPI)
    return target


def _draw(runs: list[tuple[str, dict[str, dict[str, Any]]]], metric: str) -> Any:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    languages = list(dict.fromkeys(lang for _, langs in runs for lang in langs))
    classes = _class_order(runs)
    fig = Figure(figsize=figure_size(len(languages), len(runs)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)

    run_palette = colormaps["tab10" if len(runs) <= 10 else "tab20"]
    class_palette = colormaps["Set2" if len(classes) <= 8 else "tab20"]
    run_colour = {name: run_palette(i % run_palette.N) for i, (name, _) in enumerate(runs)}
    class_colour = {c: class_palette(i % class_palette.N) for i, c in enumerate(classes)}
    slot = 0.8  # of the unit space per language, filled by its bars
    width = slot / len(runs)

    for r, (name, langs) in enumerate(runs):
        at = [i for i, lang in enumerate(languages) if lang in langs]
        xs = [i - slot / 2 + width * (r + 0.5) for i in at]
        entries = [langs[languages[i]] for i in at]
        rates = [e["rate"] for e in entries]
        top.bar(
            xs,
            rates,
            width,
            color=run_colour[name],
            label=name,
            yerr=[[e["rate"] - e["lo"] for e in entries], [e["hi"] - e["rate"] for e in entries]],
            error_kw={"elinewidth": 0.9, "capsize": 2.5, "ecolor": "0.2"},
        )
        base = [0.0] * len(entries)
        for cls in classes:
            heights = [e["classes"].get(cls, 0.0) / e["samples"] if e["samples"] else 0.0 for e in entries]
            bottom.bar(
                xs,
                heights,
                width,
                bottom=base,
                color=class_colour[cls],
                edgecolor=run_colour[name],
                linewidth=1.0 if len(runs) > 1 else 0.0,
                label=cls if r == 0 else None,
            )
            base = [b + h for b, h in zip(base, heights, strict=True)]

    top.set_ylim(0.0, 1.0)
    top.set_ylabel(metric)
    top.set_title(f"{metric} per language (error bars: interval)", fontsize=10)
    top.grid(axis="y", alpha=0.3)
    top.legend(title="run", fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    bottom.set_ylim(0.0, 1.0)
    bottom.set_ylabel("fraction of samples")
    order = " (bars in run order as above, outlined in the run's colour)" if len(runs) > 1 else ""
    bottom.set_title(f"failed samples by class{order}", fontsize=10)
    bottom.grid(axis="y", alpha=0.3)
    if classes:
        bottom.legend(title="failure class", fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.set_xticks(range(len(languages)))
    rotate = len(languages) > 6 or max(len(lang) for lang in languages) > 12
    bottom.set_xticklabels(
        languages, rotation=45 if rotate else 0, ha="right" if rotate else "center", rotation_mode="anchor"
    )
    bottom.set_xlim(-0.6, len(languages) - 0.4)
    return fig
