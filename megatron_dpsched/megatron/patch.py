"""Install the ``--dp-schedule`` hooks into ``megatron.training.training`` at run time.

``enable()`` replaces seven names *in the namespace of*
``megatron.training.training`` (the module that holds ``train``,
``train_step`` and ``evaluate``); nothing else in Megatron is touched, and
``disable()`` puts the originals back. Both are idempotent. The replacements
are one-line adapters around the hook functions of
:mod:`megatron_dpsched.megatron.hooks`, the same functions that the source patch
(``patches/megatron_training_dpsched.patch``) calls explicitly; no scheduling
logic lives here.

1. ``get_forward_backward_func``: its result goes through
   :func:`~megatron_dpsched.megatron.hooks.forward_backward_func`.
2. ``get_num_microbatches``: becomes :func:`~megatron_dpsched.megatron.hooks.num_microbatches`.
3. ``update_num_microbatches``: calls
   :func:`~megatron_dpsched.megatron.hooks.on_update_num_microbatches`, then the original.
4. ``get_moe_metrics_tracker``, ``MTPLossLoggingHelper``, ``DSAIndexerLossLoggingHelper``:
   the objects ``training_log`` reports auxiliary losses through, with their ``loss_scale``
   replaced by ``1 / hooks.microbatches_run()`` (``training_log`` divides by
   ``get_num_microbatches()``, which during a scheduled step counts samples, not micro-batches).
5. ``training_log``: the original, then :func:`~megatron_dpsched.megatron.hooks.on_training_log`.

``check_megatron()`` verifies that ``train``, ``train_step`` and ``evaluate``
still use these names the way this module expects and raises
``RuntimeError`` otherwise (``enable()`` calls it first). Use either this
module or the source patch, not both: ``enable()`` refuses a patched
``training.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megatron_dpsched.megatron import hooks
from megatron_dpsched.megatron.hooks import (  # noqa: F401 - re-exported for callers of this module
    _accounting_count,
    active_step,
    check_interleaved_count,
    find_step_feed,
    is_replaying,
    scheduled_forward_backward,
)

_TARGET = "megatron.training.training"
_PATCHED = ("get_forward_backward_func", "get_num_microbatches", "update_num_microbatches",
            "get_moe_metrics_tracker", "MTPLossLoggingHelper", "DSAIndexerLossLoggingHelper", "training_log")
_EXPECTED_USES = {
    "train": ("get_forward_backward_func", "get_num_microbatches", "update_num_microbatches", "train_step",
              "training_log"),
    "train_step": ("get_num_microbatches",),
    "evaluate": ("get_forward_backward_func",),
    "training_log": ("get_moe_metrics_tracker", "MTPLossLoggingHelper", "DSAIndexerLossLoggingHelper"),
}
_originals: dict[str, Any] = {}


def _training_module() -> Any:
    import importlib

    return importlib.import_module(_TARGET)


def check_megatron(module: Any = None) -> None:
    """Raise ``RuntimeError`` if Megatron's training loop does not look as this patch expects."""
    module = module or _training_module()
    for name in _PATCHED:
        if not callable(getattr(module, name, None)):
            raise RuntimeError(f"dp-schedule: {_TARGET}.{name} is missing; unsupported Megatron version")
    for function, names in _EXPECTED_USES.items():
        code = getattr(getattr(module, function, None), "__code__", None)
        missing = [n for n in names if code is None or n not in code.co_names]
        if missing:
            raise RuntimeError(
                f"dp-schedule: {_TARGET}.{function} no longer uses {missing}; unsupported Megatron version"
            )
    if "opt_param_scheduler" not in module.train_step.__code__.co_varnames:
        raise RuntimeError(f"dp-schedule: {_TARGET}.train_step changed its signature; unsupported version")


def enable() -> None:
    """Install the hooks (idempotent; a no-op when ``training.py`` carries the source patch)."""
    if _originals:
        return
    module = _training_module()
    if is_source_patched(module):
        return
    check_megatron(module)
    replacements = {
        "get_forward_backward_func": _get_forward_backward_func,
        "get_num_microbatches": hooks.num_microbatches,
        "update_num_microbatches": _update_num_microbatches,
        "get_moe_metrics_tracker": _get_moe_metrics_tracker,
        "MTPLossLoggingHelper": _ScaledByMicroBatchesRun(module.MTPLossLoggingHelper, "track_mtp_metrics"),
        "DSAIndexerLossLoggingHelper": _ScaledByMicroBatchesRun(module.DSAIndexerLossLoggingHelper,
                                                                "track_indexer_metrics"),
        "training_log": _training_log,
    }
    for name, replacement in replacements.items():
        _originals[name] = getattr(module, name)
        setattr(module, name, replacement)


def disable() -> None:
    """Restore Megatron's originals (idempotent)."""
    if not _originals:
        return
    module = _training_module()
    for name, original in _originals.items():
        setattr(module, name, original)
    _originals.clear()
    hooks.on_update_num_microbatches()


def is_enabled() -> bool:
    """Whether :func:`enable` has monkey-patched Megatron."""
    return bool(_originals)


def is_source_patched(module: Any = None) -> bool:
    """Whether ``megatron.training.training`` was built from the source-patched ``training.py``."""
    module = module or _training_module()
    return getattr(module, "dpsched_hooks", None) is hooks


def _get_forward_backward_func(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    return hooks.forward_backward_func(_originals["get_forward_backward_func"](*args, **kwargs))


def _update_num_microbatches(*args: Any, **kwargs: Any) -> None:
    hooks.on_update_num_microbatches()
    return _originals["update_num_microbatches"](*args, **kwargs)


def _get_moe_metrics_tracker(*args: Any, **kwargs: Any) -> Any:
    return _ScaledByMicroBatchesRun(_originals["get_moe_metrics_tracker"](*args, **kwargs), "report")


def _training_log(*args: Any, **kwargs: Any) -> Any:
    result = _originals["training_log"](*args, **kwargs)
    hooks.on_training_log(kwargs["iteration"] if "iteration" in kwargs else args[3])
    return result


class _ScaledByMicroBatchesRun:
    """``target`` whose ``method`` gets ``loss_scale = 1 / hooks.microbatches_run()`` (first argument)."""

    def __init__(self, target: Any, method: str) -> None:
        self._target, self._method = target, method

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if name != self._method:
            return attribute

        def scaled(*args: Any, **kwargs: Any) -> Any:
            scale = 1 / hooks.microbatches_run()
            if "loss_scale" in kwargs:
                kwargs["loss_scale"] = scale
            else:
                args = (scale, *args[1:])
            return attribute(*args, **kwargs)

        return scaled
