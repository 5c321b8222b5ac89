"""Run logs: console line, ``train_log.jsonl``, ``mlperf_log.txt`` (``:::MLLOG``), ``report.json``, loss PNG.

Every optimizer step produces one JSON record with fixed keys and units (torchtitan convention):
``step`` (1-based), ``loss`` (mean CE per supervised token of the step, nats), ``grad_norm`` (global L2
norm *before* clipping), ``lr``, ``tokens_per_s`` (non-padding tokens of the global batch / step wall
time, whole job), ``mem_gib`` (peak device memory on CUDA, peak process RSS on CPU), ``step_time_s``,
``valid_tokens``; with the nvfp4 recipe, on the steps the console prints (:func:`is_console_step`), also
``master_moved`` and ``master_step_kept`` (:mod:`ida_trainer.movement`). The console prints the same keys
every ``train.log_every`` steps, through tqdm so the progress bar (with ETA) stays intact.

``mlperf_log.txt`` follows the MLPerf logging line format, written without the ``mlperf-logging``
dependency: ``:::MLLOG {"namespace": "", "time_ms": <int>, "event_type": "POINT_IN_TIME" |
"INTERVAL_START" | "INTERVAL_END", "key": ..., "value": ..., "metadata": {"file": ..., "lineno": ...,
...}}`` with the keys in that order and ``json.dumps`` default separators. Precision provenance goes in
``weight_precision`` / ``compute_precision`` / ``lowest_numerical_precision_in_linear``; ``train_loss``
carries ``samples_count`` metadata; ``eval_accuracy`` is pass@1.

On resume both files are kept and cut back to the checkpoint's step, so they hold each step of the
(possibly interrupted) run once, in order: a torn last JSONL line left by a kill mid-write is repaired
first (:func:`ida_common.jsonl.repair_torn_tail`, the same repair the eval files get), JSONL records after
the step are dropped, and so are MLLOG lines whose ``step_num`` lies after it (and a torn last MLLOG
line). Kill point (:mod:`ida_common.killpoint`): ``train_log.torn_record``, half a record written.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ida_common.files import atomic_output, atomic_write_text
from ida_common.jsonl import iter_jsonl, repair_torn_tail
from ida_common.killpoint import kill_point

MLLOG_PREFIX = ":::MLLOG "
POINT_IN_TIME = "POINT_IN_TIME"
INTERVAL_START = "INTERVAL_START"
INTERVAL_END = "INTERVAL_END"
STEP_KEYS = ("step", "loss", "grad_norm", "lr", "tokens_per_s", "mem_gib", "step_time_s", "valid_tokens")
RECIPE_STEP_KEYS = ("master_moved", "master_step_kept")  # the nvfp4 recipe's, on console steps (movement.py)


def peak_memory_gib() -> float:
    """Peak device memory (CUDA) or peak resident set size of this process (CPU), in GiB."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


class MLLogger:
    """Writer of ``:::MLLOG`` lines (append mode, one flush per line).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "mlperf_log.txt"
        >>> MLLogger(p).event("max_steps", 10)
        >>> p.read_text().startswith(':::MLLOG {"namespace": "", "time_ms": ')
        True
    """

    def __init__(self, path: str | Path, *, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def _line(self, event_type: str, key: str, value: Any, metadata: Mapping[str, Any] | None) -> None:
        if not self.enabled:
            return
        caller = sys._getframe(2)  # the code that called event/start/end (inspect.stack is ~50 ms)
        md = {"file": os.path.basename(caller.f_code.co_filename), "lineno": caller.f_lineno, **(metadata or {})}
        rec = {
            "namespace": "",
            "time_ms": int(time.time() * 1000),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": md,
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(MLLOG_PREFIX + json.dumps(rec) + "\n")

    def event(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        """A POINT_IN_TIME line."""
        self._line(POINT_IN_TIME, key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        """An INTERVAL_START line."""
        self._line(INTERVAL_START, key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        """An INTERVAL_END line."""
        self._line(INTERVAL_END, key, value, metadata)


def read_mllog(path: str | Path) -> list[dict[str, Any]]:
    """Parse the ``:::MLLOG`` lines of a file (other lines are ignored)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith(MLLOG_PREFIX):
            out.append(json.loads(line[len(MLLOG_PREFIX) :]))
    return out


class TrainLogError(ValueError):
    """A damaged run log (the message names the file and line)."""


def read_train_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``train_log.jsonl``.

    Raises:
        TrainLogError: a line that is not a JSON object with an integer ``step`` (names file:line).
    """
    with open(path, "rb") as f:
        out = []
        for _, where, rec in iter_jsonl(f, path, TrainLogError, what="train_log line"):
            if not isinstance(rec.get("step"), int):
                raise TrainLogError(f'{where}: a step record needs an integer "step"')
            out.append(rec)
        return out


def cut_mllog(path: str | Path, step: int) -> None:
    """Drop the ``:::MLLOG`` lines of steps after ``step`` (and a torn last line); atomic rewrite."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    kept = []
    for line in lines:
        if not line.endswith(b"\n"):
            continue  # torn by a kill mid-write
        text = line.decode("utf-8", errors="replace")
        if text.startswith(MLLOG_PREFIX):
            try:
                rec = json.loads(text[len(MLLOG_PREFIX) :])
                at = rec.get("metadata", {}).get("step_num")
            except (ValueError, AttributeError):
                continue  # a damaged line carries nothing worth keeping
            if isinstance(at, int) and at > step:
                continue
        kept.append(line)
    if len(kept) != len(lines):
        with atomic_output(path) as f:
            f.write(b"".join(kept))


def is_console_step(step: int, log_every: int, total_steps: int) -> bool:
    """Whether step ``step`` (1-based) gets a console line: the first, every ``log_every``-th and the last."""
    return step % log_every == 0 or step == total_steps or step == 1


def format_step(rec: Mapping[str, Any], total_steps: int) -> str:
    """The fixed-format console line for one step record."""
    moved = ""
    if "master_moved" in rec:
        kept = rec.get("master_step_kept")
        moved = f" | master moved {rec['master_moved']:.2%}" + (f", {kept:.2f}x the step" if kept is not None else "")
    return (
        f"step {rec['step']:>6}/{total_steps} | loss {rec['loss']:.4f} | grad_norm {rec['grad_norm']:.4f} | "
        f"lr {rec['lr']:.3e} | tok/s {rec['tokens_per_s']:,.0f} | mem {rec['mem_gib']:.2f} GiB{moved}"
    )


class RunLogger:
    """All per-run logging of rank 0 (other ranks get a disabled logger that writes nothing).

    Args:
        out_dir: the run directory.
        total_steps: planned optimizer steps (for the console line and the bar's ETA).
        start_step: steps already done (resume); the JSONL is cut back to this step.
        log_every: console line period.
        progress: show a tqdm bar on stderr.
        enabled: False on non-zero ranks.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        total_steps: int,
        start_step: int = 0,
        log_every: int = 10,
        progress: bool = True,
        enabled: bool = True,
    ):
        self.out = Path(out_dir)
        self.total_steps = total_steps
        self.log_every = log_every
        self.enabled = enabled
        self.jsonl = self.out / "train_log.jsonl"
        self.mllog = MLLogger(self.out / "mlperf_log.txt", enabled=enabled)
        self.losses: list[tuple[int, float]] = []
        self.evals: list[dict[str, Any]] = []
        self._bar = None
        if not enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        if self.jsonl.exists():
            repair_torn_tail(self.jsonl)
            kept = [r for r in read_train_log(self.jsonl) if r["step"] <= start_step]
            atomic_write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
            self.losses = [(r["step"], r["loss"]) for r in kept]
        cut_mllog(self.mllog.path, start_step)
        if progress and total_steps > start_step:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=start_step, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True
            )

    def print(self, msg: str) -> None:
        """A console message that does not break the progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(msg)
        else:
            print(msg, flush=True)

    def log_step(self, rec: Mapping[str, Any]) -> None:
        """Record one optimizer step (JSONL, MLLOG ``train_loss``, console line, bar)."""
        if not self.enabled:
            return
        samples = rec.get("samples", rec["step"])
        rec = {k: rec[k] for k in STEP_KEYS} | {k: rec[k] for k in RECIPE_STEP_KEYS if k in rec}
        line = json.dumps(rec) + "\n"
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(line[: len(line) // 2])
            f.flush()
            kill_point("train_log.torn_record")
            f.write(line[len(line) // 2 :])
        self.losses.append((rec["step"], rec["loss"]))
        self.mllog.event("train_loss", rec["loss"], {"step_num": rec["step"], "samples_count": samples})
        if is_console_step(rec["step"], self.log_every, self.total_steps):
            self.print(format_step(rec, self.total_steps))
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{rec['loss']:.3f}", refresh=False)
            self._bar.update(1)

    def log_eval(self, step: int, summary: Mapping[str, Any], *, samples_count: int) -> None:
        """Record an evaluation (MLLOG ``eval_accuracy`` = pass@1, degenerate count; console)."""
        if not self.enabled:
            return
        rec = {
            "step": step,
            "pass@1": summary.get("pass@1"),
            "num_degenerate": summary.get("num_degenerate"),
            "num_problems": summary.get("num_problems"),
        }
        self.evals.append(rec)
        self.mllog.start("eval_start", None, {"step_num": step})
        self.mllog.event(
            "eval_accuracy",
            rec["pass@1"],
            {"step_num": step, "samples_count": samples_count, "num_degenerate": rec["num_degenerate"]},
        )
        self.mllog.end("eval_stop", None, {"step_num": step})
        passed, n = summary.get("passed"), rec["num_problems"]
        if isinstance(passed, int) and isinstance(n, int):
            from ida_eval.analysis import format_pass_at_1

            score = format_pass_at_1(passed, n)
        else:
            score = f"{rec['pass@1']} on {n} problems"
        self.print(f"eval  step {step}: pass@1 {score}, degenerate outputs {rec['num_degenerate']}")

    def close(self) -> None:
        """Close the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write_report(self, report: Mapping[str, Any]) -> Path:
        """Write ``report.json`` atomically; returns its path."""
        path = self.out / "report.json"
        if self.enabled:
            atomic_write_text(path, json.dumps(report, indent=2, default=str) + "\n")
        return path

    def loss_figure(self, *, title: str) -> Any:
        """The matplotlib figure of :meth:`plot_loss`: the loss curve, and pass@1 of each eval as red dots on
        a second axis, with one legend naming both."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        steps, losses = zip(*self.losses, strict=True)
        ax.plot(steps, losses, lw=1.2, label="train loss (left axis)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss (nats / supervised token)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        evals = [e for e in self.evals if e["pass@1"] is not None]
        if evals:
            ax2 = ax.twinx()
            ax2.plot(
                [e["step"] for e in evals],
                [e["pass@1"] for e in evals],
                "o--",
                color="tab:red",
                label="pass@1 of the eval (right axis)",
            )
            ax2.set_ylabel("pass@1")
            ax2.set_ylim(-0.02, 1.02)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, loc="upper right", fontsize=8)
        fig.tight_layout()
        return fig

    def plot_loss(self, *, title: str) -> Path | None:
        """Write ``loss.png`` (loss per step, eval pass@1 on a second axis when there is any)."""
        if not self.enabled or not self.losses:
            return None
        import matplotlib.pyplot as plt

        fig = self.loss_figure(title=title)
        path = self.out / "loss.png"
        tmp = self.out / ".loss.png.tmp.png"
        fig.savefig(tmp)
        plt.close(fig)
        os.replace(tmp, path)
        return path
