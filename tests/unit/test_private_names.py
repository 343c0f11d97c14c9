"""No module of the package uses another module's private name (``_name``): neither ``from
megatron_dpsched.x import _name`` nor ``module._name`` on a module of the package it imported. What modules
share is public, in one place. Read from the source with ``ast``, imports under ``if TYPE_CHECKING:`` too."""

from __future__ import annotations

import ast

from test_core_imports import ROOT, import_base, package_sources


def is_private(name: str) -> bool:
    """``_name``, not ``__dunder__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def _module_names(tree: ast.AST, *, importer: str, modules: set[str], packages: set[str]) -> dict[str, str]:
    """Local name -> module of ``modules`` it is bound to by an import in ``tree``."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, importer=importer, packages=packages)
            bound |= {alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names
                      if f"{base}.{alias.name}" in modules}
    return bound


def private_uses(sources: dict[str, str], *, packages: set[str] = frozenset()) -> list[str]:
    """Every private name a module of ``sources`` takes from another, as ``importer: module._name``."""
    found = []
    for importer, text in sources.items():
        tree = ast.parse(text)
        bound = _module_names(tree, importer=importer, modules=set(sources), packages=packages)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = import_base(node, importer=importer, packages=packages)
                found += [f"{importer}: {base}.{alias.name}" for alias in node.names
                          if is_private(alias.name) and (base in sources or base.startswith(f"{ROOT}."))]
            elif isinstance(node, ast.Attribute) and is_private(node.attr) and (dotted := _dotted(node.value)):
                head, _, rest = dotted.partition(".")
                module = ".".join(filter(None, (bound.get(head), rest))) if head in bound else None
                if module in sources and module != importer:
                    found.append(f"{importer}: {module}.{node.attr}")
    return found


def test_no_module_of_the_package_uses_another_modules_private_name() -> None:
    sources, packages = package_sources()
    assert f"{ROOT}.megatron.job_checks" in sources
    uses = private_uses(sources, packages=packages)
    assert not uses, "private names used across modules (make them public, in one place): " + ", ".join(uses)


def test_a_private_name_taken_from_another_module_is_found() -> None:
    sources = {
        "p": "", "p.a": "_x = 1\n__all__ = []\n", "p.b": "from p.a import _x\nfrom .a import __all__\n",
        "p.c": "import p.a as a\nimport p.a\nfrom p import a as m\n"
               "def f():\n    return a._x, p.a._x, m._x, a.__all__, a.x\n",
        "p.d": "class K:\n    _y = 1\n_z = K._y\n",
    }
    assert private_uses(sources, packages={"p"}) == ["p.b: p.a._x", "p.c: p.a._x", "p.c: p.a._x", "p.c: p.a._x"]
