"""Chaos campaign: random ``kill -9`` trials of ``python -m mxfp8_codec quantize`` and of the trainer.

Usage::

    python scripts/chaos.py                      # 30 kills of each command (about 40 min on a loaded 2-core box)
    python scripts/chaos.py --kills 5 --only quantize --seed 3

Each trial starts the real command, sends it ``SIGKILL`` at a random moment of its work (uniform over
the unkilled reference run's duration), then checks, like a user who reruns after a crash would:

- **nothing lost**: every file under its final name is complete (its sha256 equals the reference
  run's; a torn or half-copied file counts as lost), the command's input is unchanged, and every
  complete trainer checkpoint left by the kill loads and equals the reference run's checkpoint of the
  same step; after recovery the finished outputs equal the unkilled reference run's byte for byte, and
  the trainer's loss records (step, loss, grad norm, lr) are bit-identical and each step appears once
  in ``train_log.jsonl`` and ``mlperf_log.txt``;
- **nothing stuck**: the recovery run succeeds without manual cleanup — the same command again (for
  quantize; plus ``--overwrite`` when the command answers that the destination exists and says so), or
  ``--resume`` (for the trainer) — and leaves no temporary files behind.

Half of the trials start from an empty destination, the other half replace a previous complete output
(quantize ``--overwrite`` onto the reference output; the trainer ``--overwrite`` onto a copy of the
reference run), where a kill must leave either the old or the new bytes under every final name.

The report per command: trials, kills (trials whose process was still running at the kill), survivors
(kills after which nothing was lost or stuck), lost, stuck, and the reason for each failure. Exit status
0 when nothing was lost or stuck, 1 otherwise. Inputs: a small Llama checkpoint (BF16, two shards, a
40 MB side file so that copies take long enough to be interrupted) built with transformers; the
trainer's tiny demo model (4 steps, a checkpoint every step, keep 2, export on, CPU, one thread so
every float sum runs in the same order). Results with the command and load go to docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ida_common.checksums import file_sha256  # after the path set-up

TRAIN_STEPS = 4
TRAIN_ARGS = [
    "--model.hidden_size",
    "32",
    "--model.intermediate_size",
    "64",
    "--model.num_heads",
    "2",
    "--train.global_batch_size",
    "2",
    "--steps",
    str(TRAIN_STEPS),
    "--checkpoint.every",
    "1",
    "--checkpoint.keep",
    "2",
    "--eval.final",
    "false",
    "--checkpoint.export",
    "true",
    "--train.progress",
    "false",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # the same summation order in every process: bit-identical losses
    env.pop("IDA_KILL_AT", None)
    return env


def _is_temp(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith((".tmp", ".tmp.png")) or ".tmp/" in rel + "/" or name.startswith(".")


def _files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (temporaries included)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


@dataclass
class Tally:
    trials: int = 0
    kills: int = 0
    survivors: int = 0
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)


def _run_and_kill(cmd: list[str], delay: float, started: Path | None = None) -> tuple[bool, float, str]:
    """Start ``cmd``; SIGKILL it ``delay`` s after ``started`` exists (or after the start); returns
    (killed, seconds from ``started`` (or the start) to the end, stderr tail)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        if started is not None:
            while not started.exists() and proc.poll() is None:
                time.sleep(0.002)
        t0 = time.monotonic()
        t_kill = t0 + delay
        while proc.poll() is None and time.monotonic() < t_kill:
            time.sleep(0.002)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        err.seek(0)
        return killed, time.monotonic() - t0, err.read().decode(errors="replace")[-400:]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=1800, check=False)


# --------------------------------------------------------------------------------------------------
# quantize


def _build_hf_source(root: Path) -> Path:
    """A small Llama checkpoint in BF16: two safetensors shards + index, config, tokenizer, a big side file."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ida_trainer.demo import corpus_texts, train_demo_tokenizer

    src = root / "hf"
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(src, max_shard_size="30MB")
    train_demo_tokenizer(corpus_texts()).save_pretrained(src)
    rng = random.Random(0)  # a 40 MB side file: long enough to copy that a kill can land mid-copy
    (src / "vocab_stats.json").write_text(json.dumps({"counts": [rng.random() for _ in range(2_000_000)]}))
    return src


class Quantize:
    name = "quantize"

    def __init__(self, work: Path):
        self.work = work
        self.src = _build_hf_source(work)
        self.src_files = _files(self.src)
        self.ref = work / "quantize-ref"
        t0 = time.monotonic()
        # kills are drawn over the work part (from the output directory's creation on), not the imports
        _, self.work_s, err = _run_and_kill(self._cmd(self.ref), 1e9, started=self.ref)
        self.duration = time.monotonic() - t0
        if not (self.ref / "model.safetensors").is_file():
            raise SystemExit(f"chaos: the reference quantize run failed: {err.strip()[-300:]}")
        self.ref_files = {k: v for k, v in _files(self.ref).items() if not _is_temp(k)}
        again = work / "quantize-ref2"
        _run(self._cmd(again))
        if {k: v for k, v in _files(again).items() if not _is_temp(k)} != self.ref_files:
            raise SystemExit("chaos: two unkilled quantize runs differ; outputs are not comparable")
        shutil.rmtree(again)
        help_text = _run([sys.executable, "-m", "mxfp8_codec", "quantize", "--help"]).stdout
        self.has_overwrite = "--overwrite" in help_text

    def _cmd(self, out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "mxfp8_codec", "quantize", str(self.src), str(out), *extra]

    def trial(self, k: int, rng: random.Random) -> tuple[bool, list[str], list[str]]:
        out = self.work / f"quantize-{k}"
        replace = k % 2 == 1 and self.has_overwrite
        extra = ["--overwrite"] if replace else []
        if replace:
            shutil.copytree(self.ref, out)
        if replace:  # the old output is there already: draw the kill over the whole run
            killed, _, _ = _run_and_kill(self._cmd(out, *extra), rng.uniform(0, self.duration))
        else:
            killed, _, _ = _run_and_kill(self._cmd(out), rng.uniform(0, self.work_s), started=out)
        why_lost, why_stuck = [], []
        if _files(self.src) != self.src_files:
            why_lost.append("the source checkpoint changed")
        for rel, sha in _files(out).items():
            if not _is_temp(rel) and self.ref_files.get(rel) != sha:
                why_lost.append(f"{rel} under its final name differs from the reference (torn or stale)")
        res = _run(self._cmd(out, *extra))
        if res.returncode != 0 and "--overwrite" in res.stderr and not extra:
            res = _run(self._cmd(out, "--overwrite"))  # the command said how to go on: that is not stuck
        if res.returncode != 0:
            why_stuck.append(f"the rerun failed: {res.stderr.strip().splitlines()[-1:]}")
        else:
            final = _files(out)
            temps = [r for r in final if _is_temp(r)]
            if temps:
                why_stuck.append(f"temporary files left after a successful rerun: {temps}")
            if {r: s for r, s in final.items() if not _is_temp(r)} != self.ref_files:
                why_lost.append("the rerun's outputs differ from the reference")
        shutil.rmtree(out, ignore_errors=True)
        return killed, why_lost, why_stuck


# --------------------------------------------------------------------------------------------------
# trainer


def _records(out: Path) -> list[tuple]:
    from ida_trainer.logs import read_train_log

    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in read_train_log(out / "train_log.jsonl")]


def _mllog_steps(out: Path) -> list[int]:
    from ida_trainer.logs import read_mllog

    return [r["metadata"]["step_num"] for r in read_mllog(out / "mlperf_log.txt") if r["key"] == "train_loss"]


class Train:
    name = "trainer"

    def __init__(self, work: Path):
        from ida_trainer.checkpoint import list_checkpoints

        self.work = work
        self.ref = work / "train-ref"
        t0 = time.monotonic()
        # the reference run; each checkpoint is hashed as soon as it appears (before keep-pruning removes it)
        self.ckpt_sha: dict[str, str] = {}
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self._cmd(self.ref), env=_env(), stdout=subprocess.DEVNULL, stderr=err)
            while True:
                done = proc.poll() is not None
                for _, path in list_checkpoints(self.ref / "checkpoints"):
                    if path.name not in self.ckpt_sha:
                        self.ckpt_sha[path.name] = file_sha256(path / "model.safetensors")
                if done:
                    break
                time.sleep(0.01)
            err.seek(0)
            if proc.returncode != 0:
                raise SystemExit(f"chaos: the reference trainer run failed: {err.read().decode()[-300:]}")
        self.duration = time.monotonic() - t0
        if len(self.ckpt_sha) != TRAIN_STEPS:
            raise SystemExit(f"chaos: saw {sorted(self.ckpt_sha)} of the reference run's {TRAIN_STEPS} checkpoints")
        # kills are drawn over the work part (from config.toml written to report.json), not the imports
        self.work_s = (self.ref / "report.json").stat().st_mtime - (self.ref / "config.toml").stat().st_mtime
        self.ref_records = _records(self.ref)
        last = f"ckpt-{TRAIN_STEPS:06d}"
        self.final_sha = {
            "checkpoint": self.ckpt_sha[last],
            "export": file_sha256(self.ref / "export" / "model.safetensors"),
        }

    def _cmd(self, out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "ida_trainer", "--out", str(out), *TRAIN_ARGS, *extra]

    def trial(self, k: int, rng: random.Random) -> tuple[bool, list[str], list[str]]:
        from ida_trainer.checkpoint import list_checkpoints, load_checkpoint

        out = self.work / f"train-{k}"
        replace = k % 2 == 1
        if replace:
            shutil.copytree(self.ref, out)
        if replace:  # the old run's config.toml is there already: draw the kill over the whole run
            killed, _, _ = _run_and_kill(self._cmd(out, "--overwrite"), rng.uniform(0, self.duration))
        else:
            killed, _, _ = _run_and_kill(self._cmd(out), rng.uniform(0, self.work_s), started=out / "config.toml")
        why_lost, why_stuck = [], []
        for _, path in list_checkpoints(out / "checkpoints"):
            try:
                with load_checkpoint(path):
                    pass
            except Exception as err:  # noqa: BLE001 - any failure to load is a loss
                why_lost.append(f"{path.name} does not load: {err}")
                continue
            if file_sha256(path / "model.safetensors") != self.ckpt_sha.get(path.name):
                why_lost.append(f"{path.name} differs from the reference checkpoint of that step")
        res = _run(self._cmd(out, "--resume"))
        if res.returncode != 0:
            why_stuck.append(f"--resume failed: {res.stderr.strip().splitlines()[-1:]}")
        else:
            try:
                self._check_finished(out, why_lost, why_stuck)
            except (OSError, ValueError, KeyError) as err:  # a damaged or missing output is a loss
                why_lost.append(f"reading the outputs failed: {err}")
        shutil.rmtree(out, ignore_errors=True)
        return killed, why_lost, why_stuck

    def _check_finished(self, out: Path, why_lost: list[str], why_stuck: list[str]) -> None:
        from ida_trainer.checkpoint import list_checkpoints

        if _records(out) != self.ref_records:
            why_lost.append("the resumed run's loss records differ from the reference")
        if _mllog_steps(out) != list(range(1, TRAIN_STEPS + 1)):
            why_lost.append(f"mlperf_log.txt train_loss steps {_mllog_steps(out)}")
        ckpts = list_checkpoints(out / "checkpoints")
        last = out / "checkpoints" / f"ckpt-{TRAIN_STEPS:06d}"
        if not last.is_dir() or file_sha256(last / "model.safetensors") != self.final_sha["checkpoint"]:
            why_lost.append("the final checkpoint differs from the reference")
        if file_sha256(out / "export" / "model.safetensors") != self.final_sha["export"]:
            why_lost.append("the export differs from the reference")
        if [s for s, _ in ckpts] != [TRAIN_STEPS - 1, TRAIN_STEPS]:
            why_stuck.append(f"checkpoints left: {[p.name for _, p in ckpts]}")
        temps = [r for r in _files(out) if _is_temp(r)] + [p.name for p in self.work.glob(f".{out.name}.*")]
        if temps:
            why_stuck.append(f"temporary files left after a successful resume: {temps}")


def _tally(tally: Tally, k: int, killed: bool, why_lost: list[str], why_stuck: list[str]) -> None:
    tally.trials += 1
    tally.kills += killed
    if why_lost:
        tally.lost.append(f"trial {k}: " + "; ".join(why_lost))
    if why_stuck:
        tally.stuck.append(f"trial {k}: " + "; ".join(why_stuck))
    if killed and not why_lost and not why_stuck:
        tally.survivors += 1
    state = "killed" if killed else "finished before the kill"
    verdict = "LOST " + "; ".join(why_lost) if why_lost else ""
    verdict += (" STUCK " + "; ".join(why_stuck)) if why_stuck else ""
    print(f"  trial {k:3d}: {state}: {verdict.strip() or 'ok'}", flush=True)


def _campaign(cmd: Quantize | Train, kills: int, max_trials: int, jobs: int, seed: int) -> Tally:
    """Trials in batches of ``jobs`` concurrent ones until ``kills`` kills (or ``max_trials``)."""
    from concurrent.futures import ThreadPoolExecutor

    tally = Tally()
    k = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while tally.kills < kills and k < max_trials:
            batch = list(range(k, min(k + jobs, max_trials)))
            k = batch[-1] + 1
            futures = [(i, pool.submit(cmd.trial, i, random.Random(f"{seed}-{cmd.name}-{i}"))) for i in batch]
            for i, fut in futures:
                _tally(tally, i, *fut.result())
    return tally


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/chaos.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=30, help="kills per command (trials repeat until reached)")
    ap.add_argument("--only", choices=["quantize", "trainer"], help="campaign for one command only")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    ap.add_argument("--workdir", type=Path, help="where the trials run (default: a temporary directory)")
    ap.add_argument("--jobs", type=int, default=2, help="trials run at the same time (each is one process)")
    ap.add_argument("--max-trials", type=int, default=0, help="stop after this many trials per command (0: 3 x kills)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ida-chaos-", dir=args.workdir))
    load = os.getloadavg()[0]
    print(
        f"chaos: work dir {work}, seed {args.seed}, {args.kills} kills per command, {args.jobs} trials at a time, "
        f"load {load:.1f}",
        flush=True,
    )
    results: list[tuple[str, Tally, float]] = []
    try:
        for cls in (Quantize, Train):
            if args.only and cls.name != args.only:
                continue
            t0 = time.monotonic()
            cmd = cls(work)
            print(f"{cmd.name}: reference run {cmd.duration:.1f} s, of which work {cmd.work_s:.1f} s", flush=True)
            tally = _campaign(cmd, args.kills, args.max_trials or 3 * args.kills, args.jobs, args.seed)
            results.append((cmd.name, tally, time.monotonic() - t0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'command':<10} {'trials':>6} {'kills':>6} {'survivors':>9} {'lost':>5} {'stuck':>6} {'wall s':>7}")
    for name, t, wall in results:
        print(f"{name:<10} {t.trials:>6} {t.kills:>6} {t.survivors:>9} {len(t.lost):>5} {len(t.stuck):>6} {wall:>7.0f}")
    for name, t, _ in results:
        for line in t.lost:
            print(f"{name} LOST {line}")
        for line in t.stuck:
            print(f"{name} STUCK {line}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    bad = any(t.lost or t.stuck for _, t, _ in results)
    short = any(t.kills < args.kills for _, t, _ in results)
    if short:
        print("chaos: fewer kills than asked (runs finished before their kill time); raise --max-trials")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
