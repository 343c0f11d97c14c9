"""Helpers of the GPT entry point's step statistics and of the CPU demo (``scripts/demo.py``)."""

from megatron_dpsched.demo.stats import StepRecorder, load_plans, load_step_records, write_plan

__all__ = ["StepRecorder", "load_plans", "load_step_records", "write_plan"]
