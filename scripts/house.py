"""The house rules, measured: the import graph, import circles, module and function sizes.

    python scripts/house.py            # packages' import graph, then any rule broken
    python scripts/house.py --modules  # the graph between modules instead of packages
    python scripts/house.py --sizes    # lines per package

Reads the source with ``ast`` only (nothing is imported), so it runs anywhere. Imports made
inside functions count too: a circle through a late import is still a circle. The rules cover
the whole tree (TREE: the installed packages, the tests, the benches and these scripts); the
rules about who may import or print what concern the installed packages (PACKAGES). Exit code
1 when a rule is broken: an import circle, a module over MAX_MODULE_LINES lines, a function
over MAX_FUNCTION_LINES lines. ``tests/test_house.py`` runs the same checks.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what pip installs (pyproject's packages.find)
PACKAGES = ("orchestrator", "kernels", "jobs")
# every folder of the project's Python: the packages, the tests, the benches (`python -m bench.X`)
# and these scripts
TREE = (*PACKAGES, "tests", "bench", "scripts")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules(root: Path = ROOT, folders: tuple[str, ...] = TREE) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``folders`` (named from the root, as
    ``python -m`` names them: ``bench.merge``, ``scripts.house``)."""
    out: dict[str, Path] = {}
    for pkg in folders:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> project modules it imports (anywhere in its body)."""
    known = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                hit = _resolve(t, known)
                if hit and hit != mod and not mod.startswith(hit + "."):  # a package's own __init__
                    graph[mod].add(hit)
    return graph


def collapse(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The graph between packages: module names cut to ``depth`` parts."""

    def cut(m: str) -> str:
        return ".".join(m.split(".")[:depth])

    out: dict[str, set[str]] = defaultdict(set)
    for src, dsts in graph.items():
        out[cut(src)]
        for d in dsts:
            if cut(d) != cut(src):
                out[cut(src)].add(cut(d))
    return dict(out)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def oversized(root: Path = ROOT) -> list[str]:
    """Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES lines."""
    out = []
    for mod, path in modules(root).items():
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            out.append(f"module {mod}: {n} lines (over {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(
                        f"function {mod}.{node.name} (line {node.lineno}): {length} lines (over {MAX_FUNCTION_LINES})"
                    )
    return out


def sizes(root: Path = ROOT) -> dict[str, int]:
    """Lines per package (sub-packages of orchestrator apart)."""
    out: dict[str, int] = defaultdict(int)
    for mod, path in modules(root).items():
        out[".".join(mod.split(".")[:2]) if mod.startswith("orchestrator.") else mod.split(".")[0]] += len(
            path.read_text(encoding="utf-8").splitlines()
        )
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    if "--sizes" in argv:
        for pkg, n in sizes().items():
            print(f"{pkg:28} {n:6}")
        return 0
    graph = imports()
    shown = graph if "--modules" in argv else collapse(graph)
    for src in sorted(shown):
        print(f"{src} -> {', '.join(sorted(shown[src])) or '-'}")
    broken = [f"import circle: {' <-> '.join(c)}" for c in cycles(graph)] + oversized()
    for line in broken:
        print(line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
