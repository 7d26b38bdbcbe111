"""No import loops inside voicepipe/: the module import graph, read from the source with `ast`, has no cycle.

What counts as an edge, A -> B: any `import voicepipe.x` / `from voicepipe.x import y` / relative import in A,
wherever it stands: at the top, inside a function, or under `if TYPE_CHECKING:`. A function-level import is
how a cycle gets hidden, not removed (gateway.py and audiosocket_server.py imported each other that way), and
a type-only one still says that each module needs the other's concepts. `from pkg import name` points at the
submodule `pkg.name` when there is one, otherwise at `pkg`. Importing `pkg.sub` does not count as importing
`pkg` itself: Python loads a package before its submodules without a loop, so a package `__init__` that
re-exports its submodules is not a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]



def module_files(root: Path, package: str = "voicepipe") -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `package` under `root`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path, package: str = "voicepipe") -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (see the module docstring for what counts)."""
    files = module_files(root, package)

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names if _inside(alias.name, package))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                if _inside(base, package):
                    targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else known(base)
                                   for a in node.names)
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_voicepipe_has_no_import_cycle() -> None:
    found = [sorted(c) for c in cycles(import_graph(ROOT))]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checker_finds_a_cycle_hidden_in_a_function_and_under_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "loop"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from loop.a import A\n")  # a package re-exporting: no cycle by itself
    (pkg / "a.py").write_text("A = 1\n\ndef f():\n    from loop.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n")
    (pkg / "c.py").write_text("from . import a\nimport loop.sub.b\n")
    graph = import_graph(tmp_path, "loop")
    assert graph == {"loop": {"loop.a"}, "loop.a": {"loop.sub.b"}, "loop.sub": set(), "loop.sub.b": {"loop.a"},
                     "loop.c": {"loop.a", "loop.sub.b"}}
    assert cycles(graph) == [{"loop.a", "loop.sub.b"}]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
