"""Which MBXP languages can run here: each language's tools, present or not, and their versions.

``python -m ida_eval.toolchains`` prints one line per language (the commands it needs, found or
missing, the version line), ``--json`` the same as JSON; ``--install`` prints the ``apt-get``
command line that installs the missing languages' Debian 12 packages (``--install --json``: that
line and the languages without a package as JSON), and ``--install --yes`` runs it (as root;
``apt-get update`` first). Swift has no Debian package: it stays ``toolchain missing``. Every tool
is looked up and run on the sandbox's ``PATH`` (:data:`ida_eval.sandbox.SAFE_PATH`), whatever the
caller's is: what is found here is what a sandboxed program finds, except Python's: its programs run
under the interpreter that runs ida_eval (``sys.executable``, :mod:`ida_eval.sandbox`), whatever
``python3`` ``PATH`` holds, so that interpreter and its version are reported. Errors speak the project's
CLI voice (:mod:`ida_common.cli`). Language rules (packages, commands) live in :mod:`ida_eval.languages`.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ida_common.cli import ArgumentParser, CannotRunHere, Run, run_main
from ida_eval.languages import LANGUAGES, Language, environment, missing_tools, tool_env
from ida_eval.sandbox import SAFE_PATH

__all__ = ["apt_command", "main", "toolchain_report", "toolchain_version"]

PROG = "ida_eval.toolchains"
VERSION_TIMEOUT_S = 60.0  # kotlinc -version starts a JVM: seconds on a busy machine


@functools.cache
def toolchain_version(lang: Language) -> str | None:
    """The version line of ``lang``'s toolchain (the first line of its version command; kotlinc's last), run on
    the sandbox's ``PATH`` with the language's tool environment, once per process; for Python, this
    interpreter's (it runs the programs). What each results record says its verdict came from."""
    if lang.name == "python":
        return f"Python {platform.python_version()}"
    env = tool_env(lang)
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
    if lang.name in ("javascript", "typescript"):
        dirs = dict(environment(lang)).get("NODE_PATH", "").split(":")
        if not any(os.path.isdir(os.path.join(d, "lodash")) for d in dirs if d):
            return "lodash (node-lodash)"
    if lang.name == "perl":
        perl = shutil.which("perl", path=SAFE_PATH)
        ok = (
            perl is not None
            and subprocess.run(
                [perl, "-MData::Compare", "-e1"], capture_output=True, env=tool_env(), check=False
            ).returncode
            == 0
        )
        if not ok:
            return "Data::Compare (libdata-compare-perl)"
    return None


def toolchain_report(languages: Sequence[str] | None = None, versions: bool = True) -> list[dict[str, Any]]:
    """One dict per language: ``language``, ``commands``, ``missing`` (tools and libraries),
    ``present`` (bool), ``version`` (first line of the version command, or None) and ``packages``."""
    rows = []
    for name in languages or LANGUAGES:
        lang = LANGUAGES[name]
        if name == "python":  # its programs run under this interpreter, never PATH's python3 (ida_eval.sandbox)
            rows.append(_row(name, [sys.executable], [], toolchain_version(lang) if versions else None, lang.packages))
            continue
        missing = missing_tools(lang)
        if not missing:
            lib = _library_missing(lang)
            if lib:
                missing.append(lib)
        version = toolchain_version(lang) if versions and not missing_tools(lang) else None
        rows.append(_row(name, list(lang.tools), missing, version, lang.packages))
    return rows


def _row(
    name: str, commands: list[str], missing: list[str], version: str | None, packages: Sequence[str]
) -> dict[str, Any]:
    return {
        "language": name,
        "commands": commands,
        "missing": missing,
        "present": not missing,
        "version": version,
        "packages": list(packages),
    }


def apt_command(rows: Sequence[dict[str, Any]], all_languages: bool = False) -> list[str]:
    """``apt-get install`` argv for the Debian packages of the missing (or all) languages."""
    pkgs: list[str] = []
    for r in rows:
        if all_languages or not r["present"]:
            pkgs += [p for p in r["packages"] if p not in pkgs]
    return ["apt-get", "install", "-y", "--no-install-recommends", *pkgs] if pkgs else []


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 2 bad usage or ``--yes`` without root, 3 apt-get
    failed: :mod:`ida_common.cli`, docs/cli.md)."""
    return run_main(PROG, _main, argv)


def _main(run: Run) -> int:
    ap = ArgumentParser(
        prog=f"python -m {PROG}",
        short_prog=PROG,
        description="List the MBXP languages' toolchains (present, version).",
    )
    ap.add_argument("--language", action="append", choices=list(LANGUAGES), help="only these languages")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--install", action="store_true", help="print the apt-get line for the missing toolchains")
    ap.add_argument("--all", action="store_true", help="with --install: every language's packages")
    ap.add_argument("--yes", action="store_true", help="with --install: run apt-get update and the install (as root)")
    args = ap.parse_args(run.argv)
    if (args.all or args.yes) and not args.install:
        ap.error("--all and --yes go with --install")
    rows = toolchain_report(args.language, versions=not args.install)
    if not args.install:
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        width = max(len(r["language"]) for r in rows)
        for r in rows:
            state = "present" if r["present"] else "MISSING " + ", ".join(r["missing"])
            print(f"{r['language']:<{width}}  {' '.join(r['commands']):<14} {state}  {r['version'] or ''}".rstrip())
        return 0
    cmd = apt_command(rows, args.all)
    unavailable = [r["language"] for r in rows if not r["packages"] and (args.all or not r["present"])]
    if args.yes and cmd and os.geteuid() != 0:
        raise PermissionError(
            f"--install --yes runs apt-get, which needs root: run it as root, or run '{' '.join(cmd)}' yourself"
        )
    if args.json:
        print(json.dumps({"command": cmd, "no_debian_package": unavailable}, indent=2))
    else:
        if unavailable:
            print(f"no Debian package for: {', '.join(unavailable)} (stays 'toolchain missing')", file=sys.stderr)
        print(" ".join(cmd) if cmd else "nothing to install")
    if args.yes and cmd:
        for step in (["apt-get", "update"], cmd):
            env = tool_env() | {"DEBIAN_FRONTEND": "noninteractive"}
            status = subprocess.run(step, env=env, stdout=sys.stderr if args.json else None, check=False).returncode
            if status != 0:
                raise CannotRunHere(
                    f"'{' '.join(step)}' failed with exit status {status}: the packages are not installed"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
