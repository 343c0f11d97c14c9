"""The torch-free parts of the Megatron layer import neither torch nor Megatron: every module of
``megatron_dpsched.runtime``, the package ``megatron_dpsched.megatron`` itself (its names import their modules
when first used) and ``megatron.failures`` (which reads Megatron's state only where Megatron is loaded). Each
check runs in a fresh interpreter, so what other tests imported does not count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_core_imports import ROOT, package_sources

RUNTIME = f"{ROOT}.runtime"
TORCH_FREE = sorted(package_sources(RUNTIME)[0]) + [f"{ROOT}.megatron", f"{ROOT}.megatron.failures"]


def loaded_after_import(module: str, *, then: str = "") -> list[str]:
    """The top-level packages among torch and megatron that ``import module`` (then ``then``) loads."""
    code = (f"import json, sys, {module}\n{then}\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron'})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", TORCH_FREE)
def test_importing_it_loads_neither_torch_nor_megatron(module: str) -> None:
    assert loaded_after_import(module) == []


def test_the_runtime_subpackage_holds_the_helpers() -> None:
    assert {f"{RUNTIME}.job_identity", f"{RUNTIME}.over_cap", f"{RUNTIME}.ranks", f"{RUNTIME}.megatron_state"} <= set(
        TORCH_FREE)


def test_the_megatron_package_lists_its_names_without_importing_them() -> None:
    listed = ("import megatron_dpsched.megatron as package\n"
              "assert set(package.__all__) <= set(dir(package)), sorted(set(package.__all__) - set(dir(package)))")
    assert loaded_after_import(f"{ROOT}.megatron", then=listed) == []
