"""The house rules of docs/ARCHITECTURE.md, checked on the source (scripts/house.py reads it
with ast, importing nothing): no import circle, modules under 400 lines, functions under 60,
arrows that point one way, and the lint and type checks the test command runs."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("house", REPO / "scripts" / "house.py")
assert _spec is not None and _spec.loader is not None
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)


def test_no_import_circle() -> None:
    assert house.cycles(house.imports()) == []


def test_modules_and_functions_stay_small() -> None:
    assert house.oversized() == []


def test_arrows_point_one_way() -> None:
    graph = house.collapse(house.imports())
    # kernels know nothing of the orchestrator; the planner and the spec know no storage,
    # control, analysis or command line; only the CLI may import the CLI
    assert not any(d.startswith(("orchestrator", "jobs")) for d in graph["kernels"] if d)
    for low in ("orchestrator.spec", "orchestrator.planning"):
        assert not graph[low] & {
            "orchestrator.store",
            "orchestrator.control",
            "orchestrator.analysis",
            "orchestrator.cli",
            "jobs",
        }, (low, graph[low])
    assert not graph["orchestrator.store"] & {"orchestrator.control", "orchestrator.analysis", "orchestrator.cli"}
    users_of_cli = {src for src, dsts in graph.items() if "orchestrator.cli" in dsts}
    assert users_of_cli <= {"orchestrator.__main__"}, users_of_cli


def test_the_checker_sees_a_circle(tmp_path) -> None:
    """house.cycles is not vacuous: a planted circle is found."""
    assert house.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_dispatch_imports_submitit_and_only_the_cli_prints() -> None:
    import ast

    for mod, path in house.modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if "submitit" in names:
            assert mod.startswith("orchestrator.control.dispatch"), mod
        prints = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
        ]
        if prints and mod.startswith("orchestrator."):
            assert mod.startswith("orchestrator.cli"), (mod, prints)
