"""docs/trainer.md stays true: its reference figures of the demo come from a real demo run, and the demo's
duration is quoted the same way in README.md, ``python -m ida_trainer --help`` and docs/trainer.md.

The reference block is generated from a run's ``report.json``; after a deliberate change of the demo,
print the new block with ``python -m tests.ida_trainer.test_docs_trainer runs/demo/report.json`` and paste
it into docs/trainer.md under its CPU kind (the demo is deterministic on one kind of CPU: the same code
gives the same figures, bit for bit; torch's CPU math takes other paths on other CPUs, see :func:`cpu_kind`).
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


def cpu_kind() -> str:
    """The kind of CPU and torch the figures depend on: torch's CPU math (MKL, oneDNN) picks its code path,
    and so its summation order, by vendor and vector extensions; oneDNN's bf16 GEMMs use AMX tiles where
    there are some; and another torch release has other kernels (torch 2.11 on an Intel Xeon with AMX: loss
    0.13 where 2.13 gives 0.15). ``"GenuineIntel avx512 amx, torch 2.13"``, ``"AuthenticAMD avx2, torch 2.13"``..."""
    import torch

    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return f"unknown, torch {release}"
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.MULTILINE)
    flag_line = re.search(r"^flags\s*:(.*)$", info, re.MULTILINE)
    flags = set(flag_line.group(1).split()) if flag_line else set()
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    amx = " amx" if "amx_bf16" in flags else ""
    return f"{vendor.group(1) if vendor else 'unknown'} {isa}{amx}, torch {release}"


def documented_blocks() -> dict[str, str]:
    """docs/trainer.md's reference figures, one block per CPU kind (``# cpu: KIND`` before each)."""
    m = BLOCK_RE.search(TRAINER_MD.read_text(encoding="utf-8"))
    assert m, "docs/trainer.md lost its <!-- check:demo-reference --> block"
    parts = re.split(r"^# cpu: (.+)\n", m.group(1), flags=re.MULTILINE)
    assert parts[0] == "" and len(parts) > 1, "each reference block starts with a '# cpu: KIND' line"
    return {kind: block.rstrip("\n") + "\n" for kind, block in zip(parts[1::2], parts[2::2], strict=True)}


def test_demo_duration_is_quoted_the_same_everywhere() -> None:
    from ida_trainer.cli import usage
    from ida_trainer.demo import DEMO_DURATION

    assert DEMO_DURATION in usage()
    for doc in (REPO / "README.md", TRAINER_MD):
        assert DEMO_DURATION in doc.read_text(encoding="utf-8"), (
            f"{doc.name} does not say the demo takes {DEMO_DURATION}"
        )


@pytest.mark.slow
def test_reference_figures_come_from_a_real_demo_run(tmp_path: Path) -> None:
    """The full default demo (300 steps, final eval of 48 problems): its figures are the documented ones."""
    out = tmp_path / "demo"
    res = subprocess.run(
        [sys.executable, "-m", "ida_trainer", "--out", str(out), "--train.progress", "false"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=3600,
        check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    blocks, kind = documented_blocks(), cpu_kind()
    if kind not in blocks:
        pytest.skip(
            f"docs/trainer.md has no reference figures for this CPU kind and torch release; add:\n# cpu: {kind}\n"
            + reference_block(report)
        )
    assert reference_block(report) == blocks[kind]


if __name__ == "__main__":
    print(f"# cpu: {cpu_kind()}\n" + reference_block(json.loads(Path(sys.argv[1]).read_text())), end="")
