"""ida_eval.figures.plot_runs: valid PNGs of the documented size for one run and for a comparison, atomic
writes (an error while drawing or saving leaves the previous file and no temporary), one-line errors."""

from __future__ import annotations

import doctest
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ida_eval import figures
from ida_eval.figures import DPI, figure_size, plot_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LANGUAGES = [
    "python",
    "java",
    "javascript",
    "typescript",
    "kotlin",
    "ruby",
    "php",
    "cpp",
    "csharp",
    "go",
    "perl",
    "scala",
]


def language(rate: float, samples: int = 100, *, degenerate: int = 0) -> dict[str, Any]:
    passed = round(rate * samples)
    failed = samples - passed
    degenerate = min(degenerate, failed)
    classes = {"passed": passed, "degenerate": degenerate, "wrong_answer": failed - degenerate}
    return {
        "rate": passed / samples,
        "interval": [max(0.0, passed / samples - 0.05), min(1.0, passed / samples + 0.05)],
        "classes": classes,
    }


def run(name: str, shift: float = 0.0) -> dict[str, Any]:
    return {
        "name": name,
        "languages": {lang: language((0.07 * i + shift) % 1.0, degenerate=i) for i, lang in enumerate(LANGUAGES)},
    }


def png_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def assert_png(path: Path, languages: int, runs: int) -> None:
    import matplotlib.image

    width, height = figure_size(languages, runs)
    want = (round(width * DPI), round(height * DPI))
    assert png_size(path) == want
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (want[1], want[0]) and pixels.shape[2] in (3, 4)
    assert pixels[..., :3].min() < 0.5  # something was drawn, not a blank canvas


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_doctests_run():
    result = doctest.testmod(figures)
    assert result.failed == 0 and result.attempted >= 3


def test_single_run_and_three_run_comparison(tmp_path):
    one = plot_runs([run("base")], tmp_path / "one.png")
    assert one == tmp_path / "one.png"
    assert_png(one, len(LANGUAGES), 1)
    three = plot_runs(
        [run("base"), run("sft-nvfp4", 0.3), run("sft-bf16", 0.6)], tmp_path / "three.png", metric="pass@10"
    )
    assert_png(three, len(LANGUAGES), 3)
    assert png_size(three)[0] > png_size(one)[0]  # wider for more bars
    assert leftovers(tmp_path) == []


def test_json_round_trip_runs_and_partial_languages(tmp_path):
    """What the callers write into JSON plots the same; a language missing from one run leaves a gap;
    a class only one run has, and an explicit 'samples', are drawn."""
    a = json.loads(json.dumps(run("a")))
    b = {
        "name": "b",
        "languages": {"python": {"rate": 0.2, "interval": [0.1, 0.3], "classes": {"my_class": 3}, "samples": 10}},
    }
    out = plot_runs((a, b), str(tmp_path / "ab.png"))
    assert_png(out, len(LANGUAGES), 2)
    assert plot_runs([b], tmp_path / "b.png").stat().st_size > 0
    no_classes = {"name": "c", "languages": {"go": {"rate": 1.0, "interval": [0.9, 1.0]}}}
    assert_png(plot_runs([no_classes], tmp_path / "c.png"), 1, 1)


class Exploding(Mapping):
    """A classes mapping that raises on the third class it yields."""

    def __init__(self) -> None:
        self.data = {"passed": 3, "degenerate": 1, "timeout": 2, "wrong_answer": 4}

    def __getitem__(self, key: str) -> int:
        return self.data[key]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        for i, key in enumerate(self.data):
            if i == 2:
                raise RuntimeError("boom while reading the classes")
            yield key


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "fig.png"
    bad = run("x")
    bad["languages"]["python"]["classes"] = Exploding()
    with pytest.raises(RuntimeError, match="boom while reading"):
        plot_runs([bad], path)
    assert not path.exists() and leftovers(tmp_path) == []

    old = plot_runs([run("old")], path).read_bytes()

    def half_a_png(self, fname, **kwargs):
        fname.write(PNG_SIGNATURE + b"partial")
        fname.flush()
        raise KeyboardInterrupt  # Ctrl-C in the middle of the encoder

    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", half_a_png)
    with pytest.raises(KeyboardInterrupt):
        plot_runs([run("new")], path)
    assert path.read_bytes() == old and leftovers(tmp_path) == []


def with_language(**entry: Any) -> list[dict[str, Any]]:
    return [{"name": "sft", "languages": {"python": language(0.5), "java": {**language(0.5), **entry}}}]


@pytest.mark.parametrize(
    ("runs", "kwargs", "message"),
    [
        ([], {}, "no runs to plot"),
        ({"name": "x"}, {}, "runs must be a sequence of run mappings, got dict"),
        ([run("a")], {"metric": ""}, "metric must be a non-empty string"),
        (["a"], {}, "run 0: expected a mapping"),
        ([{"languages": {}}], {}, "run 0: 'name' must be a non-empty string, got None"),
        ([run("a"), run("a")], {}, "run 1: the name 'a' is used twice"),
        ([{"name": "empty", "languages": {}}], {}, "run 'empty': no languages"),
        ([{"name": "none"}], {}, "run 'none': no languages"),
        (
            with_language(interval=[0.6, 0.9]),
            {},
            "run 'sft', language 'java': interval [0.6, 0.9] does not contain rate 0.5",
        ),
        (with_language(interval=[0.1]), {}, "run 'sft', language 'java': 'interval' must be a [lo, hi] pair"),
        (
            with_language(interval=[0.4, 1.5]),
            {},
            "run 'sft', language 'java': 'interval' must be numbers 0 <= lo <= hi <= 1",
        ),
        (
            with_language(rate=float("nan")),
            {},
            "run 'sft', language 'java': 'rate' must be a number in [0, 1], got nan",
        ),
        (with_language(rate=True), {}, "run 'sft', language 'java': 'rate' must be a number in [0, 1], got True"),
        (
            with_language(classes={"timeout": -1}),
            {},
            "language 'java': class 'timeout': the count must be a number >= 0",
        ),
        (with_language(classes=[1, 2]), {}, "language 'java': 'classes' must map class names to counts"),
        (with_language(samples=10), {}, "language 'java': 'samples' must be a number >= the sum of the classes (100)"),
    ],
)
def test_bad_input_is_one_line_naming_run_and_language(tmp_path, runs, kwargs, message):
    path = tmp_path / "bad.png"
    with pytest.raises(ValueError) as info:
        plot_runs(runs, path, **kwargs)
    text = str(info.value)
    assert message in text and "\n" not in text
    assert not os.path.exists(path) and leftovers(tmp_path) == []
