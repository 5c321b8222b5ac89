"""Which MBXP languages can run here: each language's tools, present or not, and their versions.

``python -m ida_eval.toolchains`` prints one line per language (the commands it needs, found or
missing, the version line), ``--json`` the same as JSON; ``--install`` prints the ``apt-get``
command line that installs the missing languages' Debian 12 packages, and ``--install --yes`` runs it
(as root; ``apt-get update`` first). Swift has no Debian package: it stays ``toolchain missing``.
Language rules (packages, commands) live in :mod:`ida_eval.languages`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ida_eval.languages import LANGUAGES, Language, environment, missing_tools

__all__ = ["apt_command", "main", "toolchain_report"]

VERSION_TIMEOUT_S = 60.0  # kotlinc -version starts a JVM: seconds on a busy machine


def _version(lang: Language) -> str | None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    env.update((k, v) for k, v in environment(lang) if "{work}" not in v)
    try:
        proc = subprocess.run(
            lang.version_cmd, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"? ({e.__class__.__name__})"
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return lines[-1] if lang.name == "kotlin" and lines else (lines[0] if lines else None)


def _library_missing(lang: Language) -> str | None:
    """A language library the tests need that is absent (lodash, Data::Compare), else None."""
    import os

    if lang.name in ("javascript", "typescript"):
        dirs = dict(environment(lang)).get("NODE_PATH", "").split(":")
        if not any(os.path.isdir(os.path.join(d, "lodash")) for d in dirs if d):
            return "lodash (node-lodash)"
    if lang.name == "perl":
        ok = subprocess.run(["perl", "-MData::Compare", "-e1"], capture_output=True, check=False).returncode == 0
        if not ok:
            return "Data::Compare (libdata-compare-perl)"
    return None


def toolchain_report(languages: Sequence[str] | None = None, versions: bool = True) -> list[dict[str, Any]]:
    """One dict per language: ``language``, ``commands``, ``missing`` (tools and libraries),
    ``present`` (bool), ``version`` (first line of the version command, or None) and ``packages``."""
    rows = []
    for name in languages or LANGUAGES:
        lang = LANGUAGES[name]
        missing = missing_tools(lang)
        if not missing:
            lib = _library_missing(lang)
            if lib:
                missing.append(lib)
        rows.append(
            {
                "language": name,
                "commands": list(lang.tools),
                "missing": missing,
                "present": not missing,
                "version": _version(lang) if versions and not missing_tools(lang) else None,
                "packages": list(lang.packages),
            }
        )
    return rows


def apt_command(rows: Sequence[dict[str, Any]], all_languages: bool = False) -> list[str]:
    """``apt-get install`` argv for the Debian packages of the missing (or all) languages."""
    pkgs: list[str] = []
    for r in rows:
        if all_languages or not r["present"]:
            pkgs += [p for p in r["packages"] if p not in pkgs]
    return ["apt-get", "install", "-y", "--no-install-recommends", *pkgs] if pkgs else []


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ida_eval.toolchains", description="List the MBXP languages' toolchains (present, version)."
    )
    ap.add_argument("--language", action="append", choices=list(LANGUAGES), help="only these languages")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--install", action="store_true", help="print the apt-get line for the missing toolchains")
    ap.add_argument("--all", action="store_true", help="with --install: every language's packages")
    ap.add_argument("--yes", action="store_true", help="with --install: run apt-get update and the install")
    args = ap.parse_args(argv)
    rows = toolchain_report(args.language, versions=not args.install)
    if args.install:
        cmd = apt_command(rows, args.all)
        unavailable = [r["language"] for r in rows if not r["packages"] and (args.all or not r["present"])]
        if unavailable:
            print(f"no Debian package for: {', '.join(unavailable)} (stays 'toolchain missing')", file=sys.stderr)
        if not cmd:
            print("nothing to install")
            return 0
        print(" ".join(cmd))
        if args.yes:
            env_cmd = ["env", "DEBIAN_FRONTEND=noninteractive"]
            for step in (["apt-get", "update"], cmd):
                if subprocess.run(env_cmd + step, check=False).returncode != 0:
                    print(f"error: {' '.join(step)} failed", file=sys.stderr)
                    return 1
        return 0
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["language"]) for r in rows)
    for r in rows:
        state = "present" if r["present"] else "MISSING " + ", ".join(r["missing"])
        print(f"{r['language']:<{width}}  {' '.join(r['commands']):<14} {state}  {r['version'] or ''}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
