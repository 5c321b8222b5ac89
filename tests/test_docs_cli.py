"""docs/cli.md's command table lists exactly the commands that exist: every ``python -m`` entry point
of the project and every subcommand of those that have them, nothing that is gone (issue 24)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ida_common", "mxfp8_codec", "nvfp4_cuda", "ida_trainer", "ida_eval")
NOT_COMMANDS = {"ida_eval._sandbox_boot"}  # run as a script inside the sandbox, never by a user
SPAN = re.compile(r"`([^`]*)`")


def entry_points() -> set[str]:
    """Modules a user runs with ``python -m``: packages with ``__main__.py``, modules with a
    ``if __name__ == "__main__"`` block."""
    found = set()
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if path.name == "__main__.py":
                found.add(module.rsplit(".", 1)[0])
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.If)
                    and "__name__" in ast.unparse(node.test)
                    and "__main__" in ast.unparse(node.test)
                ):
                    found.add(module)
    return found - NOT_COMMANDS


def documented() -> dict[str, set[str]]:
    """``{module: {subcommands}}`` from the first column of docs/cli.md's command table: a span
    ``python -m MODULE [SUB ...]``, then spans ``SUB ...`` of the same module."""
    table = (REPO / "docs" / "cli.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    shown: dict[str, set[str]] = {}
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        module = None
        for span in SPAN.findall(line.split(" | ")[0]):
            words = span.split()
            if words[:2] == ["python", "-m"]:
                module, words = words[2], words[3:]
                shown.setdefault(module, set())
            if module and words and re.fullmatch(r"[a-z]+", words[0]):
                shown[module].add(words[0])
    return shown


def subcommands(module: str) -> set[str]:
    """The subcommands ``python -m MODULE --help`` offers (argparse's ``{a,b} ...`` in its usage; an
    option's choices have no ``...``), run in-process."""
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)  # already imported: fine
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    finally:
        sys.argv = argv
    usage = out.getvalue().split("\n\n", 1)[0]
    choices = re.search(r"\{([a-z,]+)\}\s+\.\.\.", usage)
    return set(choices.group(1).split(",")) if choices else set()


def test_cli_table_lists_every_command_and_nothing_else() -> None:
    shown = documented()
    assert set(shown) == entry_points(), "docs/cli.md's table and the python -m entry points differ"
    for module, subs in shown.items():
        assert subs == subcommands(module), f"docs/cli.md's table and {module}'s subcommands differ"
