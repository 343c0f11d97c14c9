"""Every ``--dp-schedule-*`` option reaches the job identity, ``--dp-schedule-over-cap`` included (issue 27,
"Tests that catch"): ranks that differ in it disagree on a field; a resume may change it (it only changes how a
step runs) but not an option that changes what a step trains. One process, Megatron's own argument parsing."""

from __future__ import annotations

import copy

import harness
import pytest

from megatron_dpsched.megatron.job_checks import identity_from_args
from megatron_dpsched.runtime.job_identity import OPTIONS_FIELD, RUN_TIME_OPTIONS_FIELD, resume_changes

pytestmark = pytest.mark.distributed


def _differing(first: dict[str, str], second: dict[str, str]) -> list[str]:
    return [name for name in first if first[name] != second[name]]


def test_over_cap_is_in_the_run_time_options_and_balance_in_the_trained_ones() -> None:
    args = harness.parse_megatron_args(harness.base_argv())
    warned = identity_from_args(args)
    refusing_args = copy.copy(args)
    refusing_args.dp_schedule_over_cap = "refuse"
    refusing = identity_from_args(refusing_args)
    assert _differing(warned.summaries, refusing.summaries) == [RUN_TIME_OPTIONS_FIELD]
    assert "over_cap='refuse'" in refusing.summaries[RUN_TIME_OPTIONS_FIELD]
    assert warned.digests() != refusing.digests()  # what the ranks exchange
    assert resume_changes(warned.summaries, refusing) == []  # a resume may change it

    tokens_args = copy.copy(args)
    tokens_args.dp_schedule_balance = "tokens"
    tokens = identity_from_args(tokens_args)
    assert OPTIONS_FIELD in _differing(warned.summaries, tokens.summaries)
    assert [change.split(":")[0] for change in resume_changes(warned.summaries, tokens)][0] == OPTIONS_FIELD
