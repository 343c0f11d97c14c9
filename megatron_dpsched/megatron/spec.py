"""Megatron's ``--spec MODULE NAME``: a user's layer spec, or a function that builds one."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any


def import_layer_spec(spec: Sequence[str], *, config: Any, vp_stage: int | None) -> Any:
    """The layer (or block) spec named by ``--spec MODULE NAME``.

    A ``ModuleSpec`` is used as it is; a function is called, with the model's ``config`` and
    ``vp_stage`` when it takes them (then it may return this stage's whole block spec, e.g. to
    choose the final norm).
    """
    from megatron.core.transformer.spec_utils import ModuleSpec, import_module

    found = import_module(list(spec))
    if found is None:
        raise ValueError(f"--spec {' '.join(spec)}: cannot import it")
    if isinstance(found, ModuleSpec):
        return found
    if not callable(found):
        raise ValueError(f"--spec {' '.join(spec)}: neither a ModuleSpec nor a function returning one")
    parameters = inspect.signature(found).parameters
    return found(config=config, vp_stage=vp_stage) if "config" in parameters else found()
