"""The package layout keeps the data flow one way: lengths -> plan (core) -> feeds -> Megatron.

Static checks over the source (no imports): the core imports only the standard library, NumPy and itself,
and no product module imports the test-only stand-ins in ``megatron_dpsched.testing``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_dpsched"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_product_module_imports_the_test_stand_ins() -> None:
    offenders = {str(path.relative_to(PACKAGE)): sorted(n for n in _imports(path) if "megatron_dpsched.testing" in n)
                 for path in PACKAGE.rglob("*.py") if "testing" not in path.relative_to(PACKAGE).parts}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_core_imports_only_the_standard_library_numpy_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    for path in (PACKAGE / "core").rglob("*.py"):
        outside = {name for name in _imports(path)
                   if name.split(".")[0] not in allowed and not name.startswith("megatron_dpsched.core")}
        assert outside == set(), f"{path.name} imports {sorted(outside)}"


def test_the_stand_ins_live_in_the_testing_package() -> None:
    assert (PACKAGE / "testing" / "cpu_shim.py").exists() and (PACKAGE / "testing" / "cpu_attention.py").exists()
    assert not list((PACKAGE / "megatron").glob("cpu_*.py"))
