"""CONTRIBUTING.md's diagram of the Megatron layer is the import graph of the source: every module of
``megatron_dpsched/megatron/`` and ``runtime/`` (and ``options.py``) is in it once, with exactly the modules
of those it imports when it runs (``test_core_imports.import_graph``)."""

from __future__ import annotations

import re
from pathlib import Path

from test_core_imports import ROOT, import_graph

CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"
MARKER = "<!-- megatron-layer-diagram -->"
SHOWN = (f"{ROOT}.megatron", f"{ROOT}.runtime", f"{ROOT}.options")
"""The modules the diagram shows: these and what lies below them."""


def _short(module: str) -> str:
    """``megatron_dpsched.megatron.hooks`` -> ``hooks``; ``megatron_dpsched.runtime.ranks`` -> ``runtime.ranks``;
    the two packages as ``megatron (package)`` and ``runtime (package)``."""
    name = module.removeprefix(f"{ROOT}.")
    return f"{name} (package)" if name in ("megatron", "runtime") else name.removeprefix("megatron.")


def drawn(text: str) -> dict[str, set[str]]:
    """The diagram's arrows: module -> the modules it imports (a line without ``->`` lists modules importing none;
    an indented line goes on with the line above)."""
    block = text.split(MARKER, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    entries: list[str] = []
    for line in block.splitlines():
        if line.startswith(" ") and entries:
            entries[-1] += " " + line.strip()
        elif line.strip():
            entries.append(line.strip())
    graph: dict[str, set[str]] = {}
    for entry in entries:
        entry = re.sub(r"\s*\((?!package\))[^)]*\)$", "", entry)  # a closing remark: "(none of these)"
        left, _, right = entry.partition("->")
        targets = {name.strip() for name in right.split(",") if name.strip()}
        for module in (name.strip() for name in left.split(",") if name.strip()):
            assert module not in graph, f"{module} is in the diagram twice"
            graph[module] = targets if "->" in entry else set()
    return graph


def actual() -> dict[str, set[str]]:
    """The imports among the shown modules, from the source."""
    graph = import_graph()
    shown = {module for module in graph if module.startswith(SHOWN)}
    return {_short(module): {_short(target) for target in graph[module] if target in shown} for module in shown}


def test_the_diagram_is_the_import_graph_of_the_megatron_layer() -> None:
    diagram, source = drawn(CONTRIBUTING.read_text(encoding="utf-8")), actual()
    assert "hooks" in source and "runtime.job_identity" in source["job_checks"]
    wrong = {module: (sorted(diagram.get(module, {"(missing)"})), sorted(imports))
             for module, imports in source.items() if diagram.get(module) != imports}
    extra = sorted(diagram.keys() - source.keys())
    assert not wrong and not extra, f"CONTRIBUTING.md's diagram differs from the source: {wrong}; not modules: {extra}"


def test_the_diagram_parser_reads_arrows_lists_and_continued_lines() -> None:
    block = "p (package)   (a remark)\na -> b,\n     c\nd, e (package),\n    f (none of these)\n"
    text = f"{MARKER}\n```text\n{block}```\n"
    assert drawn(text) == {"p (package)": set(), "a": {"b", "c"}, "d": set(), "e (package)": set(), "f": set()}
