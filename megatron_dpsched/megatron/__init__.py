"""Megatron integration of the dp-schedule planner (its modules import torch and megatron-core).

* :mod:`.arguments`: ``--dp-schedule*`` flags (``add_dp_schedule_args``) and what the planner plans with
  (``plan_setup_from_args``: the ``ScheduleConfig`` and the cost model).
* :mod:`.checks`: every check of the flags, before Megatron parses, after it parses, when the data is known.
* :mod:`.provider`: ``setup_dp_schedule(args)`` and ``scheduled_datasets_provider(provider)``, the
  three-line way onto the scheduled data path for an existing training script.
* :mod:`.patch`: ``enable()`` / ``disable()`` install the :mod:`.hooks` into
  ``megatron.training.training`` (``patches/`` has the same hooks as a source patch).
* :mod:`.job_checks`: every rank agrees on the job (flags, planner config, data) before the model is
  built; checkpoints remember it and a resume compares (``setup_dp_schedule`` installs it on every rank).
* :mod:`.feeds`: schedule-driven data iterators (precomputed plan or map-style dataset).
* :mod:`.collate`: packed (thd) or padded (bshd) micro-batches, zero-weight dummies.
* :mod:`.forward_step`: forward step and per-token loss.
* :mod:`megatron_dpsched.testing.cpu_shim`: dry-run / testing-only CPU device shim (never imported here).

Importing this package imports none of them, nor torch: each name of ``__all__`` imports its module the
first time it is used (PEP 562), so that the torch-free helpers (:mod:`megatron_dpsched.runtime`) and
:mod:`.failures` stay torch-free.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron_dpsched.megatron import patch
    from megatron_dpsched.megatron.arguments import (
        DPScheduleOptions,
        PlanSetup,
        add_dp_schedule_args,
        plan_setup_from_args,
    )
    from megatron_dpsched.megatron.checks import validate_dp_schedule_args
    from megatron_dpsched.megatron.collate import CollateConfig, collate_micro_batch, pad_multiple_for
    from megatron_dpsched.megatron.feeds import (
        ChunkIterator,
        ScheduledDataIterator,
        ScheduledDatasetLoader,
        StepBatches,
        StepFeed,
    )
    from megatron_dpsched.megatron.forward_step import ScheduledForwardStep, scheduled_loss_func
    from megatron_dpsched.megatron.patch import disable, enable, is_enabled
    from megatron_dpsched.megatron.provider import build_feed, scheduled_datasets_provider, setup_dp_schedule

_EXPORTS: dict[str, str] = {
    "patch": "patch", "disable": "patch", "enable": "patch", "is_enabled": "patch",
    "DPScheduleOptions": "arguments", "PlanSetup": "arguments", "add_dp_schedule_args": "arguments",
    "plan_setup_from_args": "arguments",
    "validate_dp_schedule_args": "checks",
    "CollateConfig": "collate", "collate_micro_batch": "collate", "pad_multiple_for": "collate",
    "ChunkIterator": "feeds", "ScheduledDataIterator": "feeds", "ScheduledDatasetLoader": "feeds",
    "StepBatches": "feeds", "StepFeed": "feeds",
    "ScheduledForwardStep": "forward_step", "scheduled_loss_func": "forward_step",
    "build_feed": "provider", "scheduled_datasets_provider": "provider", "setup_dp_schedule": "provider",
}
"""Each name of ``__all__`` -> the module of this package that holds it (``patch`` is the module itself)."""

__all__ = [
    "build_feed",
    "scheduled_datasets_provider",
    "setup_dp_schedule",
    "ChunkIterator",
    "CollateConfig",
    "DPScheduleOptions",
    "PlanSetup",
    "ScheduledDataIterator",
    "ScheduledDatasetLoader",
    "ScheduledForwardStep",
    "StepBatches",
    "StepFeed",
    "add_dp_schedule_args",
    "collate_micro_batch",
    "disable",
    "enable",
    "is_enabled",
    "pad_multiple_for",
    "patch",
    "plan_setup_from_args",
    "scheduled_loss_func",
    "validate_dp_schedule_args",
]


def __getattr__(name: str) -> Any:
    """``name`` of ``__all__``, from its module, imported the first time it is asked for (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    value = module if name == _EXPORTS[name] else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The names of ``__all__``, imported or not, and the module's own ``__dunder__`` names."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
