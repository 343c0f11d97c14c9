#!/usr/bin/env python
"""Measured step time, side by side: real Megatron ``train_step`` on gloo CPU processes under every plan.

For each setting (``--settings``: DP 2 x PP 2, PP 4, PP 2 x VPP 2, four processes each, by default; ``pp2`` and
``pp2_vpp2_dp1``, PP 2 and PP 2 x VPP 2 on one data-parallel rank, two processes each: one core per process on a
two-core machine) one launch of the setting's gloo processes builds a GPT with Megatron's real
``setup_model_and_optimizer`` and trains the same global batches
under every plan, each through the shipped-plan feed (``ScheduledDataIterator``, packed ``thd`` micro-batches):

- ``project``: this project's plan, as ``--dp-schedule`` makes it from the run's Megatron arguments (with
  ``--cost-model FILE``: from that calibrated cost-model file, as ``--dp-schedule-cost-model``);
- the peers' plans (:mod:`megatron_dpsched.baselines`): slime's Karmarkar-Karp deal, verl, NeMo-RL, Megatron-LM's
  RL packer, and with ``--megatron-lm-src`` Megatron-LM's ``DpBalancedScheduler`` run from that checkout (without
  it the script prints that it is skipped); a verl plan over the cap is trained as planned and marked;
- ``megatron_fixed``: Megatron's fixed micro-batches.

The plans take turns step by step (step ``s`` of every plan, in an order rotated by ``s``, a barrier before
each), so other processes' load on a shared machine falls on all plans alike; each process runs one torch
thread. Every rank records every step (:class:`~megatron_dpsched.megatron.step_recorder.StepRecorder`, as
``--step-stats-dir`` does). After the launch, per setting, ``megatron_dpsched.calibration.fit`` (as
``megatron-dpsched calibrate``, robust) fits the step-time model to the same run's records: per step and
data-parallel rank, the CPU seconds of its forward and backward work summed over its pipeline stages against the
micro-batch count, tokens and squared lengths (pipeline records cannot be fitted per stage by ``calibrate``,
which takes PP = 1 records; the sum over stages is the whole model's work, what the simulator splits over the
stages). Then per plan: the measured median step time (slowest rank's ``train_step`` wall time over the measured
steps), the simulator's prediction (``core/steptime.py``'s ``simulate_step`` with the fitted model), their ratio,
and the prediction bounded by the cores the processes share (the simulator gives every stage its own device);
the measured and simulated CPU work, and the project's speed-up over each plan, measured and simulated (the
median over the steps of the plan's step time over the project's on the same global batch, run seconds apart);
per setting: whether the plan simulated fastest by those paired figures is the one measured fastest, the rank
agreement (Kendall tau) of the two orders, each stage's share of the work and each process's share of a core.
It checks that every
plan trained every sample exactly once (from the step records' sample ids)::

    python scripts/bench_measured.py --megatron-lm-src ../Megatron-LM --out out/bench_measured   # ~10 min on 2 cores
    python scripts/bench_measured.py --out out/bench_measured --from-records   # the table again, from those records
    python scripts/bench_measured.py --settings pp2 pp2_vpp2_dp1 --steps 12 --out out/bench_measured_2   # one core each
    python scripts/bench_measured.py --quick          # DP 2 x PP 2 only, 3 small steps: a smoke run (the test's)

The figures of ``docs/bench_measured.md`` are from the first and the third command.

Figures are wall time on a shared machine: the load average before and after each launch is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "distributed"
sys.path[:0] = [str(REPO)]

from megatron_dpsched.core.schedule import DPSchedule  # noqa: E402

VOCAB = 64
"""The test harness's GPT vocabulary (token ids below it)."""
PEERS = ("slime_kk", "verl", "nemo_rl", "megatron_lm_rl")
DP_BALANCED = "megatron_dp_balanced"
FIXED = "megatron_fixed"
PROJECT = "project"


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One parallel layout (four processes in the default settings; two in the ``one_core_each`` ones)."""

    name: str
    dp: int
    pp: int
    vpp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.pp


SETTINGS = {s.name: s for s in (Setting(name="dp2_pp2", dp=2, pp=2), Setting(name="pp4", dp=1, pp=4),
                                Setting(name="pp2_vpp2", dp=2, pp=2, vpp=2), Setting(name="pp2", dp=1, pp=2),
                                Setting(name="pp2_vpp2_dp1", dp=1, pp=2, vpp=2))}
DEFAULT_SETTINGS = ("dp2_pp2", "pp4", "pp2_vpp2")
"""The issue's three layouts of four processes; ``pp2`` and ``pp2_vpp2_dp1`` run two processes, one core each on
a two-core machine (a device per stage, as the simulator assumes), where a quiet machine lets the wall-time order
of the plans be checked (only the packing, count and order differ there: one data-parallel rank)."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one launch trains (JSON to the spawned processes)."""

    setting: Setting
    lengths: list[int]
    global_batch_size: int
    cap: int
    hidden_size: int
    num_layers: int
    warmup_steps: int
    out: str
    megatron_lm_src: str | None = None
    cost_model: str | None = None
    plans: tuple[str, ...] = field(default=())

    @property
    def num_steps(self) -> int:
        return len(self.lengths) // self.global_batch_size


# --- the lengths ------------------------------------------------------------------------------------------------


def bimodal_lengths(count: int, *, seq_length: int, seed: int = 0) -> list[int]:
    """Short answers and long reasoning traces (70% around ``seq_length / 16``, 30% around ``3 seq_length / 4``),
    each a whole sample up to ``seq_length`` tokens: the bimodal set of the step-time bench, scaled to the run."""
    rng = random.Random(seed)
    short, long = seq_length / 16, 3 * seq_length / 4
    return [max(8, min(seq_length, int(rng.gauss(short, short / 4) if rng.random() < 0.7 else
                                       rng.gauss(long, long / 8)))) for _ in range(count)]


# --- inside the spawned processes -------------------------------------------------------------------------------


def megatron_argv(spec: RunSpec) -> list[str]:
    """The test harness's fp32 GPT flags (local layers, SGD, no dropout, ``--dp-schedule``), resized for the run,
    with the packed-attention test spec and the cap (later flags win in Megatron's parser)."""
    import harness

    s = spec.setting
    seq = str(max(spec.lengths))
    argv = harness.base_argv(train_iters=spec.num_steps * 16, extra=[
        "--num-layers", str(spec.num_layers), "--hidden-size", str(spec.hidden_size),
        "--num-attention-heads", str(max(1, spec.hidden_size // 64)), "--ffn-hidden-size", str(4 * spec.hidden_size),
        "--seq-length", seq, "--max-position-embeddings", seq, "--global-batch-size", str(spec.global_batch_size),
        "--lr", "1e-4", "--min-lr", "1e-4", "--pipeline-model-parallel-size", str(s.pp),
        "--dp-schedule-max-tokens-per-gpu", str(spec.cap), "--dp-schedule-collate-format", "thd",
        "--spec", *harness.STAND_IN_SPEC,
    ])
    if s.vpp > 1:
        argv += ["--num-layers-per-virtual-pipeline-stage", str(spec.num_layers // (s.pp * s.vpp))]
    if spec.cost_model:
        argv += ["--dp-schedule-cost-model", spec.cost_model]
    return argv


def build_plans(spec: RunSpec, setup: Any) -> tuple[dict[str, DPSchedule], dict[str, str]]:
    """Every plan of the run over the same lengths, and a note per plan (skipped, over the cap)."""
    from megatron_dpsched.baselines import build_baseline_schedule, cap_violations
    from megatron_dpsched.baselines.megatron_schedulers import (
        SchedulerRefused,
        build_scheduler_schedule,
        dp_balanced_step_plan,
    )
    from megatron_dpsched.core.cost import sample_costs
    from megatron_dpsched.core.schedule import plan_schedule

    config, lengths = setup.config, spec.lengths
    costs = sample_costs(lengths, setup.cost_model) if setup.cost_model is not None else None
    plans = {PROJECT: plan_schedule(lengths, config=config, cost_model=setup.cost_model)}
    notes: dict[str, str] = {}
    for name in PEERS:
        plans[name] = build_baseline_schedule(name, lengths, config=config, costs=costs)
    if spec.megatron_lm_src:
        try:
            plans[DP_BALANCED] = build_scheduler_schedule(dp_balanced_step_plan(spec.megatron_lm_src), lengths,
                                                          config=config, costs=costs or [float(n) for n in lengths])
        except SchedulerRefused as refusal:
            notes[DP_BALANCED] = f"refused by Megatron-LM's code ({refusal}): not trained"
    else:
        notes[DP_BALANCED] = "skipped: no --megatron-lm-src checkout given"
    plans[FIXED] = build_baseline_schedule(FIXED, lengths, config=config, costs=costs)
    for name, plan in list(plans.items()):
        over = cap_violations(plan)
        if over:  # trained as planned: the feed checks the plan against its own config's cap
            widest = max(sum(lengths[i] for i in mb) for r in range(plan.dp_size) for s in range(plan.num_steps)
                         for mb in plan.rank_step_micro_batches(r, s))
            plans[name] = DPSchedule.from_dict({**plan.to_dict(), "config": {
                **plan.to_dict()["config"], "max_tokens_per_gpu": widest}})
            notes[name] = f"{over} micro-batches over the cap of {spec.cap} (up to {widest} tokens), trained as planned"
    return plans, notes


def make_sample(lengths: Sequence[int]) -> Callable[[int], dict[str, Any]]:
    """Sample ``i``: ``lengths[i]`` arithmetic token ids below :data:`VOCAB` (content does not change the time)."""
    import torch

    def sample(sample_id: int) -> dict[str, Any]:
        n = lengths[sample_id]
        seq = (torch.arange(n + 1) * (1 + sample_id % 7) + sample_id) % (VOCAB - 1) + 1
        return {"tokens": seq[:-1], "labels": seq[1:]}

    return sample


class _Recorded:
    """The forward step: Megatron's scheduled GPT step, chunk 0's micro-batches seen by the active recorder."""

    def __init__(self) -> None:
        from megatron_dpsched.megatron.forward_step import ScheduledForwardStep

        self.recorder: Any = None
        self._forward = ScheduledForwardStep()

    def __call__(self, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
        chunk = getattr(getattr(data_iterator, "iterable", data_iterator), "chunk", 0)
        if chunk != 0:
            return self._forward(data_iterator, model)
        batch = next(data_iterator)
        self.recorder.on_batch(batch)
        return self._forward(iter([batch]), model)


def worker(rank: int, spec_path: str, init_file: str) -> None:
    """One process: Megatron set up on gloo, every plan trained in turn step by step, records written."""
    warnings.filterwarnings("ignore")
    sys.path[:0] = [str(REPO), str(HARNESS)]
    import harness
    import torch
    import torch.distributed as dist

    from megatron_dpsched.testing import cpu_shim

    data = json.loads(Path(spec_path).read_text())
    spec = RunSpec(**{**data, "setting": Setting(**data["setting"])})
    harness.env_for_rank(rank, spec.setting.world_size)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=spec.setting.world_size, timeout=timedelta(seconds=600))
    cpu_shim.install()
    torch.set_num_threads(1)
    args = harness.parse_megatron_args(megatron_argv(spec))
    harness.initialize(args)
    harness.install_hooks()
    try:
        train_plans(spec, args)
    finally:
        harness.remove_hooks()
        harness.teardown()
        dist.destroy_process_group()


def train_plans(spec: RunSpec, args: Any) -> None:
    """Megatron's real ``train_step`` for every step of every plan, the plans taking turns."""
    import harness
    import megatron.training.training as training
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from megatron_dpsched.megatron import ScheduledDataIterator, plan_setup_from_args
    from megatron_dpsched.megatron.provider import collate_config_from_args
    from megatron_dpsched.megatron.step_recorder import StepRecorder, record_steps

    model, optimizer, scheduler = harness.build_model_and_optimizer()
    setup = plan_setup_from_args(args, data_parallel_size=mpu.get_data_parallel_world_size())
    plans, notes = build_plans(spec, setup)
    out, rank = Path(spec.out), dist.get_rank()
    if rank == 0:
        (out / "plans.json").write_text(json.dumps({"plans": {n: p.to_dict() for n, p in plans.items()},
                                                    "notes": notes}))
    ranks = {"dp_rank": mpu.get_data_parallel_rank(), "pp_rank": mpu.get_pipeline_model_parallel_rank(),
             "tp_rank": 0, "dp_size": mpu.get_data_parallel_world_size(),
             "pp_size": mpu.get_pipeline_model_parallel_world_size(), "vpp_size": spec.setting.vpp,
             "tp_size": 1, "cp_size": 1}
    feeds = {name: ScheduledDataIterator(plan, rank=ranks["dp_rank"], samples=make_sample(spec.lengths),
                                         num_chunks=len(model), collate=collate_config_from_args(args),
                                         verify=args.dp_schedule_verify) for name, plan in plans.items()}
    iterators = {name: feed.megatron_iterators() for name, feed in feeds.items()}
    recorders = {name: StepRecorder(out / name, rank=rank, ranks=ranks) for name in plans}
    forward, config = _Recorded(), training_config(model, optimizer)
    forward_backward = training.get_forward_backward_func()
    names = list(plans)
    args.curr_iteration = args.iteration = 0
    for step in range(spec.num_steps):
        for name in names[step % len(names):] + names[: step % len(names)]:
            forward.recorder = recorders[name]
            record_steps(recorders[name])
            training.update_num_microbatches(args.consumed_train_samples, consistency_check=False)
            dist.barrier()
            training.train_step(forward, iterators[name], model, optimizer, scheduler, config, forward_backward)
            args.consumed_train_samples += plans[name].step_num_samples[step]
            args.curr_iteration = args.iteration = args.curr_iteration + 1
    record_steps(None)
    for feed in feeds.values():
        feed.close()


def training_config(model: list[Any], optimizer: Any) -> Any:
    """The model config as Megatron's ``train()`` sets it up before its first ``train_step``: training mode, the
    loss scale, the timers and ``finalize_model_grads`` (the data-parallel gradient all-reduce and the pipeline's
    embedding sync)."""
    from megatron.core.utils import get_model_config
    from megatron.training.global_vars import get_timers
    from megatron.training.training import finalize_model_grads

    for chunk in model:
        chunk.train()
    config = get_model_config(model[0])
    config.grad_scale_func = optimizer.scale_loss
    config.timers = get_timers()
    if config.finalize_model_grads_func is None:
        config.finalize_model_grads_func = finalize_model_grads
    return config


def launch(spec: RunSpec) -> None:
    """Spawn the setting's processes (gloo, file rendezvous) and wait for them."""
    import torch.multiprocessing as mp

    out = Path(spec.out).resolve()  # the rendezvous URL file:// needs an absolute path
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps({**spec.__dict__, "setting": spec.setting.__dict__, "plans": list(spec.plans)}))
    mp.start_processes(worker, args=(str(spec_path), str(out / "gloo_init")), nprocs=spec.setting.world_size,
                       start_method="spawn", join=True)


# --- after the launch: measured against simulated ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    """One plan of one setting."""

    setting: str
    plan: str
    micro_batches: float
    """Mean micro-batches per rank and step."""
    measured: float
    """Median over the measured steps of the slowest rank's ``train_step`` wall seconds."""
    predicted: float
    """Median over the same steps of the simulated step seconds (fitted model)."""
    core_bound: float
    """The prediction with the shared cores: ``max(simulated, summed work / cores)`` per step, median."""
    cpu: float
    """Median over the measured steps of the forward and backward CPU seconds summed over every process: the
    work done, whatever share of the cores the processes got."""
    work: float
    """Median over the same steps of the simulated work, ``(1 + k) * sum(F)`` over every rank."""
    trained_once: bool
    """Every sample of the run trained exactly once under this plan (the step records' sample ids)."""
    step_walls: tuple[float, ...] = ()
    """The slowest rank's ``train_step`` wall seconds of each measured step."""
    step_predicted: tuple[float, ...] = ()
    """The simulated seconds of each measured step."""
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


@dataclass(frozen=True, kw_only=True)
class SettingResult:
    setting: Setting
    rows: list[PlanRow]
    fit: dict[str, Any]
    untrained: dict[str, str]
    """Plans not trained and why (no checkout given, refused by the peer's code)."""
    cpu_share: float
    """CPU seconds over wall seconds of the processes' forward and backward work: the share of a core each got."""
    stage_shares: tuple[float, ...]
    """Each pipeline stage's share of the forward and backward CPU seconds (the simulator: ``1 / P`` each)."""
    load: tuple[float, float]
    """1-minute load average before and after the launch."""
    wall_s: float


def step_samples(records: list[dict[str, Any]], *, warmup_steps: int) -> list[Any]:
    """Calibration samples: per step and data-parallel rank, the CPU seconds of the forward and backward work
    summed over the pipeline stages (the whole model), with the rank's micro-batch count, tokens and squares."""
    from megatron_dpsched.calibration import StepSample

    by_key: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for record in records:
        if record["step"] >= warmup_steps:
            by_key.setdefault((record["step"], record["dp_rank"]), []).append(record)
    samples = []
    for (step, dp_rank), stages in sorted(by_key.items()):
        first = min(stages, key=lambda r: r["pp_rank"])
        samples.append(StepSample(rank=dp_rank, step=step, tokens=first["real_tokens"], sum_sq=first["sum_sq_lengths"],
                                  micro_batches=first["micro_batches"],
                                  seconds=sum(r["compute_cpu_s"] for r in stages)))
    return samples


def cpu_share(records: dict[str, list[dict[str, Any]]]) -> float:
    """The processes' forward-backward CPU seconds over their wall seconds, over every record."""
    every = [r for plan_records in records.values() for r in plan_records]
    return sum(r["forward_backward_cpu_s"] for r in every) / sum(r["forward_backward_s"] for r in every)


def paired_speedup(row: PlanRow, project: PlanRow, *, simulated: bool = False) -> float:
    """Median over the measured steps of ``row``'s step time over the project's on the same global batch (run
    side by side, so a load that changes over the run weighs on both); ``simulated``: of the predicted times."""
    pairs = zip(row.step_predicted, project.step_predicted) if simulated else zip(row.step_walls, project.step_walls)
    return statistics.median(ours / theirs for ours, theirs in pairs)


def stage_shares(records: dict[str, list[dict[str, Any]]]) -> tuple[float, ...]:
    """Each pipeline stage's share of the compute CPU seconds over every plan's records."""
    totals: dict[int, float] = {}
    for plan_records in records.values():
        for r in plan_records:
            totals[r["pp_rank"]] = totals.get(r["pp_rank"], 0.0) + r["compute_cpu_s"]
    whole = sum(totals.values())
    return tuple(totals[s] / whole for s in sorted(totals))


def trained_once(records: list[dict[str, Any]], num_samples: int) -> bool:
    """Every sample id trained exactly once (first pipeline stage's records over all data-parallel ranks)."""
    ids = sorted(i for r in records if r["pp_rank"] == 0 for mb in r.get("micro_batch_ids", []) for i in mb)
    return ids == list(range(num_samples))


def simulated(plan: DPSchedule, step: int, model: Any) -> tuple[float, float]:
    """The simulator's step seconds of ``plan``'s step, and the work it simulates (every rank's busy seconds)."""
    from megatron_dpsched.core import rank_forward_times, simulate_step

    times = [rank_forward_times([[plan.lengths[i] for i in mb] or [1] for mb in plan.rank_step_micro_batches(r, step)],
                                model=model) for r in range(plan.dp_size)]
    seconds = simulate_step(times, layout=plan.config.layout, model=model).seconds
    return seconds, (1 + model.backward_factor) * sum(sum(t) for t in times)


def analyse(spec: RunSpec, *, load: tuple[float, float], wall_s: float, cores: int) -> SettingResult:
    """Fit the step-time model to the run's records, then measured against predicted per plan."""
    from megatron_dpsched.calibration import COEFFICIENTS, fit
    from megatron_dpsched.megatron.step_recorder import load_step_records

    out = Path(spec.out)
    saved = json.loads((out / "plans.json").read_text())
    plans = {name: DPSchedule.from_dict(p) for name, p in saved["plans"].items()}
    records = {name: load_step_records(out / name) for name in plans}
    fitted = fit([s for name in plans for s in step_samples(records[name], warmup_steps=spec.warmup_steps)],
                 robust=True)
    model = fitted.step_time_model
    fitted.to_file().save(out / "cost_model.json")
    rows = []
    for name, plan in plans.items():
        steps = range(spec.warmup_steps, spec.num_steps)
        wall = {s: max(r["step_time_s"] for r in records[name] if r["step"] == s) for s in steps}
        sim = [simulated(plan, s, model) for s in steps]
        predicted = tuple(p for p, _ in sim)
        cpu = [sum(r["compute_cpu_s"] for r in records[name] if r["step"] == s) for s in steps]
        counts = [len(plan.rank_step_micro_batches(r, s)) for s in range(plan.num_steps) for r in range(plan.dp_size)]
        rows.append(PlanRow(setting=spec.setting.name, plan=name, micro_batches=statistics.fmean(counts),
                            measured=statistics.median(wall.values()),
                            predicted=statistics.median(predicted),
                            core_bound=statistics.median(max(p, w / cores) for p, w in sim),
                            cpu=statistics.median(cpu), work=statistics.median(w for _, w in sim),
                            trained_once=trained_once(records[name], len(spec.lengths)),
                            step_walls=tuple(wall.values()), step_predicted=predicted,
                            note=saved["notes"].get(name, "")))
    coefficients = {name: getattr(model, name) for name in COEFFICIENTS}
    return SettingResult(setting=spec.setting, rows=rows, stage_shares=stage_shares(records),
                         cpu_share=cpu_share(records),
                         untrained={name: note for name, note in saved["notes"].items() if name not in plans},
                         fit=dict(fitted.report) | coefficients, load=load, wall_s=wall_s)


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-a of two orders (1: the same order, -1: reversed)."""
    pairs = list(itertools.combinations(range(len(xs)), 2))
    score = sum(math.copysign(1, (xs[i] - xs[j]) * (ys[i] - ys[j])) if (xs[i] - xs[j]) * (ys[i] - ys[j]) else 0
                for i, j in pairs)
    return score / len(pairs) if pairs else 1.0


# --- report -----------------------------------------------------------------------------------------------------


def table(results: Sequence[SettingResult]) -> list[str]:
    lines = ["| setting | plan | micro-batches / rank | measured s | predicted s | measured / predicted | "
             "predicted on the cores s | measured / that | CPU s, all processes | simulated work s | "
             "project speed-up, measured | simulated | every sample once |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for result in results:
        project = next(r for r in result.rows if r.plan == PROJECT)
        for r in result.rows:
            speedup = " | " if r.plan == PROJECT else (f"{paired_speedup(r, project):.2f}x | "
                                                    f"{paired_speedup(r, project, simulated=True):.2f}x")
            name = r.plan + (f" ({r.note})" if r.note else "")
            lines.append(f"| {r.setting} | {name} | {r.micro_batches:.1f} | {r.measured:.3f} | {r.predicted:.3f} | "
                         f"{r.ratio:.2f} | {r.core_bound:.3f} | {r.measured / r.core_bound:.2f} | {r.cpu:.3f} | "
                         f"{r.work:.3f} | {speedup} | "
                         f"{'yes' if r.trained_once else 'NO'} |")
    return lines


def setting_lines(results: Sequence[SettingResult]) -> list[str]:
    """Per setting: the fastest plan measured and predicted, the rank agreement, the fit, the stage shares, the
    load."""
    return [setting_line(result) for result in results]


def setting_line(result: SettingResult) -> str:
    rows, fit = result.rows, result.fit
    project = next(r for r in rows if r.plan == PROJECT)
    relative = {key: [paired_speedup(r, project, simulated=key == "simulated") for r in rows]
                for key in ("measured", "simulated")}  # each plan's step time over the project's, per step
    fastest = {key: rows[values.index(min(values))].plan for key, values in relative.items()}
    tau = kendall_tau(relative["measured"], relative["simulated"])
    work_tau = kendall_tau([r.cpu for r in rows], [r.work for r in rows])
    shares = " / ".join(f"{x:.2f}" for x in result.stage_shares)
    return (f"- {result.setting.name}: per step, relative to the project's step, measured fastest "
            f"{fastest['measured']}, simulated fastest {fastest['simulated']} (Kendall tau of the two orders "
            f"{tau:.2f}); least CPU work measured {min(rows, key=lambda r: r.cpu).plan}, simulated "
            f"{min(rows, key=lambda r: r.work).plan} (tau {work_tau:.2f}); "
            f"fitted a = {fit['seconds_per_token'] * 1e6:.2f} us/token, "
            f"b = {fit['seconds_per_token_pair'] * 1e9:.3f} ns/token pair, "
            f"c = {fit['seconds_per_microbatch'] * 1e3:.2f} ms/micro-batch (forward; "
            f"R^2 {fit['r_squared'] or float('nan'):.3f}, mean error "
            f"{fit['mean_relative_error']:.1%}); CPU share per pipeline stage {shares} (simulated: "
            f"{1 / len(result.stage_shares):.2f} each); each process ran {result.cpu_share:.0%} of its "
            f"forward-backward wall time on a core; load average {result.load[0]:.2f} before, "
            f"{result.load[1]:.2f} after; launch {result.wall_s:.0f} s."
            + "".join(f" Not trained: {name}, {note}." for name, note in result.untrained.items()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(DEFAULT_SETTINGS))
    parser.add_argument("--steps", type=int, default=10, help="global batches per plan (the first --warmup-steps "
                        "are not measured)")
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=512, help="the longest sample")
    parser.add_argument("--cap", type=int, default=1024, help="--dp-schedule-max-tokens-per-gpu")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--megatron-lm-src", default=os.environ.get("DPSCHED_MEGATRON_LM_SRC"),
                        help="a Megatron-LM checkout: its DpBalancedScheduler joins "
                        "(default: $DPSCHED_MEGATRON_LM_SRC)")
    parser.add_argument("--cost-model", help="plan the project's plan from this cost-model file "
                        "(--dp-schedule-cost-model; from 'megatron-dpsched calibrate' or a previous run's out folder)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                        help="cores the processes share (the bound of the 'on the cores' prediction)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: DP 2 x PP 2 only, 3 steps of 8 samples, a small model")
    parser.add_argument("--out", type=Path, help="keep the records here (default: a temporary folder)")
    parser.add_argument("--markdown", type=Path, help="also write the table and the lines here")
    parser.add_argument("--from-records", action="store_true",
                        help="train nothing: analyse the records a previous run kept in --out (same size options)")
    args = parser.parse_args(argv)
    if args.quick:
        args.settings, args.steps, args.global_batch_size = ["dp2_pp2"], 3, 8
        args.seq_length, args.cap, args.hidden_size = 128, 256, 64
    if args.steps <= args.warmup_steps:
        parser.error("--steps must be larger than --warmup-steps")
    if args.from_records and args.out is None:
        parser.error("--from-records needs --out, the folder of a previous run")
    return args


def run(args: argparse.Namespace, out: Path) -> list[SettingResult]:
    """Launch and analyse every setting (with ``--from-records``: analyse the records kept in ``out``)."""
    lengths = bimodal_lengths(args.steps * args.global_batch_size, seq_length=args.seq_length)
    results = []
    for name in args.settings:
        folder = out / name
        spec = RunSpec(setting=SETTINGS[name], lengths=lengths, global_batch_size=args.global_batch_size,
                       cap=args.cap, hidden_size=args.hidden_size, num_layers=args.num_layers,
                       warmup_steps=args.warmup_steps, out=str(folder), megatron_lm_src=args.megatron_lm_src,
                       cost_model=args.cost_model)
        if not args.from_records:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            before, start = os.getloadavg()[0], time.perf_counter()
            launch(spec)
            (folder / "launch.json").write_text(json.dumps({"load": [before, os.getloadavg()[0]],
                                                            "wall_s": time.perf_counter() - start}))
        launched = json.loads((folder / "launch.json").read_text())
        results.append(analyse(spec, load=tuple(launched["load"]), wall_s=launched["wall_s"], cores=args.cores))
        print("\n".join(table(results[-1:])), file=sys.stderr, flush=True)  # progress; the full table at the end
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.megatron_lm_src:
        print(f"{DP_BALANCED}: skipped (no --megatron-lm-src checkout given)")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_measured_"))
    results = run(args, out)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores shared with other processes, "
               f"{platform.python_implementation()} {platform.python_version()}")
    text = "\n".join([*table(results), "", *setting_lines(results),
                      f"- machine: {machine}; {args.global_batch_size} samples per step, {args.steps} steps "
                      f"({args.warmup_steps} warm-up) per plan, GPT of {args.num_layers} layers x {args.hidden_size}, "
                      f"cap {args.cap}, lengths bimodal up to {args.seq_length}."])
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
