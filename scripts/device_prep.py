"""Prepare this checkout for a lent GPU machine, here, without one: what ``scripts/device_check.sh`` needs there.

The device image (docs/nvfp4.md, "Device check") has torch, CUDA and Triton but no cffi, a transformers
older than pyproject.toml's floor, and no package index.  This

* downloads the wheels it lacks into ``.whl/`` for the image's Python (CPython 3.12, manylinux x86-64):
  cffi and pycparser at the versions this environment has, and transformers at the floor's newest
  release (``transformers>=5.24`` -> ``5.24.*``: the version the suite runs on whose own requirements
  the image meets; ``device_check.sh`` installs ``.whl/*.whl`` with ``--no-deps`` and step 1 checks every
  requirement with ``scripts/check_deps.py``);
* copies the MBPP prompts into ``.devrun/`` (steps 7 and 8 read them) from ``--shared`` (default ../shared);
* lists both folders in ``.git/info/exclude`` (never committed; a carried path must be ignored);
* prints the device call: its command, ``carry`` and the total that travels (limit 64 MiB).

    python scripts/device_prep.py [--shared DIR]

A rerun keeps wheels already downloaded.  Exit status: 0 ready; 1 a download failed or the prompts are
missing (named); 2 bad usage.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from check_deps import read_requirements  # scripts/, beside this script

from ida_common.files import atomic_write_text, copy_file_atomic

WHEELS, DATA = ".whl", ".devrun"
PROMPTS = "mbxp/mbpp_release_v1.jsonl"
TRAVEL_LIMIT = 64 << 20  # bytes: the working tree, carried paths included
# the device image's interpreter and platform tags (docs/nvfp4.md, "Device check")
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    arg
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    for arg in ("--platform", tag)
]
# the run's own command (device.run: at most 600 s; device_check.sh's budget is 540 s, see its header)
COMMAND = (
    "export PYTHON=python3 PYTHONUNBUFFERED=1; timeout 585 bash scripts/device_check.sh /tmp/report; rc=$?; "
    'tar czf "$OUT/device_report.tgz" -C /tmp report; cp /tmp/report/report.md "$OUT/"; exit $rc'
)


def wanted_wheels() -> list[str]:
    """pip requirement strings: cffi and pycparser as installed here, transformers at its floor's newest release."""
    floor = next(r for r in map(Requirement, read_requirements(REPO / "pyproject.toml")) if r.name == "transformers")
    low = next(s.version for s in floor.specifier if s.operator == ">=")
    return [
        f"cffi=={metadata.version('cffi')}",
        f"pycparser=={metadata.version('pycparser')}",
        f"transformers=={low}.*",
    ]


def exclude(paths: list[str]) -> None:
    """Add ``/path/`` lines to .git/info/exclude (once each)."""
    info = REPO / ".git" / "info"
    info.mkdir(parents=True, exist_ok=True)
    path = info / "exclude"
    lines = path.read_text().splitlines() if path.exists() else []
    missing = [f"/{p}/" for p in paths if f"/{p}/" not in lines]
    if missing:
        atomic_write_text(path, "".join(line + "\n" for line in lines + missing))


def travelling_bytes(carry: list[str]) -> int:
    """Tracked files + untracked files git does not ignore + the carried folders."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    total = sum((REPO / p.decode()).stat().st_size for p in listed if p and (REPO / p.decode()).is_file())
    return total + sum(f.stat().st_size for c in carry for f in (REPO / c).rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="the shared data folder")
    args = ap.parse_args(argv)
    prompts = args.shared / PROMPTS
    if not prompts.is_file():
        print(f"device_prep: error: {prompts}: no such file (--shared names the folder holding mbxp/)", file=sys.stderr)
        return 1
    exclude([WHEELS, DATA])
    (REPO / WHEELS).mkdir(exist_ok=True)
    for spec in wanted_wheels():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", str(REPO / WHEELS), spec]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"device_prep: error: pip download {spec} failed: {last}", file=sys.stderr)
            return 1
    names = sorted(p.name for p in (REPO / WHEELS).glob("*.whl"))
    projects = [n.split("-", 1)[0].lower() for n in names]
    if len(set(projects)) != len(projects):  # pip install stops at two versions of one project
        print(
            f"device_prep: error: {WHEELS}/ holds two versions of one project: {names}; remove the old", file=sys.stderr
        )
        return 1
    (REPO / DATA).mkdir(exist_ok=True)
    copy_file_atomic(prompts, REPO / DATA / prompts.name)
    size = travelling_bytes([WHEELS, DATA])
    print(f"wheels ({WHEELS}/): {', '.join(names)}")
    print(f"data ({DATA}/): {prompts.name}")
    print(f"travels: {size / 2**20:.1f} MiB of {TRAVEL_LIMIT >> 20} MiB")
    print(f'device run: kind "nvidia-h200", carry ["{WHEELS}", "{DATA}"], timeout_s 600, command:')
    print(COMMAND)
    if size > TRAVEL_LIMIT:
        print(f"device_prep: error: {size / 2**20:.1f} MiB would travel, over the limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if shutil.which("git") is None:
        sys.exit("device_prep: error: git is not on PATH")
    sys.exit(main())
