#!/usr/bin/env python
"""Files, lines and function lengths per package of a checkout, and the longest functions.

Usage: ``python scripts/code_stats.py [CHECKOUT]`` (default: this one). To compare with an older commit::

    git worktree add /tmp/before COMMIT && python scripts/code_stats.py /tmp/before
"""

from __future__ import annotations

import argparse
import ast
import statistics
from collections import defaultdict
from pathlib import Path

LONG = 80
"""Functions longer than this many lines are listed (the project's limit)."""


def functions(path: Path) -> list[tuple[int, str]]:
    """``(lines, name)`` of every function and method in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.end_lineno - node.lineno + 1, node.name) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def package_of(path: Path, package: Path) -> str:
    """The subpackage ``path`` lies in (``core``, ``megatron``...), or ``(top level)``."""
    parts = path.relative_to(package).parts
    return parts[0] if len(parts) > 1 else "(top level)"


def report(checkout: Path) -> list[str]:
    package = checkout / "megatron_dpsched"
    files: dict[str, int] = defaultdict(int)
    lines: dict[str, int] = defaultdict(int)
    lengths: dict[str, list[int]] = defaultdict(list)
    named: list[tuple[int, str]] = []
    for path in sorted(package.rglob("*.py")):
        key = package_of(path, package)
        files[key] += 1
        lines[key] += len(path.read_text(encoding="utf-8").splitlines())
        for length, name in functions(path):
            lengths[key].append(length)
            named.append((length, f"{path.relative_to(package)}:{name}"))
    out = ["package | files | lines | functions | median function | longest function"]
    out += [f"{key} | {files[key]} | {lines[key]} | {len(lengths[key])} | {statistics.median(lengths[key]):g} | "
            f"{max(lengths[key])}" for key in sorted(files) if lengths[key]]
    megatron = sorted((item for item in named if item[1].startswith("megatron/")), reverse=True)[:5]
    out.append("longest in megatron/: " + ", ".join(f"{name} ({length})" for length, name in megatron))
    everywhere = [(length, f"{path.relative_to(checkout)}:{name}")
                  for folder in ("megatron_dpsched", "tests", "scripts", "examples")
                  for path in sorted((checkout / folder).rglob("*.py")) for length, name in functions(path)]
    out.append(f"over {LONG} lines (package, tests, scripts, examples): "
               + (", ".join(f"{name} ({length})" for length, name in sorted(everywhere, reverse=True)
                            if length > LONG) or "none"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    print("\n".join(report(parser.parse_args().checkout)))


if __name__ == "__main__":
    main()
