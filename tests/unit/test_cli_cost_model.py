"""``megatron-dpsched calibrate`` -> FILE -> ``megatron-dpsched plan --cost-model FILE``: the what-if tool reads
the file calibrate writes (as ``--dp-schedule-cost-model`` does) and simulates with its coefficients; a model's
shape is ``--model-shape`` (no torch)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from megatron_dpsched.cli import main

TRUE = {"seconds_per_token": 2e-5, "seconds_per_token_pair": 3e-8, "seconds_per_microbatch": 1.5e-3}
# dp 2, global batch 4, cap 100: step 0 = four 60s (each alone: two micro-batches [60] per rank), step 1 =
# four 30s (one micro-batch [30, 30] per rank), step 2 = one 90 (one rank runs [90], the other a dummy).
LENGTHS = "60 60 60 60 30 30 30 30 90"
LAYOUT = ["--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "100"]


def _stats(directory: Path, *, steps: int = 8, ranks: int = 2) -> Path:
    """Step records of a PP=1 run whose compute time is exactly ``TRUE``'s, backward factor 2."""
    rng = random.Random(0)
    directory.mkdir()
    for rank in range(ranks):
        lines = []
        for step in range(steps):
            lengths = [rng.randint(20, 2000) for _ in range(rng.randint(4, 24))]
            count = rng.randint(2, 8)
            forward = (TRUE["seconds_per_token"] * sum(lengths) + TRUE["seconds_per_token_pair"]
                       * sum(n * n for n in lengths) + TRUE["seconds_per_microbatch"] * count)
            lines.append(json.dumps({"rank": rank, "step": step, "pp_size": 1, "micro_batches": count,
                                     "real_tokens": sum(lengths), "sum_sq_lengths": sum(n * n for n in lengths),
                                     "compute_s": 3 * forward}))
        (directory / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def calibrated(tmp_path: Path, capsys) -> Path:
    """The cost-model file the real ``calibrate`` command writes."""
    path = tmp_path / "cost.json"
    assert main(["calibrate", str(_stats(tmp_path / "stats")), "-o", str(path)]) == 0
    assert f"plan ... --cost-model {path}" in capsys.readouterr().out
    return path


def _lengths(tmp_path: Path) -> str:
    (tmp_path / "lengths.txt").write_text(LENGTHS)
    return str(tmp_path / "lengths.txt")


def _hand_seconds(micro_batches_per_rank: list[list[list[int]]], coefficients: dict[str, float]) -> float:
    """PP 1: the slowest rank's sum over its micro-batches of (1 + k) x (a T + b S + c), a dummy as one token."""
    a, b, c, k = (coefficients[name] for name in ("seconds_per_token", "seconds_per_token_pair",
                                                  "seconds_per_microbatch", "backward_factor"))
    return max(sum((1 + k) * (a * sum(mb or [1]) + b * sum(n * n for n in mb or [1]) + c) for mb in rank)
               for rank in micro_batches_per_rank)


def test_plan_simulates_with_the_coefficients_calibrate_wrote(tmp_path: Path, calibrated: Path, capsys) -> None:
    written = json.loads(calibrated.read_text())["step_time_model"]
    for name, value in TRUE.items():  # noise-free records: the fit recovers them
        assert written[name] == pytest.approx(value, rel=1e-6), name
    assert main(["plan", _lengths(tmp_path), *LAYOUT, "--cost-model", str(calibrated), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    seconds = [step["strategies"]["dpsched"]["seconds"] for step in report["steps"]]
    expected = [_hand_seconds([[[60], [60]], [[60], [60]]], written), _hand_seconds([[[30, 30]], [[30, 30]]], written),
                _hand_seconds([[[90]], [[]]], written)]
    assert seconds == pytest.approx(expected, rel=1e-9)
    assert report["simulation"]["step_time_model"] == written
    assert report["simulation"]["cost_model_source"] == f"cost-model file {calibrated}"
    assert main(["plan", _lengths(tmp_path), *LAYOUT, "--json"]) == 0  # the default shape's FLOPs: other times
    flops = json.loads(capsys.readouterr().out)
    assert flops["steps"][1]["strategies"]["dpsched"]["seconds"] != pytest.approx(expected[1], rel=0.01)


def test_plan_balances_the_files_sample_cost_and_plans_for_its_step_time(tmp_path: Path, calibrated: Path,
                                                                         capsys) -> None:
    a, b = TRUE["seconds_per_token"], TRUE["seconds_per_token_pair"]
    plan = tmp_path / "plan.json"
    assert main(["plan", _lengths(tmp_path), *LAYOUT, "--cost-model", str(calibrated), "-o", str(plan)]) == 0
    out = capsys.readouterr().out
    assert f"model: measured step-time model (cost-model file {calibrated}): forward 2e-05 s per token" in out
    costs = json.loads(plan.read_text())["costs"]
    assert costs[:2] == pytest.approx([60 + 60 * 60 / (a / b)] * 2, rel=1e-6)  # s + s^2 / (a / b)
    assert main(["plan", _lengths(tmp_path), *LAYOUT, "--pp-size", "2", "--cost-model", str(calibrated)]) == 0
    assert "measured step-time model" in capsys.readouterr().out  # the step-time objective, from the file


def test_model_shape_file_and_flags_give_the_same_plan(tmp_path: Path, capsys) -> None:
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps({"hidden_size": 256, "num_layers": 2, "num_attention_heads": 4}))
    flags = ["--hidden-size", "256", "--num-layers", "2", "--num-attention-heads", "4"]
    assert main(["plan", _lengths(tmp_path), *LAYOUT, "--model-shape", str(shape), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(["plan", _lengths(tmp_path), *LAYOUT, *flags, "--json"]) == 0
    from_flags = json.loads(capsys.readouterr().out)
    assert from_file["steps"] == from_flags["steps"] and from_file["simulation"]["cost_model"]["hidden_size"] == 256


def _one_line_error(capsys, argv: list[str], expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megatron-dpsched: error: ") and expected in err[0], err


def test_a_model_shape_given_as_cost_model_names_model_shape(tmp_path: Path, capsys) -> None:
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps({"hidden_size": 256, "num_layers": 2, "num_attention_heads": 4}))
    _one_line_error(capsys, ["plan", _lengths(tmp_path), *LAYOUT, "--cost-model", str(shape)],
                    f"holds a model shape (CostModel fields), not a cost-model file from 'megatron-dpsched "
                    f"calibrate': pass it as --model-shape {shape}")


def test_cost_model_errors_are_one_line(tmp_path: Path, calibrated: Path, capsys) -> None:
    lengths, path = _lengths(tmp_path), str(calibrated)
    for extra, named in ((["--flops-per-gpu", "1e14"], "--flops-per-gpu"),
                         (["--microbatch-overhead-ms", "1"], "--microbatch-overhead-ms"),
                         (["--hidden-size", "64"], "--hidden-size"), (["--model-shape", path], "--model-shape")):
        _one_line_error(capsys, ["plan", lengths, *LAYOUT, "--cost-model", path, *extra],
                        f"--cost-model cannot be combined with {named}")
    _one_line_error(capsys, ["plan", lengths, *LAYOUT, "--model-shape", path],
                    f"--model-shape {path} is a cost-model file ('megatron-dpsched calibrate' writes it), not a "
                    f"model shape: pass it as --cost-model {path}")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(calibrated.read_text()), "version": 7}))
    _one_line_error(capsys, ["plan", lengths, *LAYOUT, "--cost-model", str(bad)],
                    f"--cost-model {bad}: version must be 1, got 7")
    _one_line_error(capsys, ["plan", lengths, *LAYOUT, "--cost-model", str(tmp_path / "none.json")],
                    "none.json: no such file")
