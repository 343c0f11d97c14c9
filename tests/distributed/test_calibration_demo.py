"""Calibration from a real run: step records of the CPU demo, ``megatron-dpsched calibrate``, and planning
with the fitted ``--dp-schedule-cost-model``; the flag's validation.

The demo (``scripts/demo.py --compare calibrated --repeat 2``) trains real Megatron jobs on gloo (DP=2, the
demo's 2-layer GPT, 6 steps of 32 samples): ``--dp-schedule``; then, calibrated on that run's records (CPU
seconds of each rank's forward-backward without the gradient reduction, steps 2..5, Huber),
``--dp-schedule --dp-schedule-cost-model``; then both once more. Each step's time is the fastest of its two
repeats: other processes on this shared machine only ever add time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dpsched.calibration import fit, read_records, samples_from_records
from megatron_dpsched.core import StepTimeModel
from megatron_dpsched.core.cost import CostModelFile, GenericCostModel
from megatron_dpsched.megatron import add_dp_schedule_args, plan_setup_from_args, validate_dp_schedule_args

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
PREDICTION_RTOL = 0.5
"""A gross bound on each rank's predicted step time against the measured one (wrong units, a lost term).
The target (15%) is a benchmark figure, not a timed test: ``scripts/demo.py --compare calibrated`` prints it
(measured 1.7-13.3% worst rank over 7 runs on the shared 2-core machine, README)."""
NOT_WORSE_RTOL = 0.5
"""A gross bound: calibrated planning measuring more than 1.5x slower than planning with the FLOPs model means a
broken fit. The target (never worse) is a benchmark figure printed by the demo; the same plans differ by 1-4%
between repeats on a quiet machine and by up to 35% on a crowded one, too much for a timed test."""


def _args(*argv: str, **overrides: object) -> argparse.Namespace:
    args = add_dp_schedule_args(argparse.ArgumentParser()).parse_args(["--dp-schedule", *argv])
    defaults = dict(micro_batch_size=1, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                    microbatch_group_size_per_vp_stage=None, overlap_p2p_comm=True, calculate_per_token_loss=False,
                    global_batch_size=8, hidden_size=64, num_layers=2, num_attention_heads=4)
    return argparse.Namespace(**{**vars(args), **defaults, **overrides})


def _cost_file(tmp_path: Path, **step_time: float) -> Path:
    coefficients = {"seconds_per_token": 1e-5, "seconds_per_token_pair": 1e-7, "seconds_per_microbatch": 2e-3,
                    **step_time}
    return CostModelFile(step_time=StepTimeModel(**coefficients)).save(tmp_path / "cost.json")


def test_the_cost_model_file_drives_balancing_and_the_step_time_objective(tmp_path: Path) -> None:
    path = str(_cost_file(tmp_path))
    args = _args("--dp-schedule-max-tokens-per-gpu", "64", "--dp-schedule-cost-model", path,
                 pipeline_model_parallel_size=2)
    validate_dp_schedule_args(args)
    setup = plan_setup_from_args(args, data_parallel_size=2)
    cost = setup.cost_model
    assert isinstance(cost, GenericCostModel) and cost.attention_length == pytest.approx(100.0)  # 1e-5 / 1e-7
    model = setup.config.step_time_model
    assert (model.seconds_per_token, model.seconds_per_token_pair, model.seconds_per_microbatch) == (1e-5, 1e-7, 2e-3)
    tokens = plan_setup_from_args(_args("--dp-schedule-balance", "tokens", "--dp-schedule-cost-model", path),
                                  data_parallel_size=2)
    assert tokens.cost_model is None and tokens.config.step_time_model is None


def test_bad_cost_model_files_fail_at_argument_time_naming_the_flag_and_field(tmp_path: Path) -> None:
    cap = ("--dp-schedule-max-tokens-per-gpu", "64")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**CostModelFile(step_time=StepTimeModel(seconds_per_token=1.0)).to_dict(),
                               "version": 7}))
    with pytest.raises(ValueError, match=r"^--dp-schedule-cost-model: .*bad.json: version must be 1, got 7$"):
        validate_dp_schedule_args(_args(*cap, "--dp-schedule-cost-model", str(bad)))
    with pytest.raises(ValueError, match="^--dp-schedule-cost-model: .*missing.json: no such file"):
        validate_dp_schedule_args(_args(*cap, "--dp-schedule-cost-model", str(tmp_path / "missing.json")))
    good = str(_cost_file(tmp_path))
    with pytest.raises(ValueError, match="^--dp-schedule-microbatch-overhead-ms has no effect with "
                                         "--dp-schedule-cost-model"):
        validate_dp_schedule_args(_args(*cap, "--dp-schedule-cost-model", good, "--dp-schedule-microbatch-overhead-ms",
                                        "1", pipeline_model_parallel_size=2))
    plain = _args("--dp-schedule-cost-model", good)
    plain.dp_schedule = False
    with pytest.raises(ValueError, match="--dp-schedule-cost-model given without --dp-schedule"):
        validate_dp_schedule_args(plain)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("calibrated")
    cmd = [sys.executable, str(REPO / "scripts" / "demo.py"), "--out", str(out), "--steps", "6",
           "--compare", "calibrated", "--repeat", "2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout[proc.stdout.index("calibrated on"):])  # the measured figures, with pytest -s
    return json.loads((out / "summary.json").read_text()), out


def test_records_hold_the_figures_the_fit_needs(calibrated) -> None:
    summary, out = calibrated
    records = read_records(out / "dp-schedule")
    lengths = summary["lengths"]
    assert len(records) == 12 and {r["pp_size"] for r in records} == {1}
    for record in records:
        assert record["compute_s"] == pytest.approx(record["forward_backward_s"] - record["grad_sync_s"])
        assert 0 < record["compute_cpu_s"] and 0 < record["compute_s"] < record["step_time_s"]
        assert record["real_tokens"] == record["tokens"]  # every real position is a loss token here
        assert record["padded_sum_sq"] >= record["sum_sq_lengths"] > record["real_tokens"]
        assert record["micro_batches"] == len(record["micro_batch_ids"]) == len(record["micro_batch_seconds"])
        assert [f[0] for f in record["micro_batch_figures"]] == [
            sum(lengths[i] for i in ids) for ids in record["micro_batch_ids"]]
        wall = sum(seconds[0] for seconds in record["micro_batch_seconds"])
        assert 0 < wall <= record["compute_s"]  # the first micro-batch's loading comes before its stamp


def test_the_fitted_model_predicts_every_rank(calibrated) -> None:
    summary, out = calibrated
    report = summary["calibration"]
    assert report["n"] == 8 and report["steps"] == [2, 3, 4, 5] and report["rows"] == "micro-batch"
    errors = {rank: e["max"] for rank, e in report["rank_relative_errors"].items()}
    assert max(errors.values()) < PREDICTION_RTOL, errors
    loaded = CostModelFile.load(out / "cost_model.json")
    refit = fit(samples_from_records(read_records(out / "dp-schedule"), time="compute-cpu"), robust=True)
    assert loaded.step_time.seconds_per_token == pytest.approx(refit.step_time_model.seconds_per_token)


def test_planning_with_the_fitted_model_is_not_slower(calibrated) -> None:
    summary, _ = calibrated
    assert summary["plan_matches"]
    assert set(summary["runs"]) == {"dp-schedule", "calibrated", "dp-schedule-2", "calibrated-2"}
    figure = {run: t["mean_compute_cpu_s"] for run, t in summary["totals"].items()}
    assert figure["calibrated"] <= figure["dp-schedule"] * (1 + NOT_WORSE_RTOL), (figure, summary["run_to_run_noise"])
    assert summary["max_relative_loss_difference"] < 1e-4
