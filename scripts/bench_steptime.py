"""Benchmark the step-time objective: simulated pipeline step time of the plans, against an exhaustive search.

For each length file (those shipped in ``megatron_dpsched/data`` and those of ``--lengths-dir``
where it exists, see :mod:`bench_common`), pipeline layout (PP=1, PP=4, PP=4 with VPP=2), DP size and token cap, it
plans ``--steps`` steps of ``--samples-per-rank`` samples per rank (balance by the FLOPs of a
Llama-3-8B-shaped model) and simulates every step on Megatron's schedule with a step-time
model from the same FLOPs at ``--tflops`` per GPU plus ``--overhead-ms`` per micro-batch:

- ``default``: :func:`megatron_dpsched.build_dp_schedule` without a step-time model;
- ``step-time``: the same with ``step_time_model`` (spec step 7);
- ``exhaustive``: per step, the fastest of the default plan and, at every legal count from the
  aligned lower bound to one sample per micro-batch, both the plan of steps 3-4 at that count
  and the default's ranks repacked into it (each ordered as in step 6).

  With ``--kk-reference`` it also tries, at every legal count, plans dealt and packed by largest differencing
  (Karmarkar-Karp) under the cap, written apart from the planner (:mod:`kk_reference`; its plain deal is left out
  where samples times ranks pass ``PLAIN_LIMIT``, as at DP 512 with 32 samples per rank; the equal-count one stays).

  Every plan of the exhaustive search runs each rank's micro-batches in the fastest of four orders
  (cheapest at both ends, verl's, cost descending, cost ascending), written out here apart from the planner.

``--model workload`` balances and times verl's workload instead: a sample of ``L`` tokens costs
``c(L) = 24576 L + L^2`` and a micro-batch's forward takes the ``c`` of its samples plus ``o``, with
``o = s * c(2048)`` for each ``s`` of ``--overhead-scales`` (default ``1`` and ``0.1``). Besides the length
files, the synthetic sets of :func:`synthetic_pools` are planned (a heavy tail past the cap up to 32k tokens,
log-normal, bimodal, rare giants, RL rollouts with giants near the limit) unless ``--no-synthetic``.

It prints the summed step times, ``step-time / exhaustive`` summed and per step (worst and median per
layout, and over the heavy tail alone; targets for the worst step: <= 1.02 at PP=1, <= 1.05 with PP=4,
``--strict``: <= 1.01 and <= 1.03) and the planning time and peak traced memory of 65,536 samples on 512
ranks (targets: 0.15 CPU s at PP=1 without a step-time model, else 0.5 s; 300 MiB; the wall time is printed
too), with ``--million`` also of 1,000,000 samples on 1,024 ranks drawn from each length set, one line per set
(1.5 s at PP=1, 3 s at PP=4 VPP=2 with the step-time model). Misses are printed; the exit status is 0 whenever it ran
(``--check``: 1 on a miss)::

    .venv/bin/python scripts/bench_steptime.py --markdown docs/bench_steptime.md   # also write the docs page
    .venv/bin/python scripts/bench_steptime.py --model workload --dp 8 64 512 --strict
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from bench_common import DEFAULT_LENGTHS_DIR, length_files
from bench_schedule import heavy_tail
from kk_reference import kk_dealt_plans

from megatron_dpsched import CostModel, DPSchedule, build_dp_schedule
from megatron_dpsched.baselines import PLANNERS, breaks_cap
from megatron_dpsched.cli import read_lengths
from megatron_dpsched.core import StepTimeModel
from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.cost import sample_costs
from megatron_dpsched.core.objective import repack_ranks
from megatron_dpsched.core.planning import lower_bound_microbatches, plan_at_count

# --- an independent pipeline simulator (written apart from megatron_dpsched.core.steptime) --------------------------


def forward_seconds(batch_lengths: Sequence[int], model: StepTimeModel) -> float:
    """A micro-batch's whole-model forward: ``a * tokens + b * sum of squares + c``; an empty one runs one token."""
    if not batch_lengths:
        return model.seconds_per_token + model.seconds_per_token_pair + model.seconds_per_microbatch
    tokens = math.fsum(batch_lengths)
    squares = math.fsum(float(n) * n for n in batch_lengths)
    return model.seconds_per_token * tokens + model.seconds_per_token_pair * squares + model.seconds_per_microbatch


@functools.lru_cache(maxsize=256)
def pipeline_program(pp: int, vpp: int, group: int, count: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """Every op of one rank's step as ``(stage, forward?, micro-batch, virtual stage, dependency op or -1)``, in an
    order that runs each op after its dependency and after the op before it on its stage. Megatron's programme per
    stage: forwards go through the micro-batches group by group (``group`` micro-batches on chunk 0, then on chunk 1,
    ...; the last group may be short), backwards through the same list with the chunks mirrored; ``warm`` forwards
    first (``pp - s - 1``, interleaved ``2 (pp - s - 1) + (vpp - 1) group``, at most all), then one forward and one
    backward in turn, then the backwards left."""
    listing = [(m, chunk) for start in range(0, count, group) for chunk in range(vpp)
               for m in range(start, min(start + group, count))]
    programs = []
    for stage in range(pp):
        warm = pp - stage - 1 if vpp == 1 else 2 * (pp - stage - 1) + (vpp - 1) * group
        warm = min(warm, len(listing))
        fwd = [(1, m, chunk * pp + stage) for m, chunk in listing]
        bwd = [(0, m, (vpp - 1 - chunk) * pp + stage) for m, chunk in listing]
        ops = fwd[:warm]
        for j in range(len(listing) - warm):
            ops += [fwd[warm + j], bwd[j]]
        programs.append(ops + bwd[len(listing) - warm:])
    last = pp * vpp - 1
    index: dict[tuple[int, int, int], int] = {}
    out: list[tuple[int, int, int, int, int]] = []
    heads = [0] * pp
    while len(out) < sum(map(len, programs)):
        moved = False
        for stage in range(pp):
            while heads[stage] < len(programs[stage]):
                forward, m, virtual = programs[stage][heads[stage]]
                need = ((1, m, virtual - 1) if virtual else None) if forward else (
                    (1, m, last) if virtual == last else (0, m, virtual + 1))
                if need is not None and need not in index:
                    break
                index[(forward, m, virtual)] = len(out)
                out.append((stage, forward, m, virtual, -1 if need is None else index[need]))
                heads[stage] += 1
                moved = True
        assert moved, "the programme deadlocks"
    return tuple(out)


def independent_makespans(forward: np.ndarray, *, pp: int, vpp: int, group: int, backward_factor: float) -> np.ndarray:
    """Each rank's makespan (rows of ``forward``: its micro-batches' whole-model forward seconds in run order)."""
    ranks, count = forward.shape
    if pp == 1:
        return forward.sum(axis=1) * (1 + backward_factor)
    share = forward / (pp * vpp)
    program = pipeline_program(pp, vpp, group, count)
    ends = np.zeros((len(program), ranks))
    free = np.zeros((pp, ranks))
    for k, (stage, is_forward, m, _, need) in enumerate(program):
        start = free[stage] if need < 0 else np.maximum(free[stage], ends[need])
        ends[k] = free[stage] = start + (share[:, m] if is_forward else backward_factor * share[:, m])
    return free.max(axis=0)


def independent_seconds(plan: Sequence[RankPlan], sizes: Sequence[int], *, layout: PipelineLayout,
                        model: StepTimeModel) -> float:
    """A plan's step time in :func:`independent_makespans` (ranks lock-stepped: the slowest)."""
    count = max(len(rank) for rank in plan)
    assert all(len(rank) == count for rank in plan), "every rank runs the step's count"
    forward = np.array([[forward_seconds([sizes[i] for i in mb], model) for mb in rank] for rank in plan])
    return float(independent_makespans(forward, pp=layout.pp_size, vpp=layout.vpp_size, group=layout.group_size,
                                       backward_factor=model.backward_factor).max())


LLAMA3_8B = CostModel(
    hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
    ffn_hidden_size=14336, vocab_size=128256, swiglu=True,
)
LAYOUTS = ((1, 1), (4, 1), (4, 2))
TARGETS = {1: 1.02, 4: 1.05}
STRICT_TARGETS = {1: 1.01, 4: 1.03}
HEAVY_TAIL = "synthetic_heavy_tail"
WORKLOAD_FLOPS = 1e12
"""``--model workload``: seconds = workload / this (any scale gives the same ratios)."""


def workload(length: int) -> float:
    """verl's ``calculate_workload``: ``24576 L + L^2``."""
    return 24576.0 * length + float(length) * length


@dataclass(frozen=True, kw_only=True)
class Timing:
    """What a setting balances (``cost_model``) and how its steps are timed (``model``), with a label."""

    label: str
    cost_model: Callable[[int], float]
    model: StepTimeModel


@dataclass(frozen=True, kw_only=True)
class Row:
    """One setting: summed simulated step seconds and micro-batches per rank of each method."""

    dataset: str
    pp: int
    vpp: int
    dp: int
    cap: int
    timing: str
    seconds: dict[str, float]
    microbatches: dict[str, int]
    step_ratios: tuple[float, ...]
    """Per step: step-time / exhaustive."""
    default_ratios: tuple[float, ...] = ()
    """Per step: default (no step-time model: the micro-batches objective) / exhaustive."""
    peer_ratios: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Per peer (:data:`PEERS`, and ``kk_reference``): step-time / peer of every step where the peer keeps the cap."""

    @property
    def ratio(self) -> float:
        return self.seconds["step-time"] / self.seconds["exhaustive"]

    @property
    def worst_step(self) -> float:
        return max(self.step_ratios)


def timings(args: argparse.Namespace) -> list[Timing]:
    """The cost and step-time models of ``--model``."""
    if args.model == "llama3-8b":
        model = StepTimeModel.from_cost_model(LLAMA3_8B, flops_per_second=args.tflops * 1e12,
                                              seconds_per_microbatch=args.overhead_ms / 1000)
        return [Timing(label=f"o={args.overhead_ms:g}ms", cost_model=LLAMA3_8B, model=model)]
    return [Timing(label=f"o={scale:g}c(2048)", cost_model=workload,
                   model=StepTimeModel(seconds_per_token=24576 / WORKLOAD_FLOPS,
                                       seconds_per_token_pair=1 / WORKLOAD_FLOPS,
                                       seconds_per_microbatch=scale * workload(2048) / WORKLOAD_FLOPS))
            for scale in args.overhead_scales]


def step_seconds(plan: list[RankPlan], sizes: Sequence[int], *, config: ScheduleConfig, model: StepTimeModel) -> float:
    """Simulated time of one step's plan (sample ids index ``sizes``) in the bench's own simulator."""
    return independent_seconds(plan, sizes, layout=config.layout, model=model)


def plan_of_step(schedule: DPSchedule, step: int) -> list[RankPlan]:
    return [[list(mb) for mb in schedule.rank_step_micro_batches(r, step)] for r in range(schedule.dp_size)]


def reference_orders(rank: RankPlan, costs: Sequence[float]) -> list[RankPlan]:
    """A rank's micro-batches in four orders (written here apart from the planner's): ascending cost dealt to
    the front and the back (cheapest at both ends), verl's (descending, then ``[::2][::-1] + [1::2]``),
    descending and ascending."""
    ascending = sorted(rank, key=lambda mb: (sum(costs[i] for i in mb), sorted(mb)[:1]))
    descending = ascending[::-1]
    both_ends = ascending[0::2] + ascending[1::2][::-1]
    verl = descending[0::2][::-1] + descending[1::2]
    return [both_ends, verl, descending, ascending]


def fastest_orders(plan: list[RankPlan], sizes: Sequence[int], costs: Sequence[float], *, config: ScheduleConfig,
                   model: StepTimeModel) -> float:
    """The step time with every rank in its fastest reference order (ranks run apart: the step is the slowest),
    in the bench's own simulator (:func:`independent_makespans`), every order for all ranks at once."""
    if config.pp_size == 1:
        return step_seconds(plan, sizes, config=config, model=model)
    layout = config.layout
    orders = [reference_orders(rank, costs) for rank in plan]
    seconds = [independent_makespans(np.array([[forward_seconds([sizes[i] for i in mb], model) for mb in ranks[k]]
                                               for ranks in orders]), pp=layout.pp_size, vpp=layout.vpp_size,
                                     group=layout.group_size, backward_factor=model.backward_factor)
               for k in range(len(orders[0]))]
    return float(np.min(seconds, axis=0).max())


Step = tuple[list[RankPlan], list[int], list[float]]
"""One step's plan in local sample ids, with its sizes and costs."""


def local_step(plan: list[RankPlan], lengths: list[int], timing: Timing) -> Step:
    """A step's plan renumbered to local sample ids (sorted global ids), with the step's sizes and costs."""
    samples = sorted(i for rank in plan for mb in rank for i in mb)
    local = {sample: index for index, sample in enumerate(samples)}
    sizes = [lengths[i] for i in samples]
    costs = list(sample_costs(sizes, timing.cost_model))
    return [[[local[i] for i in mb] for mb in rank] for rank in plan], sizes, costs


def exhaustive_step(plan: list[RankPlan], lengths: list[int], *, config: ScheduleConfig, timing: Timing,
                    kk: bool = False) -> tuple[float, float | None]:
    """Fastest simulated time over every legal count (fresh plans and repacks of ``plan``, and with ``kk`` the
    plans of :func:`kk_reference.kk_dealt_plans`) and every order; and the fastest KK-dealt plan alone (``None``
    without ``kk``)."""
    default, sizes, costs = local_step(plan, lengths, timing)
    best = fastest_orders(default, sizes, costs, config=config, model=timing.model)
    lower = lower_bound_microbatches(sizes, config=config)
    top = config.layout.align(max(math.ceil(len(sizes) / config.dp_size), len(default[0])))
    for count in range(lower, top + 1):
        if not config.layout.is_legal(count):
            continue
        for candidate in (plan_at_count(sizes, costs, config=config, num_microbatches=count),
                          repack_ranks(default, sizes, config, count)):
            if candidate is not None:
                best = min(best, fastest_orders(candidate, sizes, costs, config=config, model=timing.model))
    if not kk or config.token_cap is None:
        return best, None
    dealt = kk_dealt_plans(sizes, costs, dp_size=config.dp_size, cap=config.token_cap, layout=config.layout,
                           lower_bound=lower)
    kk_best = min((fastest_orders(candidate, sizes, costs, config=config, model=timing.model) for candidate in dealt),
                  default=math.inf)
    return min(best, kk_best), kk_best


PEERS = ("slime_kk", "slime_strided", "verl", "nemo_rl", "megatron_lm_rl")
"""The peers' rewrites (:mod:`megatron_dpsched.baselines`) each step is compared with, in their own order."""


def peer_seconds(plan: list[RankPlan], lengths: list[int], *, config: ScheduleConfig,
                 timing: Timing) -> dict[str, float]:
    """Each peer's simulated step time on the samples of ``plan`` (one step), for the peers whose plan keeps the cap
    (a micro-batch of several samples over it is left out)."""
    _, sizes, costs = local_step(plan, lengths, timing)
    out = {}
    for name in PEERS:
        theirs = PLANNERS[name](list(range(len(sizes))), sizes=sizes, costs=costs, config=config)
        if not any(breaks_cap(mb, sizes, config.token_cap) for rank in theirs for mb in rank):
            out[name] = step_seconds(theirs, sizes, config=config, model=timing.model)
    return out


def run_setting(lengths: list[int], *, dataset: str, layout: tuple[int, int], dp: int, cap: int,
                timing: Timing, args: argparse.Namespace) -> Row:
    kwargs = dict(dp_size=dp, global_batch_size=args.samples_per_rank * dp, max_tokens_per_gpu=cap,
                  pp_size=layout[0], vpp_size=layout[1], cost_model=timing.cost_model)
    plans = {"default": build_dp_schedule(lengths, **kwargs),
             "step-time": build_dp_schedule(lengths, **kwargs, step_time_model=timing.model)}
    per_step: dict[str, list[float]] = {}
    for name, schedule in plans.items():
        per_step[name] = [step_seconds(plan_of_step(schedule, s), lengths, config=schedule.config, model=timing.model)
                          for s in range(schedule.num_steps)]
    default = plans["default"]
    searched = [exhaustive_step(plan_of_step(default, s), lengths, config=default.config, timing=timing,
                                kk=args.kk_reference) for s in range(default.num_steps)]
    per_step["exhaustive"] = [best for best, _ in searched]
    ratios = {name: tuple(ours / best for ours, best in zip(per_step[name], per_step["exhaustive"]))
              for name in plans}
    peers: dict[str, list[float]] = {}
    if args.peers:
        for s, ours in enumerate(per_step["step-time"]):
            for name, theirs in peer_seconds(plan_of_step(default, s), lengths, config=default.config,
                                             timing=timing).items():
                peers.setdefault(name, []).append(ours / theirs)
    if args.kk_reference:
        peers["kk_reference"] = [ours / kk for ours, (_, kk) in zip(per_step["step-time"], searched)]
    return Row(dataset=dataset, pp=layout[0], vpp=layout[1], dp=dp, cap=cap, timing=timing.label,
               seconds={name: sum(values) for name, values in per_step.items()},
               microbatches={name: sum(schedule.num_microbatches) for name, schedule in plans.items()},
               step_ratios=ratios["step-time"], default_ratios=ratios["default"],
               peer_ratios={name: tuple(values) for name, values in peers.items()})


PlanningTime = tuple[int, str, str, float, float, float]
"""``(samples, length set, label, CPU seconds, wall seconds, peak MiB)`` of one planning-time case."""
SPEED_TARGETS = {(65536, "PP=1 default"): 0.15, (1_000_000, "PP=1 default"): 1.5,
                 (1_000_000, "PP=4 VPP=2 step-time"): 3.0}
"""CPU seconds the planner should take (issue 19); every other 65,536-sample case: < 0.5 s."""
MEMORY_TARGET_MIB = 300.0
"""Peak traced memory of one planning run (``tracemalloc``)."""


def planning_time(first: tuple[str, list[int]], sets: dict[str, list[int]], *, args: argparse.Namespace,
                  repeats: int = 3) -> list[PlanningTime]:
    """Best-of planning time of 65,536 samples on 512 ranks (one step, cap 16384) drawn from the ``first`` length
    file, per objective and layout, and with ``--million`` of 1,000,000 samples on 1,024 ranks (PP=1 default,
    PP=4 VPP=2 step-time) drawn from each length set of ``sets``, each with
    the peak memory ``tracemalloc`` traces in one more run (traced runs are slower, so they are not timed).
    The planner runs on one thread, so on an idle machine CPU and wall time agree; on a shared one the CPU
    time is the figure that does not depend on the neighbours' load."""
    timing = timings(args)[0]
    model = timing.model
    runs = [(65536, 512, *first, [("PP=1 default", 1, 1, None), ("PP=1 step-time", 1, 1, model),
                                   ("PP=4 default", 4, 1, None), ("PP=4 step-time", 4, 1, model),
                                   ("PP=4 VPP=2 step-time", 4, 2, model)])]
    if args.million:
        runs += [(1_000_000, 1024, name, pool, [("PP=1 default", 1, 1, None), ("PP=4 VPP=2 step-time", 4, 2, model)])
                 for name, pool in sets.items()]
    out = []
    for samples, dp, name, pool, cases in runs:
        rng = random.Random(7)
        lengths = [rng.choice(pool) for _ in range(samples)]
        for label, pp, vpp, step_model in cases:
            kwargs = dict(dp_size=dp, global_batch_size=samples, max_tokens_per_gpu=16384, pp_size=pp, vpp_size=vpp,
                          cost_model=timing.cost_model, step_time_model=step_model)
            out.append((samples, name, label, *measure_planning(lengths, kwargs, repeats=repeats)))
    return out


def measure_planning(lengths: list[int], kwargs: dict, *, repeats: int) -> tuple[float, float, float]:
    """Best-of CPU and wall seconds of ``build_dp_schedule(lengths, **kwargs)``, and the peak MiB
    ``tracemalloc`` traces in one more (untimed) run."""
    cpu = wall = math.inf
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        build_dp_schedule(lengths, **kwargs)
        cpu, wall = min(cpu, time.process_time() - start_cpu), min(wall, time.perf_counter() - start)
    tracemalloc.start()
    build_dp_schedule(lengths, **kwargs)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return cpu, wall, peak


def markdown(rows: list[Row]) -> str:
    names = list(dict.fromkeys(name for r in rows for name in r.peer_ratios))
    lines = ["| lengths | PP | VPP | dp | cap | o | micro-batches default / step-time | step s default | "
             "step s step-time | step s exhaustive | step-time / exhaustive | worst step | default / step-time |"
             + "".join(f" worst / {name} |" for name in names),
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names)]
    for r in rows:
        s, m = r.seconds, r.microbatches
        peers = "".join(f" {max(r.peer_ratios[n]):.3f} |" if r.peer_ratios.get(n) else " - |" for n in names)
        lines.append(f"| {r.dataset} | {r.pp} | {r.vpp} | {r.dp} | {r.cap} | {r.timing} | {m['default']} / "
                     f"{m['step-time']} | {s['default']:.3f} | {s['step-time']:.3f} | {s['exhaustive']:.3f} | "
                     f"{r.ratio:.3f} | {r.worst_step:.3f} | {s['default'] / s['step-time']:.2f} |{peers}")
    return "\n".join(lines)


PEER_TOLERANCE = 0.005
"""A step is behind a peer when its simulated time is more than this share above the peer's."""


def peer_line(rows: list[Row]) -> str:
    """Per peer: the worst step-time / peer over ``rows``, and the steps behind it by more than
    :data:`PEER_TOLERANCE`."""
    names = dict.fromkeys(name for r in rows for name in r.peer_ratios)
    parts = []
    for name in names:
        ratios = [x for r in rows for x in r.peer_ratios.get(name, ())]
        behind = sum(1 for x in ratios if x > 1 + PEER_TOLERANCE)
        parts.append(f"{name} worst {max(ratios):.3f}, {behind} of {len(ratios)} steps behind by > 0.5%")
    return "; step-time / peer (capped plans): " + "; ".join(parts) if parts else ""


def targets(args: argparse.Namespace) -> dict[int, float]:
    return STRICT_TARGETS if args.strict else TARGETS


def layout_line(rows: list[Row], *, pp: int, vpp: int, target: float) -> str:
    steps = [ratio for r in rows for ratio in r.step_ratios]
    speedup = [r.seconds["default"] / r.seconds["step-time"] for r in rows]
    tail = [ratio for r in rows if r.dataset == HEAVY_TAIL for ratio in r.step_ratios]
    tail_text = f", heavy tail worst {max(tail):.3f}" if tail else ""
    plain = [ratio for r in rows for ratio in r.default_ratios]
    plain_tail = [ratio for r in rows if r.dataset == HEAVY_TAIL for ratio in r.default_ratios]
    plain_text = f", heavy tail worst {max(plain_tail):.3f}" if plain_tail else ""
    return (f"PP={pp} VPP={vpp}: step-time / exhaustive per step worst {max(steps):.3f}, median "
            f"{statistics.median(steps):.3f}{tail_text} (target {target}); default (micro-batches objective) / "
            f"exhaustive worst {max(plain):.3f}, median {statistics.median(plain):.3f}{plain_text}; default / "
            f"step-time {min(speedup):.2f}-{max(speedup):.2f}x over {len(rows)} settings{peer_line(rows)}.")


def summary(rows: list[Row], times: list[PlanningTime], args: argparse.Namespace) -> str:
    models = ("Llama-3-8B FLOPs at " f"{args.tflops:g} TFLOP/s per GPU plus {args.overhead_ms:g} ms per micro-batch"
              if args.model == "llama3-8b" else
              "verl's workload c(L) = 24576 L + L^2 per sample plus o per micro-batch")
    searched = "; the exhaustive search also tries KK-dealt plans" if args.kk_reference else ""
    parts = [f"Settings: {args.samples_per_rank} samples per rank, {args.steps} steps, {models}{searched}."]
    for label in dict.fromkeys(r.timing for r in rows):
        for pp, vpp in LAYOUTS:
            mine = [r for r in rows if (r.pp, r.vpp, r.timing) == (pp, vpp, label)]
            if mine:
                prefix = f"{label} " if args.model != "llama3-8b" else ""
                parts.append(prefix + layout_line(mine, pp=pp, vpp=vpp, target=targets(args)[pp]))
    for samples, name in dict.fromkeys((t[0], t[1]) for t in times):
        dp = 512 if samples == 65536 else 1024
        parts.append(f"Planning {samples:,} samples of {name} on {dp:,} ranks (cap 16384), best of 3, CPU seconds "
                     "(wall), peak traced MiB: " + ", ".join(f"{label} {cpu:.3f} s ({wall:.3f} s), {mib:.0f} MiB"
                                                            for n, set_, label, cpu, wall, mib in times
                                                            if (n, set_) == (samples, name))
                     + " (targets: " + ", ".join(f"{label} <= {goal} s" for (n, label), goal in SPEED_TARGETS.items()
                                                 if n == samples)
                     + (", others < 0.5 s" if samples == 65536 else "") + f", <= {MEMORY_TARGET_MIB:.0f} MiB).")
    return "\n".join(f"- {p}" for p in parts)


def misses(rows: list[Row], times: list[PlanningTime], args: argparse.Namespace) -> list[str]:
    goal = targets(args)
    out = [f"{r.dataset} PP={r.pp} VPP={r.vpp} dp={r.dp} cap={r.cap} {r.timing}: step-time / exhaustive worst step "
           f"{r.worst_step:.4f} > {goal[r.pp]}" for r in rows if r.worst_step > goal[r.pp]]
    out += [f"{r.dataset} PP={r.pp} VPP={r.vpp} dp={r.dp} cap={r.cap} {r.timing}: step-time / {name} worst step "
            f"{max(ratios):.4f} > {1 + PEER_TOLERANCE}" for r in rows for name, ratios in r.peer_ratios.items()
            if ratios and max(ratios) > 1 + PEER_TOLERANCE]
    for samples, name, label, cpu, _, mib in times:
        goal = SPEED_TARGETS.get((samples, label), 0.5 if samples == 65536 else math.inf)
        if cpu > goal:
            out.append(f"planning time {samples:,} samples of {name} {label}: {cpu:.3f} CPU s > {goal} s")
        if mib > MEMORY_TARGET_MIB:
            out.append(f"planning memory {samples:,} samples of {name} {label}: {mib:.0f} MiB > "
                       f"{MEMORY_TARGET_MIB:.0f} MiB")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths-dir", type=Path, default=DEFAULT_LENGTHS_DIR,
                        help="more length files (*.txt) besides the shipped ones (default: ../shared/data/lengths)")
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--caps", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--layouts", nargs="+", default=[f"{pp}x{vpp}" for pp, vpp in LAYOUTS],
                        choices=[f"{pp}x{vpp}" for pp, vpp in LAYOUTS], help="PPxVPP layouts to plan")
    parser.add_argument("--samples-per-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", choices=("llama3-8b", "workload"), default="llama3-8b",
                        help="what is balanced and timed: Llama-3-8B FLOPs, or verl's workload 24576 L + L^2")
    parser.add_argument("--tflops", type=float, default=400.0, help="llama3-8b: sustained TFLOP/s per GPU")
    parser.add_argument("--overhead-ms", type=float, default=10.0, help="llama3-8b: fixed forward ms per micro-batch")
    parser.add_argument("--overhead-scales", type=float, nargs="+", default=[1.0, 0.1],
                        help="workload: per-micro-batch forward time o = S * c(2048), one run per S")
    parser.add_argument("--synthetic", action=argparse.BooleanOptionalAction, default=True,
                        help="also plan the synthetic sets: a heavy tail past the cap (up to 32k tokens), log-normal, "
                             "bimodal, rare giants, RL rollouts with giants near the 4096 limit, rare giants past the "
                             "cap")
    parser.add_argument("--datasets", nargs="+", help="only these length sets (file stems or synthetic_* names)")
    parser.add_argument("--no-planning-time", dest="planning_time", action="store_false",
                        help="skip the 65,536-sample planning time")
    parser.add_argument("--million", action="store_true",
                        help="also time 1,000,000 samples on 1,024 ranks (PP=1 default, PP=4 VPP=2 step-time), "
                             "drawn from each length set (the files and the heavy tail, as --datasets selects)")
    parser.add_argument("--strict", action="store_true", help="targets 1.01 (PP=1) and 1.03 (PP=4) per step")
    parser.add_argument("--kk-reference", action="store_true",
                        help="the exhaustive search also tries plans dealt and packed by largest differencing under "
                             "the cap at every legal count (scripts/kk_reference.py)")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                        help="compare every step with the peers' rewrites that keep the cap (" + ", ".join(PEERS) + ")")
    parser.add_argument("--markdown", type=Path, help="also write the full table here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed (default: exit 0)")
    return parser.parse_args(argv)


def synthetic_pools(seed: int = 1234) -> dict[str, list[int]]:
    """Synthetic length sets: the heavy tail past the cap (``bench_schedule.heavy_tail``, up to 32k), a log-normal
    (median 1000), a bimodal (short answers and 3k reasoning traces), rare giants (2% of 3k-4k in short
    samples), RL rollouts with giants near the 4096 response limit (12% of samples in the top 8% below it) and rare
    giants past the cap (1% of 6k-24k in short samples)."""
    rng = random.Random(seed)
    clip = lambda x: max(16, min(4096, int(x)))  # noqa: E731
    return {
        "synthetic_heavy_tail": heavy_tail(20000, random.Random(seed)),
        "synthetic_lognormal": [clip(rng.lognormvariate(math.log(1000), 0.8)) for _ in range(20000)],
        "synthetic_bimodal": [clip(rng.gauss(300, 80) if rng.random() < 0.7 else rng.gauss(3000, 400))
                              for _ in range(20000)],
        "synthetic_rare_giants": [clip(rng.uniform(3000, 4096) if rng.random() < 0.02 else
                                       rng.lognormvariate(math.log(300), 0.6)) for _ in range(20000)],
        "synthetic_rl_giants": [clip(rng.uniform(3770, 4096) if rng.random() < 0.12 else
                                     rng.lognormvariate(math.log(800), 0.7)) for _ in range(20000)],
        "synthetic_giants_past_cap": [int(rng.uniform(6000, 24000)) if rng.random() < 0.01 else
                                      clip(rng.lognormvariate(math.log(300), 0.6)) for _ in range(20000)],
    }


def pools(args: argparse.Namespace) -> dict[str, list[int]]:
    """Length pools by name: the files, then (unless ``--no-synthetic``) :func:`synthetic_pools`."""
    out = {name: read_lengths(str(path)) for name, path in length_files(args.lengths_dir).items()}
    if args.synthetic:
        out.update(synthetic_pools())
    return {name: pool for name, pool in out.items() if not args.datasets or name in args.datasets}


def main(argv: list[str] | None = None, *, log: Callable[[str], None] = print) -> int:
    args = parse_args(argv)
    rows = []
    layouts = [tuple(int(x) for x in text.split("x")) for text in args.layouts]
    for name, pool in pools(args).items():
        for timing in timings(args):
            for layout in layouts:
                for dp in args.dp:
                    for cap in args.caps:
                        rng = random.Random(f"{name}-{dp}-{cap}")
                        lengths = [rng.choice(pool) for _ in range(args.samples_per_rank * dp * args.steps)]
                        rows.append(run_setting(lengths, dataset=name, layout=layout, dp=dp, cap=cap, timing=timing,
                                                args=args))
    first_name, first_path = next(iter(length_files(args.lengths_dir).items()))
    first = (first_name, read_lengths(str(first_path)))
    times = planning_time(first, pools(args), args=args) if args.planning_time else []
    table, text = markdown(rows), summary(rows, times, args)
    log(table + "\n\n" + text)
    if args.markdown:
        args.markdown.write_text(table + "\n\n" + text + "\n", encoding="utf-8")
    missed = misses(rows, times, args)
    log("targets: all met" if not missed else "targets missed:\n  " + "\n  ".join(missed))
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
