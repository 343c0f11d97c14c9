"""The pure planning core has no import circle: every import a ``core/`` module runs, at its top or inside a
function (a lazy import is still an import), read from the source with ``ast``. Imports under ``if
TYPE_CHECKING:`` never run and are left out: ``stats``, ``invariants`` and ``fingerprint`` name
``schedule.DPSchedule`` there for their annotations, while ``schedule`` imports them when called."""

from __future__ import annotations

import ast
from pathlib import Path

import megatron_dpsched.core

CORE = Path(megatron_dpsched.core.__file__).parent
PACKAGE = "megatron_dpsched.core"


def _module_name(path: Path) -> str:
    return PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"


def _imported(node: ast.AST, *, importer: str, modules: set[str]) -> set[str]:
    """The ``core`` modules an import statement loads (``from core import padding`` is the module ``padding``;
    ``from core import X`` for any other ``X`` is the package's ``__init__``)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:  # relative: from importer's package
        parent = PACKAGE.split(".")[: len(PACKAGE.split(".")) - node.level + 1]
        base = ".".join(parent + ([base] if base else []))
    found = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules}
    if base in modules and len(found) < len(node.names):
        found.add(base)
    return found - {importer}


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    nodes, pending = [], [tree]
    while pending:
        node = pending.pop()
        nodes.append(node)
        children = node.orelse if _is_type_checking(node) else list(ast.iter_child_nodes(node))
        pending.extend(children)
    return nodes


def source_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Per module (name -> source text), the other modules of ``sources`` it imports when it runs."""
    graph = {}
    for name, text in sources.items():
        nodes = _run_time_nodes(ast.parse(text))
        graph[name] = set().union(*(_imported(node, importer=name, modules=set(sources)) for node in nodes))
    return graph


def import_graph() -> dict[str, set[str]]:
    """Per ``core`` module, the ``core`` modules it imports."""
    return source_graph({_module_name(path): path.read_text(encoding="utf-8") for path in sorted(CORE.glob("*.py"))})


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path ``a -> b -> ... -> a``, or ``None`` (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_core_modules_import_no_circle() -> None:
    graph = import_graph()
    assert len(graph) > 10 and f"{PACKAGE}.cost" in graph[PACKAGE] and f"{PACKAGE}.invariants" in graph[
        f"{PACKAGE}.schedule"]  # the package imports its modules; a lazy import counts
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_sees_a_circle_and_lazy_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    modules = {PACKAGE, f"{PACKAGE}.cost", f"{PACKAGE}.steptime", f"{PACKAGE}.padding"}
    text = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from megatron_dpsched.core.schedule import X\n"
            "def f():\n    from megatron_dpsched.core.steptime import StepTimeModel\n"
            "from megatron_dpsched.core import padding\nfrom . import cost\n")
    graph = source_graph({f"{PACKAGE}.x": text, **dict.fromkeys(modules, ""), f"{PACKAGE}.schedule": ""})
    assert graph[f"{PACKAGE}.x"] == {f"{PACKAGE}.steptime", f"{PACKAGE}.padding", f"{PACKAGE}.cost"}
