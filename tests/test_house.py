"""The house rules of docs/ARCHITECTURE.md, checked on the source (scripts/house.py reads it
with ast, importing nothing): on the whole tree (packages, tests, benches, scripts) no import
circle, modules under 400 lines and functions under 60; arrows that point one way, tests and
benches apart, submitit only in dispatch and prints only in the CLI.

Lint, format and types are not checked here: the test command (scripts/test.sh) runs ruff and
mypy on the whole tree before pytest, so a run of the suite has passed them already."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("house", REPO / "scripts" / "house.py")
assert _spec is not None and _spec.loader is not None
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """The import graph between modules, read once for the tests below (a parse of the tree)."""
    return house.imports()


def test_the_rules_cover_the_whole_tree() -> None:
    """Every Python file of the packages, tests, benches and scripts is a module the checks see."""
    seen = set(house.modules().values())
    for folder in ("orchestrator", "kernels", "jobs", "tests", "bench", "scripts"):
        files = set((REPO / folder).rglob("*.py"))
        assert files and files <= seen, sorted(files - seen)


def test_no_import_circle(graph: dict[str, set[str]]) -> None:
    assert house.cycles(graph) == []


def test_modules_and_functions_stay_small() -> None:
    assert house.oversized() == []


def test_arrows_point_one_way(graph: dict[str, set[str]]) -> None:
    packages = house.collapse(graph)
    # kernels know nothing of the orchestrator; the planner and the spec know no storage,
    # control, analysis or command line; only the CLI may import the CLI
    assert not any(d.startswith(("orchestrator", "jobs")) for d in packages["kernels"] if d)
    for low in ("orchestrator.spec", "orchestrator.planning"):
        assert not packages[low] & {
            "orchestrator.store",
            "orchestrator.control",
            "orchestrator.analysis",
            "orchestrator.cli",
            "jobs",
        }, (low, packages[low])
    assert not packages["orchestrator.store"] & {"orchestrator.control", "orchestrator.analysis", "orchestrator.cli"}
    # a test may import the CLI to drive it in process; the rule is about the packages
    users_of_cli = {
        src for src, dsts in packages.items() if "orchestrator.cli" in dsts and src.split(".")[0] in house.PACKAGES
    }
    assert users_of_cli <= {"orchestrator.__main__"}, users_of_cli


def test_tests_and_benches_never_import_each_other_and_the_packages_neither(graph: dict[str, set[str]]) -> None:
    tops = house.collapse(graph, depth=1)
    assert "bench" not in tops["tests"] and "tests" not in tops["bench"], (tops["tests"], tops["bench"])
    for pkg in house.PACKAGES:
        assert not tops[pkg] & {"tests", "bench", "scripts"}, (pkg, tops[pkg])


def test_the_checker_sees_a_circle() -> None:
    """house.cycles is not vacuous: a planted circle is found."""
    assert house.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_dispatch_imports_submitit_and_only_the_cli_prints() -> None:
    import ast

    for mod, path in house.modules(folders=house.PACKAGES).items():
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
