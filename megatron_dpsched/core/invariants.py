"""The invariant checker behind :meth:`DPSchedule.check`.

Each check raises :class:`ScheduleInvariantError` whose message starts with
the invariant's number in the contract of :mod:`megatron_dpsched.core.schedule` and names
the rank, step and micro-batch at fault.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NoReturn

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.padding import collated_size, planned_sizes
from megatron_dpsched.core.planning import lower_bound_microbatches
from megatron_dpsched.core.steps import split_steps
from megatron_dpsched.core.validation import MAX_TOKENS, is_int, is_real

if TYPE_CHECKING:
    from megatron_dpsched.core.schedule import DPSchedule


class ScheduleInvariantError(AssertionError):
    """A plan breaks one of the numbered invariants (a bug, or a tampered plan)."""


def check_invariants(schedule: DPSchedule) -> None:
    """Check invariants 1-6 of the schedule spec; raise on the first failure."""
    _check_inputs(schedule)
    _check_shape(schedule)
    _check_lockstep(schedule)
    _check_coverage(schedule)
    _check_caps(schedule)
    _check_legal_counts(schedule)
    _check_steps(schedule)


def _fail(number: int, message: str) -> NoReturn:
    raise ScheduleInvariantError(f"invariant {number}: {message}")


def _check_inputs(schedule: DPSchedule) -> None:
    if not isinstance(schedule.config, ScheduleConfig):
        _fail(6, f"config is a {type(schedule.config).__name__}, not a ScheduleConfig")
    _check_integers(schedule)
    for index, length in enumerate(schedule.lengths):
        if not is_int(length) or not 1 <= length <= MAX_TOKENS:
            _fail(6, f"lengths[{index}] = {length!r} is not a positive integer token count")
    for index, cost in enumerate(schedule.costs):
        if not is_real(cost) or not math.isfinite(cost) or cost <= 0:
            _fail(6, f"costs[{index}] = {cost!r} is not a finite number > 0")
    if schedule.groups is not None and len(schedule.groups) != len(schedule.lengths):
        _fail(6, f"{len(schedule.groups)} group ids for {len(schedule.lengths)} samples")
    if schedule.num_steps == 0:
        _fail(6, "the plan has no steps")
    for step, count in enumerate(schedule.step_num_samples):
        if count < 1:
            _fail(6, f"step {step} trains {count} samples; every step must train at least one")


def _check_integers(schedule: DPSchedule) -> None:
    """Sample ids, positions and counts are integers (not bools, floats or strings)."""
    fields = {
        "num_microbatches": [schedule.num_microbatches],
        "step_num_samples": [schedule.step_num_samples],
        "dropped": [schedule.dropped],
        "partitions": schedule.partitions,
        "micro_batch_indices": [mb for rank in schedule.micro_batch_indices for mb in rank],
    }
    for name, rows in fields.items():
        for row in rows:
            bad = next((value for value in row if not is_int(value)), None)
            if bad is not None:
                _fail(6, f"{name} holds {bad!r}; it must hold integers")


def _check_shape(schedule: DPSchedule) -> None:
    dp = schedule.dp_size
    if len(schedule.partitions) != dp or len(schedule.micro_batch_indices) != dp:
        _fail(3, f"expected {dp} partitions and micro_batch_indices, got "
              f"{len(schedule.partitions)} and {len(schedule.micro_batch_indices)}")
    if len(schedule.step_num_samples) != schedule.num_steps:
        _fail(5, f"{len(schedule.step_num_samples)} step_num_samples for {schedule.num_steps} steps")
    if len(schedule.costs) != len(schedule.lengths):
        _fail(3, f"{len(schedule.costs)} costs for {len(schedule.lengths)} samples")


def _check_lockstep(schedule: DPSchedule) -> None:
    total = sum(schedule.num_microbatches)
    for rank, batches in enumerate(schedule.micro_batch_indices):
        if len(batches) != total:
            _fail(1, f"rank {rank} has {len(batches)} micro-batches, the steps need {total}")


def _check_caps(schedule: DPSchedule) -> None:
    config = schedule.config
    sizes = planned_sizes(schedule.lengths, pad_multiple=config.pad_multiple)
    for rank in range(schedule.dp_size):
        for step in range(schedule.num_steps):
            for index, mb in enumerate(schedule.rank_step_micro_batches(rank, step)):
                where = f"rank {rank}, step {step}, micro-batch {index}"
                if config.micro_batch_size is not None and len(mb) > config.micro_batch_size:
                    _fail(2, f"{where} holds {len(mb)} samples > micro_batch_size={config.micro_batch_size}")
                if config.token_cap is None or len(mb) < 2:
                    continue
                tokens = collated_size(mb, sizes, padded_rows=config.padded_rows)
                if tokens > config.token_cap:
                    _fail(2, f"{where} collates to {tokens} tokens ({_how_collated(config)}) in {len(mb)} samples "
                          f"> max_tokens_per_gpu * cp_size = {config.token_cap}")


def _how_collated(config: ScheduleConfig) -> str:
    rows = "rows x longest" if config.padded_rows else "sum of lengths"
    return rows if config.pad_multiple == 1 else f"{rows}, each rounded up to {config.pad_multiple}"


def _check_coverage(schedule: DPSchedule) -> None:
    seen: dict[int, int] = {}
    for rank, (partition, batches) in enumerate(zip(schedule.partitions, schedule.micro_batch_indices)):
        flat = [p for mb in batches for p in mb]
        if flat != list(range(len(partition))):
            _fail(3, f"rank {rank}: flattened micro_batch_indices is not range({len(partition)})")
        for sample in partition:
            if not 0 <= sample < len(schedule.lengths):
                _fail(3, f"rank {rank} owns sample {sample}, outside 0..{len(schedule.lengths) - 1}")
            if sample in seen:
                _fail(3, f"sample {sample} is on rank {seen[sample]} and rank {rank}")
            seen[sample] = rank
    for sample in schedule.dropped:
        if not 0 <= sample < len(schedule.lengths):
            _fail(3, f"dropped sample {sample} is outside 0..{len(schedule.lengths) - 1}")
        if sample in seen:
            _fail(3, f"sample {sample} is both dropped and on rank {seen[sample]}")
        seen[sample] = -1
    missing = [i for i in range(len(schedule.lengths)) if i not in seen]
    if missing:
        _fail(3, f"{len(missing)} samples are neither scheduled nor dropped, first {missing[:5]}")


def _check_legal_counts(schedule: DPSchedule) -> None:
    layout = schedule.config.layout
    for step, count in enumerate(schedule.num_microbatches):
        if not layout.is_legal(count):
            _fail(4, f"step {step} runs {count} micro-batches, which Megatron's schedule rejects for "
                  f"pp_size={layout.pp_size}, vpp_size={layout.vpp_size}, "
                  f"microbatch_group_size_per_vp_stage={layout.group_size}")
        _check_count_bounds(schedule, step, count)


def _check_count_bounds(schedule: DPSchedule, step: int, count: int) -> None:
    """At least the aligned lower bound; with a step-time model at most ``max(lower bound, align(n))`` (a plan
    without one may run more: ``balance_growth``, or a shipped plan with empty micro-batches of its own)."""
    config = schedule.config
    sizes = planned_sizes(schedule.lengths, pad_multiple=config.pad_multiple)
    per_rank = [sum(len(mb) for mb in schedule.rank_step_micro_batches(r, step)) for r in range(schedule.dp_size)]
    if sum(per_rank) == 0:
        return  # invariant 6 reports the empty step
    lower = lower_bound_microbatches([sizes[i] for i in schedule.step_samples(step)], config=config)
    if count < lower:
        _fail(4, f"step {step} runs {count} micro-batches, below the aligned lower bound {lower}")
    upper = max(lower, config.layout.align(max(per_rank)))
    if config.step_time_model is not None and count > upper:
        _fail(4, f"step {step} runs {count} micro-batches, more than max(lower bound, align(most samples on "
              f"a rank)) = {upper} that a plan for step time may run")


def _check_steps(schedule: DPSchedule) -> None:
    """Invariant 5: steps and ``dropped`` are exactly the cut of step 1; ``step_num_samples`` counts each step."""
    config = schedule.config
    try:
        expected, dropped = split_steps(len(schedule.lengths), global_batch_size=config.global_batch_size,
                                        groups=schedule.groups, drop_last=config.drop_last)
    except ValueError as error:
        _fail(6, str(error))
    if len(expected) != schedule.num_steps:
        _fail(5, f"the plan has {schedule.num_steps} steps; {len(schedule.lengths)} samples in steps of "
              f"global_batch_size={config.global_batch_size} (drop_last={config.drop_last}) make {len(expected)}")
    for step, want in enumerate(expected):
        samples = schedule.step_samples(step)
        if len(samples) != schedule.step_num_samples[step]:
            _fail(5, f"step {step} trains {len(samples)} samples, step_num_samples says "
                  f"{schedule.step_num_samples[step]}")
        if samples != want:
            _fail(5, f"step {step} does not hold the next global_batch_size={config.global_batch_size} "
                  f"samples/groups in input order (first difference: {_first_difference(samples, want)})")
    if sorted(schedule.dropped) != dropped:
        _fail(5, f"dropped holds {len(schedule.dropped)} samples; only the trailing partial step "
              f"({len(dropped)} samples with drop_last={config.drop_last}) may be dropped")


def _first_difference(actual: list[int], expected: list[int]) -> str:
    extra = sorted(set(actual) - set(expected))
    if extra:
        return f"sample {extra[0]} does not belong in it"
    return f"sample {sorted(set(expected) - set(actual))[0]} is missing"
