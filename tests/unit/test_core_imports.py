"""The package has no import circle: every import a module runs, at its top or inside a function (a lazy
import is still an import), read from the source with ``ast``. Imports under ``if TYPE_CHECKING:`` never run
and are left out: ``stats``, ``invariants`` and ``fingerprint`` name ``schedule.DPSchedule`` there for their
annotations, while ``schedule`` imports them when called. A circle is named as a path ``a -> b -> a``."""

from __future__ import annotations

import ast
from pathlib import Path

import megatron_dpsched

ROOT = "megatron_dpsched"
CORE = f"{ROOT}.core"

def package_sources(package: str = ROOT) -> tuple[dict[str, str], set[str]]:
    """Every module of ``package`` and its subpackages (name -> source text), and which names are packages."""
    folder = Path(megatron_dpsched.__file__).parent.joinpath(*package.split(".")[1:])
    sources, packages = {}, set()
    for path in sorted(folder.rglob("*.py")):
        parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
            packages.add(".".join(parts))
        sources[".".join(parts)] = path.read_text(encoding="utf-8")
    return sources, packages


def import_base(node: ast.ImportFrom, *, importer: str, packages: set[str]) -> str:
    """The module a ``from ... import`` names (a relative one counted from the importer's package)."""
    if not node.level:
        return node.module or ""
    parts = importer.split(".") if importer in packages else importer.split(".")[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _imported(node: ast.AST, *, importer: str, modules: set[str], packages: set[str]) -> set[str]:
    """The modules of ``modules`` an import statement loads (``from pkg import mod`` is the module ``mod``;
    ``from pkg import X`` for any other ``X`` is the package's ``__init__``)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules} - {importer}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = import_base(node, importer=importer, packages=packages)
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


def run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    nodes, pending = [], [tree]
    while pending:
        node = pending.pop()
        nodes.append(node)
        children = node.orelse if _is_type_checking(node) else list(ast.iter_child_nodes(node))
        pending.extend(children)
    return nodes


def source_graph(sources: dict[str, str], *, packages: set[str] = frozenset()) -> dict[str, set[str]]:
    """Per module (name -> source text), the other modules of ``sources`` it imports when it runs."""
    graph = {}
    for name, text in sources.items():
        nodes = run_time_nodes(ast.parse(text))
        graph[name] = set().union(*(_imported(node, importer=name, modules=set(sources), packages=packages)
                                    for node in nodes))
    return graph


def import_graph(package: str = ROOT) -> dict[str, set[str]]:
    """Per module of ``package`` (subpackages included), the modules of ``package`` it imports."""
    sources, packages = package_sources(package)
    return source_graph(sources, packages=packages)


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
    graph = import_graph(CORE)
    assert len(graph) > 10 and f"{CORE}.cost" in graph[CORE] and f"{CORE}.invariants" in graph[
        f"{CORE}.schedule"]  # the package imports its modules; a lazy import counts
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_module_of_the_package_imports_a_circle() -> None:
    graph = import_graph()
    assert {f"{ROOT}.whatif.sweep", f"{ROOT}.megatron.hooks", f"{ROOT}.core.schedule", f"{ROOT}.cli"} <= set(graph)
    assert f"{ROOT}.whatif.plots" in graph[f"{ROOT}.whatif.sweep"]  # a lazy import counts
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_a_circle_and_lazy_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    modules = {CORE, f"{CORE}.cost", f"{CORE}.steptime", f"{CORE}.padding"}
    text = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from megatron_dpsched.core.schedule import X\n"
            "def f():\n    from megatron_dpsched.core.steptime import StepTimeModel\n"
            "from megatron_dpsched.core import padding\nfrom . import cost\n")
    graph = source_graph({f"{CORE}.x": text, **dict.fromkeys(modules, ""), f"{CORE}.schedule": ""})
    assert graph[f"{CORE}.x"] == {f"{CORE}.steptime", f"{CORE}.padding", f"{CORE}.cost"}


def test_relative_imports_count_from_the_importers_package() -> None:
    sources = {"p": "from .sub import mod\n", "p.sub": "from . import mod\nfrom .. import top\n",
               "p.sub.mod": "from ..top import f\n", "p.top": "import p.sub.mod\n"}
    graph = source_graph(sources, packages={"p", "p.sub"})
    assert graph == {"p": {"p.sub.mod"}, "p.sub": {"p.sub.mod", "p.top"}, "p.sub.mod": {"p.top"},
                     "p.top": {"p.sub.mod"}}
    assert find_cycle(graph) == ["p.sub.mod", "p.top", "p.sub.mod"]
