"""The project's plans against the peers' REAL planners, run from their checkouts (``--slime-src`` etc.).

Each ``--*-src PATH`` names a checkout of a peer (slime, verl, NeMo-RL, Megatron-LM: its RL packer and
main's ``DpBalancedScheduler``); its own planner functions are imported from there (:mod:`peer_sources` says
which files and what stands in for imports that are not here; nothing of a peer is copied into this
repository). Hybrid CP's ``BalancedCPScheduler`` comes from the installed megatron-core: it joins when a
checkout is given (``--no-hybrid-cp``: never; ``--hybrid-cp``: also alone). Without any peer the script
says so and exits 0. Then it:

(a) checks each rewrite of :mod:`megatron_dpsched.baselines` against the real code on ``--rewrite-cases``
    random inputs (DP 1-8, 1-24 samples per rank, caps 64-4096, PP 1/2/4 x VPP 1/2): how many plans are
    identical, identical up to which rank holds which micro-batches, or different (with the first
    differing input and the largest difference in simulated step time, rewrite / real);
(b) plans the length sets (shipped and ``--lengths-dir`` files, and synthetic ones: :func:`synthetic_pools`)
    at each ``--dp`` (default 8 64; add 512 for the large run), cap 4096 and 16384, PP1, PP4 and PP4 x VPP2,
    ``--steps`` steps of ``--samples-per-rank`` samples per rank, with the project (``default``: no step-time
    model; ``step-time``: ``step_time_model`` given) and every peer, and simulates every step on Megatron's
    schedule (1F1B and interleaved, in ``bench_steptime``'s simulator written apart from the planner's) with
    verl's workload ``c(L) = 24576 L + L^2`` per sample plus ``o = c(2048)`` per micro-batch, and again with
    ``o`` ten times smaller (``--overhead-scales``); the project balances the same ``c``.

Per layout, objective and peer it prints the project's worst step and median step as project / peer
(> 1: the project is slower) and the steps it is behind by more than 0.5%. A peer step whose plan puts
more than the cap in a micro-batch of several samples is cap-breaking: it is counted apart (how many,
and how many of those are faster than the project's) and never as a win; a step the peer's code refuses
(it raises: a sample over the cap...) is counted as refused::

    .venv/bin/python scripts/bench_peers.py --slime-src ../slime --verl-src ../verl \\
        --nemo-rl-src ../RL --megatron-lm-src ../Megatron-LM            # ~5 min on one core
    .venv/bin/python scripts/bench_peers.py ... --dp 8 64 512 --check   # exit 1 if a capped peer step wins by > 0.5%

The source paths default to ``DPSCHED_SLIME_SRC``, ``DPSCHED_VERL_SRC``, ``DPSCHED_NEMO_RL_SRC`` and
``DPSCHED_MEGATRON_LM_SRC``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import DEFAULT_LENGTHS_DIR, length_files  # noqa: E402
from bench_steptime import WORKLOAD_FLOPS, independent_seconds, synthetic_pools, workload  # noqa: E402
from peer_sources import REWRITES, STAND_INS, PeerPlanner, PeerRefused, load_peers  # noqa: E402

from megatron_dpsched import build_dp_schedule  # noqa: E402
from megatron_dpsched.baselines import PLANNERS, breaks_cap  # noqa: E402
from megatron_dpsched.baselines.partition import pad_to_legal  # noqa: E402
from megatron_dpsched.cli import read_lengths  # noqa: E402
from megatron_dpsched.core import StepTimeModel  # noqa: E402
from megatron_dpsched.core.config import RankPlan, ScheduleConfig  # noqa: E402

TOLERANCE = 0.005
LAYOUTS = ((1, 1), (4, 1), (4, 2))
CAPS = (4096, 16384)
OBJECTIVES = ("default", "step-time")
SOURCES = {"slime": "DPSCHED_SLIME_SRC", "verl": "DPSCHED_VERL_SRC", "nemo_rl": "DPSCHED_NEMO_RL_SRC",
           "megatron_lm": "DPSCHED_MEGATRON_LM_SRC"}


# --- the comparison's logic (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PeerStep:
    """One step of one setting: the project's simulated seconds against one peer's."""

    layout: str
    setting: str
    step: int
    objective: str
    peer: str
    project: float
    peer_seconds: float | None
    """None: the peer's code refused the step."""
    cap_breaking: bool = False
    """The peer's plan holds more than the cap in a micro-batch of several samples."""

    @property
    def ratio(self) -> float:
        """Project / peer step time (> 1: the project is slower)."""
        assert self.peer_seconds is not None
        return self.project / self.peer_seconds


@dataclass(frozen=True, kw_only=True)
class Tally:
    """The steps of one (layout, objective, peer)."""

    steps: int
    compared: list[float] = field(default_factory=list)
    """Project / peer of every step the peer planned within the cap."""
    behind: int = 0
    """Compared steps where the project is slower by more than the tolerance."""
    cap_breaking: int = 0
    cap_breaking_faster: int = 0
    """Cap-breaking steps whose (cap-breaking) plan is faster than the project's by more than the tolerance."""
    refused: int = 0

    @property
    def worst(self) -> float | None:
        return max(self.compared) if self.compared else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.compared) if self.compared else None


def tally(rows: Sequence[PeerStep], *, tolerance: float = TOLERANCE) -> Tally:
    """Worst and median project / peer over the steps the peer planned within the cap; cap-breaking and refused
    steps counted apart, never as wins."""
    compared = [r.ratio for r in rows if r.peer_seconds is not None and not r.cap_breaking]
    breaking = [r for r in rows if r.peer_seconds is not None and r.cap_breaking]
    return Tally(steps=len(rows), compared=compared, behind=sum(1 for x in compared if x > 1 + tolerance),
                 cap_breaking=len(breaking), cap_breaking_faster=sum(1 for r in breaking if r.ratio > 1 + tolerance),
                 refused=sum(1 for r in rows if r.peer_seconds is None))


def losses(rows: Sequence[PeerStep], *, tolerance: float = TOLERANCE) -> list[PeerStep]:
    """The compared steps (within the cap) where the project is behind by more than ``tolerance``, worst first."""
    out = [r for r in rows if r.peer_seconds is not None and not r.cap_breaking and r.ratio > 1 + tolerance]
    return sorted(out, key=lambda r: -r.ratio)


def cap_breaking(plan: Sequence[RankPlan], lengths: Sequence[int], cap: int) -> bool:
    """Whether a micro-batch of two or more samples holds more than ``cap`` tokens (:func:`breaks_cap`)."""
    return any(breaks_cap(mb, lengths, cap) for rank in plan for mb in rank)


def plan_match(real: Sequence[RankPlan], rewrite: Sequence[RankPlan]) -> str:
    """``"identical"`` (same micro-batches, same ranks, same order), ``"rank order"`` (the same ranks, dealt to
    other rank ids) or ``"different"``. Samples within a micro-batch are a set."""
    def canonical(plan: Sequence[RankPlan]) -> list[tuple[frozenset[int], ...]]:
        return [tuple(frozenset(mb) for mb in rank) for rank in plan]

    ours, theirs = canonical(rewrite), canonical(real)
    if ours == theirs:
        return "identical"
    key = lambda rank: [sorted(mb) for mb in rank]  # noqa: E731
    return "rank order" if sorted(ours, key=key) == sorted(theirs, key=key) else "different"


# --- timing ---------------------------------------------------------------------------------------------------------


def workload_model(scale: float) -> StepTimeModel:
    """Forward seconds of a micro-batch: ``(c of its samples + scale * c(2048)) / WORKLOAD_FLOPS``."""
    return StepTimeModel(seconds_per_token=24576 / WORKLOAD_FLOPS, seconds_per_token_pair=1 / WORKLOAD_FLOPS,
                         seconds_per_microbatch=scale * workload(2048) / WORKLOAD_FLOPS)


def step_seconds(plan: Sequence[RankPlan], lengths: Sequence[int], *, config: ScheduleConfig,
                 model: StepTimeModel) -> float:
    """Simulated step time of a plan (sample ids index ``lengths``): the slowest rank on Megatron's schedule, in
    the benchmarks' own simulator (``bench_steptime.independent_seconds``, written apart from the planner's)."""
    return independent_seconds(plan, lengths, layout=config.layout, model=model)


# --- (a) rewrites against the real code -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RewriteCheck:
    peer: str
    cases: int
    refused: int
    counts: dict[str, int]
    worst_gap: float
    """Largest |rewrite / real - 1| of the simulated step time over the differing plans."""
    first: str | None
    """The first differing input, printable."""


def random_case(rng: random.Random) -> tuple[list[int], ScheduleConfig]:
    """A small random step: DP 1-8, 1-24 samples per rank, a cap of 64-4096, PP 1/2/4 with VPP 1/2, lengths
    log-normal about a fifth of the cap (a few over it in a tenth of the cases)."""
    dp = rng.choice((1, 2, 3, 4, 8))
    pp, vpp = rng.choice(((1, 1), (2, 1), (4, 1), (2, 2), (4, 2)))
    cap = rng.choice((64, 256, 1000, 4096))
    top = cap * (2 if rng.random() < 0.1 else 1)
    count = dp * rng.randint(1, 24)
    lengths = [max(1, min(top, int(rng.lognormvariate(math.log(cap / 5), 1.0)))) for _ in range(count)]
    config = ScheduleConfig(dp_size=dp, global_batch_size=count, max_tokens_per_gpu=cap, pp_size=pp, vpp_size=vpp)
    return lengths, config


def check_rewrite(peer: PeerPlanner, *, cases: int, seed: int = 0) -> RewriteCheck:
    """Run the peer's real planner and its rewrite on ``cases`` random steps and compare the plans."""
    rng = random.Random(f"{seed}-{peer.name}")
    model = workload_model(1.0)
    counts = {"identical": 0, "rank order": 0, "different": 0}
    refused, gap, first = 0, 0.0, None
    for _ in range(cases):
        lengths, config = random_case(rng)
        try:
            real = peer.plan(lengths, config=config)
        except PeerRefused:
            refused += 1
            continue
        costs = [workload(n) for n in lengths]
        rewrite = pad_to_legal(PLANNERS[REWRITES[peer.name]](list(range(len(lengths))), sizes=lengths, costs=costs,
                                                             config=config), config.layout)
        match = plan_match(real, rewrite)
        counts[match] += 1
        if match == "different":
            ratio = step_seconds(rewrite, lengths, config=config, model=model) / step_seconds(
                real, lengths, config=config, model=model)
            gap = max(gap, abs(ratio - 1))
            if first is None:
                first = (f"dp={config.dp_size} pp={config.pp_size} vpp={config.vpp_size} cap={config.token_cap} "
                         f"lengths={lengths} real={real} rewrite={rewrite} (rewrite / real step time {ratio:.4f})")
    return RewriteCheck(peer=peer.name, cases=cases, refused=refused, counts=counts, worst_gap=gap, first=first)


def rewrite_report(checks: Sequence[RewriteCheck]) -> list[str]:
    lines = ["Rewrites (megatron_dpsched.baselines) against the real code, random steps (DP 1-8, 1-24 samples per "
             "rank, caps 64-4096, PP 1/2/4 x VPP 1/2):"]
    for c in checks:
        planned = c.cases - c.refused
        lines.append(f"  {c.peer}: {planned} of {c.cases} planned by the real code ({c.refused} refused): "
                     f"{c.counts['identical']} identical, {c.counts['rank order']} same up to rank ids, "
                     f"{c.counts['different']} differ (largest step-time gap {c.worst_gap:.2%})")
        if c.first:
            lines.append(f"    first difference: {c.first[:600]}")
    return lines


# --- (b) the comparison on the length sets --------------------------------------------------------------------------


def pools(args: argparse.Namespace) -> dict[str, list[int]]:
    out = {name: read_lengths(str(path)) for name, path in length_files(args.lengths_dir).items()}
    out.update(synthetic_pools())
    return {name: pool for name, pool in out.items() if not args.datasets or name in args.datasets}


def layout_name(pp: int, vpp: int) -> str:
    return f"PP{pp}" + (f" x VPP{vpp}" if vpp > 1 else "")


class PeerCache:
    """Peer plans by what the peer's code reads of the layout (the VPP group size only when interleaved; PP only
    for a peer Megatron refuses with PP > 1), so PP1 and PP4 share one run of the peer's code. Each plan the peer
    makes is also checked against its rewrite in :mod:`megatron_dpsched.baselines` (``matches``: peer ->
    plan_match results)."""

    def __init__(self) -> None:
        self.plans: dict[tuple, list[RankPlan] | str] = {}
        self.matches: dict[str, list[str]] = {}
        self.not_run: set[str] = set()

    def plan(self, peer: PeerPlanner, lengths: list[int], config: ScheduleConfig) -> list[RankPlan] | str:
        layout = config.layout
        key = (peer.name, tuple(lengths), config.dp_size, config.token_cap,
               layout.group_size if layout.interleaved else None,
               config.pp_size > 1 and peer.pipeline_refusal is not None)
        if key not in self.plans:
            try:
                self.plans[key] = peer.raw_plan(lengths, config=config)
            except PeerRefused as exc:
                self.plans[key] = str(exc)
            else:
                self._check_rewrite(peer, lengths, config, self.plans[key])
        raw = self.plans[key]
        return raw if isinstance(raw, str) else pad_to_legal([[list(mb) for mb in r] for r in raw], layout)

    def _check_rewrite(self, peer: PeerPlanner, lengths: list[int], config: ScheduleConfig,
                       real: list[RankPlan]) -> None:
        if peer.name not in REWRITES:
            return
        rewrite = PLANNERS[REWRITES[peer.name]](list(range(len(lengths))), sizes=lengths,
                                                costs=[workload(n) for n in lengths], config=config)
        match = plan_match(pad_to_legal(real, config.layout), pad_to_legal(rewrite, config.layout))
        self.matches.setdefault(peer.name, []).append(match)


SLIME_FLOPS_STATES = 4_000_000
"""slime's ``balance_by_flops`` splits a step by Karmarkar-Karp into ``ceil(tokens / cap)`` parts with one
partial partition of that many parts per sample: above this many (samples x parts; DP 512 reaches ~65M) it
is not run (minutes and gigabytes per step), and the steps are listed as not run."""


def too_slow(peer: PeerPlanner, lengths: Sequence[int], config: ScheduleConfig) -> bool:
    return peer.name == "slime_flops" and len(lengths) * math.ceil(sum(lengths) / config.token_cap) > SLIME_FLOPS_STATES


def rewrite_on_steps(cache: PeerCache) -> str:
    """How the rewrites did on the comparison's own steps."""
    parts = [f"{peer} {matches.count('identical')} of {len(matches)} identical"
             + (f" ({len(matches) - matches.count('identical')} not)" if matches.count("identical") < len(matches)
                else "") for peer, matches in cache.matches.items()]
    return "Rewrites on the steps below that the real code planned: " + ", ".join(parts) + "."


def run_setting(lengths: list[int], *, setting: str, config: ScheduleConfig, peers: Sequence[PeerPlanner],
                model: StepTimeModel, cache: PeerCache) -> list[PeerStep]:
    """Every step of one setting: the project's two objectives against every peer."""
    options = dict(dp_size=config.dp_size, global_batch_size=config.global_batch_size,
                   max_tokens_per_gpu=config.max_tokens_per_gpu, pp_size=config.pp_size, vpp_size=config.vpp_size,
                   cost_model=workload)
    schedules = {"default": build_dp_schedule(lengths, **options),
                 "step-time": build_dp_schedule(lengths, step_time_model=model, **options)}
    gbs, layout = config.global_batch_size, layout_name(config.pp_size, config.vpp_size)
    rows = []
    for step in range(len(lengths) // gbs):
        ids = list(range(step * gbs, (step + 1) * gbs))
        sizes = [lengths[i] for i in ids]
        project = {}
        for objective, schedule in schedules.items():
            plan = [[list(mb) for mb in schedule.rank_step_micro_batches(r, step)] for r in range(config.dp_size)]
            assert sorted(i for rank in plan for mb in rank for i in mb) == ids
            project[objective] = step_seconds(plan, lengths, config=config, model=model)
        for peer in peers:
            if too_slow(peer, sizes, config):
                cache.not_run.add(f"{peer.name} {layout} {setting} step {step}")
                continue
            plan = cache.plan(peer, sizes, config)
            seconds = None if isinstance(plan, str) else step_seconds(plan, sizes, config=config, model=model)
            breaking = not isinstance(plan, str) and cap_breaking(plan, sizes, config.token_cap)
            rows += [PeerStep(layout=layout, setting=setting, step=step, objective=objective, peer=peer.name,
                              project=project[objective], peer_seconds=seconds, cap_breaking=breaking)
                     for objective in OBJECTIVES]
    return rows


def run_all(peers: Sequence[PeerPlanner], args: argparse.Namespace, *, scale: float, cache: PeerCache,
            log: Callable[[str], None]) -> list[PeerStep]:
    model, rows = workload_model(scale), []
    for name, pool in pools(args).items():
        for dp in args.dp:
            for cap in args.caps:
                rng = random.Random(f"{name}-{dp}-{cap}")
                gbs = args.samples_per_rank * dp
                lengths = [rng.choice(pool) for _ in range(gbs * args.steps)]
                for pp, vpp in args.layouts:
                    config = ScheduleConfig(dp_size=dp, global_batch_size=gbs, max_tokens_per_gpu=cap, pp_size=pp,
                                            vpp_size=vpp)
                    setting = f"{name} dp{dp} cap{cap}"
                    rows += run_setting(lengths, setting=setting, config=config, peers=peers, model=model,
                                        cache=cache)
                log(f"  planned {name} dp {dp} cap {cap}")
    return rows


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def comparison_table(rows: Sequence[PeerStep]) -> list[str]:
    lines = ["| layout | objective | peer | steps | worst (project / peer) | median | behind > 0.5% | "
             "cap-breaking (faster) | refused |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for layout in dict.fromkeys(r.layout for r in rows):
        for objective in OBJECTIVES:
            for peer in dict.fromkeys(r.peer for r in rows):
                t = tally([r for r in rows if (r.layout, r.objective, r.peer) == (layout, objective, peer)])
                lines.append(f"| {layout} | {objective} | {peer} | {t.steps} | {fmt(t.worst)} | {fmt(t.median)} | "
                             f"{t.behind} | {t.cap_breaking} ({t.cap_breaking_faster}) | {t.refused} |")
    return lines


def headline(rows: Sequence[PeerStep], *, label: str) -> list[str]:
    lines = []
    for objective in OBJECTIVES:
        mine = [r for r in rows if r.objective == objective]
        t = tally(mine)
        lines.append(f"{label} {objective}: behind a peer by > 0.5% on {t.behind} of {len(t.compared)} compared "
                     f"peer-steps (worst {fmt(t.worst)}, median {fmt(t.median)}); cap-breaking peer-steps "
                     f"{t.cap_breaking} ({t.cap_breaking_faster} faster, not counted); refused {t.refused}")
        for r in losses(mine)[:8]:
            lines.append(f"    {r.layout} {r.setting} step {r.step} vs {r.peer}: {r.ratio:.4f}")
    return lines


# --- command line ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for peer, variable in SOURCES.items():
        parser.add_argument(f"--{peer.replace('_', '-')}-src", dest=peer, type=Path, default=os.environ.get(variable),
                            help=f"a checkout of the peer (default ${variable})")
    parser.add_argument("--hybrid-cp", action=argparse.BooleanOptionalAction, default=None,
                        help="hybrid CP's BalancedCPScheduler, installed megatron-core (default: with a checkout)")
    parser.add_argument("--lengths-dir", type=Path, default=DEFAULT_LENGTHS_DIR)
    parser.add_argument("--datasets", nargs="+", help="only these length sets")
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64], help="DP sizes (add 512 for the large run)")
    parser.add_argument("--caps", type=int, nargs="+", default=list(CAPS))
    parser.add_argument("--layouts", nargs="+", default=[f"{pp}x{vpp}" for pp, vpp in LAYOUTS],
                        help="PPxVPP layouts (default 1x1 4x1 4x2)")
    parser.add_argument("--samples-per-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--overhead-scales", type=float, nargs="+", default=[1.0, 0.1],
                        help="per-micro-batch forward time o = S * c(2048), one run per S (default 1 and 0.1)")
    parser.add_argument("--rewrite-cases", type=int, default=300, help="random steps per rewrite check (0: skip)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the project is behind a peer's capped plan by > 0.5%% on some step")
    args = parser.parse_args(argv)
    args.layouts = [tuple(int(x) for x in text.split("x")) for text in args.layouts]
    return args


def main(argv: list[str] | None = None, *, log: Callable[[str], None] = print) -> int:
    args = parse_args(argv)
    sources = {peer: getattr(args, peer) for peer in SOURCES}
    hybrid_cp = any(sources.values()) if args.hybrid_cp is None else args.hybrid_cp
    peers = load_peers(sources, hybrid_cp=hybrid_cp)
    if not peers:
        log("no peer source given (--slime-src/--verl-src/--nemo-rl-src/--megatron-lm-src or "
            + "/".join(SOURCES.values()) + ", or --hybrid-cp): nothing to compare")
        return 0
    given = [peer for peer in SOURCES if sources[peer]] + (["hybrid_cp"] if hybrid_cp else [])
    log("Real planners: " + ", ".join(p.name for p in peers) + ". Not the peers' code: "
        + "; ".join(f"{peer}: {STAND_INS[peer]}" for peer in given) + ".")
    if args.rewrite_cases:
        log("\n".join(rewrite_report([check_rewrite(p, cases=args.rewrite_cases) for p in peers
                                      if p.name in REWRITES])))
    missed, cache = 0, PeerCache()  # the peers' plans do not depend on the timing: one run of their code
    for scale in args.overhead_scales:
        rows = run_all(peers, args, scale=scale, cache=cache,
                       log=lambda text: print(text, file=sys.stderr, flush=True))
        label = f"o={scale:g}c(2048)"
        log(f"\n{label}: project / peer simulated step time, {args.samples_per_rank} samples per rank, {args.steps} "
            f"steps per setting, DP {' '.join(map(str, args.dp))}, caps {' '.join(map(str, args.caps))}")
        log("\n".join(comparison_table(rows)))
        log("\n".join(headline(rows, label=label)))
        missed += len(losses([r for r in rows if r.objective == "step-time"]))
    log(rewrite_on_steps(cache))
    if cache.not_run:
        log(f"Not run (too slow, see SLIME_FLOPS_STATES): {len(cache.not_run)} peer-steps, e.g. {min(cache.not_run)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
