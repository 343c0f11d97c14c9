"""The side-by-side table and the JSON document of a :class:`~.analysis.WhatIf`."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from megatron_dpsched.whatif.analysis import (
    LABELS,
    OURS,
    Simulation,
    StepComparison,
    StrategyStep,
    StrategyTotal,
    WhatIf,
)
from megatron_dpsched.whatif.model import describe_model

COLUMNS_HELP = (
    "mb: micro-batches per DP rank; fill: token fill, the real tokens that fit the cap / (mb x DP x cap), "
    "100% = every micro-batch full; imb: imbalance, the busiest DP rank's FLOPs / the mean rank's - 1, in %; "
    "pad: padding share of the computed tokens, in %; time: simulated forward-backward step time; "
    "speedup: a baseline's time / dp-schedule's (Megatron fixed at the micro-batch size named above); "
    "*: Megatron refuses the step (see the warnings)"
)


def layout_title(report: WhatIf, *, caps: Sequence[int] = ()) -> str:
    """``DP 8, PP 2, VPP 1, CP 1, TP 1, cap 16384 tokens``: the layout in a line (plot titles, table header);
    ``caps`` (a sweep) replace the report's own cap."""
    config = report.config
    batching = (f"caps {', '.join(map(str, caps))} tokens/GPU" if caps
                else f"cap {config.max_tokens_per_gpu} tokens/GPU" if config.max_tokens_per_gpu is not None
                else f"micro-batch size {config.micro_batch_size}")
    return (f"DP {config.dp_size}, PP {config.pp_size}, VPP {config.vpp_size}, CP {config.cp_size}, "
            f"TP {report.simulation.tp_size}, {batching}")


def time_unit(report: WhatIf) -> tuple[str, float]:
    """Seconds, or milliseconds when every step is shorter than a second: the unit and the factor."""
    longest = max(step.strategies[name].seconds for step in report.steps for name in report.strategies)
    return ("s", 1.0) if longest >= 1.0 else ("ms", 1e3)


def _cells(row: StrategyStep | StrategyTotal, scale: float, *, capped: bool) -> str:
    fill = f"{100 * row.token_fill:5.1f}" if capped else "    -"
    return (f"{row.micro_batches:6d} {fill} {100 * row.imbalance:5.1f} {100 * row.padding_share:5.1f} "
            f"{row.seconds * scale:9.2f}")


SPEEDUP_HEADERS = {"megatron_fixed": "fixed", "per_rank_first_fit": "per-rank",
                   "megatron_dp_balanced": "DpBal.", "megatron_hybrid_cp": "hyb. CP"}
"""The speedup columns' headers (over which baseline); Megatron fixed's adds its micro-batch size."""


def speedup_header(report: WhatIf, name: str) -> str:
    """``fixed mbs 2``, ``per-rank``: the baseline a speedup column is measured against."""
    size = report.fixed_micro_batch_size
    return f"fixed mbs {size}" if name == "megatron_fixed" and size is not None else SPEEDUP_HEADERS[name]


def table_lines(report: WhatIf, *, header: list[str]) -> Iterator[str]:
    """The table, a line at a time: ``header`` lines, column groups, one line per step, the totals."""
    unit, scale = time_unit(report)
    names, baselines = report.strategies, report.strategies[1:]
    capped = report.config.token_cap is not None
    yield from header
    yield from textwrap.wrap("columns per strategy: " + COLUMNS_HELP, width=110, subsequent_indent="  ")
    cells = f"{'mb':>6s} {'fill%':>5s} {'imb%':>5s} {'pad%':>5s} {'time ' + unit:>9s}"
    groups = f"{'':13s}" + "".join(f" | {report.label(name):^{len(cells)}s}" for name in names)
    widths = [max(11, len(speedup_header(report, b))) for b in baselines]
    title = "speedup of dp-schedule over"
    yield groups + (f" | {title:^{sum(widths) + 3 * len(widths) - 2}s}".rstrip() if baselines else "")
    yield "step samples " + "".join(f" | {cells}" for _ in names) + "".join(
        f" | {speedup_header(report, b):>{width}s}" for b, width in zip(baselines, widths))
    unit_size = (report.config.micro_batch_size or 1) * report.config.dp_size
    for step in report.steps:
        mark = "*" if step.samples % unit_size else " "
        yield (f"{step.step:4d} {step.samples:7d}{mark}" + "".join(
            f" | {_cells(step.strategies[n], scale, capped=capped)}" for n in names)
            + "".join(f" | {step.speedup(b):{width - 1}.2f}x" for b, width in zip(baselines, widths)))
    samples = sum(step.samples for step in report.steps)
    yield (f"{'all':>4s} {samples:7d} " + "".join(f" | {_cells(report.total(n), scale, capped=capped)}"
                                                   for n in names)
           + "".join(f" | {report.total_speedup(b):{width - 1}.2f}x" for b, width in zip(baselines, widths)))
    yield ("all: micro-batches and times summed over steps, fill and padding over all tokens, imbalance the "
           "mean over steps")
    if baselines:
        yield from textwrap.wrap(speedup_sentence(report), width=110, subsequent_indent="  ")


def speedup_sentence(report: WhatIf) -> str:
    """The total speedups in words, each naming its baseline (Megatron fixed with its micro-batch size)."""
    parts = [f"{report.total_speedup(name):.2f}x over {against(report, name)}" for name in report.strategies[1:]]
    return f"dp-schedule's simulated time, all steps: {', '.join(parts)}"


def against(report: WhatIf, name: str) -> str:
    """The baseline ``name`` a speedup is measured against, in words."""
    size = report.fixed_micro_batch_size
    if name != "megatron_fixed" or size is None:
        return LABELS[name]
    return f"Megatron fixed at micro-batch size {size} ({_fixed_count(report)} per rank in a full step)"


def _fixed_count(report: WhatIf) -> str:
    """``4 micro-batches``: Megatron fixed's micro-batches per rank in a full step."""
    assert report.fixed_micro_batch_size is not None, "a report with Megatron fixed"
    count = report.config.global_batch_size // report.config.dp_size // report.fixed_micro_batch_size
    return f"{count} micro-batch{'' if count == 1 else 'es'}"


def header_lines(report: WhatIf, *, source: str, model_source: str, caps: Sequence[int] = ()) -> list[str]:
    """What was planned: input, layout, model, throughput (``caps``: a sweep's)."""
    config, simulation = report.config, report.simulation
    samples = len(report.schedules[OURS].lengths)
    return [
        f"input: {source}, {samples} samples; global batch {config.global_batch_size}, "
        f"{len(report.steps)} steps; balance {config.balance}",
        f"layout: {layout_title(report, caps=caps)}; packed micro-batches as {simulation.collate_format} "
        "(Megatron fixed: padded rows)",
        *_fixed_size(report, caps=caps),
        _model_line(simulation, model_source),
    ]


def _model_line(simulation: Simulation, model_source: str) -> str:
    """The model shape and throughput, or the measured step-time model of a cost-model file."""
    measured = simulation.step_time_model
    if measured is None:
        return (f"model: {describe_model(simulation.cost_model)} ({model_source}); "
                f"{simulation.flops_per_gpu / 1e12:g} TFLOP/s per GPU, "
                f"{simulation.seconds_per_microbatch * 1e3:g} ms per micro-batch")
    return (f"model: measured step-time model ({model_source}): forward {measured.seconds_per_token:.4g} s per "
            f"token + {measured.seconds_per_token_pair:.4g} s per sum(length^2) + "
            f"{measured.seconds_per_microbatch * 1e3:.4g} ms per micro-batch, backward x "
            f"{measured.backward_factor:g}")


FIXED_RULE = ("the largest Megatron accepts (global batch a multiple of size x DP) whose padded micro-batch of "
              "the longest sample fits the cap and that leaves each rank at least PP micro-batches per step")
"""Megatron fixed's default micro-batch size (:func:`~.analysis.baseline_micro_batch_size`), in words."""


def _fixed_size(report: WhatIf, *, caps: Sequence[int]) -> list[str]:
    """The header line naming Megatron fixed's micro-batch size (none without a cap: no baselines)."""
    chosen = ("given by --baseline-micro-batch-size" if report.fixed_size_given
              else f"{FIXED_RULE}; --baseline-micro-batch-size sets it")
    if caps:
        return [f"Megatron fixed: micro-batch size (column mbs): {chosen}"]
    size = report.fixed_micro_batch_size
    if size is None:
        return []
    return [f"Megatron fixed: micro-batch size {size} ({chosen}), {_fixed_count(report)} per rank in a full "
            "step; the speedups over it are against this size"]


def _strategy_json(row: StrategyStep | StrategyTotal) -> dict[str, Any]:
    data = asdict(row)
    data["padding_share"] = row.padding_share
    return data


def _step_json(step: StepComparison, baselines: tuple[str, ...]) -> dict[str, Any]:
    return {
        "step": step.step, "samples": step.samples, "tokens": step.tokens,
        "strategies": {name: _strategy_json(row) for name, row in step.strategies.items()},
        "speedup": {name: step.speedup(name) for name in baselines},
    }


def report_json(report: WhatIf, *, source: str, model_source: str, plots: list[str]) -> dict[str, Any]:
    """The machine-readable report (``--json``): layout, model, per-step figures, totals, warnings."""
    baselines = report.strategies[1:]
    return {
        "input": source,
        "samples": len(report.schedules[OURS].lengths),
        "config": asdict(report.config),
        "tp_size": report.simulation.tp_size,
        "megatron_fixed_micro_batch_size": report.fixed_micro_batch_size,
        "megatron_fixed_micro_batch_size_from": ("--baseline-micro-batch-size" if report.fixed_size_given
                                                 else FIXED_RULE) if report.fixed_micro_batch_size else None,
        "speedup_against": {name: against(report, name) for name in baselines},
        "simulation": {**asdict(report.simulation), "cost_model_source": model_source},
        "strategies": list(report.strategies),
        "columns": COLUMNS_HELP,
        "steps": [_step_json(step, baselines) for step in report.steps],
        "total": {
            "samples": sum(step.samples for step in report.steps),
            "strategies": {name: asdict(report.total(name)) for name in report.strategies},
            "speedup": {name: report.total_speedup(name) for name in baselines},
        },
        "warnings": [asdict(warning) for warning in report.warnings],
        "plots": plots,
    }

