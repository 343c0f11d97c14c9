"""``megatron-dpsched plan --max-tokens-per-gpu A,B,...``: the cap sweep, Megatron fixed's micro-batch size,
the one-line refusal of a global batch Megatron refuses (no torch)."""

from __future__ import annotations

import json

import pytest

from megatron_dpsched import ScheduleConfig
from megatron_dpsched.baselines import build_baseline_schedule
from megatron_dpsched.baselines.simple import fixed_micro_batch_size
from megatron_dpsched.cli import main
from megatron_dpsched.whatif.caps import CapFigures, CapResult, recommend
from megatron_dpsched.whatif.model import DEFAULT_MODEL
from megatron_dpsched.whatif.sweep import parse_caps

# dp 2, global batch 4: step 0 = 60 50 60 50, step 1 = 30 20 30 20 (no ragged step, nothing over a cap).
LENGTHS = "60 50 60 50 30 20 30 20"
LAYOUT = ["--dp-size", "2", "--global-batch-size", "4", "--collate-format", "thd", "--microbatch-overhead-ms", "0"]
FLOPS = 4e14


def _forward(mb: list[int], overhead: float) -> float:
    """One micro-batch's forward restated: a per token + b per token pair of each sample, plus the overhead."""
    a = DEFAULT_MODEL.linear_flops_per_token / FLOPS
    b = DEFAULT_MODEL.quadratic_flops_per_token_pair / FLOPS
    return a * sum(mb or [1]) + b * sum(n * n for n in (mb or [1])) + overhead


def _step_seconds(ranks: list[list[list[int]]], overhead: float = 0.0) -> float:
    """PP 1: a rank runs forward and backward (2 x forward) back to back; the step waits for the slowest."""
    return max(sum(3 * _forward(mb, overhead) for mb in rank) for rank in ranks)


def _sweep(tmp_path, capsys, *extra: str) -> dict:
    path = tmp_path / "lengths.txt"
    path.write_text(LENGTHS)
    assert main(["plan", str(path), *LAYOUT, "--max-tokens-per-gpu", "200,100", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_figures_match_a_hand_recomputation(tmp_path, capsys) -> None:
    sweep = _sweep(tmp_path, capsys)
    small, large = sweep["caps"]
    assert (small["cap"], large["cap"]) == (100, 200)  # sorted
    # cap 100: 60 + 50 > 100, so dp-schedule runs each long sample alone (2 per rank), then [30, 20] per rank;
    # Megatron fixed: 100 // 60 = 1 sample per micro-batch.
    ours_100 = [[[[60], [50]], [[60], [50]]], [[[30, 20]], [[30, 20]]]]
    fixed_100 = [[[[60], [50]], [[60], [50]]], [[[30], [20]], [[30], [20]]]]
    # cap 200: [60, 50] and [30, 20] per rank; Megatron fixed: 200 // 60 = 3, the largest size dividing the
    # 2 samples per rank is 2, so its rows are [60, 50] padded to 2 x 60 and [30, 20] padded to 2 x 30.
    ours_200 = [[[[60, 50]], [[60, 50]]], [[[30, 20]], [[30, 20]]]]
    fixed_200 = [[[[60, 60]], [[60, 60]]], [[[30, 30]], [[30, 30]]]]  # as computed, padding included
    for result, ours, fixed in ((small, ours_100, fixed_100), (large, ours_200, fixed_200)):
        times = [_step_seconds(step) for step in ours]
        fixed_times = [_step_seconds(step) for step in fixed]
        assert result["ours"]["seconds"] == pytest.approx(sum(times), rel=1e-9)
        assert result["fixed"]["seconds"] == pytest.approx(sum(fixed_times), rel=1e-9)
        assert result["ours"]["median_step_seconds"] == pytest.approx(sum(times) / 2, rel=1e-9)
        assert result["speedup"] == pytest.approx(sum(fixed_times) / sum(times), rel=1e-9)
        assert result["ours"]["median_micro_batches"] == sum(len(step[0]) for step in ours) / 2
        assert result["fixed"]["micro_batches"] == sum(len(step[0]) for step in fixed)
    assert (small["fixed_micro_batch_size"], large["fixed_micro_batch_size"]) == (1, 2)
    assert (small["ours"]["largest_microbatch"], large["ours"]["largest_microbatch"]) == (60, 110)
    assert (small["fixed"]["largest_microbatch"], large["fixed"]["largest_microbatch"]) == (60, 120)
    assert small["ours"]["token_fill"] == pytest.approx(320 / (3 * 2 * 100))
    assert large["ours"]["token_fill"] == pytest.approx(320 / (2 * 2 * 200))
    assert large["fixed"]["padding_share"] == pytest.approx(40 / 360)
    assert small["over_cap"] == large["over_cap"] == 0


def test_recommended_cap_is_the_fastest_and_of_near_ties_the_smallest(tmp_path, capsys) -> None:
    # without a per-micro-batch overhead both caps take the same simulated time: the smaller cap wins
    sweep = _sweep(tmp_path, capsys)
    assert sweep["caps"][0]["ours"]["seconds"] == pytest.approx(sweep["caps"][1]["ours"]["seconds"])
    assert sweep["recommended_cap"] == 100 and "smallest" in sweep["rule"]
    # 10 ms per micro-batch: cap 200 runs 2 micro-batches per rank instead of 3
    assert _sweep(tmp_path, capsys, "--microbatch-overhead-ms", "10")["recommended_cap"] == 200


def _result(cap: int, seconds: float) -> CapResult:
    figures = CapFigures(seconds=seconds, median_step_seconds=seconds, median_micro_batches=1, micro_batches=1,
                         token_fill=1.0, padding_share=0.0, largest_microbatch=cap)
    return CapResult(cap=cap, ours=figures, fixed=figures, fixed_micro_batch_size=1, over_cap=0)


@pytest.mark.parametrize(("times", "expected"), [
    ({4096: 10.0, 8192: 9.95, 16384: 9.91}, 4096),  # all within 1% of 9.91
    ({4096: 10.0, 8192: 9.75, 16384: 9.7}, 8192),  # 9.75 is within 1% of 9.7 (9.797), 10.0 is not
    ({4096: 9.0, 8192: 9.5}, 4096),
    ({4096: 12.0, 8192: 10.0, 16384: 11.0}, 8192),
])
def test_recommend_rule(times: dict[int, float], expected: int) -> None:
    assert recommend([_result(cap, seconds) for cap, seconds in times.items()]) == expected


def test_the_table_marks_the_recommended_cap_and_states_the_rule(tmp_path, capsys) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(LENGTHS)
    plan = tmp_path / "plan.json"
    assert main(["plan", str(path), *LAYOUT, "--max-tokens-per-gpu", "100,200", "--microbatch-overhead-ms", "10",
                 "-o", str(plan)]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[0].strip(): line for line in out.splitlines() if line.split("|")[0].strip().isdigit()}
    assert set(rows) == {"100", "200"} and "<- recommended" in rows["200"] and "recommended" not in rows["100"]
    assert "caps 100, 200 tokens/GPU" in out and "of caps within 1% of it, the smallest" in out
    assert out.rstrip().endswith(f"wrote {plan} (the plan at --max-tokens-per-gpu 200)")
    assert json.loads(plan.read_text())["config"]["max_tokens_per_gpu"] == 200


@pytest.mark.parametrize(("text", "expected"), [("4096", (4096,)), ("16384,4096", (4096, 16384)),
                                                 (" 200, 100 ,200", (100, 200))])
def test_parse_caps(text: str, expected: tuple[int, ...]) -> None:
    assert parse_caps(text) == expected


@pytest.mark.parametrize(("caps", "expected"), [
    ("4096,x", "expected an integer or a comma-separated list of integers, got '4096,x'"),
    ("4096,,8192", "expected an integer or a comma-separated list"),
    ("4096,0", "must be >= 1, got '0'"),
    ("-5", "must be between 1 and 2147483647, got '-5'"),
])
def test_bad_caps_are_one_line(tmp_path, capsys, caps: str, expected: str) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(LENGTHS)
    assert main(["plan", str(path), *LAYOUT, "--max-tokens-per-gpu", caps]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("megatron-dpsched: error: argument --max-tokens-per-gpu") and expected in line, line


def test_a_global_batch_that_is_not_a_multiple_of_dp_is_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(" ".join(["100"] * 300))
    for cap in ("4096", "4096,8192"):
        assert main(["plan", str(path), "--dp-size", "8", "--global-batch-size", "100",
                     "--max-tokens-per-gpu", cap]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            "megatron-dpsched: error: --global-batch-size 100 must be a multiple of --dp-size 8: Megatron refuses "
            "any other global batch\n")


def _accepted_sizes(global_batch_size: int, dp: int) -> list[int]:
    """Every micro-batch size Megatron's batch arithmetic accepts for this global batch (the spec, by brute force)."""
    return [m for m in range(1, global_batch_size + 1) if global_batch_size % (m * dp) == 0]


@pytest.mark.parametrize(("gbs", "dp", "longest", "cap", "expected"), [
    (256, 8, 3000, 16384, 4),  # 16384 // 3000 = 5, but 32 samples per rank: 5 is refused, 4 is not
    (256, 8, 50, 500, 8),
    (96, 8, 100, 700, 6),  # 12 per rank, at most 7: 6
    (96, 8, 10, 100_000, 12),  # never more than a rank's samples
    (256, 8, 5000, 4096, 1),  # longer than the cap
])
def test_fixed_micro_batch_size_is_one_megatron_accepts(gbs, dp, longest, cap, expected) -> None:
    config = ScheduleConfig(dp_size=dp, global_batch_size=gbs, max_tokens_per_gpu=cap)
    size = fixed_micro_batch_size([longest, 1], config=config)
    assert size == expected
    assert size in _accepted_sizes(gbs, dp) and (size * longest <= cap or size == 1)
    assert all(m * longest > cap for m in _accepted_sizes(gbs, dp) if m > size)


def test_megatron_fixed_plan_cuts_micro_batches_of_that_size(tmp_path, capsys) -> None:
    lengths = [3000] + [100] * 255
    config = ScheduleConfig(dp_size=8, global_batch_size=256, max_tokens_per_gpu=16384)
    schedule = build_baseline_schedule("megatron_fixed", lengths, config=config)
    for rank in range(8):
        micro_batches = schedule.rank_step_micro_batches(rank, 0)
        assert [len(mb) for mb in micro_batches] == [4] * 8  # 32 samples per rank in micro-batches of 4
    path = tmp_path / "lengths.txt"
    path.write_text(" ".join(map(str, lengths)))
    assert main(["plan", str(path), "--dp-size", "8", "--global-batch-size", "256", "--max-tokens-per-gpu",
                 "16384"]) == 0
    out = capsys.readouterr().out
    assert "Megatron fixed: micro-batch size 4 (the largest Megatron accepts (global batch a multiple" in out
    assert main(["plan", str(path), "--dp-size", "8", "--global-batch-size", "256", "--max-tokens-per-gpu",
                 "16384", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["megatron_fixed_micro_batch_size"] == 4
