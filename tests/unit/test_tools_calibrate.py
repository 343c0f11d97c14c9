"""``megatron-dpsched calibrate`` refuses what no run records and fits that explain nothing, in one line each."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from megatron_dpsched.calibration import fit_problems
from megatron_dpsched.cli import main
from megatron_dpsched.core.cost import CostModelFile

TRUE = (2e-5, 3e-8, 1.5e-3)  # seconds per token, per sum(length^2), per micro-batch


def _record(rng: random.Random, *, rank: int, step: int, noise_only: bool) -> dict:
    """One rank's step: its figures, and a compute time that follows ``TRUE`` (1% noise) or ignores them."""
    lengths = [rng.randint(20, 2000) for _ in range(rng.randint(4, 24))]
    mbs = rng.randint(2, 8)
    tokens, squares = sum(lengths), sum(n * n for n in lengths)
    forward = TRUE[0] * tokens + TRUE[1] * squares + TRUE[2] * mbs
    seconds = rng.uniform(0.05, 0.15) if noise_only else 3 * forward * (1 + rng.gauss(0, 0.01))
    return {"rank": rank, "step": step, "pp_size": 1, "micro_batches": mbs, "real_tokens": tokens,
            "sum_sq_lengths": squares, "padded_tokens": tokens, "padded_sum_sq": squares, "compute_s": seconds,
            "compute_cpu_s": seconds, "forward_backward_s": seconds * 1.1}


def _stats(directory: Path, *, noise_only: bool = False, edit: dict | None = None, steps: int = 12) -> Path:
    """A --step-stats-dir of 2 ranks; ``edit`` updates rank 1's record of step 4 (line 5 of rank1.jsonl)."""
    rng = random.Random(7)
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        records = [_record(rng, rank=rank, step=step, noise_only=noise_only) for step in range(steps)]
        if rank == 1 and edit:
            records[4].update(edit)
        (directory / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("megatron-dpsched: error: "), captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize(("edit", "message"), [
    ({"micro_batch_figures": [[10, 100, 10, 100], [-5, 25, 5, 25]], "micro_batch_seconds": [[0.1, 0.1]] * 2},
     "rank1.jsonl:5: micro_batch_figures must be a list of rows of 4 or more numbers >= 0 (row 1 holds -5)"),
    ({"real_tokens": 300, "sum_sq_lengths": 200},
     "rank1.jsonl:5: sum_sq_lengths 200 is below the token count (real_tokens 300): no step has that"),
    ({"micro_batch_figures": [[10, 100, 10, 100], [40, 30, 40, 30]], "micro_batch_seconds": [[0.1, 0.1]] * 2},
     "rank1.jsonl:5: sum of squares 30 is below the token count (micro_batch_figures row 1: tokens 40)"),
    ({"real_tokens": -3}, "rank1.jsonl:5: real_tokens must be an integer >= 0, got -3"),
])
def test_impossible_records_are_refused_naming_file_and_line(tmp_path: Path, capsys, edit: dict,
                                                             message: str) -> None:
    stats = _stats(tmp_path / "stats", edit=edit)
    assert main(["calibrate", str(stats), "-o", str(tmp_path / "cost.json")]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "cost.json").exists()


def test_tokens_without_a_micro_batch_say_so(tmp_path: Path, capsys) -> None:
    assert main(["calibrate", str(_stats(tmp_path / "stats", edit={"micro_batches": 0}))]) == 2
    assert "in 0 micro-batches: no step trains tokens without a micro-batch" in _one_error_line(capsys)


def test_a_deeply_nested_line_is_one_line(tmp_path: Path, capsys) -> None:
    stats = _stats(tmp_path / "stats")
    with (stats / "rank0.jsonl").open("a") as handle:
        handle.write("[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["calibrate", str(stats)]) == 2
    assert _one_error_line(capsys).endswith("rank0.jsonl:13 nests JSON too deeply to be a step record")


def test_a_fit_of_pure_noise_is_refused_unless_accepted(tmp_path: Path, capsys) -> None:
    stats = _stats(tmp_path / "stats", noise_only=True, steps=30)
    target = tmp_path / "cost.json"
    assert main(["calibrate", str(stats), "-o", str(target)]) == 2
    line = _one_error_line(capsys)
    assert "the fit is too poor to write: " in line and "pass --accept-poor-fit to write it anyway" in line
    assert "its standard error exceeds it" in line or "<= 0 (mean relative error" in line
    assert not target.exists()
    assert main(["calibrate", str(stats), "-o", str(target), "--accept-poor-fit"]) == 0
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert warnings and all(w.startswith("megatron-dpsched: warning: poor fit, written as --accept-poor-fit asks: ")
                            for w in warnings)
    assert "R^2" in captured.out and target.exists()
    assert CostModelFile.load(target).fit["poor_fit"] == [w.split("asks: ", 1)[1] for w in warnings]


def test_a_good_fit_is_written_without_a_word(tmp_path: Path, capsys) -> None:
    assert main(["calibrate", str(_stats(tmp_path / "stats")), "-o", str(tmp_path / "cost.json")]) == 0
    assert capsys.readouterr().err == ""
    assert CostModelFile.load(tmp_path / "cost.json").fit["poor_fit"] == []


@pytest.mark.parametrize(("report", "expected"), [
    ({"r_squared": -0.01, "mean_relative_error": 0.35, "standard_errors": {}, "coefficients": {}},
     ["R^2 -0.01 <= 0 (mean relative error 35%): it predicts the step times no better than their mean"]),
    ({"r_squared": 0.0, "mean_relative_error": 0.2, "standard_errors": {}, "coefficients": {}},
     ["R^2 0 <= 0 (mean relative error 20%): it predicts the step times no better than their mean"]),
    ({"r_squared": None, "standard_errors": {"seconds_per_token": None}, "coefficients": {"seconds_per_token": 0.0}},
     []),
    ({"r_squared": 0.9, "standard_errors": {"seconds_per_token": 2e-5, "seconds_per_token_pair": 3e-9},
      "coefficients": {"seconds_per_token": 1e-5, "seconds_per_token_pair": 3e-9}},
     ["seconds_per_token 1e-05 +- 2e-05: its standard error exceeds it"]),
])
def test_fit_problems_name_r_squared_and_each_loose_coefficient(report: dict, expected: list[str]) -> None:
    assert fit_problems(report) == expected
