"""A legal 100 MB header: time and peak memory of verify / inspect-free commands on it.

The safetensors header may be up to 100 MB (``MAX_HEADER_BYTES``); a file whose header is that big
holds about 1.66 million zero-size tensors and no data at all. Issue 11 measured the codec at
56 s / 1.7 GB for ``verify``, 218 s / 3.3 GB for ``dequantize`` and ~150 s / 3 GB for ``rename`` on
such a file. This script writes one (:func:`write_big_header_file`, also used by the tests with a
smaller count) and runs each command in a fresh interpreter under ``/usr/bin/time -v``, printing
wall time, CPU time and peak RSS, for the checkout it runs from and, with ``--baseline DIR``, for
another checkout (e.g. a ``git worktree`` of the old commit) in the same run, with the ratios.

Usage:
    python benchmarks/bench_big_header.py [--tensors N] [--commands verify,rename,dequantize]
        [--baseline /path/to/old/checkout] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_TENSORS_IN_100MB = 1_660_000  # entries of the form below that fit in 100,000,000 header bytes


def write_big_header_file(path: str | os.PathLike[str], n: int) -> int:
    """Write a valid MXFP8-declared safetensors file with ``n`` zero-size F32 tensors ``tNNNNNNN``.

    Returns:
        The header length in bytes (60 bytes per tensor).
    """
    parts = ['{"__metadata__":{"weights_dtype":"MXFP8_E4M3_UE8M0_K32","format_version":"1"}']
    parts += [f',"t{i:07d}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(n)]
    parts.append("}")
    js = "".join(parts).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
    return len(js)


def _run(checkout: Path, args: list[str]) -> tuple[float, float, int, str]:
    """``(wall s, user+sys s, peak RSS KiB, outcome)`` of ``python -m mxfp8_codec ARGS`` from ``checkout``.

    ``outcome`` is ``"ok"`` or the command's last stderr line (a refusal is a result too: ``dequantize``
    of a 100 MB header of F32 entries would need a header over the 100 MB limit)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    r = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-m", "mxfp8_codec", *args],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )

    def field(name: str) -> str:
        m = re.search(rf"{re.escape(name)}: (.+)", r.stderr)
        if m is None:
            raise SystemExit(f"/usr/bin/time -v printed no {name!r}")
        return m.group(1).strip()

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)")
    secs = sum(float(x) * 60**i for i, x in enumerate(reversed(wall.split(":"))))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    outcome, status = "ok", field("Exit status")
    if status != "0":
        lines = [line for line in r.stderr.replace("\r", "\n").splitlines() if "error" in line]
        outcome = lines[-1].strip() if lines else f"exit status {status}"
    return secs, cpu, int(field("Maximum resident set size (kbytes)")), outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=MAX_TENSORS_IN_100MB)
    p.add_argument("--commands", default="verify,rename,dequantize")
    p.add_argument("--baseline", type=Path, help="another checkout to run the same commands from")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        src = Path(d, "big.safetensors")
        n = write_big_header_file(src, args.tensors)
        print(f"header {n} bytes, {args.tensors} zero-size tensors; load {os.getloadavg()[0]:.1f}")
        checkouts = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        for cmd in args.commands.split(","):
            for _ in range(args.repeats):
                results = {}
                for label, checkout in checkouts:
                    out = Path(d, f"out-{label}.safetensors")
                    out.unlink(missing_ok=True)
                    cmd_args = {
                        "verify": ["verify", str(src)],
                        "rename": ["rename", str(src), str(out), "--prefix", "t=u"],
                        "dequantize": ["dequantize", str(src), str(out)],
                    }[cmd]
                    results[label] = _run(checkout, cmd_args)
                    wall, cpu, rss, outcome = results[label]
                    print(
                        f"{cmd:<11} {label:<9} wall {wall:7.1f} s  cpu {cpu:7.1f} s  peak RSS {rss / 1024:7.0f} MiB"
                        f"  {outcome}"
                    )
                if "baseline" in results:
                    (w0, c0, r0, _), (w1, c1, r1, _) = results["baseline"], results["this"]
                    print(f"{cmd:<11} this/baseline: wall {w1 / w0:.2f}x  cpu {c1 / c0:.2f}x  RSS {r1 / r0:.2f}x")
        print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
