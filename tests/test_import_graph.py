"""The engine's modules import each other without a circle: the graph of every import inside jagg_engine (read
with ``ast``: top-level imports and those inside functions alike, since a function-level import that closes a
circle hides it without breaking it) has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jagg_engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import statement of module ``name``, absolute."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                origin = ".".join(anchor + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            found.append((origin, [alias.name for alias in node.names]))
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module → the modules of the package it imports. ``from pkg import x`` goes to the submodule ``pkg.x``
    when there is one, else to the submodule whose name ``pkg/__init__.py`` re-exports as x, else to the
    package's ``__init__`` itself."""
    modules = {module_name(p): p for p in package.rglob("*.py")}
    parsed = {name: _imports(name, path) for name, path in modules.items()}
    reexports: dict[str, dict[str, str]] = {}  # package → name → the submodule it comes from
    for name, path in modules.items():
        if path.name == "__init__.py":
            reexports[name] = {
                alias: origin
                for origin, aliases in parsed[name]
                if origin.startswith(name + ".") and origin in modules
                for alias in aliases
            }
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, imports in parsed.items():
        for origin, aliases in imports:
            if origin not in modules:
                continue
            targets = {origin} if not aliases else set()
            for alias in aliases:
                if f"{origin}.{alias}" in modules:
                    targets.add(f"{origin}.{alias}")
                else:
                    targets.add(reexports.get(origin, {}).get(alias, origin))
            graph[name] |= targets - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
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


def test_the_graph_sees_the_imports() -> None:
    graph = import_graph()
    assert "jagg_engine.store.index" in graph["jagg_engine.store.run_store"]
    assert "jagg_engine.store.base" in graph["jagg_engine.store.index"]
    assert "jagg_engine.errors" in graph["jagg_engine.cli"]


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_jagg_engine() -> None:
    found = cycles(import_graph())
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)
