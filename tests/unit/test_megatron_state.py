"""Megatron's private state (its global arguments and timers, its checkpoint reader) is read in one module of
the package, ``runtime/megatron_state.py``; every other module calls its public functions."""

from __future__ import annotations

import re

from test_core_imports import ROOT, package_sources
from test_torch_free_runtime import loaded_after_import

ADAPTER = f"{ROOT}.runtime.megatron_state"
PRIVATE = re.compile(r"\b(_GLOBAL_[A-Z_]+|_load_base_checkpoint)\b")
"""Megatron's private names the plugin reads: ``global_vars._GLOBAL_*`` and ``checkpointing._load_base_checkpoint``."""


def test_megatrons_private_names_appear_in_the_adapter_only() -> None:
    sources, _ = package_sources()
    where = {name: sorted(set(PRIVATE.findall(text))) for name, text in sources.items() if PRIVATE.search(text)}
    assert set(where) == {ADAPTER}, f"read Megatron's private state through {ADAPTER}: {where}"
    assert where[ADAPTER] == ["_GLOBAL_ARGS", "_GLOBAL_TIMERS", "_load_base_checkpoint"]


def test_without_megatron_loaded_nothing_is_set_and_nothing_is_imported() -> None:
    asked = (f"from {ADAPTER} import megatron_args, megatron_timers\n"
             "assert megatron_args() is None and megatron_timers() is None")
    assert loaded_after_import(ADAPTER, then=asked) == []
