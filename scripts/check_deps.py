"""Whether this Python has what pyproject.toml asks for, where the checkout is used without installing it.

``pip install`` enforces the project's requirements; a lent GPU machine runs the checkout from
``PYTHONPATH`` on its image's packages instead (``scripts/device_check.sh``, step 1), where an older
transformers would fail later steps in ways that do not name the cause.  This prints one line per
requirement of ``[project] dependencies`` (the installed version, or what is wrong) and the requirements of
those distributions in turn (one level: a carried wheel installed with ``--no-deps`` must find its own),
and exits 1 when any is missing or out of range.

    python scripts/check_deps.py [--pyproject PATH] [--extra test]

Exit status: 0 every requirement met; 1 some are not (each named); 2 bad usage or an unreadable pyproject.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (as in ida_trainer/cli.py)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def read_requirements(pyproject: Path, extras: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``[project] dependencies`` of a pyproject.toml, then each named optional-dependencies group."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return requirements


def unmet(req: Requirement, extras: tuple[str, ...] = ("",)) -> tuple[str | None, str | None]:
    """(installed version or None, what is wrong or None) for one requirement; a marker that does not apply
    here (another platform, an extra not asked for) is met."""
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
        return None, None
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return None, "not installed"
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        return have, f"{have} installed, {req.specifier} required"
    return have, None


def check(requirements: list[str], extras: tuple[str, ...]) -> list[str]:
    """The report's lines; a line starting with 'UNMET' for each requirement not met."""
    lines = []
    for text in requirements:
        req = Requirement(text)
        have, problem = unmet(req, extras)
        if have is None and problem is None:
            continue  # marker: not for this platform / extra
        if problem:
            lines.append(f"UNMET {req.name}: {problem} (pyproject.toml: {text})")
            continue
        lines.append(f"ok    {req.name} {have} ({req.specifier or 'any'})")
        for sub_text in metadata.requires(req.name) or []:  # its own requirements, one level
            try:
                sub = Requirement(sub_text)
            except InvalidRequirement:
                continue
            _, sub_problem = unmet(sub)
            if sub_problem:
                lines.append(f"UNMET {sub.name}: {sub_problem} (needed by {req.name} {have}: {sub_text})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    ap.add_argument("--extra", action="append", default=[], help="also check this optional-dependencies group")
    args = ap.parse_args(argv)
    try:
        requirements = read_requirements(args.pyproject, args.extra)
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        print(f"check_deps: error: {args.pyproject}: cannot read [project] dependencies: {exc!r}", file=sys.stderr)
        return 2
    lines = check(requirements, ("", *args.extra))
    print("\n".join(lines))
    bad = [line for line in lines if line.startswith("UNMET")]
    print(f"check_deps: {len(bad)} unmet" if bad else "check_deps: every requirement met")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
