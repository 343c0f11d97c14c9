"""Cutting the sample stream into optimizer steps."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from megatron_dpsched.core.validation import require_int, require_sequence


def split_steps(
    num_samples: int,
    *,
    global_batch_size: int,
    groups: Sequence[Hashable] | None,
    drop_last: bool,
) -> tuple[list[list[int]], list[int]]:
    """Return (samples of each step in index order, dropped samples).

    Without ``groups`` a step is ``global_batch_size`` consecutive samples.
    With ``groups`` a step is ``global_batch_size`` groups, taken in order of
    their first sample, with all of their samples. A trailing step with fewer
    units is kept as a smaller step, or dropped (and reported) with ``drop_last``.
    """
    if groups is None:  # a unit per sample: steps are consecutive ranges
        ranges, dropped = step_ranges(num_samples, global_batch_size=global_batch_size, drop_last=drop_last)
        return list(map(list, ranges)), list(dropped)
    units = _units(num_samples, groups)
    steps = [
        sorted(i for unit in units[start : start + global_batch_size] for i in unit)
        for start in range(0, len(units), global_batch_size)
    ]
    dropped: list[int] = []
    if drop_last and len(units) % global_batch_size:
        dropped = steps.pop()
    return steps, dropped


def step_ranges(num_samples: int, *, global_batch_size: int, drop_last: bool) -> tuple[list[range], range]:
    """:func:`split_steps` without groups, each step and the dropped samples a ``range``."""
    steps = [range(start, min(start + global_batch_size, num_samples))
             for start in range(0, num_samples, global_batch_size)]
    dropped = steps.pop() if drop_last and num_samples % global_batch_size else range(0)
    return steps, dropped


def _units(num_samples: int, groups: Sequence[Hashable] | None) -> list[list[int]]:
    if groups is None:
        return [[i] for i in range(num_samples)]
    require_sequence("groups", groups)
    if len(groups) != num_samples:
        raise ValueError(f"groups must hold one id per sample: got {len(groups)} ids for {num_samples} lengths")
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(groups):
        try:
            members.setdefault(group, []).append(index)
        except TypeError:
            raise ValueError(f"groups[{index}] = {group!r} is not hashable") from None
    return list(members.values())


def compute_dynamic_global_batch_size(num_samples: int, dp_size: int) -> int:
    """One step per rollout: the largest multiple of ``dp_size`` not above ``num_samples``, at least ``dp_size``."""
    require_int("num_samples", num_samples)
    require_int("dp_size", dp_size)
    return max(dp_size, num_samples // dp_size * dp_size)
