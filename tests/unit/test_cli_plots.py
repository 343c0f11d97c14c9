"""The PNGs of ``megatron-dpsched plan --plot-dir``: written, sized, titled, labelled, with legends."""

from __future__ import annotations

import pytest

from megatron_dpsched.cli import main
from megatron_dpsched.core import ScheduleConfig
from megatron_dpsched.whatif.analysis import Simulation, WhatIf, compare, plan_strategies, plan_warnings
from megatron_dpsched.whatif.model import DEFAULT_MODEL
from megatron_dpsched.whatif.plots import plot_microbatch_sizes, plot_rank_load, plot_timeline

image = pytest.importorskip("matplotlib.image")  # the [demo] extra

LENGTHS = [(i * 37) % 500 + 1 for i in range(40)]


@pytest.fixture(scope="module")
def report() -> WhatIf:
    config = ScheduleConfig(dp_size=2, global_batch_size=16, max_tokens_per_gpu=600, pp_size=2, vpp_size=2)
    schedules = plan_strategies(LENGTHS, config=config, cost_model=DEFAULT_MODEL)
    simulation = Simulation(cost_model=DEFAULT_MODEL)
    return WhatIf(config=config, simulation=simulation, schedules=schedules,
                  steps=compare(schedules, simulation=simulation), warnings=plan_warnings(schedules["dpsched"]))


def _labels(axis) -> list[str]:
    legend = axis.get_legend()
    return [] if legend is None else [text.get_text() for text in legend.get_texts()]


def test_rank_load_is_titled_with_the_layout(report) -> None:
    figure = plot_rank_load(report, 1)
    assert "step 1" in figure.get_suptitle() and "DP 2, PP 2, VPP 2" in figure.get_suptitle()
    axes = figure.get_axes()
    assert len(axes) == 3 and axes[0].get_ylabel() == "tokens computed"
    assert all(axis.get_xlabel() == "DP rank" and axis.get_title() for axis in axes)
    assert _labels(axes[0]) == ["real tokens", "padding"]


def test_microbatch_histogram_marks_the_cap(report) -> None:
    (axis,) = plot_microbatch_sizes(report).get_axes()
    assert "Micro-batch sizes" in axis.get_title() and "cap 600" in axis.get_title()
    assert axis.get_xlabel() == "real tokens per micro-batch" and axis.get_ylabel().startswith("micro-batches")
    labels = _labels(axis)
    assert labels[-1] == "token cap 600" and labels[0].startswith("dp-schedule (")


def test_timeline_shows_forward_and_backward_per_stage(report) -> None:
    figure = plot_timeline(report, report.slowest_step)
    assert "slowest DP rank" in figure.get_suptitle()
    axes = figure.get_axes()
    assert len(axes) == 3 and axes[-1].get_xlabel().startswith("time (")
    assert all(axis.get_ylabel() == "pipeline stage" and "DP rank" in axis.get_title() for axis in axes)
    assert _labels(axes[0]) == ["forward", "backward", "lighter: odd model chunks"]  # VPP 2
    bars = [c for c in axes[0].collections]
    assert len(bars) == 2 * 2 * report.steps[report.slowest_step].strategies["dpsched"].micro_batches * 2


def test_plot_dir_writes_three_pngs(tmp_path, capsys) -> None:
    (tmp_path / "lengths.txt").write_text(" ".join(map(str, LENGTHS)))
    out = tmp_path / "plots"
    assert main(["plan", str(tmp_path / "lengths.txt"), "--dp-size", "2", "--global-batch-size", "16",
                 "--max-tokens-per-gpu", "600", "--pp-size", "2", "--plot-dir", str(out), "--plot-step", "0"]) == 0
    assert f"wrote {out / 'timeline.png'}" in capsys.readouterr().out
    for name in ("rank_load.png", "microbatch_sizes.png", "timeline.png"):
        pixels = image.imread(out / name)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 600, (name, pixels.shape)


def _report(lengths: list[int], **layout: int) -> WhatIf:
    config = ScheduleConfig(**layout)
    schedules = plan_strategies(lengths, config=config, cost_model=DEFAULT_MODEL)
    simulation = Simulation(cost_model=DEFAULT_MODEL)
    return WhatIf(config=config, simulation=simulation, schedules=schedules,
                  steps=compare(schedules, simulation=simulation), warnings=plan_warnings(schedules["dpsched"]))


def test_many_ranks_are_drawn_sorted_by_load_not_one_bar_each() -> None:
    lengths = [(i * 37) % 500 + 1 for i in range(256)]
    wide = _report(lengths, dp_size=64, global_batch_size=256, max_tokens_per_gpu=600)
    for figure in (plot_rank_load(wide, 0), plot_timeline(wide, 0)):  # PP 1: the timeline shows rank times
        for axis in figure.get_axes():
            assert not axis.patches, "one bar per rank at DP 64"
            assert axis.get_xlabel() == "64 DP ranks, sorted by load (quantiles)"
            assert _labels(axis)[-1] == "busiest rank"
    narrow = plot_rank_load(_report(lengths, dp_size=8, global_batch_size=256, max_tokens_per_gpu=600), 0)
    assert all(len(axis.patches) == 2 * 8 for axis in narrow.get_axes())  # tokens and padding per rank


def test_pp1_timeline_shows_each_ranks_time_and_its_wait() -> None:
    report = _report(LENGTHS, dp_size=2, global_batch_size=16, max_tokens_per_gpu=600)
    figure = plot_timeline(report, 0)
    axes = figure.get_axes()
    assert "waits for the slowest rank" in figure.get_suptitle() and axes[0].get_ylabel().startswith("time (")
    assert _labels(axes[0]) == ["forward-backward", "waiting for the slowest rank"]
    for axis, name in zip(axes, report.strategies):  # busy + waiting = the step time on every rank
        heights = [bar.get_height() for bar in axis.patches]
        seconds = report.steps[0].strategies[name].seconds * 1e3
        assert [a + b for a, b in zip(heights[:2], heights[2:])] == pytest.approx([seconds, seconds])


def test_a_crowded_timeline_numbers_no_ops() -> None:
    lengths = [(i * 37) % 500 + 1 for i in range(128)]
    crowded = plot_timeline(_report(lengths, dp_size=1, global_batch_size=128, max_tokens_per_gpu=600,
                                    pp_size=2), 0)
    assert not any(axis.texts for axis in crowded.get_axes())


@pytest.mark.parametrize(("dp", "samples"), [(8, 512), (512, 2048)])
def test_a_cap_sweep_writes_sweep_png(tmp_path, capsys, dp: int, samples: int) -> None:
    (tmp_path / "lengths.txt").write_text(" ".join(str((i * 37) % 1500 + 1) for i in range(samples)))
    out = tmp_path / "plots"
    assert main(["plan", str(tmp_path / "lengths.txt"), "--dp-size", str(dp), "--global-batch-size",
                 str(samples // 2), "--max-tokens-per-gpu", "2048,4096,8192", "--pp-size", "2",
                 "--plot-dir", str(out)]) == 0
    assert f"wrote {out / 'sweep.png'}" in capsys.readouterr().out
    assert sorted(path.name for path in out.iterdir()) == ["sweep.png"]
    pixels = image.imread(out / "sweep.png")
    assert pixels.shape[0] > 600 and pixels.shape[1] > 1000, pixels.shape
