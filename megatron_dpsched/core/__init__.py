"""The pure planning core: no torch, no Megatron (see :mod:`.schedule` for the spec)."""

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.cost import DEFAULT_COST_MODEL, CostModel, GenericCostModel
from megatron_dpsched.core.invariants import ScheduleInvariantError
from megatron_dpsched.core.schedule import DPSchedule, build_dp_schedule, plan_schedule
from megatron_dpsched.core.stats import StepStats
from megatron_dpsched.core.steps import compute_dynamic_global_batch_size
from megatron_dpsched.core.steptime import (
    StepEvent,
    StepTime,
    StepTimeline,
    StepTimeModel,
    rank_forward_times,
    simulate_rank,
    simulate_step,
    stage_op_order,
)

__all__ = [
    "DEFAULT_COST_MODEL",
    "CostModel",
    "DPSchedule",
    "GenericCostModel",
    "PipelineLayout",
    "ScheduleConfig",
    "ScheduleInvariantError",
    "StepEvent",
    "StepStats",
    "StepTime",
    "StepTimeModel",
    "StepTimeline",
    "build_dp_schedule",
    "compute_dynamic_global_batch_size",
    "plan_schedule",
    "rank_forward_times",
    "simulate_rank",
    "simulate_step",
    "stage_op_order",
]
