"""Option rules of one line each that the rest of the suite let through: a cost-model file counts as a model to
time, ``--dp-schedule-cap-counts tokens`` plans without padding, and every option is in one of the job identity's
option fields (issue 27, "Tests that catch")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_dpsched.options import OPTIONS, DPScheduleOptions, OptionError, Setting, check_argv, check_setting

PIPELINED_WITH_A_FILE = ["--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "64", "--pipeline-model-parallel-size",
                         "2", "--dp-schedule-balance", "tokens", "--dp-schedule-cost-model", "calibrated.json"]
"""PP 2, a token cap, balance tokens and a cost-model file, no ``--hidden-size``: the file is the model the
step-time objective times, so the file acts (with balance tokens it acts through that objective only)."""


def test_a_cost_model_file_is_a_model_to_time_before_megatron_parses() -> None:
    check_argv(PIPELINED_WITH_A_FILE)  # accepted: the step-time objective uses the file
    without_file = PIPELINED_WITH_A_FILE[:-2]
    with pytest.raises(OptionError, match="^--dp-schedule-microbatch-overhead-ms has no effect with the micro-batches "
                                          r"objective \(no --hidden-size\)"):
        check_argv([*without_file, "--dp-schedule-microbatch-overhead-ms", "3"])


def test_a_cost_model_file_is_a_model_to_time_in_megatrons_args() -> None:
    args = SimpleNamespace(dp_schedule=True, dp_schedule_max_tokens_per_gpu=64, dp_schedule_balance="tokens",
                           dp_schedule_cost_model="calibrated.json", pipeline_model_parallel_size=2, hidden_size=None)
    setting = Setting.from_args(args)
    assert setting.has_model and setting.objective == "step-time"
    check_setting(setting)
    setting = Setting.from_args(SimpleNamespace(**{**vars(args), "dp_schedule_cost_model": None}))
    assert not setting.has_model and setting.objective == "micro-batches"


@pytest.mark.parametrize("collate_format", ["bshd", "thd"])
def test_cap_counts_tokens_plans_real_lengths(collate_format: str) -> None:
    """``tokens``: the cap bounds real tokens, so the plan has no pad multiple and no padded rows; ``padded``
    counts what collate makes (the multiple, and rows with bshd)."""
    tokens = DPScheduleOptions(enabled=True, max_tokens_per_gpu=64, cap_counts="tokens")
    assert not tokens.counts_padding
    assert tokens.planned_padding(pad_multiple=8, collate_format=collate_format) == {"pad_multiple": 1,
                                                                                     "padded_rows": False}
    padded = DPScheduleOptions(enabled=True, max_tokens_per_gpu=64, cap_counts="padded")
    assert padded.counts_padding
    assert padded.planned_padding(pad_multiple=8, collate_format=collate_format) == {
        "pad_multiple": 8, "padded_rows": collate_format == "bshd"}


def test_every_option_is_in_exactly_one_option_field_of_the_job_identity() -> None:
    """The job identity's two option fields (what a step trains; how it runs) hold every option between them, so
    two ranks (or a resume) that differ in any option, ``--dp-schedule-over-cap`` included, differ in a field."""
    options = DPScheduleOptions(enabled=True, max_tokens_per_gpu=64, over_cap="refuse")
    trained, run_time = options.option_values(run_time=False), options.option_values(run_time=True)
    assert sorted([*trained, *run_time]) == sorted(option.name for option in OPTIONS)
    assert not set(trained) & set(run_time)
    assert run_time["over_cap"] == "refuse" and run_time["verify"] == "off"
    other = DPScheduleOptions(enabled=True, max_tokens_per_gpu=64, over_cap="warn")
    assert other.option_values(run_time=True) != run_time
