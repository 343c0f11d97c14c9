"""Reading a plan back from its JSON form (:meth:`DPSchedule.to_dict`), with errors that name the key.

Only the shape is checked here (a JSON object with every key, integers where the
plan holds integers); whether the plan keeps its invariants is
:meth:`DPSchedule.check`'s job.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.validation import is_int

KEYS = ("config", "lengths", "costs", "groups", "partitions", "micro_batch_indices", "num_microbatches",
        "step_num_samples", "dropped")


def schedule_fields(data: Any) -> dict[str, Any]:
    """The keyword arguments of ``DPSchedule`` for a dict made by ``to_dict``."""
    if not isinstance(data, dict):
        raise ValueError(f"not a plan: expected a JSON object with keys {', '.join(KEYS)}, "
                         f"got a {type(data).__name__}")
    missing = [key for key in KEYS if key not in data]
    if missing:
        raise ValueError(f"not a plan: missing key(s) {', '.join(missing)}")
    if not isinstance(data["config"], dict):
        raise ValueError("not a plan: 'config' must be an object of ScheduleConfig options")
    try:
        config = ScheduleConfig(**data["config"])
    except TypeError as error:
        raise ValueError(f"not a plan: 'config': {error}") from None
    groups = data["groups"]
    return {
        "config": config,
        "lengths": _numbers("lengths", data["lengths"], integer=True),
        "costs": _numbers("costs", data["costs"], integer=False),
        "groups": None if groups is None else tuple(_hashable(g) for g in _list("groups", groups)),
        "partitions": _nested("partitions", data["partitions"], depth=1),
        "micro_batch_indices": _nested("micro_batch_indices", data["micro_batch_indices"], depth=2),
        "num_microbatches": _ints("num_microbatches", data["num_microbatches"]),
        "step_num_samples": _ints("step_num_samples", data["step_num_samples"]),
        "dropped": _ints("dropped", data["dropped"]),
    }


def _list(name: str, value: Any) -> list:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"not a plan: '{name}' must be a list, got {type(value).__name__}")
    return list(value)


def _nested(name: str, value: Any, *, depth: int) -> tuple:
    """Integers nested ``depth`` lists deep, as tuples."""
    if depth == 0:
        return _ints(name, value)
    return tuple(_nested(f"{name}[{i}]", item, depth=depth - 1) for i, item in enumerate(_list(name, value)))


def _ints(name: str, value: Any) -> tuple[int, ...]:
    values = _list(name, value)
    for index, item in enumerate(values):
        if not is_int(item):
            raise ValueError(f"not a plan: '{name}'[{index}] must be an integer, got {item!r}")
    return tuple(int(item) for item in values)


def _numbers(name: str, value: Any, *, integer: bool) -> tuple:
    """Numbers as stored; whether they are valid lengths or costs is for ``check()`` to say."""
    values = _list(name, value)
    for index, item in enumerate(values):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise ValueError(f"not a plan: '{name}'[{index}] must be a number, got {item!r}")
        if not integer and isinstance(item, int) and abs(item) > MAX_FLOAT:
            raise ValueError(f"not a plan: '{name}'[{index}] is too large for a float")
    return tuple(values) if integer else tuple(float(item) for item in values)


MAX_FLOAT = 2**1023
"""Integers beyond this do not convert to a float."""
MAX_GROUP_DEPTH = 16
"""Group ids are JSON scalars or lists of them, at most this deep."""


def _hashable(group_id: Any, depth: int = 0) -> Hashable:
    """JSON turns tuple group ids into lists; turn them back. Only JSON scalars and lists are group ids."""
    if isinstance(group_id, list):
        if depth >= MAX_GROUP_DEPTH:
            raise ValueError(f"not a plan: a group id is nested more than {MAX_GROUP_DEPTH} lists deep")
        return tuple(_hashable(g, depth + 1) for g in group_id)
    if group_id is not None and not isinstance(group_id, (str, int, float)):
        raise ValueError(f"not a plan: group ids must be strings, numbers or lists of them, got {group_id!r}")
    return group_id
