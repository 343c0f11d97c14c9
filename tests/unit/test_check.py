"""``DPSchedule.check()`` rejects every malformed or tampered plan; ``from_dict`` and the CLI say why in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from assertions import assert_invariants

from megatron_dpsched import DPSchedule, ScheduleInvariantError, build_dp_schedule
from megatron_dpsched.cli import main

LENGTHS = [30, 12, 25, 8, 40, 3, 17, 22, 9, 35, 14, 6] * 2
DP = 3


@pytest.fixture(scope="module")
def schedule() -> DPSchedule:
    plan = build_dp_schedule(LENGTHS, dp_size=DP, global_batch_size=12, max_tokens_per_gpu=40)
    assert_invariants(plan, LENGTHS)
    assert plan.num_steps == 2
    return plan


def _replace_rank(values: tuple, rank: int, new: object) -> tuple:
    return values[:rank] + (new,) + values[rank + 1 :]


@pytest.mark.parametrize(("field", "value", "number"), [
    ("lengths", -5, 6), ("lengths", 0, 6), ("lengths", 2.5, 6), ("lengths", True, 6), ("lengths", 2**31, 6),
    ("costs", float("nan"), 6), ("costs", -1.0, 6), ("costs", float("inf"), 6), ("costs", 0.0, 6),
])
def test_bad_lengths_and_costs_are_rejected(schedule, field, value, number) -> None:
    values = list(getattr(schedule, field))
    values[4] = value
    with pytest.raises(ScheduleInvariantError, match=rf"invariant {number}: {field}\[4\]"):
        dataclasses.replace(schedule, **{field: tuple(values)}).check()


def test_negative_lengths_cannot_hide_a_cap_violation() -> None:
    """Samples of 40, 37 and -20 tokens in one micro-batch 'sum' to 57 > 40 real tokens of a 40 cap."""
    plan = build_dp_schedule([40, 37, 20], dp_size=1, global_batch_size=3, max_tokens_per_gpu=100)
    assert plan.num_microbatches == (1,)
    lying = dataclasses.replace(plan, config=dataclasses.replace(plan.config, max_tokens_per_gpu=40),
                                lengths=(40, 37, -20))
    with pytest.raises(ScheduleInvariantError, match="invariant 6: lengths\\[2\\]"):
        lying.check()


def test_a_step_without_samples_is_rejected(schedule) -> None:
    """A trailing step that trains nothing (Megatron would step the optimizer on a dummy)."""
    empty_step = dataclasses.replace(
        schedule,
        num_microbatches=schedule.num_microbatches + (1,),
        step_num_samples=schedule.step_num_samples + (0,),
        micro_batch_indices=tuple(batches + ((),) for batches in schedule.micro_batch_indices),
    )
    with pytest.raises(ScheduleInvariantError, match="invariant 6: step 2 trains 0 samples"):
        empty_step.check()


def test_a_plan_without_steps_is_rejected() -> None:
    plan = build_dp_schedule([5, 6], dp_size=1, global_batch_size=2, max_tokens_per_gpu=10)
    nothing = dataclasses.replace(plan, num_microbatches=(), step_num_samples=(), partitions=((),),
                                  micro_batch_indices=((),), dropped=(0, 1))
    with pytest.raises(ScheduleInvariantError, match="invariant 6: the plan has no steps"):
        nothing.check()


def test_step_num_samples_must_agree_with_the_partitions(schedule) -> None:
    """[16, 8] for 12 + 12 samples would have Megatron count 24 samples but step its scheduler by 16 first."""
    wrong = dataclasses.replace(schedule, step_num_samples=(16, 8))
    with pytest.raises(ScheduleInvariantError, match="invariant 5: step 0 trains 12 samples, step_num_samples says 16"):
        wrong.check()


@pytest.mark.parametrize("rank", range(DP))
def test_one_rank_with_an_extra_micro_batch_is_caught_whichever_rank(schedule, rank) -> None:
    batches = schedule.micro_batch_indices[rank] + ((),)
    broken = dataclasses.replace(schedule, micro_batch_indices=_replace_rank(schedule.micro_batch_indices, rank,
                                                                            batches))
    with pytest.raises(ScheduleInvariantError, match=f"invariant 1: rank {rank} has"):
        broken.check()


@pytest.mark.parametrize("rank", range(DP))
def test_one_rank_that_shifts_a_micro_batch_into_another_step_is_caught(schedule, rank) -> None:
    """Same total count, but this rank runs one micro-batch more in step 0 and one fewer in step 1."""
    first = schedule.num_microbatches[0]
    batches = list(schedule.micro_batch_indices[rank])
    moved = batches[first]  # the first micro-batch of step 1 ...
    merged = tuple(sorted(batches[first - 1] + moved))  # ... merged into the last of step 0
    shifted = batches[: first - 1] + [merged, ()] + batches[first + 1 :]
    broken = dataclasses.replace(schedule, micro_batch_indices=_replace_rank(schedule.micro_batch_indices, rank,
                                                                            tuple(shifted)))
    with pytest.raises(ScheduleInvariantError, match="invariant [25]"):
        broken.check()


@pytest.mark.parametrize(("data", "message"), [
    ([1, 2, 3], "not a plan: expected a JSON object .* got a list"),
    ({"config": {}}, "not a plan: missing key"),
    ("plan", "got a str"),
])
def test_from_dict_names_what_is_missing(data, message) -> None:
    with pytest.raises(ValueError, match=message):
        DPSchedule.from_dict(data)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("groups", [{"a": 1}] * len(LENGTHS), "group ids must be strings, numbers or lists"),
    ("groups", [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]] * len(LENGTHS), "nested more than 16 lists deep"),
    ("costs", [10**400] * len(LENGTHS), r"'costs'\[0\] is too large for a float"),
    ("partitions", [[0, 1.5]], r"'partitions\[0\]'\[1\] must be an integer"),
    ("num_microbatches", "2", "'num_microbatches' must be a list"),
    ("lengths", [5, "6"], r"'lengths'\[1\] must be a number"),
    ("config", {"dp_size": 2, "global_batch_size": 8, "max_tokens_per_gpu": 40, "bogus": 1}, "'config'"),
    ("config", {"dp_size": 0, "global_batch_size": 8, "max_tokens_per_gpu": 40}, "dp_size must be an integer"),
])
def test_from_dict_checks_types_by_key(schedule, key, value, message) -> None:
    data = {**schedule.to_dict(), key: value}
    with pytest.raises(ValueError, match=message):
        DPSchedule.from_dict(data)


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _tampered(schedule: DPSchedule, **changes: object) -> str:
    return json.dumps({**schedule.to_dict(), **changes})


@pytest.mark.parametrize(("make", "message"), [
    (lambda s: "{not json", "is not JSON"),
    (lambda s: "120\n34\n56\n", "is not JSON"),  # a length file given by mistake
    (lambda s: "[1, 2, 3]", "not a plan: expected a JSON object"),
    (lambda s: _tampered(s, lengths=[-1] + list(s.lengths[1:])), "invariant 6: lengths[0]"),
    (lambda s: _tampered(s, costs=[float("nan")] * len(s.costs)), "invariant 6: costs[0]"),
    (lambda s: _tampered(s, num_microbatches=[], step_num_samples=[], micro_batch_indices=[[]] * DP,
                         partitions=[[]] * DP, dropped=list(range(len(s.lengths)))), "invariant 6: the plan has no"),
    (lambda s: _tampered(s, step_num_samples=[16, 8]), "invariant 5: step 0 trains 12"),
    (lambda s: _tampered(s, num_microbatches=list(s.num_microbatches) + [1],
                         step_num_samples=list(s.step_num_samples) + [0],
                         micro_batch_indices=[[list(mb) for mb in r] + [[]] for r in s.micro_batch_indices]),
     "invariant 6: step 2 trains 0 samples"),
])
def test_cli_check_prints_one_line_and_exits_2(schedule, tmp_path, capsys, make, message) -> None:
    path = _write(tmp_path, "plan.json", make(schedule))
    assert main(["check", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("megatron-dpsched: error: ") and message in lines[0], lines[0]


def test_cli_check_accepts_a_good_plan(schedule, tmp_path, capsys) -> None:
    path = _write(tmp_path, "plan.json", json.dumps(schedule.to_dict()))
    assert main(["check", path]) == 0
    assert "step" in capsys.readouterr().out


def test_a_full_step_cut_short_with_its_tail_dropped_is_rejected() -> None:
    plan = build_dp_schedule([100] * 8, dp_size=2, global_batch_size=4, max_tokens_per_gpu=1000, drop_last=True)
    data = plan.to_dict()
    moved = data["partitions"][1].pop()
    data["micro_batch_indices"][1][-1].pop()
    data["step_num_samples"][-1] -= 1
    data["dropped"] = [moved]
    with pytest.raises(ScheduleInvariantError, match="invariant 5"):
        DPSchedule.from_dict(data).check()


def test_a_partial_step_kept_although_drop_last_says_drop_it_is_rejected() -> None:
    plan = build_dp_schedule([100] * 6, dp_size=2, global_batch_size=4, max_tokens_per_gpu=1000)
    assert plan.step_num_samples == (4, 2)
    lying = dataclasses.replace(plan, config=dataclasses.replace(plan.config, drop_last=True))
    with pytest.raises(ScheduleInvariantError, match="invariant 5: the plan has 2 steps"):
        lying.check()


@pytest.mark.parametrize(("extra", "number"), [(-1, 3), (7, 3), (True, 6), (2.0, 6)])
def test_dropped_ids_are_range_and_type_checked(extra, number) -> None:
    plan = build_dp_schedule([100] * 7, dp_size=2, global_batch_size=4, max_tokens_per_gpu=1000, drop_last=True)
    with pytest.raises(ScheduleInvariantError, match=f"invariant {number}"):
        dataclasses.replace(plan, dropped=plan.dropped + (extra,)).check()


def test_non_integer_ids_are_rejected_not_crashed_on(schedule) -> None:
    partitions = list(schedule.partitions)
    partitions[2] = (float(partitions[2][0]),) + partitions[2][1:]
    with pytest.raises(ScheduleInvariantError, match="invariant 6: partitions holds"):
        dataclasses.replace(schedule, partitions=tuple(partitions)).check()
    with pytest.raises(ScheduleInvariantError, match="invariant 6: config is a NoneType"):
        dataclasses.replace(schedule, config=None).check()


@pytest.mark.parametrize(("step", "first_sample", "message"), [
    (-1, 0, "step must be in 0..1"), (2, 0, "step must be in 0..1"), (0, -1, "first_sample"),
    (0, 1.5, "first_sample"), (0, 2**63, "first_sample must be at most"),
])
def test_fingerprint_arguments_are_checked(schedule, step, first_sample, message) -> None:
    with pytest.raises(ValueError, match=message):
        schedule.step_fingerprint(step, first_sample=first_sample)


def test_numpy_group_ids_survive_json() -> None:
    np = pytest.importorskip("numpy")
    plan = build_dp_schedule([100] * 4, dp_size=2, global_batch_size=2, max_tokens_per_gpu=1000,
                             groups=np.array([0, 0, 1, 1]))
    copy = DPSchedule.from_dict(json.loads(json.dumps(plan.to_dict())))
    copy.check()
    assert copy == plan
