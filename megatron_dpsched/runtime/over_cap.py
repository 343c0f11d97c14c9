"""Samples over the token cap: found before training and counted every step (standard library and the pure core).

A sample whose planned size (its length rounded up to the pad multiple when ``--dp-schedule-cap-counts padded``)
is over the token cap ``max_tokens_per_gpu x cp_size`` cannot share a micro-batch: it trains alone, in a
micro-batch over the cap, which may not fit in memory. ``--dp-schedule-over-cap`` says what training does about
them before the first step (:func:`over_cap_notice`: ``allow`` nothing, ``warn`` one warning per dataset,
``refuse`` an error); every step's log line and TensorBoard scalars count them whatever it says
(:func:`step_over_cap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_dpsched.core.padding import planned_sizes
from megatron_dpsched.options import BY_NAME

SHOWN = 5
"""How many over-cap samples a message lists (the longest first)."""


@dataclass(frozen=True, kw_only=True)
class OverCap:
    """The samples over the cap among some samples."""

    ids: tuple[int, ...]
    """Their sample ids, in id order."""
    lengths: tuple[int, ...]
    """Their real lengths, in the order of ``ids``."""
    cap: int
    """The token cap (``max_tokens_per_gpu x cp_size``)."""

    @property
    def count(self) -> int:
        """How many samples are over the cap."""
        return len(self.ids)

    @property
    def longest(self) -> int:
        """The longest of them, in real tokens (0 when there are none)."""
        return max(self.lengths, default=0)


def find_over_cap(lengths: Sequence[int], *, token_cap: int, pad_multiple: int = 1,
                  ids: Sequence[int] | None = None) -> OverCap:
    """The samples of ``lengths`` (sample ``ids``, default ``0..n-1``) whose planned size is over ``token_cap``."""
    ids = range(len(lengths)) if ids is None else ids
    assert len(ids) == len(lengths), "one id per length"
    sizes = planned_sizes(lengths, pad_multiple=pad_multiple)
    over = [(i, n) for i, n, size in zip(ids, lengths, sizes) if size > token_cap]
    return OverCap(ids=tuple(i for i, _ in over), lengths=tuple(n for _, n in over), cap=token_cap)


def describe(over: OverCap, *, dataset: str) -> str:
    """``3 sample(s) of the train dataset are longer than the token cap ...``, the longest few with their ids."""
    shown = sorted(zip(over.lengths, over.ids), key=lambda pair: (-pair[0], pair[1]))[:SHOWN]
    listed = ", ".join(f"id {i} ({n} tokens)" for n, i in shown)
    more = f" and {over.count - len(shown)} more" if over.count > len(shown) else ""
    return (f"{over.count} sample(s) of the {dataset} dataset are over the token cap of {over.cap} "
            f"(--dp-schedule-max-tokens-per-gpu x --context-parallel-size), the longest {over.longest} tokens: "
            f"{listed}{more}; each trains alone in a micro-batch over the cap, which may not fit in memory")


def over_cap_notice(over: OverCap, *, policy: str, dataset: str) -> str | None:
    """What ``--dp-schedule-over-cap policy`` does about ``over``: the warning to print (``warn``), ``None``
    (``allow``, or nothing over the cap), or a ``ValueError`` naming the samples (``refuse``)."""
    BY_NAME["over_cap"].check(policy)
    if not over.count or policy == "allow":
        return None
    if policy == "refuse":
        raise ValueError(f"--dp-schedule-over-cap refuse: {describe(over, dataset=dataset)}; raise the cap, drop "
                         "or cut them, or give --dp-schedule-over-cap warn")
    return (f"dp-schedule: WARNING: {describe(over, dataset=dataset)} (--dp-schedule-over-cap allow: no warning; "
            "refuse: stop)")


def step_over_cap(lengths: Sequence[int], samples: Sequence[int], *, token_cap: int | None,
                  pad_multiple: int) -> OverCap | None:
    """The over-cap samples among one step's ``samples`` (ids into ``lengths``); ``None`` without a cap."""
    if token_cap is None:
        return None
    return find_over_cap([lengths[i] for i in samples], token_cap=token_cap, pad_multiple=pad_multiple, ids=samples)
