"""Megatron's own schedulers, run from their real code (loaded at run time, never copied here).

- ``"megatron_dp_balanced"``: Megatron-LM main's ``DpBalancedScheduler.get_groups_and_subsamples``, compiled from
  a checkout's ``megatron/core/datasets/data_schedule.py`` (only ``BasePackingScheduler`` and
  ``DpBalancedScheduler``: the module's imports need Transformer Engine), constructed as ``wrap_data_iterator``
  does (the VPP group only with VPP). It packs each DP rank's samples into micro-batches.
- ``"megatron_hybrid_cp"``: hybrid context parallel's ``BalancedCPScheduler.get_groups_and_subsamples`` from the
  installed megatron-core (torch), as ``HybridCPDataLoaderWrapper`` calls it; ``hybrid_context_parallel_forward_
  backward`` runs each sub-sample of a group as a micro-batch of its own, group after group.

Both take a step's ``(global id, length)`` pairs in the order Megatron gathers them (:func:`megatron_order`) and
return per micro-batch (or group), per DP x CP rank, the ids placed there. A :data:`StepPlan` maps a step's
lengths and the config to micro-batches per DP rank as positions into the lengths, or raises
:class:`SchedulerRefused` where Megatron would stop the job (its code raises, or it refuses the layout).
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

from megatron_dpsched.baselines.partition import pad_to_legal
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.schedule import DPSchedule, assemble_schedule
from megatron_dpsched.core.steps import split_steps

DATA_SCHEDULE = "megatron/core/datasets/data_schedule.py"
"""Where Megatron-LM main defines ``DpBalancedScheduler``, relative to the checkout."""

HYBRID_CP_PIPELINE_REFUSAL = "AssertionError: Hybrid context parallelism not supported with pipeline parallelism"
"""megatron/training/arguments.py's assertion for ``--hybrid-context-parallel`` with PP > 1, word for word."""

HYBRID_CP_SPLIT_REFUSAL = "BalancedCPScheduler runs a sample on several ranks with CP > 1: not timed here"
"""A hybrid-CP plan that runs a sample on several ranks (CP > 1), which the step-time simulation cannot time."""

StepPlan = Callable[[list[int], ScheduleConfig], list[RankPlan]]
"""``plan(lengths, config)``: one step's micro-batches per DP rank, as positions into ``lengths``."""


class SchedulerRefused(ValueError):
    """Megatron's scheduler raised on this step, or Megatron refuses the layout: the job would stop."""


def megatron_order(count: int, dp_size: int) -> list[int]:
    """Step positions in the order Megatron gathers their lengths: by DP rank (rank ``r`` holds ``r, r + DP, ...``),
    then local index; the position in this list is the sample's global id."""
    return [i for rank in range(dp_size) for i in range(rank, count, dp_size)]


def classes_from_file(path: Path, names: Sequence[str], namespace: dict[str, object]) -> dict[str, type]:
    """Top-level classes ``names`` compiled from the checkout's source, in that order, globals ``namespace``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    missing = [name for name in names if name not in nodes]
    if missing:
        raise ValueError(f"{path} does not define {', '.join(missing)}: is the checkout too old?")
    code = compile(ast.Module(body=[nodes[name] for name in names], type_ignores=[]), str(path), "exec")
    exec(code, namespace)  # noqa: S102 - Megatron's own classes, read from the checkout the user named
    return {name: namespace[name] for name in names}


def dp_balanced_step_plan(source: str | Path) -> StepPlan:
    """``DpBalancedScheduler`` from the Megatron-LM checkout ``source`` (needs torch)."""
    try:
        import torch
    except ImportError as error:
        raise ValueError(f"Megatron-LM's DpBalancedScheduler needs torch installed ({error})") from None

    path = Path(source).expanduser().resolve() / DATA_SCHEDULE
    if not path.is_file():
        raise ValueError(f"{path.parents[3]} is not a Megatron-LM checkout with {DATA_SCHEDULE}")
    namespace = {"torch": torch, **{name: getattr(typing, name) for name in typing.__all__}}
    scheduler_class = classes_from_file(path, ("BasePackingScheduler", "DpBalancedScheduler"), namespace)[
        "DpBalancedScheduler"]

    def plan(lengths: list[int], config: ScheduleConfig) -> list[RankPlan]:
        layout, dp, cp = config.layout, config.dp_size, config.cp_size
        group = layout.group_size if layout.interleaved else None
        scheduler = scheduler_class(config.max_tokens_per_gpu, cp, dp, group)
        order = megatron_order(len(lengths), dp)
        groups = _refusing(scheduler.get_groups_and_subsamples, [(k, lengths[i]) for k, i in enumerate(order)])
        return [[[order[k] for k in micro_batch[rank * cp]] for micro_batch in groups] for rank in range(dp)]

    return plan


def hybrid_cp_step_plan() -> StepPlan:
    """``BalancedCPScheduler`` from the installed megatron-core (needs torch); refuses PP > 1 as Megatron does."""
    try:
        from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler
    except ImportError as error:
        raise ValueError(f"hybrid CP's BalancedCPScheduler needs megatron-core 0.19 and torch installed "
                         f"({type(error).__name__}: {error})") from None

    def plan(lengths: list[int], config: ScheduleConfig) -> list[RankPlan]:
        dp, cp = config.dp_size, config.cp_size
        if config.pp_size > 1:
            raise SchedulerRefused(HYBRID_CP_PIPELINE_REFUSAL)
        scheduler = BalancedCPScheduler(config.max_tokens_per_gpu, SimpleNamespace(size=lambda: dp * cp))
        order = megatron_order(len(lengths), dp)
        _, groups = _refusing(scheduler.get_groups_and_subsamples,
                              [(k, lengths[i]) for k, i in enumerate(order)], config)
        ranks = [[[order[k]] for group in groups for k in group[rank]] for rank in range(dp * cp)]
        if cp > 1 or sum(map(len, ranks)) != len(lengths):  # a sample on several ranks
            raise SchedulerRefused(HYBRID_CP_SPLIT_REFUSAL)
        return ranks

    return plan


def _refusing(call: Callable, *args: object) -> typing.Any:
    """``call(*args)``, what Megatron's code raises turned into :class:`SchedulerRefused` (its first line)."""
    try:
        return call(*args)
    except (AssertionError, ValueError, RuntimeError, IndexError) as exc:
        message = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise SchedulerRefused(f"{type(exc).__name__}: {message}") from exc


def build_scheduler_schedule(
    plan: StepPlan, lengths: Sequence[int], *, config: ScheduleConfig, costs: Sequence[float]
) -> DPSchedule:
    """Every step of ``lengths`` planned by ``plan``, empty micro-batches appended up to Megatron's legal count
    (``PipelineLayout.align``); raises :class:`SchedulerRefused` naming the first step refused."""
    sizes = tuple(int(n) for n in lengths)
    steps, dropped = split_steps(len(sizes), global_batch_size=config.global_batch_size, groups=None,
                                 drop_last=config.drop_last)
    plans = []
    for index, step in enumerate(steps):
        try:
            ranks = plan([sizes[i] for i in step], config)
        except SchedulerRefused as refusal:
            raise SchedulerRefused(f"step {index}: {refusal}") from refusal
        plans.append([[[step[p] for p in mb] for mb in rank] for rank in pad_to_legal(ranks, config.layout)])
    return assemble_schedule(plans, lengths=sizes, costs=tuple(costs), groups=None, config=config, dropped=dropped)
