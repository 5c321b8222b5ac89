"""docs/trainer.md stays true: its reference figures of the demo come from a real demo run, and the demo's
duration is quoted the same way in README.md, ``python -m ida_trainer --help`` and docs/trainer.md.

The reference block is generated from a run's ``report.json``; after a deliberate change of the demo,
print the new block with ``python -m tests.ida_trainer.test_docs_trainer runs/demo/report.json`` and paste
it into docs/trainer.md (the demo is deterministic: the same code gives the same figures, bit for bit).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINER_MD = REPO / "docs" / "trainer.md"
BLOCK_RE = re.compile(r"<!-- check:demo-reference -->\n```text\n(.*?)```", re.S)


def reference_block(report: Mapping[str, Any]) -> str:
    """The text of docs/trainer.md's ``demo-reference`` block for a demo run's report."""
    from ida_eval.analysis import format_pass_at_1

    ev = report["final_eval"]
    counts = {k: v for k, v in ev["counts"].items() if k != "passed"}
    lines = [
        f"steps {report['steps']}: loss {report['first_loss']:.2f} -> {report['final_loss']:.2f}",
        f"final eval: pass@1 {format_pass_at_1(ev['passed'], ev['n_tasks'])}",
        "failures: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
    ]
    return "\n".join(lines) + "\n"


def documented_block() -> str:
    m = BLOCK_RE.search(TRAINER_MD.read_text(encoding="utf-8"))
    assert m, "docs/trainer.md lost its <!-- check:demo-reference --> block"
    return m.group(1)


def test_demo_duration_is_quoted_the_same_everywhere() -> None:
    from ida_trainer.cli import usage
    from ida_trainer.demo import DEMO_DURATION

    assert DEMO_DURATION in usage()
    for doc in (REPO / "README.md", TRAINER_MD):
        assert DEMO_DURATION in doc.read_text(encoding="utf-8"), f"{doc.name} does not say the demo takes {DEMO_DURATION}"


@pytest.mark.slow
def test_reference_figures_come_from_a_real_demo_run(tmp_path: Path) -> None:
    """The full default demo (300 steps, final eval of 48 problems): its figures are the documented ones."""
    out = tmp_path / "demo"
    res = subprocess.run([sys.executable, "-m", "ida_trainer", "--out", str(out), "--train.progress", "false"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=3600, check=False,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert reference_block(report) == documented_block()


if __name__ == "__main__":
    print(reference_block(json.loads(Path(sys.argv[1]).read_text())), end="")
