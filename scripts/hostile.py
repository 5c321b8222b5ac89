"""Hostile-input campaign replay: the cases of issue 23 that a user hits through the command lines.

Usage::

    python scripts/hostile.py                 # every case (about a minute on a 2-core box)
    python scripts/hostile.py --only timeout  # the cases whose name contains "timeout"

Each case runs a real command (``python -m ...`` in a subprocess, this checkout first on the path)
on inputs built in a temporary directory, as a careless or hostile user would, and checks what the
user gets: the exit status, ONE error line naming what is wrong (no traceback), and that a run with
other work still does it. The cases:

- **surrogate**: a samples line whose completion holds a lone surrogate (``"\\udcff"``, valid JSON)
  beside a right one: exit 0, both get a verdict, the completion is kept losslessly, a rerun resumes
  with nothing to do;
- **timeout-***: ``--timeout inf | nan | 0 | 1e300``, ``--run-timeout all=inf``, ``--compile-timeout
  all=inf`` (``ida_eval.execute``) and ``--timeout inf`` (``ida_eval.mbxp``, which used to fail only
  after a whole generation): exit 2, one line at parse time, nothing written;
- **invalid-utf8**: a samples file with a byte that is not UTF-8: exit 2, the line names file:line;
- **stdin-forge-LANG**: a completion that copies stdin (where the driver's nonce used to wait) to
  stdout and exits 0, in every interpreted language with a toolchain here: exit 0, not passed;
- **no-quantization-config** / **null-quantization-config**: ``from_pretrained`` of an MXFP8
  checkpoint (``python -m mxfp8_codec demo``'s) whose config.json has no ``quantization_config`` (or
  null), with ``mxfp8_codec.hf`` imported: MXFP8 modules and logits bit-identical to the load with
  ``MXFP8Config()`` (was: raw E4M3 codes in plain ``nn.Linear``);
- **unwritable-destination**: ``quantize`` / ``dequantize`` onto a destination under a regular file:
  exit 2, one line naming the destination given (was: the hidden temporary).
- **flipped-byte** (2026-12-07): one bit flipped in the middle of a copy of the demo's MXFP8 weights, then
  ``verify`` on the copy: exit 1, one line naming the file and its ``SHA256SUMS`` (was: the flipped byte
  passed every structural check and decoded as another E4M3 value);
- **flipped-byte-from-pretrained** (2026-12-07): the same copy loaded by ``from_pretrained`` with
  ``mxfp8_codec.hf`` imported: ``MXFP8LoadError`` naming the file (was: loaded, another weight).
- **hostile-optimizer-state** (2026-12-07): a 2-step trainer run whose newest checkpoint gets an
  ``optimizer.st`` nested 100,000 deep (its ``SHA256SUMS`` rewritten, as whoever planted it would), then
  ``--resume``: exit 2, one line naming the file and the way on; moved aside as the line says, the run resumes
  from the checkpoint before it.

The tests cover each case too (docs/reliability.md names them); this script is the campaign's
reproduction, in the user's words, to rerun after a change. Exit status 0 when every case holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ida_eval.languages import LANGUAGES, missing_tools  # after the path set-up

PY_PROBLEM = {
    "task_id": "MBPP/1",
    "prompt": "def add(a, b):\n",
    "test": "def check(f):\n    assert f(1, 2) == 3\n",
    "entry_point": "add",
}
# (prompt, test, completion that copies stdin to stdout and exits 0) per interpreted language
FORGE: dict[str, tuple[str, str, str]] = {
    "javascript": (
        "function add(a, b) {\n",
        "\nif (add(1, 2) !== 3) { throw 'wrong'; }\n",
        '    process.stdout.write(require("fs").readFileSync(0));\n    process.exit(0);\n}',
    ),
    "ruby": ("def add(a, b)\n", '\nraise "wrong" if add(1, 2) != 3\n', "  STDOUT.write(STDIN.read)\n  exit!(0)\nend"),
    "php": (
        "<?php\nfunction add($a, $b) {\n",
        '\nif (add(1, 2) != 3) { throw new Exception("wrong"); }\n',
        "    fwrite(STDOUT, stream_get_contents(STDIN));\n    exit(0);\n}",
    ),
    "perl": (
        "sub add {\n  my ($x, $y) = @_;\n",
        '\ndie "wrong" unless add(1, 2) == 3;\n',
        "  local $/;\n  print STDOUT <STDIN>;\n  exit 0;\n}",
    ),
}


@dataclass
class Case:
    name: str
    module: str  # run as python -m MODULE; "" for python -c ARGV[0]
    argv: list[str]
    status: int
    check: Callable[[subprocess.CompletedProcess[str]], str | None] | None = None  # why it failed, or None
    error_has: str = ""  # the one error line must contain this


def _run(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGV``, or ``python -c ARGV[0] ARGV[1:]`` when ``module`` is empty."""
    env = {k: v for k, v in os.environ.items() if k not in ("IDA_DEBUG", "RANK")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    head = ["-m", module] if module else ["-c"]
    return subprocess.run(
        [sys.executable, *head, *argv], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()] if path.exists() else []


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def build_cases(work: Path) -> list[Case]:
    problems = _write_jsonl(work / "problems.jsonl", [PY_PROBLEM])
    ex = ["--problems", str(problems), "--workers", "1", "--no-progress"]
    cases = []

    bad = "    return a + b  # \udcff\n"
    surrogate = work / "surrogate.jsonl"
    surrogate.write_text(
        json.dumps({"task_id": "MBPP/1", "completion": bad})
        + "\n"
        + json.dumps({"task_id": "MBPP/1", "completion": "    return a + b\n"})
        + "\n"
    )
    out = work / "surrogate-results.jsonl"

    def surrogate_check(res: subprocess.CompletedProcess[str]) -> str | None:
        recs = _records(out)
        if len(recs) != 2 or not all(r["passed"] for r in recs) or recs[0]["completion"] != bad:
            return f"records: {[(r['completion'], r['result']) for r in recs]}"
        again = _run("ida_eval.execute", [*ex, "--samples", str(surrogate), "--out", str(out)])
        return None if again.returncode == 0 and len(_records(out)) == 2 else f"resume: rc {again.returncode}"

    cases.append(
        Case("surrogate", "ida_eval.execute", [*ex, "--samples", str(surrogate), "--out", str(out)], 0, surrogate_check)
    )

    nothing = work / "never-written.jsonl"
    for flag, value in (
        ("--timeout", "inf"),
        ("--timeout", "nan"),
        ("--timeout", "0"),
        ("--timeout", "1e300"),
        ("--run-timeout", "all=inf"),
        ("--compile-timeout", "all=inf"),
    ):
        cases.append(
            Case(
                f"timeout-execute{flag}={value}",
                "ida_eval.execute",
                [*ex, "--canonical", "--out", str(nothing), flag, value],
                2,
                lambda _res: f"{nothing} was written" if nothing.exists() else None,
                "seconds",
            )
        )
    cases.append(
        Case(
            "timeout-mbxp--timeout=inf",
            "ida_eval.mbxp",
            ["--checkpoint", str(work / "no-checkpoint"), "--out", str(work / "run"), "--timeout", "inf"],
            2,
            lambda _res: "the run directory was made" if (work / "run").exists() else None,
            "seconds",
        )
    )

    utf8 = work / "utf8.jsonl"
    utf8.write_bytes(
        b'{"task_id": "MBPP/1", "completion": "    return a + b\\n"}\n{"task_id": "MBPP/1", "completion": "\xff"}\n'
    )
    cases.append(
        Case(
            "invalid-utf8",
            "ida_eval.execute",
            [*ex, "--samples", str(utf8), "--out", str(nothing)],
            2,
            None,
            f"{utf8}:2: not valid JSON (invalid UTF-8",
        )
    )

    for lang, (prompt, test, completion) in FORGE.items():
        if missing_tools(LANGUAGES[lang]):
            print(f"skip stdin-forge-{lang}: toolchain missing", file=sys.stderr)
            continue
        tid = f"{LANGUAGES[lang].prefixes[0]}/0"
        probs = _write_jsonl(
            work / f"{lang}.jsonl",
            [{"task_id": tid, "language": lang, "prompt": prompt, "test": test, "entry_point": "add"}],
        )
        samples = _write_jsonl(work / f"{lang}-samples.jsonl", [{"task_id": tid, "completion": completion}])
        res_file = work / f"{lang}-results.jsonl"

        def forged(_res: subprocess.CompletedProcess[str], res_file: Path = res_file) -> str | None:
            recs = _records(res_file)
            return None if len(recs) == 1 and not recs[0]["passed"] else f"forged: {recs}"

        cases.append(
            Case(
                f"stdin-forge-{lang}",
                "ida_eval.execute",
                [
                    "--problems",
                    str(probs),
                    "--samples",
                    str(samples),
                    "--out",
                    str(res_file),
                    "--workers",
                    "1",
                    "--no-progress",
                ],
                0,
                forged,
            )
        )
    demo = work / "demo"
    cases.append(Case("demo", "mxfp8_codec", ["demo", str(demo)], 0))  # the checkpoints the next cases use
    for how in ("no", "null"):
        ckpt = work / f"{how}-config"
        cases.append(Case(f"{how}-quantization-config", "", [_NO_CONFIG_CHECK, str(demo / "mxfp8"), str(ckpt), how], 0))
    cases.append(
        Case(
            "flipped-byte",
            "",
            [_FLIP_THEN_VERIFY, str(demo / "mxfp8"), str(work / "flipped")],
            1,
            None,
            "model.safetensors: its bytes differ from the sha256 recorded in SHA256SUMS",
        )
    )
    cases.append(
        Case(
            "flipped-byte-from-pretrained",
            "",
            [_FLIP_THEN_LOAD, str(demo / "mxfp8"), str(work / "flipped-load")],
            2,
            None,
            "model.safetensors: its bytes differ from the sha256 recorded in SHA256SUMS",
        )
    )
    run = work / "trainer-run"

    def resumes_from_the_one_before(_res: subprocess.CompletedProcess[str]) -> str | None:
        (run / "checkpoints" / "ckpt-000002").rename(work / "aside")  # what the line says
        again = _run("ida_trainer", [*_TRAIN_2_STEPS.split(), "--out", str(run), "--resume"])
        ok = again.returncode == 0 and "resumed from" in again.stdout and "ckpt-000001" in again.stdout
        return None if ok else f"after moving it aside: exit {again.returncode}: {again.stderr.strip()[-300:]}"

    cases.append(
        Case(
            "hostile-optimizer-state",
            "",
            [_PLANT_OPTIMIZER_STATE, str(run)],
            2,
            resumes_from_the_one_before,
            "ckpt-000002/optimizer.st is damaged (not an optimizer state: its structure is nested too deeply)",
        )
    )
    blocker = work / "a-file"
    blocker.write_text("x")
    for cmd in ("quantize", "dequantize"):
        src = demo / ("hf" if cmd == "quantize" else "mxfp8")
        cases.append(
            Case(
                f"unwritable-destination-{cmd}",
                "mxfp8_codec",
                [cmd, str(src), str(blocker / "out")],
                2,
                None,
                f"{blocker / 'out'}: {blocker} is a file, not a directory",
            )
        )
    return cases


# from_pretrained of the demo's MXFP8 checkpoint with its quantization_config removed (or null), module imported
_NO_CONFIG_CHECK = """
import json, os, shutil, sys, warnings
import torch
from transformers import AutoModelForCausalLM
import mxfp8_codec.hf as mh
src, dst, how = sys.argv[1:4]
shutil.copytree(src, dst)
cfg = json.load(open(dst + "/config.json"))
if how == "no":
    del cfg["quantization_config"]
else:
    cfg["quantization_config"] = None
json.dump(cfg, open(dst + "/config.json", "w"))
os.remove(dst + "/SHA256SUMS")  # config.json was edited on purpose: its list no longer holds (the load would say so)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = AutoModelForCausalLM.from_pretrained(dst)
ref = AutoModelForCausalLM.from_pretrained(src)
ids = torch.arange(1, 17).reshape(1, 16)
same = torch.equal(model(ids).logits, ref(ids).logits)
n = len(list(mh.mxfp8_modules(model)))
print(f"mxfp8 modules {n}, logits bit-identical {same}, warned {any('quantization_config' in str(w.message) for w in caught)}")
sys.exit(0 if same and n > 0 else 1)
"""


# a copy of the demo's MXFP8 directory with one bit flipped in the middle of its weights, then `verify` on it
_FLIP_THEN_VERIFY = """
import shutil, sys
from mxfp8_codec.cli import main
src, dst = sys.argv[1:3]
shutil.copytree(src, dst)
with open(dst + "/model.safetensors", "r+b") as f:
    f.seek(0, 2)
    f.seek(f.tell() // 2)
    byte = f.read(1)[0]
    f.seek(-1, 1)
    f.write(bytes([byte ^ 0x04]))
sys.exit(main(["verify", dst]))
"""


# the same damage, then from_pretrained with mxfp8_codec.hf imported: MXFP8LoadError, reported as a CLI would
_FLIP_THEN_LOAD = (
    _FLIP_THEN_VERIFY.split("sys.exit(")[0]
    + """
from transformers import AutoModelForCausalLM
import mxfp8_codec.hf as mh
try:
    AutoModelForCausalLM.from_pretrained(dst)
except mh.MXFP8LoadError as exc:
    print(f"from_pretrained: error: {exc}", file=sys.stderr)
    sys.exit(2)
sys.exit(0)
"""
)


_TRAIN_2_STEPS = (
    "--train.steps 2 --checkpoint.every 1 --checkpoint.export false --eval.final false --train.progress false"
)

# the demo trained 2 steps, its newest checkpoint's optimizer.st replaced by one nested 100,000 deep (the list
# rewritten), then --resume; the resume's stderr and exit status are this script's
_PLANT_OPTIMIZER_STATE = f"""
import subprocess, sys
from pathlib import Path
import torch
from ida_common.checksums import write_sums
from ida_trainer.checkpoint import OPTIM_FILE, OPTIM_STATE_KEY
from mxfp8_codec import write_safetensors
run = ["-m", "ida_trainer", *{_TRAIN_2_STEPS.split()!r}, "--out", sys.argv[1]]
subprocess.run([sys.executable, *run], check=True, capture_output=True)
ckpt = Path(sys.argv[1]) / "checkpoints" / "ckpt-000002"
deep = "[" * 100_000 + "]" * 100_000
write_safetensors(ckpt / OPTIM_FILE, {{"x": torch.ones(2)}}, metadata={{OPTIM_STATE_KEY: deep}})
write_sums(ckpt)
res = subprocess.run([sys.executable, *run, "--resume"], capture_output=True, text=True)
sys.stderr.write(res.stderr)
sys.exit(res.returncode)
"""


def run_case(case: Case) -> str | None:
    """Why the case failed, or None when it held."""
    res = _run(case.module, case.argv)
    if "Traceback" in res.stderr:
        return "a traceback: " + res.stderr.strip().splitlines()[-1]
    if res.returncode != case.status:
        return f"exit status {res.returncode}, expected {case.status}: {res.stderr.strip()[-300:]}"
    if case.status != 0:
        lines = [ln for ln in res.stderr.splitlines() if ": error: " in ln]
        if len(lines) != 1 or case.error_has not in lines[0]:
            return f"expected one error line containing {case.error_has!r}, got {lines}"
    return case.check(res) if case.check else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    args = ap.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ida-hostile-") as tmp:
        every = build_cases(Path(tmp))
        cases = [c for c in every if args.only in c.name]
        demo = next(c for c in every if c.name == "demo")  # builds the checkpoints later cases read
        if demo not in cases and any(demo.argv[-1] in arg for c in cases for arg in c.argv):
            cases.insert(0, demo)
        for case in cases:
            why = run_case(case)
            failed += why is not None
            print(f"{'held' if why is None else 'FAILED':<7} {case.name}" + (f": {why}" if why else ""), flush=True)
    print(f"{len(cases) - failed} of {len(cases)} cases held")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
