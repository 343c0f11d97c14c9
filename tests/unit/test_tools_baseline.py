"""``megatron-dpsched plan`` compares with Megatron fixed at a micro-batch size Megatron users run with the layout
(at least PP micro-batches per rank), lets the user set it, and every speedup names what it is measured against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_dpsched.cli import main
from megatron_dpsched.core import ScheduleConfig
from megatron_dpsched.whatif.analysis import baseline_micro_batch_size

# 256 short samples (longest 100) on DP 8: 32 per rank; a cap of 16384 fits 163 of the longest in a micro-batch
LENGTHS = [20 + (i * 37) % 81 for i in range(256)]
LAYOUT = ["--dp-size", "8", "--global-batch-size", "256", "--max-tokens-per-gpu", "16384"]


def _input(tmp_path: Path) -> str:
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, LENGTHS)))
    return str(path)


@pytest.mark.parametrize(("pp", "vpp", "expected"), [
    (1, 1, 32),  # PP 1: the largest size Megatron accepts that fits the cap (one micro-batch per rank)
    (2, 1, 16),  # 2 micro-batches per rank
    (4, 1, 8),
    (8, 1, 4),
    (32, 1, 1),
    (64, 1, 1),  # fewer samples per rank than stages: 1
    (4, 2, 8),  # 4 micro-batches: legal for the interleaved schedule with group 4
])
def test_default_size_leaves_each_rank_at_least_pp_micro_batches(pp: int, vpp: int, expected: int) -> None:
    config = ScheduleConfig(dp_size=8, global_batch_size=256, max_tokens_per_gpu=16384, pp_size=pp, vpp_size=vpp)
    size = baseline_micro_batch_size(LENGTHS, config=config)
    assert size == expected
    per_rank = 256 // 8
    assert per_rank % size == 0 and (per_rank // size >= pp or size == 1)


def test_default_size_still_fits_the_cap_and_what_megatron_accepts() -> None:
    # longest 1000, cap 3000: at most 3 per micro-batch; 24 per rank: 3 divides it, PP 4 allows up to 6
    config = ScheduleConfig(dp_size=4, global_batch_size=96, max_tokens_per_gpu=3000, pp_size=4)
    assert baseline_micro_batch_size([1000] + [10] * 95, config=config) == 3
    # 20 per rank, PP 3: 6 allowed by the count, 5 by the cap and 20 % 5 == 0
    config = ScheduleConfig(dp_size=4, global_batch_size=80, max_tokens_per_gpu=6000, pp_size=3)
    assert baseline_micro_batch_size([1000] + [10] * 79, config=config) == 5


def test_interleaved_schedule_prefers_a_count_it_accepts() -> None:
    # 24 per rank, PP 4 x VPP 2 (group 4): size 6 gives 4 micro-batches (legal), 4 would give 6 (not a multiple
    # of the group, and still >= PP); the largest legal one wins
    config = ScheduleConfig(dp_size=2, global_batch_size=48, max_tokens_per_gpu=10_000, pp_size=4, vpp_size=2)
    assert config.layout.is_legal(4) and baseline_micro_batch_size([10] * 48, config=config) == 6


def test_plan_on_pp4_runs_megatron_fixed_with_at_least_four_micro_batches(tmp_path: Path, capsys) -> None:
    assert main(["plan", _input(tmp_path), *LAYOUT, "--pp-size", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["megatron_fixed_micro_batch_size"] == 8
    assert [s["strategies"]["megatron_fixed"]["micro_batches"] for s in report["steps"]] == [4]
    assert report["megatron_fixed_micro_batch_size_from"].startswith("the largest Megatron accepts")
    assert report["speedup_against"] == {
        "megatron_fixed": "Megatron fixed at micro-batch size 8 (4 micro-batches per rank in a full step)",
        "per_rank_first_fit": "per-rank packing"}


def test_the_table_names_the_baseline_of_every_speedup(tmp_path: Path, capsys) -> None:
    assert main(["plan", _input(tmp_path), *LAYOUT, "--pp-size", "4"]) == 0
    out = capsys.readouterr().out
    assert ("Megatron fixed: micro-batch size 8 (the largest Megatron accepts (global batch a multiple of size x DP) "
            "whose padded micro-batch of the longest sample fits the cap and that leaves each rank at least PP "
            "micro-batches per step; --baseline-micro-batch-size sets it), 4 micro-batches per rank in a full "
            "step") in out
    assert "Megatron fixed, mbs 8" in out and "speedup of dp-schedule over" in out and "fixed mbs 8" in out
    joined = " ".join(out.split())
    total = next(line for line in out.splitlines() if line.startswith(" all "))
    fixed_speedup = total.split("|")[4].strip()
    assert (f"dp-schedule's simulated time, all steps: {fixed_speedup} over Megatron fixed at micro-batch size 8 "
            "(4 micro-batches per rank in a full step)") in joined


def test_the_user_sets_the_baseline_size(tmp_path: Path, capsys) -> None:
    assert main(["plan", _input(tmp_path), *LAYOUT, "--pp-size", "4", "--baseline-micro-batch-size", "2",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["megatron_fixed_micro_batch_size"] == 2
    assert report["megatron_fixed_micro_batch_size_from"] == "--baseline-micro-batch-size"
    assert report["steps"][0]["strategies"]["megatron_fixed"]["micro_batches"] == 16
    assert main(["plan", _input(tmp_path), *LAYOUT, "--baseline-micro-batch-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "Megatron fixed: micro-batch size 32 (given by --baseline-micro-batch-size), 1 micro-batch per rank" in out


@pytest.mark.parametrize(("extra", "message"), [
    (["--baseline-micro-batch-size", "3"],
     "--baseline-micro-batch-size 3: Megatron needs --global-batch-size 256 to be a multiple of micro-batch size "
     "x --dp-size = 3 x 8 = 24"),
    (["--baseline-micro-batch-size", "0"], "argument --baseline-micro-batch-size: must be >= 1, got '0'"),
    (["--baseline-micro-batch-size", "64"],
     "--baseline-micro-batch-size 64: Megatron needs --global-batch-size 256 to be a multiple of micro-batch size "
     "x --dp-size = 64 x 8 = 512"),
])
def test_a_size_megatron_refuses_is_one_line(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    assert main(["plan", _input(tmp_path), *LAYOUT, *extra]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("megatron-dpsched: error: ") and message in lines[0], lines
    assert captured.out == ""


def test_static_batching_has_no_baseline_to_size(tmp_path: Path, capsys) -> None:
    argv = ["plan", _input(tmp_path), "--dp-size", "8", "--global-batch-size", "256", "--micro-batch-size", "4",
            "--baseline-micro-batch-size", "4"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["megatron-dpsched: error: --baseline-micro-batch-size 4 sizes Megatron fixed, which static "
                     "batching (--micro-batch-size) does not compare with; give --max-tokens-per-gpu instead"]


def test_a_cap_sweep_uses_the_given_size_at_every_cap(tmp_path: Path, capsys) -> None:
    argv = ["plan", _input(tmp_path), "--dp-size", "8", "--global-batch-size", "256", "--max-tokens-per-gpu",
            "4096,16384", "--pp-size", "2", "--baseline-micro-batch-size", "4", "--json"]
    assert main(argv) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert [cap["fixed_micro_batch_size"] for cap in sweep["caps"]] == [4, 4]
