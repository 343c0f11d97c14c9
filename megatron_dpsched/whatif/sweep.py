"""Which cap? Plan one input at several token caps and compare them (pure Python, no torch).

``megatron-dpsched plan INPUT --max-tokens-per-gpu 4096,8192,16384 ...`` plans the input at every cap with
the what-if machinery (:func:`~.analysis.plan_ours`, :func:`~.analysis.compare`) and prints one line per
cap: dp-schedule's simulated step time (the sum over steps and the median step), micro-batches per DP rank
per step (median), token fill, the largest collated micro-batch (padding counted as collate adds it: the
memory a cap costs) and samples longer than the cap; then Megatron fixed's figures at that cap (its
micro-batch size: the largest Megatron accepts whose padded micro-batch of the longest sample fits the cap and
that leaves each rank at least PP micro-batches per step, see :func:`~.analysis.baseline_micro_batch_size`, or
``--baseline-micro-batch-size``) and dp-schedule's speedup over it.

The recommended cap (:func:`~.caps.recommend`): the fastest simulated total; of the caps within
:data:`~.caps.TIE_TOLERANCE` (1%) of it, the smallest, which needs the least memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from megatron_dpsched.whatif.analysis import OURS, PlanWarning, WhatIf, is_padded, largest_collated
from megatron_dpsched.whatif.caps import RULE, CapFigures, CapResult, recommend
from megatron_dpsched.whatif.report import header_lines, layout_title

COLUMNS = (
    "time: simulated forward-backward time summed over steps; step: the median step; mb: micro-batches per DP "
    "rank, median step; fill: real tokens that fit the cap / (mb x DP x cap); largest: the largest collated "
    "micro-batch in tokens, padding included; over: samples longer than the cap; mbs: Megatron fixed's "
    "micro-batch size; speedup: Megatron fixed's time (at that mbs) / dp-schedule's"
)


def strategy_figures(report: WhatIf, name: str) -> CapFigures:
    """Strategy ``name``'s figures in ``report`` (one cap)."""
    total = report.total(name)
    rows = [step.strategies[name] for step in report.steps]
    return CapFigures(
        seconds=total.seconds, median_step_seconds=statistics.median(row.seconds for row in rows),
        median_micro_batches=statistics.median(row.micro_batches for row in rows),
        micro_batches=total.micro_batches, token_fill=total.token_fill, padding_share=total.padding_share,
        largest_microbatch=largest_collated(report.schedules[name], simulation=report.simulation,
                                            padded=is_padded(name, report.simulation)),
    )


def cap_result(report: WhatIf) -> CapResult:
    """The sweep's line for one capped what-if report."""
    cap = report.config.max_tokens_per_gpu
    assert cap is not None and report.fixed_micro_batch_size is not None, "a sweep plans with token caps"
    over = next((w.count for w in report.warnings if w.kind == "over_cap"), 0)
    return CapResult(cap=cap, ours=strategy_figures(report, OURS), fixed=strategy_figures(report, "megatron_fixed"),
                     fixed_micro_batch_size=report.fixed_micro_batch_size, over_cap=over)


def parse_caps(text: str) -> tuple[int, ...]:
    """``4096`` or ``4096,8192,16384``: token caps, sorted, each once; ``ValueError`` names a bad one."""
    caps = set()
    for word in text.split(","):
        word = word.strip()
        try:
            cap = int(word)
        except ValueError:
            raise ValueError(f"expected an integer or a comma-separated list of integers, got {text!r}") from None
        if cap < 1:
            raise ValueError(f"must be >= 1, got {word!r}")
        caps.add(cap)
    return tuple(sorted(caps))


def sweep_lines(results: Sequence[CapResult], *, header: list[str]) -> Iterator[str]:
    """The table, a line at a time: ``header``, the column help, one line per cap, the recommendation."""
    best = recommend(results)
    slowest = max(max(r.ours.seconds, r.fixed.seconds) for r in results)
    unit, scale = ("s", 1.0) if slowest >= 1.0 else ("ms", 1e3)
    yield from header
    yield from textwrap.wrap("columns: " + COLUMNS, width=110, subsequent_indent="  ")
    ours = f"{'time ' + unit:>10s} {'step ' + unit:>9s} {'mb':>5s} {'fill%':>5s} {'largest':>8s} {'over':>5s}"
    fixed = f"{'mbs':>4s} {'time ' + unit:>10s} {'step ' + unit:>9s} {'mb':>5s} {'fill%':>5s} {'largest':>8s}"
    yield f"{'':8s} | {'dp-schedule':^{len(ours)}s} | {'Megatron fixed':^{len(fixed)}s} |"
    yield f"{'cap':>8s} | {ours} | {fixed} | speedup"
    for r in results:
        mark = "  <- recommended" if r.cap == best else ""
        yield (f"{r.cap:8d} | {_cells(r.ours, scale)} {r.over_cap:5d} | {r.fixed_micro_batch_size:4d} "
               f"{_cells(r.fixed, scale)} | {r.speedup:6.2f}x{mark}")
    yield f"{RULE}: --max-tokens-per-gpu {best}"


def _cells(figures: CapFigures, scale: float) -> str:
    return (f"{figures.seconds * scale:10.2f} {figures.median_step_seconds * scale:9.3f} "
            f"{figures.median_micro_batches:5.1f} {100 * figures.token_fill:5.1f} {figures.largest_microbatch:8d}")


def sweep_json(results: Sequence[CapResult], *, report: WhatIf, source: str, model_source: str,
               plots: list[str]) -> dict[str, Any]:
    """The machine-readable sweep (``--json``): the layout of ``report`` (any cap's), one entry per cap."""
    config = {key: value for key, value in asdict(report.config).items() if key != "max_tokens_per_gpu"}
    return {
        "input": source, "samples": len(report.schedules[OURS].lengths), "config": config,
        "simulation": {**asdict(report.simulation), "cost_model_source": model_source},
        "columns": COLUMNS, "rule": RULE, "recommended_cap": recommend(results),
        "caps": [{**asdict(r), "speedup": r.speedup} for r in results], "plots": plots,
    }


WhatIfBuilder = Callable[[argparse.Namespace], tuple[WhatIf, str, str]]
"""The command line's planner: arguments to (report, input description, model description)."""


def run_sweep(args: argparse.Namespace, *, caps: Sequence[int], what_if: WhatIfBuilder,
              warn: Callable[[Sequence[PlanWarning]], None]) -> int:
    """``megatron-dpsched plan`` with several caps: plan at each, print the table (or ``--json``), write
    ``sweep.png`` in ``--plot-dir`` and the recommended cap's plan to ``-o``."""
    reports = [what_if(argparse.Namespace(**{**vars(args), "max_tokens_per_gpu": cap})) for cap in caps]
    warnings = {w.message: w for report, _, _ in reports for w in report.warnings}
    warn(tuple(warnings.values()))
    results = [cap_result(report) for report, _, _ in reports]
    best = recommend(results)
    report, source, model_source = reports[[r.cap for r in results].index(best)]
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(report.schedules[OURS].to_dict(), handle)
    plots = []
    if args.plot_dir:
        from megatron_dpsched.whatif.plots import write_sweep_plot

        plots = [write_sweep_plot(results, args.plot_dir, title=_title(report, caps))]
    if args.json:
        document = sweep_json(results, report=report, source=source, model_source=model_source, plots=plots)
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    header = header_lines(report, source=source, model_source=model_source, caps=caps)
    sys.stdout.writelines(line + "\n" for line in sweep_lines(results, header=header))
    for path in plots:
        print(f"wrote {path}")
    if args.output:
        print(f"wrote {args.output} (the plan at --max-tokens-per-gpu {best})")
    return 0


def _title(report: WhatIf, caps: Sequence[int]) -> str:
    return f"{layout_title(report, caps=caps)}; {len(report.steps)} steps of {report.config.global_batch_size}"


__all__ = ["cap_result", "parse_caps", "run_sweep", "strategy_figures", "sweep_json", "sweep_lines"]
