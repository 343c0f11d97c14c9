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
