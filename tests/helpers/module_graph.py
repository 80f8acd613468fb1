"""dtlaunch's module graph, measured from its imports: modules, rooms, floors and cycles.

A module's floor is the number of modules on the longest import chain that starts at it (a
module that imports nothing from dtlaunch is on floor 1). Every import counts, the lazy ones
inside functions included; only those under `if TYPE_CHECKING:` do not, since they never run
(`module_graph(typed=True)` counts them too: two modules that name each other's types are
still a circle to a reader).
The bundled example (`examples/`) is its own program and is left out.

    python tests/helpers/module_graph.py     # the numbers and the longest chain
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dtlaunch"


def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Each module's dotted name below dtlaunch (a package by its own name) and its file."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[0] == "examples":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("dtlaunch", *parts))] = path
    return found


def _runtime_nodes(tree: ast.AST, typed: bool = False) -> list[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (unless `typed`)."""
    nodes: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if not typed and (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        nodes.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def _imported(module: str, path: Path, known: dict[str, Path], typed: bool = False) -> set[str]:
    """The dtlaunch modules `module` imports when it runs (`typed`: or when it is type-checked)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8")), typed):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from a import b` imports a.b when b is a module, else a (b is a name in it)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module"):
            names = []  # importlib by name: the agents' own lazy table, nothing of dtlaunch
        else:
            continue
        found |= {name for name in names if name in known and name != module}
    return found


@dataclass(frozen=True)
class ModuleGraph:
    edges: dict[str, frozenset[str]]

    @property
    def rooms(self) -> set[str]:
        return {name.split(".")[1] for name in self.edges if name != "dtlaunch"}

    def cycles(self) -> list[list[str]]:
        """The strongly connected parts of more than one module (Tarjan's)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[list[str]] = []

        def visit(node: str) -> None:
            index[node] = low[node] = len(index)
            stack.append(node)
            for there in sorted(self.edges[node]):
                if there not in index:
                    visit(there)
                    low[node] = min(low[node], low[there])
                elif there in stack:
                    low[node] = min(low[node], index[there])
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    part.append(top)
                    if top == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))

        for node in sorted(self.edges):
            if node not in index:
                visit(node)
        return found

    def longest_chain(self, start: str) -> tuple[str, ...]:
        """The longest import chain from `start` (the graph has no cycle)."""
        @functools.cache
        def chain(node: str) -> tuple[str, ...]:
            below = [chain(there) for there in sorted(self.edges[node])]
            return (node, *max(below, key=len, default=()))
        return chain(start)

    def floors(self) -> int:
        return max(len(self.longest_chain(node)) for node in self.edges)

    def deepest(self) -> tuple[str, ...]:
        return max((self.longest_chain(node) for node in sorted(self.edges)), key=len)


def module_graph(package: Path = PACKAGE, typed: bool = False) -> ModuleGraph:
    known = package_modules(package)
    return ModuleGraph({name: frozenset(_imported(name, path, known, typed))
                        for name, path in known.items()})


def main() -> int:
    sys.setrecursionlimit(10_000)
    graph = module_graph()
    cycles = graph.cycles()
    typed = module_graph(typed=True).cycles()
    print(f"modules {len(graph.edges)}, rooms {len(graph.rooms)}, cycles {len(cycles)} "
          f"({len(typed)} with the imports for types)")
    for part in typed:
        print("  cycle through types:", " ↔ ".join(part))
    for part in cycles:
        print("  cycle:", " ↔ ".join(part))
    if not cycles:
        chain = graph.deepest()
        print(f"module floors {len(chain)}:",
              " → ".join(name.removeprefix("dtlaunch.") for name in chain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
