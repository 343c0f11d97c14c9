"""megatron-dpsched: global data-parallel micro-batch scheduling for Megatron.

The planning API (pure Python, imports neither torch nor Megatron)::

    from megatron_dpsched import build_dp_schedule
    schedule = build_dp_schedule(lengths, dp_size=8, global_batch_size=256, max_tokens_per_gpu=16384)

``enable()`` / ``disable()`` install and remove the Megatron hooks; they
import torch and Megatron only when called.
"""

from typing import Any

from megatron_dpsched.core import (
    DEFAULT_COST_MODEL,
    CostModel,
    DPSchedule,
    GenericCostModel,
    PipelineLayout,
    ScheduleConfig,
    ScheduleInvariantError,
    StepStats,
    build_dp_schedule,
    compute_dynamic_global_batch_size,
    plan_schedule,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_COST_MODEL",
    "CostModel",
    "DPSchedule",
    "GenericCostModel",
    "PipelineLayout",
    "ScheduleConfig",
    "ScheduleInvariantError",
    "StepStats",
    "build_dp_schedule",
    "compute_dynamic_global_batch_size",
    "disable",
    "enable",
    "plan_schedule",
]


def enable(*args: Any, **kwargs: Any) -> Any:
    """Install the ``--dp-schedule`` hooks into Megatron (see :mod:`megatron_dpsched.megatron.patch`)."""
    from megatron_dpsched.megatron.patch import enable as _enable

    return _enable(*args, **kwargs)


def disable(*args: Any, **kwargs: Any) -> Any:
    """Remove the hooks installed by :func:`enable`."""
    from megatron_dpsched.megatron.patch import disable as _disable

    return _disable(*args, **kwargs)
