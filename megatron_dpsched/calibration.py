"""Fit the step-time model's coefficients to measured step records (``megatron-dpsched calibrate``).

The records are what ``scripts/pretrain_gpt_dpsched.py --step-stats-dir DIR`` writes
(``megatron_dpsched.megatron.step_recorder``): per rank and step, the micro-batch count ``M``, the sum of
the sample lengths ``T`` and of their squares ``S``, and the measured seconds of the rank's
forward and backward work (``compute_s``: Megatron's ``forward_backward_func`` without the
gradient reduction, which waits for the slowest rank). With one pipeline stage a rank runs
its micro-batches one after the other, so rule 1 of :mod:`megatron_dpsched.core.steptime` gives::

    t = sum over micro-batches of (1 + k) * (a * tokens + b * sum(length ** 2) + c)
      = (1 + k) * (a * T + b * S + c * M)

with ``k`` the backward factor (fixed, default 2: backward and forward are not told apart by
one time per step). :func:`fit` finds ``a, b, c >= 0`` by least squares on the relative error
(every step weighs the same whatever its length), optionally robust (Huber weights by
iteratively reweighted least squares), after dropping the first ``warmup_steps`` steps
(allocator and autotuning warm-up). With pipeline parallelism a step's time includes bubbles
that depend on the micro-batch order, so the fit takes PP=1 records only: calibrate on a
PP=1 run of the same model per stage; the planner's simulation adds the pipeline.

The non-negative least squares is SciPy's ``scipy.optimize.nnls`` (Lawson-Hanson active set), the standard
errors come from NumPy; both are imported when fitting (``pip install megatron-dpsched[calibrate]``), so
reading records and the rest of the package work without them. No torch.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_dpsched.core.cost import CostModel, CostModelFile
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import is_int, is_real

LENGTH_FIGURES = {"real": ("real_tokens", "sum_sq_lengths"), "padded": ("padded_tokens", "padded_sum_sq")}
PART_COLUMNS = {"real": (0, 1), "padded": (2, 3)}
"""``--lengths``: the columns of ``micro_batch_figures``; ``micro_batch_seconds`` holds ``[wall, CPU]``."""
PART_CLOCKS = {"compute": 0, "compute-cpu": 1}
"""``--lengths``: the record fields of ``T`` and ``S``; ``real`` is what the planner sees, ``padded`` what the
micro-batch tensors hold (padding included)."""
TIME_FIELDS = {"compute": "compute_s", "forward-backward": "forward_backward_s", "compute-cpu": "compute_cpu_s"}
"""``--time``: the record field fitted (``compute-cpu``: CPU seconds of the training thread, for CPU runs on a
shared machine, where wall time also counts other processes' turns on the cores)."""
HUBER_K = 1.345
"""Huber threshold in robust standard deviations (95% efficiency under Gaussian noise)."""


@dataclass(frozen=True, kw_only=True)
class StepSample:
    """One rank's figures of one step."""

    rank: int
    """Global rank of the record."""
    step: int
    """Step index within the run (0 = first trained step)."""
    tokens: int
    """``T``: sum of the rank's sample lengths in the step."""
    sum_sq: int
    """``S``: sum of their squares."""
    micro_batches: int
    """``M``: micro-batches the rank ran."""
    seconds: float
    """Measured seconds."""
    parts: tuple[tuple[int, int, float], ...] = ()
    """Per micro-batch ``(tokens, sum of squared lengths, measured seconds)``, when recorded: many more, and
    more varied, rows for the fit than one per step (the step's seconds also count its first micro-batch's
    loading, which the parts leave out)."""


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    """Fitted coefficients and how well they predict the samples they were fitted on."""

    step_time_model: StepTimeModel
    """``a``, ``b``, ``c`` as fitted (seconds per token, per unit of ``sum(length ** 2)``, per micro-batch of
    one forward) and ``k``, the backward factor, as given (not fitted)."""
    report: Mapping[str, Any]
    """``n``, ``r_squared``, relative errors (``mean``, ``max``, per rank) and the options of the fit."""

    def predict(self, sample: StepSample) -> float:
        """Predicted seconds of ``sample``'s step on its rank."""
        model = self.step_time_model
        return (1 + model.backward_factor) * (model.seconds_per_token * sample.tokens
                                              + model.seconds_per_token_pair * sample.sum_sq
                                              + model.seconds_per_microbatch * sample.micro_batches)

    def to_file(self, *, cost_model: CostModel | None = None) -> CostModelFile:
        """The cost-model file ``--dp-schedule-cost-model`` and ``megatron-dpsched plan --cost-model`` load."""
        return CostModelFile(step_time=self.step_time_model, cost_model=cost_model, fit=dict(self.report))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Step records of a ``--step-stats-dir`` folder (every ``rank*.jsonl``) or of one JSONL file; a second
    record of one (rank, step) is refused naming both places (two runs recorded into one folder)."""
    return load_records(path)[0]


def load_records(path: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`read_records`' records and where each is (``file:line``, for the checks' messages)."""
    source = Path(path)
    files = sorted(source.glob("rank*.jsonl")) if source.is_dir() else [source]
    if not files or not files[0].exists():
        raise ValueError(f"{path}: no step records (a --step-stats-dir folder of rank*.jsonl files, or one file)")
    records: list[dict[str, Any]] = []
    places: list[str] = []
    seen: dict[tuple[Any, Any], str] = {}
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{file} is not a text file of JSON step records") from None
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{file}:{number} is not a JSON step record ({error.msg})") from None
                except RecursionError:
                    raise ValueError(f"{file}:{number} nests JSON too deeply to be a step record") from None
                places.append(f"{file}:{number}")
                _check_once(records[-1], seen, where=places[-1])
    return records, places


def _check_once(record: object, seen: dict[tuple[Any, Any], str], *, where: str) -> None:
    """Refuse a second record of one ``(rank, step)``, naming where both are."""
    key = _rank_step(record)
    if key is None:
        return
    if key in seen:
        raise ValueError(f"{seen[key]} and {where} both hold rank {key[0]} step {key[1]}: two runs recorded into one "
                         "folder? calibrate one run's records (a fresh --step-stats-dir per run)")
    seen[key] = where


def _rank_step(record: object) -> tuple[Any, Any] | None:
    """A record's ``(rank, step)`` when both are integers (else the record's own check names the field)."""
    if not isinstance(record, Mapping) or not is_int(record.get("rank")) or not is_int(record.get("step")):
        return None
    return record["rank"], record["step"]


def samples_from_records(
    records: Iterable[Mapping[str, Any]], *, warmup_steps: int = 2, lengths: str = "real", time: str = "compute",
    places: Sequence[str] | None = None,
) -> list[StepSample]:
    """The fit's samples: PP=1 records from step ``warmup_steps`` on; an impossible record is refused naming
    its place (``places[i]``, :func:`load_records`' ``file:line``; default ``step record i``)."""
    if lengths not in LENGTH_FIGURES:
        raise ValueError(f"--lengths must be one of {', '.join(LENGTH_FIGURES)}, got {lengths!r}")
    if time not in TIME_FIELDS:
        raise ValueError(f"--time must be one of {', '.join(TIME_FIELDS)}, got {time!r}")
    tokens, squares = LENGTH_FIGURES[lengths]
    fields = ("rank", "step", "micro_batches", tokens, squares, TIME_FIELDS[time])
    samples = []
    seen: dict[tuple[Any, Any], str] = {}
    for index, record in enumerate(records):
        where = places[index] if places is not None else f"step record {index}"
        _check_once(record, seen, where=where)
        if not isinstance(record, Mapping):
            raise ValueError(f"{where} is a {type(record).__name__}, not a JSON object")
        missing = [name for name in fields if record.get(name) is None]
        if missing:
            raise ValueError(f"{where} has no {missing[0]!r}: records from an older version or a step "
                             "that did not run forward_backward_func; record again with --step-stats-dir")
        _check_record(where, record, counts=fields[:5], seconds=fields[5])
        _check_possible(where, record, figures=(tokens, squares))
        if record.get("pp_size", 1) != 1:
            raise ValueError(f"{where} is from a run with pp_size={record['pp_size']!r}; calibrate fits "
                             "PP=1 runs (pipeline bubbles depend on the order), record a PP=1 run")
        if record["step"] >= warmup_steps:
            samples.append(StepSample(rank=record["rank"], step=record["step"], tokens=record[tokens],
                                      sum_sq=record[squares], micro_batches=record["micro_batches"],
                                      seconds=float(record[TIME_FIELDS[time]]),
                                      parts=_parts(record, lengths=lengths, time=time)))
    return samples


MAX_FIGURE = 2.0**63
"""Figures above this are not step figures (and would overflow the fit's floats)."""


def _check_record(where: str, record: Mapping[str, Any], *, counts: Sequence[str], seconds: str) -> None:
    """Counts are integers >= 0, the time a finite number >= 0, the per-micro-batch rows lists of such."""
    for name in counts:
        value = record[name]
        if not _is_count(value):
            raise ValueError(f"{where}: {name} must be an integer >= 0, got {_short(value)}")
    if not _is_seconds(record[seconds]):
        raise ValueError(f"{where}: {seconds} must be a finite number of seconds >= 0, "
                         f"got {_short(record[seconds])}")
    for name, width, check in (("micro_batch_figures", 4, _is_count), ("micro_batch_seconds", 2, _is_seconds)):
        rows = record.get(name)
        if rows is not None and (not isinstance(rows, list) or not all(
                isinstance(row, list) and len(row) >= width and all(check(v) for v in row) for row in rows)):
            raise ValueError(f"{where}: {name} must be a list of rows of {width} or more numbers >= 0"
                             f"{_first_bad(rows, check)}")


def _first_bad(rows: object, check: Any) -> str:
    """``(row 2 holds -5)``: the first value of ``rows`` that ``check`` refuses, where there is one."""
    for number, row in enumerate(rows if isinstance(rows, list) else []):
        for value in row if isinstance(row, list) else []:
            if not check(value):
                return f" (row {number} holds {_short(value)})"
    return ""


def _check_possible(where: str, record: Mapping[str, Any], *, figures: tuple[str, str]) -> None:
    """Refuse figures no step can have: a sum of squared lengths below the token count (every sample of ``n``
    tokens adds ``n^2 >= n``), in the record or in a per-micro-batch row, and tokens without a micro-batch."""
    tokens, squares = figures
    pairs = [(f"{tokens} {record[tokens]}", f"{squares} {record[squares]}", record[tokens], record[squares])]
    for number, row in enumerate(record.get("micro_batch_figures") or []):
        pairs += [(f"micro_batch_figures row {number}: tokens {row[t]}", f"sum of squares {row[s]}", row[t], row[s])
                  for t, s in PART_COLUMNS.values()]
    for token_text, square_text, total, square in pairs:
        if square < total:
            raise ValueError(f"{where}: {square_text} is below the token count ({token_text}): no step has that, "
                             "every sample of n tokens adds n^2 >= n to it; these are not records --step-stats-dir "
                             "writes")
    if record[tokens] > 0 and record["micro_batches"] == 0:
        raise ValueError(f"{where}: {tokens} {record[tokens]} in 0 micro-batches: no step trains tokens without a "
                         "micro-batch; these are not records --step-stats-dir writes")


def _is_count(value: object) -> bool:
    return is_int(value) and 0 <= value < MAX_FIGURE


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_seconds(value: object) -> bool:
    return is_real(value) and math.isfinite(value) and 0 <= value < MAX_FIGURE


def _parts(record: Mapping[str, Any], *, lengths: str, time: str) -> tuple[tuple[int, int, float], ...]:
    """The record's per-micro-batch rows, ``()`` where it has none (or for ``--time forward-backward``)."""
    figures, seconds = record.get("micro_batch_figures"), record.get("micro_batch_seconds")
    if time not in PART_CLOCKS or not figures or not seconds or len(figures) != len(seconds):
        return ()
    t, s = PART_COLUMNS[lengths]
    clock = PART_CLOCKS[time]
    return tuple((int(f[t]), int(f[s]), float(w[clock])) for f, w in zip(figures, seconds, strict=True))


def fit(
    samples: Sequence[StepSample], *, backward_factor: float = 2.0, robust: bool = False, iterations: int = 20
) -> CalibrationFit:
    """Non-negative ``a, b, c`` minimizing the (Huber-weighted with ``robust``) squared relative error."""
    if not math.isfinite(backward_factor) or backward_factor <= 0:
        raise ValueError(f"--backward-factor must be > 0, got {backward_factor!r}")
    usable = [s for s in samples if s.seconds > 0]
    if len(usable) < 3:
        idle = f" ({len(samples) - len(usable)} more took 0 seconds: the clock did not run?)" \
            if len(samples) > len(usable) else ""
        raise ValueError(f"{len(usable)} step records left after the warm-up steps{idle}; the fit needs at least 3 "
                         "(train more steps or pass a smaller --warmup-steps)")
    rows, targets = _rows(usable, backward_factor)
    check_identifiable(rows, unit="micro-batches" if all(s.parts for s in usable) else "step records")
    weights = [1.0 / (t * t) for t in targets]  # squared relative error
    coefficients = nnls(rows, targets, weights)
    for _ in range(iterations if robust else 0):
        relative = [(_dot(row, coefficients) - t) / t for row, t in zip(rows, targets, strict=True)]
        huber = _huber_weights(relative)
        coefficients = nnls(rows, targets, [w * h for w, h in zip(weights, huber, strict=True)])
    a, b, c = coefficients
    if a <= 0 and b <= 0:
        raise ValueError("the fit puts all the time on the micro-batch count (0 seconds per token and per "
                         "sum(length^2)): the records' micro-batch counts, tokens and squared lengths do not vary "
                         "independently enough; record steps whose micro-batches differ more (a smaller token cap, "
                         "more steps)")
    model = StepTimeModel(seconds_per_token=a, seconds_per_token_pair=b, seconds_per_microbatch=c,
                          backward_factor=backward_factor)
    report = {**fit_report(CalibrationFit(step_time_model=model, report={}), usable), "robust": robust,
              "rows": "micro-batch" if len(rows) > len(usable) else "step", "n_rows": len(rows),
              "standard_errors": standard_errors(rows, targets, coefficients),
              "coefficients": dict(zip(COEFFICIENTS, (a, b, c), strict=True))}
    return CalibrationFit(step_time_model=model, report=report)


COEFFICIENTS = ("seconds_per_token", "seconds_per_token_pair", "seconds_per_microbatch")
CONDITION_LIMIT = 1e10
"""Standard errors are left out (``None``) when the scaled normal matrix is this badly conditioned."""


def _rows(samples: Sequence[StepSample], backward_factor: float) -> tuple[list[list[float]], list[float]]:
    """The fit's rows ``(1 + k) * (tokens, sum_sq, micro-batches)`` and seconds: one per micro-batch where every
    sample has its parts, else one per step."""
    k = 1 + backward_factor
    if all(s.parts for s in samples):
        parts = [part for s in samples for part in s.parts if part[2] > 0]
        if len(parts) < 3:
            total = sum(len(s.parts) for s in samples)
            raise ValueError(f"micro_batch_seconds: {total - len(parts)} of the {total} recorded micro-batches took "
                             "0 seconds, the fit needs at least 3 timed ones (the clock did not run?); record "
                             "again, or fit the step times with --time forward-backward")
        return [[k * t, k * q, k] for t, q, _ in parts], [seconds for _, _, seconds in parts]
    return [[k * s.tokens, k * s.sum_sq, k * s.micro_batches] for s in samples], [s.seconds for s in samples]


IDENTIFIABLE_LIMIT = 1e-7
"""A design whose unit-norm columns have a smallest singular value below this (relative to the largest) is
rank-deficient: some coefficient is a combination of the others, and the fit cannot tell them apart."""
FIGURES = ("tokens", "sum(length^2)", "micro-batch count")
LABELS = ("per-token seconds (seconds_per_token)", "per-sum(length^2) seconds (seconds_per_token_pair)",
          "per-micro-batch seconds (seconds_per_microbatch)")


def check_identifiable(rows: Sequence[Sequence[float]], *, unit: str = "step records") -> None:
    """Refuse rows from which the three coefficients cannot be told apart (a column of zeros, two proportional
    columns, or one a combination of the other two), naming the coefficients and the figure that does not vary."""
    np, _ = _numerics()
    design = np.asarray(rows, dtype=float)
    scale = np.linalg.norm(design, axis=0)
    for column in np.flatnonzero(scale == 0):
        raise ValueError(f"the {LABELS[column]} cannot be fitted: every one of the {len(rows)} {unit} has "
                         f"{FIGURES[column]} 0")
    unit_columns = design / scale
    if not _rank_deficient(unit_columns):
        return
    if _rank_deficient(unit_columns, at_most=1):
        raise ValueError(f"the {len(rows)} {unit} do not vary: their tokens, sum(length^2) and micro-batch counts "
                         f"keep one proportion, so no per-token, per-sum(length^2) or per-micro-batch seconds can be "
                         f"told apart; {_RECORD_MORE}")
    for coefficient, other, (top, bottom, figure) in ((2, 0, (0, 2, "tokens per micro-batch")),
                                                      (2, 1, (1, 2, "sum(length^2) per micro-batch")),
                                                      (1, 0, (1, 0, "sum(length^2) per token"))):
        if _rank_deficient(unit_columns[:, [coefficient, other]]):
            raise ValueError(f"the {LABELS[coefficient]} cannot be told from the {LABELS[other]}: the {len(rows)} "
                             f"{unit} do not vary in {figure} (all {design[0, top] / design[0, bottom]:.6g}); "
                             f"{_RECORD_MORE}")
    raise ValueError(f"the per-token, per-sum(length^2) and per-micro-batch seconds cannot be told apart: the "
                     f"{len(rows)} {unit}' tokens, sum(length^2) and micro-batch counts are linearly dependent; "
                     f"{_RECORD_MORE}")


_RECORD_MORE = ("record steps whose micro-batches differ (samples of varied lengths, micro-batches of varied "
                "token counts, more steps)")


def _rank_deficient(unit_columns: Any, *, at_most: int | None = None) -> bool:
    """Whether the columns span at most ``at_most`` (default: one fewer than their count) dimensions, numerically."""
    np, _ = _numerics()
    at_most = unit_columns.shape[1] - 1 if at_most is None else at_most
    values = np.linalg.svd(unit_columns, compute_uv=False)
    return len(values) <= at_most or bool(values[at_most] < IDENTIFIABLE_LIMIT * values[0])


def _numerics() -> tuple[Any, Any]:
    """``(numpy, scipy.optimize.nnls)``, or a one-line ``ValueError`` naming the extra that installs them."""
    try:
        import numpy
        from scipy.optimize import nnls as scipy_nnls
    except ImportError as error:
        raise ValueError(f"megatron-dpsched calibrate needs SciPy and NumPy ({error}): "
                         "pip install 'megatron-dpsched[calibrate]'") from None
    return numpy, scipy_nnls


def _weighted(rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]) -> tuple[Any, Any]:
    """The design matrix and targets with every row multiplied by the square root of its weight."""
    np, _ = _numerics()
    root = np.sqrt(np.asarray(weights, dtype=float))
    return np.asarray(rows, dtype=float) * root[:, None], np.asarray(targets, dtype=float) * root


def nnls(rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted non-negative least squares: ``x >= 0`` minimizing ``sum(w * (row . x - target) ** 2)``, by
    ``scipy.optimize.nnls`` on unit-norm columns (the columns' scales differ by orders of magnitude)."""
    np, scipy_nnls = _numerics()
    design, target = _weighted(rows, targets, weights)
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0  # an all-zero column's coefficient stays 0
    solution, _ = scipy_nnls(design / scale, target)
    return [float(x) for x in solution / scale]


def standard_errors(
    rows: Sequence[Sequence[float]], targets: Sequence[float], coefficients: Sequence[float]
) -> dict[str, float | None]:
    """Per coefficient, its standard error from the relative residuals (weighted least squares on the
    coefficients left positive); ``None`` for one held at 0, too few rows or a near-singular fit."""
    np, _ = _numerics()
    errors: dict[str, float | None] = dict.fromkeys(COEFFICIENTS)
    support = [c for c, value in enumerate(coefficients) if value > 0]
    if not support or len(rows) <= len(support):
        return errors
    design, target = _weighted(rows, targets, [1.0 / (t * t) for t in targets])
    residual = design @ np.asarray(coefficients, dtype=float) - target
    variance = float(residual @ residual) / (len(rows) - len(support))
    columns = design[:, support]
    scale = np.linalg.norm(columns, axis=0)
    if not np.all(scale > 0):
        return errors
    normal = (columns / scale).T @ (columns / scale)
    if np.linalg.cond(normal) > CONDITION_LIMIT:
        return errors
    covariance = np.linalg.inv(normal)
    for position, column in enumerate(support):
        errors[COEFFICIENTS[column]] = math.sqrt(variance * max(float(covariance[position, position]), 0.0)) \
            / float(scale[position])
    return errors


def fit_report(model: CalibrationFit, samples: Sequence[StepSample]) -> dict[str, Any]:
    """``n``, ``r_squared`` (of the seconds) and relative errors ``|predicted - measured| / measured``."""
    errors = [abs(model.predict(s) - s.seconds) / s.seconds for s in samples]
    mean = statistics.fmean(s.seconds for s in samples)
    total = sum((s.seconds - mean) ** 2 for s in samples)
    residual = sum((model.predict(s) - s.seconds) ** 2 for s in samples)
    by_rank: dict[int, list[float]] = {}
    for sample, error in zip(samples, errors, strict=True):
        by_rank.setdefault(sample.rank, []).append(error)
    return {
        "n": len(samples),
        "steps": sorted({s.step for s in samples}),
        "r_squared": 1.0 - residual / total if total > 0 else None,  # undefined: every step took the same time
        "mean_relative_error": statistics.fmean(errors),
        "max_relative_error": max(errors),
        "rank_relative_errors": {str(rank): {"mean": statistics.fmean(e), "max": max(e)}
                                 for rank, e in sorted(by_rank.items())},
    }


def fit_problems(report: Mapping[str, Any]) -> list[str]:
    """Why a fit should not be trusted: an R^2 <= 0 (it predicts the step times no better than their mean)
    and every coefficient whose standard error exceeds it (the records do not pin it down)."""
    problems = []
    r_squared = report.get("r_squared")
    if r_squared is not None and r_squared <= 0:
        problems.append(f"R^2 {r_squared:.3g} <= 0 (mean relative error {report['mean_relative_error']:.0%}): it "
                        "predicts the step times no better than their mean")
    coefficients = report.get("coefficients", {})
    for name, error in report.get("standard_errors", {}).items():
        if error is not None and error > coefficients.get(name, math.inf):
            problems.append(f"{name} {coefficients[name]:.3g} +- {error:.2g}: its standard error exceeds it")
    return problems


def _huber_weights(residuals: Sequence[float]) -> list[float]:
    """IRLS weights ``min(1, delta / |r|)`` with ``delta`` = :data:`HUBER_K` robust standard deviations."""
    scale = 1.4826 * statistics.median(abs(r) for r in residuals)
    delta = HUBER_K * scale
    return [1.0 if delta <= 0 or abs(r) <= delta else delta / abs(r) for r in residuals]


def _dot(row: Sequence[float], coefficients: Sequence[float]) -> float:
    return sum(x * c for x, c in zip(row, coefficients, strict=True))
