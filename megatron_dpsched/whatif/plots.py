"""PNGs of a what-if report: per-rank load of a step, micro-batch sizes, the pipeline timeline.

matplotlib (the ``[demo]`` extra) is imported when a function here is called, with the Agg canvas,
never pyplot, so nothing global changes. Each function returns its figure for callers (and tests)
to inspect; :func:`write_plots` saves the three.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from megatron_dpsched.whatif.analysis import LABELS, OURS, WhatIf, is_padded, rank_timeline
from megatron_dpsched.whatif.report import layout_title, time_unit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {OURS: "tab:blue", "megatron_fixed": "tab:red", "per_rank_first_fit": "tab:green"}


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
    """Stacked bars per DP rank (real tokens, padding), one panel per strategy, shared token axis."""
    names = report.strategies
    figure = _figure(4.2 * len(names), 4.2)
    axes = figure.subplots(1, len(names), sharey=True, squeeze=False)[0]
    figure.suptitle(f"Per-rank load of step {step} ({layout_title(report)})")
    unit, scale = time_unit(report)
    for axis, name in zip(axes, names):
        row = report.steps[step].strategies[name]
        ranks = range(len(row.rank_tokens))
        axis.bar(ranks, row.rank_tokens, color=COLORS[name], label="real tokens")
        axis.bar(ranks, row.rank_padding, bottom=row.rank_tokens, color="lightgrey", hatch="//",
                 edgecolor="grey", label="padding")
        axis.set_title(f"{LABELS[name]}: {row.micro_batches} micro-batches/rank, "
                       f"{row.seconds * scale:.3g} {unit}", fontsize=9)
        axis.set_xlabel("DP rank")
        axis.set_xticks(list(ranks))
        axis.legend(loc="lower right", fontsize=8, framealpha=0.9)
    axes[0].set_ylabel("tokens computed")
    return figure


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
        label = f"{LABELS[name]} ({len(values)} micro-batches, {empty} empty)"
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
    """Gantt chart of the slowest DP rank's forward and backward ops per pipeline stage, per strategy."""
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
        axis.set_title(f"{LABELS[name]}: DP rank {row.slowest_rank}, {row.micro_batches} micro-batches, "
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


def _draw_gantt(axis: object, events: tuple, *, scale: float) -> None:
    span = max((event.end for stage in events for event in stage), default=1.0) * scale
    for stage in events:
        for event in stage:
            color = "tab:blue" if event.kind == "F" else "tab:orange"
            alpha = 1.0 if event.chunk % 2 == 0 else 0.6
            start, width = event.start * scale, (event.end - event.start) * scale
            axis.broken_barh([(start, width)], (event.stage - 0.4, 0.8), facecolors=color, alpha=alpha,
                             edgecolor="white", linewidth=0.5)
            if width > span / 60:
                axis.text(start + width / 2, event.stage, str(event.microbatch), ha="center", va="center",
                          fontsize=6, color="white")


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
