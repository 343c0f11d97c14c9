"""The step-time fit (``megatron-dpsched calibrate``) and the cost-model file it writes."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import sys
from pathlib import Path

import pytest

from megatron_dpsched.calibration import StepSample, fit, nnls, read_records, samples_from_records
from megatron_dpsched.cli import main
from megatron_dpsched.core import StepTimeModel
from megatron_dpsched.core.cost import CostModel, CostModelFile, GenericCostModel

TRUE = {"seconds_per_token": 2e-5, "seconds_per_token_pair": 3e-8, "seconds_per_microbatch": 1.5e-3}


def _records(*, steps: int = 12, ranks: int = 4, noise: float = 0.02, seed: int = 0, **extra: object) -> list[dict]:
    """Step records of a PP=1 run whose compute time follows ``TRUE`` (backward factor 2) with noise;
    steps 0 and 1 are three times slower (warm-up)."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        for rank in range(ranks):
            lengths = [rng.randint(20, 2000) for _ in range(rng.randint(4, 24))]
            mbs = rng.randint(2, 8)
            forward = (TRUE["seconds_per_token"] * sum(lengths) + TRUE["seconds_per_token_pair"]
                       * sum(n * n for n in lengths) + TRUE["seconds_per_microbatch"] * mbs)
            seconds = 3 * forward * (1 + rng.gauss(0, noise)) * (3 if step < 2 else 1)
            out.append({"rank": rank, "step": step, "pp_size": 1, "micro_batches": mbs,
                        "real_tokens": sum(lengths), "sum_sq_lengths": sum(n * n for n in lengths),
                        "padded_tokens": sum(lengths), "padded_sum_sq": sum(n * n for n in lengths),
                        "compute_s": seconds, "compute_cpu_s": seconds, "forward_backward_s": seconds * 1.1,
                        **extra})
    return out


def _write(directory: Path, records: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank in sorted({r["rank"] for r in records}):
        lines = [json.dumps(r) for r in records if r["rank"] == rank]
        (directory / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_fit_recovers_known_coefficients_from_noisy_records() -> None:
    result = fit(samples_from_records(_records()))
    assert result.step_time_model.seconds_per_token == pytest.approx(TRUE["seconds_per_token"], rel=0.05)
    assert result.step_time_model.seconds_per_token_pair == pytest.approx(TRUE["seconds_per_token_pair"], rel=0.05)
    assert result.step_time_model.seconds_per_microbatch == pytest.approx(TRUE["seconds_per_microbatch"], rel=0.2)
    assert result.report["n"] == 40 and result.report["steps"] == list(range(2, 12))
    assert result.report["r_squared"] > 0.99 and result.report["max_relative_error"] < 0.08
    assert set(result.report["rank_relative_errors"]) == {"0", "1", "2", "3"}


def test_warm_up_steps_are_left_out_and_would_bias_the_fit() -> None:
    biased = fit(samples_from_records(_records(), warmup_steps=0))
    assert biased.report["max_relative_error"] > 0.5


def test_huber_weights_resist_outlier_steps() -> None:
    records = _records(noise=0.01)
    for record in records[::9]:  # every 9th record 4x slower (a descheduled process)
        record["compute_s"] *= 4
    plain = fit(samples_from_records(records))
    robust = fit(samples_from_records(records), robust=True)
    clean = samples_from_records([r for i, r in enumerate(records) if i % 9])

    def median_error(result) -> float:
        return statistics.median(abs(result.predict(s) - s.seconds) / s.seconds for s in clean)

    assert median_error(robust) < 0.015 < 0.02 < median_error(plain)  # measured: 0.9% vs 2.7%
    for name, value in TRUE.items():
        assert getattr(robust.step_time_model, name) == pytest.approx(value, rel=0.05), name
    assert robust.report["robust"] is True


def test_nnls_clips_a_negative_coefficient_and_refits() -> None:
    rows = [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
    targets = [3.0, 2.0, 1.0]  # least squares would give a negative slope
    assert nnls(rows, targets, [1.0] * 3) == pytest.approx([0.0, 2.0])


@pytest.mark.parametrize("seed", range(6))
def test_nnls_meets_the_optimality_conditions(seed: int) -> None:
    """Karush-Kuhn-Tucker, restated without the solver: at the optimum the weighted gradient
    ``sum(w * (row . x - t) * row)`` is 0 on every positive coefficient and >= 0 on every zero one."""
    rng = random.Random(seed)
    true = [rng.uniform(0.5, 2.0) * scale for scale in (1.0, 1e-3, 1e3)]
    true[seed % 3] *= -1  # a negative slope: the bound at 0 binds
    rows = [[rng.uniform(100, 5000), rng.uniform(1e4, 1e7), float(rng.randint(1, 8))] for _ in range(40)]
    targets = [abs(sum(r * c for r, c in zip(row, true))) + rng.uniform(1e3, 1e4) for row in rows]
    weights = [rng.uniform(0.5, 2.0) / (t * t) for t in targets]
    x = nnls(rows, targets, weights)
    assert min(x) >= 0
    residuals = [sum(r * c for r, c in zip(row, x)) - t for row, t in zip(rows, targets)]
    for column in range(3):
        gradient = sum(w * e * row[column] for w, e, row in zip(weights, residuals, rows))
        size = math.sqrt(sum(w * row[column] ** 2 for w, row in zip(weights, rows)))  # the column's weighted norm
        if x[column] > 0:
            assert abs(gradient) / size < 1e-6, (column, x)
        else:
            assert gradient / size > -1e-6, (column, x)


def test_calibrate_without_scipy_names_the_extra(tmp_path: Path, capsys, monkeypatch) -> None:
    stats = _write(tmp_path / "stats", _records())
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)  # what an environment without SciPy imports
    assert main(["calibrate", str(stats)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'megatron-dpsched[calibrate]'" in err[0], err


def test_records_of_pipelined_or_old_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="pp_size=2; calibrate fits PP=1 runs"):
        samples_from_records(_records(pp_size=2))
    old = [{k: v for k, v in r.items() if k != "sum_sq_lengths"} for r in _records()]
    with pytest.raises(ValueError, match="has no 'sum_sq_lengths'"):
        samples_from_records(old)
    flat = [StepSample(rank=0, step=2 + i, tokens=100 + i, sum_sq=10_000 + 37 * i * i, micro_batches=2, seconds=1.0)
            for i in range(5)]  # the same time whatever the tokens: only the micro-batch term fits
    with pytest.raises(ValueError, match="do not vary independently enough"):
        fit(flat)
    with pytest.raises(ValueError, match="needs at least 3"):
        fit([StepSample(rank=0, step=2, tokens=10, sum_sq=100, micro_batches=1, seconds=1.0)])


def test_cost_model_file_round_trip(tmp_path: Path) -> None:
    flops = CostModel(hidden_size=64, num_layers=2, num_attention_heads=4, moe_layer_freq=(1, 0), num_experts=4,
                      moe_router_topk=2)
    written = fit(samples_from_records(_records())).to_file(cost_model=flops).save(tmp_path / "cost.json")
    loaded = CostModelFile.load(written)
    assert loaded.cost_model == flops and loaded.fit["n"] == 40
    model = loaded.step_time_model()
    assert isinstance(model, StepTimeModel) and model.backward_factor == 2.0
    assert model.seconds_per_token == pytest.approx(TRUE["seconds_per_token"], rel=0.05)
    cost = loaded.sample_cost()
    ratio = model.seconds_per_token / model.seconds_per_token_pair
    assert isinstance(cost, GenericCostModel) and cost.attention_length == pytest.approx(ratio)
    assert CostModelFile(step_time=StepTimeModel(seconds_per_token=1.0)).sample_cost().attention_length == 1e12


def _valid() -> dict:
    return CostModelFile(step_time=StepTimeModel(seconds_per_token=1e-5, seconds_per_token_pair=1e-8,
                                                 seconds_per_microbatch=1e-3)).to_dict()


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda d: d.update(format="other"), "format must be 'megatron-dpsched-cost-model'"),
    (lambda d: d.update(version=2), "version must be 1"),
    (lambda d: d.update(extra=1), "extra is not a field of a cost-model file"),
    (lambda d: d.pop("step_time_model"), "step_time_model must be an object"),
    (lambda d: d["step_time_model"].pop("seconds_per_microbatch"), "step_time_model.seconds_per_microbatch is missing"),
    (lambda d: d["step_time_model"].update(seconds_per_token=-1), "step_time_model.seconds_per_token must be a finite"),
    (lambda d: d["step_time_model"].update(seconds_per_token="fast"), "step_time_model.seconds_per_token must be"),
    (lambda d: d["step_time_model"].update(backward_factor=0), "step_time_model.backward_factor must be > 0"),
    (lambda d: d["step_time_model"].update(speed=1), "step_time_model.speed is not a step-time coefficient"),
    (lambda d: d["step_time_model"].update(seconds_per_token=0, seconds_per_token_pair=0), "would cost nothing"),
    (lambda d: d.update(cost_model={"hidden_size": 64}), "cost_model: .*missing"),
    (lambda d: d.update(cost_model={"width": 64}), "cost_model.width is not a CostModel field"),
    (lambda d: d.update(fit=[1]), "fit must be an object or null"),
    (lambda d: d["step_time_model"].update(seconds_per_token=10**400),
     "step_time_model.seconds_per_token must be a finite number of seconds, got an integer of 401 digits"),
    (lambda d: d.update(cost_model={"hidden_size": 10**400, "num_layers": 2, "num_attention_heads": 2}),
     "cost_model: hidden_size must be at most"),
])
def test_bad_cost_model_files_are_refused_naming_the_field(tmp_path: Path, edit, expected: str) -> None:
    data = _valid()
    edit(data)
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=expected) as error:
        CostModelFile.load(path)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def test_unreadable_cost_model_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        CostModelFile.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        CostModelFile.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="is a JSON object, got list"):
        CostModelFile.from_dict([])
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=re.escape("deep.json is not JSON (nested too deeply)")):
        CostModelFile.load(tmp_path / "deep.json")


def test_calibrate_command_writes_the_file_and_reports(tmp_path: Path, capsys) -> None:
    stats = _write(tmp_path / "stats", _records())
    assert main(["calibrate", str(stats), "-o", str(tmp_path / "cost.json"), "--robust"]) == 0
    out = capsys.readouterr().out
    assert "fitted on 40 step records (steps 2-11" in out and "R^2" in out and "rank    3 error" in out
    loaded = CostModelFile.load(tmp_path / "cost.json")
    assert loaded.fit["warmup_steps"] == 2 and loaded.fit["time"] == "compute" and loaded.fit["robust"]
    # one rank's 10 steps do not pin the per-micro-batch seconds down: written only when asked, with a warning
    assert main(["calibrate", str(stats / "rank0.jsonl"), "--json", "--time", "compute-cpu",
                 "--accept-poor-fit"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["fit"]["n"] == 10
    assert captured.err.startswith("megatron-dpsched: warning: poor fit, written as --accept-poor-fit asks: "
                                   "seconds_per_microbatch ")
    assert len(read_records(stats)) == 48


@pytest.mark.parametrize(("argv", "expected"), [
    (["calibrate", "MISSING"], "MISSING: no step records"),
    (["calibrate", "STATS", "--warmup-steps", "20"], "0 step records left after the warm-up steps"),
    (["calibrate", "STATS", "--backward-factor", "0"], "argument --backward-factor: must be > 0"),
])
def test_calibrate_errors_are_one_line(tmp_path: Path, capsys, argv: list[str], expected: str) -> None:
    stats = _write(tmp_path / "stats", _records())
    argv = [str(stats) if a == "STATS" else str(tmp_path / a) if a == "MISSING" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megatron-dpsched: error: ") and expected in err[0], err


def _with_parts(records: list[dict], *, seed: int = 1) -> list[dict]:
    """The records with per-micro-batch figures and seconds following ``TRUE`` (1% noise); one micro-batch
    count per step for every rank, so step rows alone cannot tell the per-micro-batch term from the rest."""
    rng = random.Random(seed)
    for record in records:
        parts = [[rng.randint(20, 600) for _ in range(rng.randint(1, 6))] for _ in range(3)]
        record["micro_batches"] = 3
        record["micro_batch_figures"] = [[sum(p), sum(n * n for n in p), sum(p), sum(n * n for n in p)] for p in parts]
        figures = record["micro_batch_figures"]
        seconds = [3 * (TRUE["seconds_per_token"] * f[0] + TRUE["seconds_per_token_pair"] * f[1]
                        + TRUE["seconds_per_microbatch"]) * (1 + rng.gauss(0, 0.01)) for f in figures]
        record["micro_batch_seconds"] = [[w, w] for w in seconds]
        record["real_tokens"] = sum(f[0] for f in record["micro_batch_figures"])
        record["sum_sq_lengths"] = sum(f[1] for f in record["micro_batch_figures"])
        record["compute_s"] = record["compute_cpu_s"] = sum(seconds) * 1.01  # plus the first batch's loading
        record["forward_backward_s"] = record["compute_s"] * 1.1
    return records


def test_micro_batch_rows_separate_the_per_micro_batch_term() -> None:
    records = _with_parts(_records(steps=5, ranks=2))
    result = fit(samples_from_records(records, time="compute-cpu"))
    assert result.report["rows"] == "micro-batch" and result.report["n_rows"] == 18 and result.report["n"] == 6
    for name, value in TRUE.items():
        assert getattr(result.step_time_model, name) == pytest.approx(value, rel=0.1), name
        assert 0 < result.report["standard_errors"][name] < 0.1 * value, name
    assert result.report["max_relative_error"] < 0.03  # the steps, predicted from the micro-batch fit
    steps_only = fit(samples_from_records(records, time="forward-backward"))  # no parts for this clock
    assert steps_only.report["rows"] == "step"


GOOD_RECORD = {"rank": 0, "step": 3, "micro_batches": 2, "real_tokens": 300, "sum_sq_lengths": 50000,
               "compute_s": 0.1, "pp_size": 1}


@pytest.mark.parametrize(("record", "message"), [
    ([1, 2, 3], "step record 0 is a list, not a JSON object"),
    ({**GOOD_RECORD, "step": "3"}, "step must be an integer >= 0, got '3'"),
    ({**GOOD_RECORD, "real_tokens": 10**400}, "real_tokens must be an integer >= 0, got 1000"),
    ({**GOOD_RECORD, "micro_batches": True}, "micro_batches must be an integer >= 0, got True"),
    ({**GOOD_RECORD, "compute_s": "0.5"}, "compute_s must be a finite number of seconds >= 0, got '0.5'"),
    ({**GOOD_RECORD, "compute_s": float("inf")}, "compute_s must be a finite number of seconds >= 0, got inf"),
    ({**GOOD_RECORD, "micro_batch_figures": [[1, 2]], "micro_batch_seconds": [[0.1, 0.1]]},
     "micro_batch_figures must be a list of rows of 4 or more numbers"),
])
def test_malformed_step_records_are_refused_naming_the_field(record, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        samples_from_records([record])


def _varied(records: list[dict], *, lengths: object) -> list[dict]:
    """The records with every rank's step made of the samples ``lengths(step, rank)`` returns (one micro-batch per
    ``(lengths, micro-batch count)`` pair) and the compute time ``TRUE`` gives them (1% noise)."""
    rng = random.Random(3)
    for record in records:
        samples, mbs = lengths(record["step"], record["rank"])
        tokens, squares = sum(samples), sum(n * n for n in samples)
        forward = (TRUE["seconds_per_token"] * tokens + TRUE["seconds_per_token_pair"] * squares
                   + TRUE["seconds_per_microbatch"] * mbs)
        seconds = 3 * forward * (1 + rng.gauss(0, 0.01))
        record.update(micro_batches=mbs, real_tokens=tokens, sum_sq_lengths=squares, compute_s=seconds)
    return records


@pytest.mark.parametrize(("lengths", "message"), [
    (lambda step, rank: ([100, 200], 2), "the 40 step records do not vary: their tokens, sum(length^2) and "
                                         "micro-batch counts keep one proportion"),
    (lambda step, rank: ([150 - step, 150 + step], 3),  # same tokens, same count, varied squares
     "the per-micro-batch seconds (seconds_per_microbatch) cannot be told from the per-token seconds "
     "(seconds_per_token): the 40 step records do not vary in tokens per micro-batch (all 100)"),
    (lambda step, rank: ([64] * (step + rank + 1), 2 + rank),  # samples of one length
     "the per-sum(length^2) seconds (seconds_per_token_pair) cannot be told from the per-token seconds "
     "(seconds_per_token): the 40 step records do not vary in sum(length^2) per token (all 64)"),
    (lambda step, rank: ([100 * (step + 1)] * (rank + 1), 2 * (step + 1) * (rank + 1)),  # tokens / count fixed
     "the per-micro-batch seconds (seconds_per_microbatch) cannot be told from the per-token seconds"),
])
def test_fits_that_cannot_tell_the_coefficients_apart_are_refused_naming_them(
        tmp_path: Path, capsys, lengths, message: str) -> None:
    stats = _write(tmp_path / "stats", _varied(_records(ranks=4, steps=12), lengths=lengths))
    assert main(["calibrate", str(stats)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megatron-dpsched: error: ") and message in err[0], err


def test_a_linear_dependence_of_all_three_figures_is_refused() -> None:
    # sum(length^2) = 200 * tokens - 5000 * micro-batches in every record: no two columns proportional
    samples = [StepSample(rank=0, step=i, tokens=100 * m + i, sum_sq=200 * (100 * m + i) - 5000 * m, micro_batches=m,
                          seconds=0.01 * (i + m)) for i in range(4) for m in (1, 2, 3)]
    with pytest.raises(ValueError, match=re.escape("seconds cannot be told apart: the 12 step records' tokens, "
                                                   "sum(length^2) and micro-batch counts are linearly dependent")):
        fit(samples)


def test_one_micro_batch_count_for_every_step_still_fits_as_an_intercept() -> None:
    """A fixed micro-batch count is a constant column: identifiable while the tokens and squares vary."""
    records = _varied(_records(), lengths=lambda step, rank: ([random.Random(step * 7 + rank).randint(20, 2000)
                                                             for _ in range(6 + step % 3 + rank)], 4))
    result = fit(samples_from_records(records))
    for name, value in TRUE.items():
        assert getattr(result.step_time_model, name) == pytest.approx(value, rel=0.15), name


def test_standard_errors_cover_the_true_coefficients() -> None:
    """Across independent noisy runs, the true coefficient lies within two standard errors about 95% of the time
    (an exact fit of a singular design would claim 0 and never cover it); a coefficient the bound holds at 0 has
    none (``None``), not 0."""
    covered = dict.fromkeys(TRUE, 0)
    fitted = dict.fromkeys(TRUE, 0)
    for seed in range(40):
        result = fit(samples_from_records(_records(seed=seed, noise=0.05)))
        for name, value in TRUE.items():
            error, estimate = result.report["standard_errors"][name], getattr(result.step_time_model, name)
            assert (error is None) == (estimate == 0) and error != 0, (seed, name, error)
            if error is not None:
                fitted[name] += 1
                covered[name] += abs(estimate - value) <= 2 * error
    # measured: 34 of 40, 34 of 40, 34 of 35 (below 95%: the weights use the noisy times)
    assert all(covered[name] >= 0.75 * fitted[name] and fitted[name] >= 30 for name in TRUE), (covered, fitted)


def test_two_runs_in_one_folder_are_refused_naming_both_files(tmp_path: Path, capsys) -> None:
    stats = _write(tmp_path / "stats", _records(ranks=2))
    (stats / "rank1-run2.jsonl").write_text((stats / "rank1.jsonl").read_text())
    assert main(["calibrate", str(stats)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{stats / 'rank1-run2.jsonl'}:1 and {stats / 'rank1.jsonl'}:1 both hold rank 1 " \
        "step 0: two runs recorded into one folder?" in err[0], err
    with pytest.raises(ValueError, match="step record 0 and step record 3 both hold rank 0 step 0"):
        samples_from_records([*_records(ranks=1, steps=3), *_records(ranks=1, steps=3)])


def test_records_whose_clock_did_not_run_are_one_line_errors(tmp_path: Path, capsys) -> None:
    records = _with_parts(_records(steps=5, ranks=2))
    for record in records:
        record["micro_batch_seconds"] = [[0.0, 0.0] for _ in record["micro_batch_seconds"]]
    stats = _write(tmp_path / "parts", records)
    assert main(["calibrate", str(stats)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "micro_batch_seconds: 18 of the 18 recorded micro-batches took 0 seconds" in err[0], err
    still = [{**r, "compute_s": 0.0} for r in _records()]
    assert main(["calibrate", str(_write(tmp_path / "still", still))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0 step records left after the warm-up steps (40 more took 0 seconds" in err[0], err
