"""No import circle between the modules of one folder of the package.

Two modules of a folder that import each other (at the top, inside a function, or for types only) are one concern
split in two with the shared core left in the parent: the import inside a function that keeps such a pair from
breaking at start-up is a trap for the next edit. The graph is read from the source with the standard library's
ast, every `import` and `from … import` counted wherever it stands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sparkconsole"

# Circles still open, each to be taken apart; the set only shrinks (it is empty: the last, tui/app ↔ tui/facade,
# went when the facade named what it reads of the App as a Protocol instead of importing it).
KNOWN: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported(path: Path, name: str) -> set[str]:
    """Every module of the package that `path` (module `name`) imports, resolved to module names (a `from X import
    y` counts as X.y where X.y is a module, else X)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                src = ".".join([*base, node.module] if node.module else base)
            else:
                src = node.module or ""
            out.add(src)
            out.update(f"{src}.{a.name}" for a in node.names)
    return out


def folder_graph() -> dict[str, set[str]]:
    """module -> the modules of its own folder (not the folder's package itself) that it imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        folder = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
        graph[name] = {m for m in imported(path, name) if m in modules and m != name
                       and m.rsplit(".", 1)[0] == folder and modules[m].name != "__init__.py"}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_new_import_circle_inside_a_folder():
    found = circles(folder_graph())
    new = [sorted(c) for c in found if c not in KNOWN]
    assert not new, ("modules of one folder import each other; move what they share into a module below both: "
                     f"{new}")
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert not gone, f"taken apart: remove from KNOWN {gone}"


@pytest.mark.parametrize(("sources", "expected"), [
    ({"a": "from . import b\n", "b": "def f():\n    from .a import x\n"}, [{"a", "b"}]),
    ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T\n", "b": "from .a import x\n"},
     [{"a", "b"}]),
    ({"a": "from .b import x\n", "b": "from .c import y\n", "c": "import json\n"}, []),
])
def test_the_walk_sees_circles_wherever_the_import_stands(tmp_path, monkeypatch, sources, expected):
    pkg = tmp_path / "sparkconsole" / "part"
    pkg.mkdir(parents=True)
    (tmp_path / "sparkconsole" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name, text in sources.items():
        (pkg / f"{name}.py").write_text(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path / "sparkconsole")
    found = [{m.rsplit(".", 1)[1] for m in c} for c in circles(folder_graph())]
    assert found == expected
