"""The imports of our packages, computed from the source: package arrows, no module cycles, no reaching in.

The package arrows (this test is where they are written down; README.md's package table says what each
package is): ``ida_trainer -> nvfp4_cuda -> mxfp8_codec``, ``ida_trainer -> mxfp8_codec``,
``ida_eval -> mxfp8_codec``, ``ida_trainer -> ida_eval``, and every package may use the stdlib-only
``ida_common`` (which imports none of them).

Between modules (``mxfp8_codec.cli``, ``nvfp4_cuda.reference``, ...), over all the packages:

* **no cycles**: when two modules need each other, what both need gets a module of its own (the way
  ``mxfp8_codec.checkpoint`` holds the checkpoint code the CLI and the exporter share). An import inside a
  function counts like one at the top: a lazy import that only dodges a cycle is still the cycle.
* **no private names across modules**: ``from m import _name`` and ``m._name`` are reserved for ``m``
  itself (and for its tests); a helper two modules share is public in the module that owns the concept.
  A package's private *modules* (``mxfp8_codec._native``) are for that package alone.

Every import counts (inside functions, under ``if TYPE_CHECKING:``); ``importlib.import_module`` strings
(``ida_eval``'s lazy package attributes) are not seen. Test modules are not part of the graph.

Run: python -m pytest -q tests/test_import_graph.py   (prints the package drawing with -s)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ida_common", "mxfp8_codec", "nvfp4_cuda", "ida_trainer", "ida_eval")
ALLOWED = {
    ("ida_trainer", "nvfp4_cuda"),
    ("nvfp4_cuda", "mxfp8_codec"),
    ("ida_trainer", "mxfp8_codec"),
    ("ida_eval", "mxfp8_codec"),
    ("ida_trainer", "ida_eval"),
    *((p, "ida_common") for p in PACKAGES if p != "ida_common"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@dataclass(frozen=True)
class Import:
    """One module named by an import statement: ``source`` imports ``target`` at ``where``."""

    source: str  # importing module, e.g. "mxfp8_codec.export"
    target: str  # imported module of ours, e.g. "mxfp8_codec.cli"
    where: str  # "mxfp8_codec/export.py:286"
    text: str  # the name as written, e.g. "mxfp8_codec.cli._copy_side_files"


class Source:
    """The modules of ``packages`` under ``root``, read with ``ast`` (nothing is imported)."""

    def __init__(self, root: Path, packages: tuple[str, ...]) -> None:
        self.root = root
        self.modules: dict[str, Path] = {}  # dotted name -> file (a package is its __init__)
        for pkg in packages:
            for path in sorted((root / pkg).rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self._trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.modules[module]
            self._trees[module] = ast.parse(path.read_text(encoding="utf-8"), str(path))
        return self._trees[module]

    def where(self, module: str, node: ast.AST) -> str:
        return f"{self.modules[module].relative_to(self.root)}:{getattr(node, 'lineno', 0)}"

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        """The absolute module a ``from ... import`` in ``module`` reads from (relative levels resolved)."""
        if not node.level:
            return node.module or ""
        package = module.split(".")
        if self.modules[module].name != "__init__.py":
            package = package[:-1]
        base = package[: len(package) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def imports(self, module: str) -> Iterator[Import]:
        """Every module of ours that ``module`` imports, wherever the statement stands.

        ``import a.b`` names ``a.b``; ``from a import b`` names ``a.b`` when that is a module, else ``a``
        (whose ``__init__`` must run to hand out ``b``). Parent packages that Python initialises on the
        way are not edges: they are already being imported when one of their modules runs.
        """
        for node in ast.walk(self.tree(module)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in self.modules:
                        yield Import(module, alias.name, self.where(module, node), alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = self.absolute(module, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in self.modules else base
                    if target in self.modules:
                        yield Import(module, target, self.where(module, node), sub)

    def graph(self) -> dict[str, dict[str, Import]]:
        """module -> {imported module -> the first import statement naming it}; self-imports left out."""
        graph: dict[str, dict[str, Import]] = {m: {} for m in self.modules}
        for m in self.modules:
            for imp in self.imports(m):
                if imp.target != m:
                    graph[m].setdefault(imp.target, imp)
        return graph

    def cycles(self) -> list[str]:
        """One line per tangle of modules that import each other: a shortest cycle through its first
        module, ``a -> b (a.py:12: b.name) -> a (b.py:40: a)``."""
        graph = self.graph()
        lines = []
        for component in _strongly_connected(graph):
            cycle = _one_cycle(graph, component)
            hops = " -> ".join(f"{imp.target} ({imp.where}: {imp.text})" for imp in cycle)
            more = f"  [{len(component)} modules entangled: {', '.join(component)}]"
            lines.append(f"{cycle[0].source} -> {hops}" + (more if len(component) > len(cycle) else ""))
        return lines

    def private_uses(self) -> list[str]:
        """``from m import _x`` and ``m._x`` where ``m`` is another module of ours; a private module
        (``_native``) may be imported only from inside its own package."""
        bad = []
        for m in self.modules:
            bound: dict[str, str] = {}  # local name -> the module of ours it refers to
            tree = self.tree(m)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name in self.modules:
                            top = alias.name.split(".")[0]
                            bound[alias.asname or top] = alias.name if alias.asname else top
                elif isinstance(node, ast.ImportFrom):
                    base = self.absolute(m, node)
                    for alias in node.names:
                        sub = f"{base}.{alias.name}"
                        if sub in self.modules:
                            bound[alias.asname or alias.name] = sub
                            if _private(alias.name) and sub.split(".")[0] != m.split(".")[0]:
                                bad.append(f"{self.where(m, node)}: {sub} (a private module of another package)")
                        elif base in self.modules and base != m and _private(alias.name):
                            bad.append(f"{self.where(m, node)}: from {base} import {alias.name}")
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and _private(node.attr):
                    target = _dotted(node.value, bound)
                    if target in self.modules and target != m:
                        bad.append(f"{self.where(m, node)}: {target}.{node.attr}")
        return sorted(set(bad))

    def package_edges(self) -> dict[tuple[str, str], list[str]]:
        """(package, package) -> where, for every import from one of our packages into another."""
        edges: dict[tuple[str, str], list[str]] = {}
        for m in self.modules:
            for imp in self.imports(m):
                a, b = m.split(".")[0], imp.target.split(".")[0]
                if a != b:
                    edges.setdefault((a, b), []).append(f"{imp.where}: {imp.text}")
        return edges


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _one_cycle(graph: dict[str, dict[str, Import]], component: list[str]) -> list[Import]:
    """A shortest cycle through the component's first module, as the imports that close it (BFS)."""
    start, members = component[0], set(component)
    came_from: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w, imp in sorted(graph[v].items()):
                if w not in members or w in came_from:
                    continue
                came_from[w] = imp
                if w == start:
                    path, node = [], start
                    while True:
                        path.append(came_from[node])
                        node = came_from[node].source
                        if node == start:
                            return path[::-1]
                nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle found in {component}")


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The module of ours an expression like ``alias`` or ``pkg.mod`` names (None if it is not one)."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value, bound)
        return f"{head}.{node.attr}" if head is not None else None
    return None


def drawing(edges: dict[tuple[str, str], list[str]]) -> str:
    return "\n".join(f"{a} -> {b}" for a, b in sorted(edges))


OURS = Source(ROOT, PACKAGES)


def test_import_drawing_follows_the_design() -> None:
    edges = OURS.package_edges()
    print("\n" + drawing(edges))
    assert ("nvfp4_cuda", "mxfp8_codec") in edges, "nvfp4_cuda must use mxfp8_codec's MXFP8, not its own"
    wrong = {e: where[:3] for e, where in edges.items() if e not in ALLOWED}
    assert not wrong, f"imports against the package arrows (this module's docstring): {wrong}"


def test_no_package_imports_another_packages_private_module() -> None:
    bad = [
        w
        for where in OURS.package_edges().values()
        for w in where
        if any(_private(part) for part in w.split(": ")[1].split(".")[1:])
    ]
    assert not bad, bad


def test_no_import_cycles_between_modules() -> None:
    cycles = OURS.cycles()
    assert not cycles, (
        f"{len(cycles)} import cycle(s) between modules; give what both sides need a module of its own "
        "(an import inside a function is still the cycle):\n  " + "\n  ".join(cycles)
    )


def test_no_module_uses_another_modules_private_names() -> None:
    bad = OURS.private_uses()
    assert not bad, (
        "private names used across modules; make the shared helper public (no underscore, in __all__ where "
        "the module has one) in the module that owns it:\n  " + "\n  ".join(bad)
    )


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The finders see a cycle through a lazy import and both spellings of a private name."""
    pkg = tmp_path / "demo_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo_pkg.b import _helper\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a._x\n")
    (pkg / "c.py").write_text("import demo_pkg.a\nimport demo_pkg.b as bb\nfrom . import _d\nbb.f(demo_pkg.a._y)\n")
    (pkg / "_d.py").write_text("")
    src = Source(tmp_path, ("demo_pkg",))
    assert src.cycles() == [
        "demo_pkg.a -> demo_pkg.b (demo_pkg/a.py:1: demo_pkg.b._helper) -> demo_pkg.a (demo_pkg/b.py:2: demo_pkg.a)"
    ]
    assert src.private_uses() == [
        "demo_pkg/a.py:1: from demo_pkg.b import _helper",
        "demo_pkg/b.py:3: demo_pkg.a._x",
        "demo_pkg/c.py:4: demo_pkg.a._y",
    ]
