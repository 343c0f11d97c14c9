"""The what-if tool's fast paths give what the plain ones give: a length file parsed at once, per-rank first fit
of short slices, every step's pipeline simulated in one pass, and the command with the collector paused."""

from __future__ import annotations

import gc
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_dpsched import ScheduleConfig, cli
from megatron_dpsched.baselines import build_baseline_schedule
from megatron_dpsched.baselines.simple import short_first_fit
from megatron_dpsched.cli import main
from megatron_dpsched.core import StepTimeModel, simulate_rank
from megatron_dpsched.core.packing import first_fit
from megatron_dpsched.whatif.analysis import Simulation, compare, largest_collated, plan_ours
from megatron_dpsched.whatif.inputs import read_lengths
from megatron_dpsched.whatif.model import DEFAULT_MODEL


@given(st.lists(st.integers(1, 60), max_size=40), st.integers(1, 50), st.randoms(use_true_random=False))
def test_short_first_fit_packs_as_the_segment_tree_first_fit(sizes: list[int], cap: int, rng: random.Random) -> None:
    items = list(range(len(sizes)))
    rng.shuffle(items)
    assert short_first_fit(items, sizes, cap) == first_fit(items, sizes, cap)


@pytest.mark.parametrize(("text", "expected"), [
    ("5\n7\n", [5, 7]), ("1 2\n\n 3\t4\r\n", [1, 2, 3, 4]), ("007 +8\n", [7, 8]), ("2147483647", [2147483647]),
    ("1\x0c2\x0b3", [1, 2, 3]),
])
def test_a_length_file_reads_as_python_reads_it(tmp_path, text: str, expected: list[int]) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    assert read_lengths(str(path)) == [int(word) for word in text.split()] == expected


@pytest.mark.parametrize(("text", "message"), [
    ("5\n0\n", "lengths.txt:2: token count 0 is out of range (1..2147483647)"),
    ("5\n\n99999999999999999999999\n", "lengths.txt:3: token count 99999999999999999999999 is out of range"),
    ("5\n-3\n", "lengths.txt:2: token count -3 is out of range (1..2147483647)"),
    ("5 x\n", "lengths.txt:1: not an integer token count: 'x'"),
    ("\n \n", "lengths.txt holds no token counts"),
])
def test_a_bad_length_file_names_its_line(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path.parent}/{message}")):
        read_lengths(str(path))


@pytest.mark.parametrize(("pp", "vpp"), [(1, 1), (4, 1), (2, 2)])
def test_every_step_simulates_as_one_rank_at_a_time(pp: int, vpp: int) -> None:
    """Steps of different micro-batch counts and DP 3 (below the vector path's rank count): each step's time is
    its slowest rank's one-rank simulation of the forward times summed here."""
    rng = random.Random(pp * 10 + vpp)
    lengths = [rng.choice((rng.randint(1, 300), rng.randint(900, 1500))) for _ in range(3 * 24 * 7 + 5)]
    config = ScheduleConfig(dp_size=3, global_batch_size=72, max_tokens_per_gpu=1024, pp_size=pp, vpp_size=vpp)
    model = StepTimeModel(seconds_per_token=1e-6, seconds_per_token_pair=1e-10, seconds_per_microbatch=1e-3)
    simulation = Simulation(cost_model=DEFAULT_MODEL, step_time_model=model, flops_per_gpu=None)
    ours = plan_ours(lengths, config=config, cost_model=DEFAULT_MODEL)
    assert len(set(ours.num_microbatches)) > 1
    for step in compare({"dpsched": ours}, simulation=simulation):
        times = [[model.forward_time([lengths[i] for i in mb]) for mb in ours.rank_step_micro_batches(rank, step.step)]
                 for rank in range(3)]
        spans = [simulate_rank(rank, layout=config.layout, model=model).makespan for rank in times]
        assert step.strategies["dpsched"].seconds == max(spans)
        assert step.strategies["dpsched"].slowest_rank == spans.index(max(spans))


def test_per_rank_first_fit_of_long_slices_uses_the_segment_tree() -> None:
    """Slices over the short-slice bound pack as the segment tree's first fit does."""
    rng = random.Random(3)
    lengths = [rng.randint(1, 2000) for _ in range(2 * 600)]
    config = ScheduleConfig(dp_size=2, global_batch_size=1200, max_tokens_per_gpu=4096)
    plan = build_baseline_schedule("per_rank_first_fit", lengths, config=config)
    for rank, items in enumerate((range(600), range(600, 1200))):
        bins = first_fit(list(items), lengths, 4096)
        assert [[plan.partitions[rank][p] for p in mb] for mb in plan.micro_batch_indices[rank]][:len(bins)] == bins


def test_plan_leaves_the_collector_as_it_found_it(tmp_path, capsys) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(["100"] * 64))
    assert gc.isenabled()
    assert main(["plan", str(path), "--dp-size", "4", "--global-batch-size", "32", "--max-tokens-per-gpu", "400"]) == 0
    assert gc.isenabled() and "dp-schedule" in capsys.readouterr().out


def _plan_output(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("extra", [[], ["--json"], ["--collate-format", "bshd", "--pp-size", "2"]])
def test_baselines_planned_beside_the_workers_report_as_one_process(tmp_path, capsys, monkeypatch, extra) -> None:
    """With several processes the baselines are planned and simulated while the workers plan: the same report."""
    monkeypatch.setattr(cli, "PARALLEL_SAMPLES", 10)
    rng = random.Random(5)
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(rng.choice((rng.randint(1, 200), rng.randint(300, 900)))) for _ in range(700)))
    argv = ["plan", str(path), "--dp-size", "4", "--global-batch-size", "64", "--max-tokens-per-gpu", "1024", *extra]
    one = _plan_output([*argv, "--jobs", "1"], capsys)
    assert one[0] == 0 and "dp-schedule" in one[1]
    assert _plan_output([*argv, "--jobs", "2"], capsys) == one


def test_the_planners_error_comes_first_with_several_processes(tmp_path, capsys, monkeypatch) -> None:
    """dp 8 over steps of 4 samples: the planner's error names --dp-size, with one process or several."""
    monkeypatch.setattr(cli, "PARALLEL_SAMPLES", 10)
    path = tmp_path / "lengths.txt"
    path.write_text("5\n" * 40)
    argv = ["plan", str(path), "--dp-size", "8", "--global-batch-size", "4", "--max-tokens-per-gpu", "64"]
    code, out, err = _plan_output([*argv, "--jobs", "1"], capsys)
    assert (code, out) == (2, "") and err.startswith("megatron-dpsched: error: --dp-size: dp_size=8 is larger than")
    assert _plan_output([*argv, "--jobs", "2"], capsys) == (code, out, err)


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize(("dp", "expected"), [("8", "--dp-size: dp_size=8 is larger than"),
                                              ("2", "a baseline refuses")])
def test_a_baselines_error_waits_for_the_planner(tmp_path, capsys, monkeypatch, jobs, dp, expected) -> None:
    """A baseline's error made beside the workers is raised after dp-schedule's plan, whose own error wins."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("a baseline refuses")

    monkeypatch.setattr(cli, "PARALLEL_SAMPLES", 10)
    monkeypatch.setattr(cli, "plan_baselines", refuse)
    path = tmp_path / "lengths.txt"
    path.write_text("5\n" * 40)
    argv = ["plan", str(path), "--dp-size", dp, "--global-batch-size", "4", "--max-tokens-per-gpu", "64",
            "--jobs", jobs]
    code, out, err = _plan_output(argv, capsys)
    assert (code, out) == (2, "") and err.startswith(f"megatron-dpsched: error: {expected}")


@pytest.mark.parametrize(("cp", "padded"), [(1, False), (2, False), (1, True), (2, True)])
def test_the_largest_collated_micro_batch_is_summed_as_collate_pads(cp: int, padded: bool) -> None:
    """Against each micro-batch's samples rounded up to 2 x CP (CP > 1), summed or rows x the longest row."""
    rng = random.Random(cp)
    lengths = [rng.choice((rng.randint(1, 60), rng.randint(200, 700))) for _ in range(16 * 9 + 3)]
    config = ScheduleConfig(dp_size=4, global_batch_size=16, max_tokens_per_gpu=512, cp_size=cp)
    ours = plan_ours(lengths, config=config, cost_model=DEFAULT_MODEL)
    multiple = 2 * cp if cp > 1 else 1
    largest = 0
    for rank in range(4):
        for mb in ours.micro_batch_indices[rank]:
            sizes = [-(-lengths[ours.partitions[rank][p]] // multiple) * multiple for p in mb]
            largest = max(largest, len(sizes) * max(sizes, default=0) if padded else sum(sizes))
    simulation = Simulation(cost_model=DEFAULT_MODEL)
    assert largest_collated(ours, simulation=simulation, padded=padded) == largest > 0
