"""PNGs of a what-if report: per-rank load of a step, micro-batch sizes, the pipeline timeline; a cap sweep.

matplotlib (the ``[demo]`` extra) is imported when a function here is called, with the Agg canvas,
never pyplot, so nothing global changes. Each function returns its figure for callers (and tests)
to inspect; :func:`write_plots` saves the three, :func:`write_sweep_plot` the sweep's.

Legible at any size: with more than :data:`RANK_BARS` DP ranks a per-rank panel draws the ranks sorted
by load as an area (its quantile curve) instead of one bar per rank; a timeline labels its ops with
micro-batch numbers only while they fit; with PP 1 (no pipeline to show) the timeline shows every DP
rank's simulated time against the step's, the wait for the slowest rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_dpsched.whatif.analysis import LABELS, OURS, WhatIf, is_padded, rank_seconds, rank_timeline
from megatron_dpsched.whatif.caps import RULE, CapResult, recommend
from megatron_dpsched.whatif.report import layout_title, time_unit

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


COLORS = {OURS: "tab:blue", "megatron_fixed": "tab:red", "per_rank_first_fit": "tab:green",
          "megatron_dp_balanced": "tab:purple", "megatron_hybrid_cp": "tab:orange"}
RANK_BARS = 32
"""Up to this many DP ranks a per-rank panel draws one bar per rank; above, the ranks sorted by load."""
LABELLED_OPS = 24
"""A timeline numbers its ops only when a stage runs at most this many."""


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ValueError(f"--plot-dir needs matplotlib (pip install 'megatron-dpsched[demo]'): {error}") from None
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_rank_load(report: WhatIf, step: int) -> Figure:
    """Real tokens and padding per DP rank stacked, one panel per strategy, shared token axis."""
    names = report.strategies
    figure = _figure(4.2 * len(names), 4.2)
    axes = figure.subplots(1, len(names), sharey=True, squeeze=False)[0]
    figure.suptitle(f"Per-rank load of step {step} ({layout_title(report)})")
    unit, scale = time_unit(report)
    for axis, name in zip(axes, names):
        row = report.steps[step].strategies[name]
        computed = [tokens + padding for tokens, padding in zip(row.rank_tokens, row.rank_padding)]
        _draw_ranks(axis, [row.rank_tokens, row.rank_padding], colors=[COLORS[name], "lightgrey"],
                    labels=["real tokens", "padding"], key=computed)
        axis.set_title(f"{report.label(name)}: {row.micro_batches} micro-batches/rank, "
                       f"{row.seconds * scale:.3g} {unit}", fontsize=9)
        axis.legend(loc="lower right", fontsize=8, framealpha=0.9)
    axes[0].set_ylabel("tokens computed")
    return figure


def _draw_ranks(axis: Axes, stacks: Sequence[Sequence[float]], *, colors: Sequence[str],
                labels: Sequence[str], key: Sequence[float]) -> None:
    """Per-rank values stacked: bars per rank up to :data:`RANK_BARS` ranks, else the ranks sorted by
    ``key`` as stacked areas (the load's quantile curve: the right end is the busiest rank)."""
    dp = len(stacks[0])
    if dp <= RANK_BARS:
        bottom = [0.0] * dp
        for values, color, label in zip(stacks, colors, labels):
            axis.bar(range(dp), values, bottom=bottom, color=color, label=label,
                     **({"hatch": "//", "edgecolor": "grey"} if color == "lightgrey" else {}))
            bottom = [b + v for b, v in zip(bottom, values)]
        axis.set_xticks(range(0, dp, 1 if dp <= 16 else 2))
        axis.set_xlabel("DP rank")
        return
    order = sorted(range(dp), key=key.__getitem__)
    order.append(order[-1])  # rank i spans [i, i + 1): the busiest rank keeps its width at the right end
    bottom = [0.0] * (dp + 1)
    for values, color, label in zip(stacks, colors, labels):
        top = [b + values[r] for b, r in zip(bottom, order)]
        axis.fill_between(range(dp + 1), bottom, top, step="post", color=color, label=label, linewidth=0,
                          **({"hatch": "//", "edgecolor": "grey"} if color == "lightgrey" else {}))
        bottom = top
    axis.axhline(max(key), color="black", linestyle=":", linewidth=1, label="busiest rank")
    axis.set_xlim(0, dp)
    axis.set_xlabel(f"{dp} DP ranks, sorted by load (quantiles)")
    axis.xaxis.get_major_locator().set_params(integer=True)


def plot_microbatch_sizes(report: WhatIf) -> Figure:
    """Histogram of real tokens per micro-batch over all steps, one outline per strategy, the cap marked."""
    figure = _figure(10.5, 4.5)
    axis = figure.subplots()
    cap = report.config.token_cap
    sizes = {name: _microbatch_tokens(report, name) for name in report.strategies}
    largest = max([cap or 1] + [max(values, default=1) for values in sizes.values()])
    bins = [largest * i / 40 for i in range(41)]
    for name, values in sizes.items():
        empty = sum(1 for value in values if value == 0)
        label = f"{report.label(name)} ({len(values)} micro-batches, {empty} empty)"
        axis.hist(values, bins=bins, histtype="step", linewidth=1.8, color=COLORS[name], label=label)
    if cap is not None:
        axis.axvline(cap, color="black", linestyle="--", label=f"token cap {cap}")
    axis.set_title(f"Micro-batch sizes, {len(report.steps)} steps ({layout_title(report)})", fontsize=10)
    axis.set_xlabel("real tokens per micro-batch")
    axis.set_ylabel("micro-batches (all ranks, all steps)")
    axis.yaxis.get_major_locator().set_params(integer=True)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def _microbatch_tokens(report: WhatIf, name: str) -> list[int]:
    schedule = report.schedules[name]
    lengths = schedule.lengths
    return [sum(lengths[schedule.partitions[rank][p]] for p in mb)
            for rank in range(schedule.dp_size) for mb in schedule.micro_batch_indices[rank]]


def plot_timeline(report: WhatIf, step: int) -> Figure:
    """Gantt chart of the slowest DP rank's forward and backward ops per pipeline stage, per strategy;
    with PP 1, :func:`plot_rank_times` instead."""
    if report.config.pp_size == 1:
        return plot_rank_times(report, step)
    names = report.strategies
    stages = report.config.pp_size
    figure = _figure(11, 1.0 + (0.55 * stages + 0.9) * len(names))
    axes = figure.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    figure.suptitle(f"Pipeline timeline of step {step}, slowest DP rank ({layout_title(report)})")
    unit, scale = time_unit(report)
    for axis, name in zip(axes, names):
        row = report.steps[step].strategies[name]
        timeline = rank_timeline(report.schedules[name], step, row.slowest_rank, simulation=report.simulation,
                                 padded=is_padded(name, report.simulation))
        _draw_gantt(axis, timeline.events, scale=scale)
        axis.set_title(f"{report.label(name)}: DP rank {row.slowest_rank}, {row.micro_batches} micro-batches, "
                       f"{row.seconds * scale:.3g} {unit} ({100 * timeline.bubble_fraction:.0f}% bubble)",
                       fontsize=9)
        axis.set_ylabel("pipeline stage")
        axis.set_yticks(range(stages))
        axis.set_ylim(stages - 0.5, -0.5)
    axes[-1].set_xlabel(f"time ({unit})")
    handles = [_patch("tab:blue", "forward"), _patch("tab:orange", "backward")]
    if report.config.vpp_size > 1:
        handles.append(_patch("lightgrey", "lighter: odd model chunks"))
    axes[0].legend(handles=handles, loc="upper right", fontsize=8)
    return figure


def _draw_gantt(axis: Axes, events: tuple, *, scale: float) -> None:
    span = max((event.end for stage in events for event in stage), default=1.0) * scale
    crowded = max((len(stage) for stage in events), default=0) > LABELLED_OPS
    for stage in events:
        for event in stage:
            color = "tab:blue" if event.kind == "F" else "tab:orange"
            alpha = 1.0 if event.chunk % 2 == 0 else 0.6
            start, width = event.start * scale, (event.end - event.start) * scale
            axis.broken_barh([(start, width)], (event.stage - 0.4, 0.8), facecolors=color, alpha=alpha,
                             edgecolor="white", linewidth=0.0 if crowded else 0.5)
            if not crowded and width > span / 40:
                axis.text(start + width / 2, event.stage, str(event.microbatch), ha="center", va="center",
                          fontsize=6, color="white")


def plot_rank_times(report: WhatIf, step: int) -> Figure:
    """Every DP rank's simulated time in ``step`` and the wait for the slowest, one panel per strategy
    (the timeline of PP 1, where a rank runs its micro-batches back to back)."""
    names = report.strategies
    figure = _figure(4.2 * len(names), 4.2)
    axes = figure.subplots(1, len(names), sharey=True, squeeze=False)[0]
    figure.suptitle(f"Simulated time of every DP rank in step {step}, which waits for the slowest rank\n"
                    f"({layout_title(report)})", fontsize=10)
    unit, scale = time_unit(report)
    for axis, name in zip(axes, names):
        row = report.steps[step].strategies[name]
        seconds = rank_seconds(report.schedules[name], step, simulation=report.simulation,
                               padded=is_padded(name, report.simulation))
        busy = [value * scale for value in seconds]
        waiting = [row.seconds * scale - value for value in busy]
        _draw_ranks(axis, [busy, waiting], colors=[COLORS[name], "lightgrey"],
                    labels=["forward-backward", "waiting for the slowest rank"], key=busy)
        idle = sum(waiting) / (len(busy) * row.seconds * scale) if row.seconds else 0.0
        axis.set_title(f"{report.label(name)}: {row.micro_batches} micro-batches/rank\n"
                       f"step {row.seconds * scale:.3g} {unit}, {100 * idle:.0f}% of GPU time waiting", fontsize=9)
        axis.legend(loc="lower right", fontsize=8, framealpha=0.9)
    axes[0].set_ylabel(f"time ({unit})")
    return figure


def _patch(color: str, label: str) -> object:
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)


def write_plots(report: WhatIf, directory: str, *, step: int) -> list[str]:
    """Save ``rank_load.png``, ``microbatch_sizes.png`` and ``timeline.png`` in ``directory``; their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "rank_load.png": plot_rank_load(report, step),
        "microbatch_sizes.png": plot_microbatch_sizes(report),
        "timeline.png": plot_timeline(report, step),
    }
    paths = []
    for name, figure in figures.items():
        figure.savefig(out / name, dpi=110)
        paths.append(str(out / name))
    return paths


def plot_sweep(results: Sequence[CapResult], *, title: str) -> Figure:
    """Per cap: simulated time, micro-batches, token fill and the largest collated micro-batch of
    dp-schedule and Megatron fixed (its micro-batch size written at each point); the recommended cap marked."""
    best = recommend(results)
    caps = [r.cap for r in results]
    slowest = max(max(r.ours.seconds, r.fixed.seconds) for r in results)
    unit, scale = ("s", 1.0) if slowest >= 1.0 else ("ms", 1e3)
    figure = _figure(11, 7.5)
    axes = figure.subplots(2, 2, sharex=True).ravel()
    figure.suptitle(f"Which cap? {title}\n{RULE}", fontsize=10)
    panels = (
        (f"simulated time, all steps ({unit})", lambda f: f.seconds * scale),
        ("micro-batches per DP rank, median step", lambda f: f.median_micro_batches),
        ("token fill (%)", lambda f: 100 * f.token_fill),
        ("largest collated micro-batch (tokens)", lambda f: f.largest_microbatch),
    )
    for axis, (label, value) in zip(axes, panels):
        axis.plot(caps, [value(r.ours) for r in results], "o-", color=COLORS[OURS], label=LABELS[OURS])
        axis.plot(caps, [value(r.fixed) for r in results], "s--", color=COLORS["megatron_fixed"],
                  label="Megatron fixed (mbs: micro-batch size)")
        axis.axvline(best, color="tab:green", linewidth=6, alpha=0.25, label=f"recommended cap {best}")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    for r in results:
        axes[0].annotate(f"mbs {r.fixed_micro_batch_size}", (r.cap, r.fixed.seconds * scale), fontsize=7,
                         textcoords="offset points", xytext=(4, 4), color=COLORS["megatron_fixed"])
    (cap_line,) = axes[3].plot(caps, caps, ":", color="black", label="the cap")
    for axis in axes:
        axis.set_ylim(0, axis.get_ylim()[1] * 1.08)  # room for the labels above the highest point
    for axis in axes[2:]:
        axis.set_xscale("log", base=2)
        axis.set_xticks(caps, [str(cap) for cap in caps])
        axis.minorticks_off()
        axis.set_xlabel("--max-tokens-per-gpu")
    axes[0].legend(fontsize=8, loc="lower left", framealpha=0.9)
    axes[3].legend(handles=[cap_line], fontsize=8, loc="upper left", framealpha=0.9)
    return figure


def write_sweep_plot(results: Sequence[CapResult], directory: str, *, title: str) -> str:
    """Save :func:`plot_sweep` as ``sweep.png`` in ``directory``; its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    plot_sweep(results, title=title).savefig(out / "sweep.png", dpi=110)
    return str(out / "sweep.png")
