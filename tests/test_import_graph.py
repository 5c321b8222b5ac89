"""The import drawing of the packages, computed from the source, against DESIGN.md's arrows.

``ida_trainer -> nvfp4_cuda -> mxfp8_codec``, ``ida_trainer -> mxfp8_codec``, ``ida_eval -> mxfp8_codec``,
``ida_trainer -> ida_eval``, and every package may use the stdlib-only ``ida_common`` (which imports none
of them). Every import counts, lazy ones inside functions included; a test module is not a package.

Run: python -m pytest -q tests/test_import_graph.py   (prints the drawing with -s)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ida_common", "mxfp8_codec", "nvfp4_cuda", "ida_trainer", "ida_eval")
ALLOWED = {
    ("ida_trainer", "nvfp4_cuda"), ("nvfp4_cuda", "mxfp8_codec"), ("ida_trainer", "mxfp8_codec"),
    ("ida_eval", "mxfp8_codec"), ("ida_trainer", "ida_eval"),
    *((p, "ida_common") for p in PACKAGES if p != "ida_common"),
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _graph() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for name in _imports(path):
                top = name.split(".")[0]
                if top in PACKAGES and top != pkg:
                    edges.setdefault((pkg, top), []).append(f"{path.relative_to(ROOT)}: {name}")
    return edges


def drawing(edges: dict[tuple[str, str], list[str]]) -> str:
    return "\n".join(f"{a} -> {b}" for a, b in sorted(edges))


def test_import_drawing_follows_the_design() -> None:
    edges = _graph()
    print("\n" + drawing(edges))
    assert ("nvfp4_cuda", "mxfp8_codec") in edges, "nvfp4_cuda must use mxfp8_codec's MXFP8, not its own"
    wrong = {e: where[:3] for e, where in edges.items() if e not in ALLOWED}
    assert not wrong, f"imports against DESIGN.md's arrows: {wrong}"


def test_no_package_imports_another_packages_private_module() -> None:
    bad = [w for where in _graph().values() for w in where
           if any(part.startswith("_") and not part.startswith("__") for part in w.split(": ")[1].split(".")[1:])]
    assert not bad, bad
