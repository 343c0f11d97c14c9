"""Megatron integration of the dp-schedule planner (imports torch and megatron-core).

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
"""

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
