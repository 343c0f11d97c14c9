"""The option fields: the ``plan`` what-if tool's options, the docs page and the errors all follow them (no torch)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dpsched.cli import build_parser, main
from megatron_dpsched.core import ScheduleConfig
from megatron_dpsched.core.config import BALANCE_MODES
from megatron_dpsched.core.ordering import MICROBATCH_ORDERS
from megatron_dpsched.core.validation import ArgumentError
from megatron_dpsched.options import (
    OPTIONS,
    PLAN_PREFIX,
    TRAINING_PREFIX,
    DPScheduleOptions,
    config_flags,
    field_docstrings,
    markdown,
)

REPO = Path(__file__).resolve().parents[2]
LAYOUT = ["--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "100"]
MIRRORED = [option for option in OPTIONS if option.mirrored]


def _plan_actions() -> dict[str, argparse.Action]:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {flag: action for action in commands.choices["plan"]._actions for flag in action.option_strings}


def test_every_field_is_a_well_formed_option() -> None:
    assert [option.name for option in OPTIONS] == [f.name for f in dataclasses.fields(DPScheduleOptions)][1:]
    for option in OPTIONS:
        assert option.kind in (int, float, str) and option.targets and option.help.strip()
        assert option.default is None or option.problem(option.default) is None, option.stem
        assert (option.minimum is not None) == (option.kind is not str), option.stem
        assert getattr(DPScheduleOptions(), option.name) == option.default
    assert set(field_docstrings(DPScheduleOptions)) == {f.name for f in dataclasses.fields(DPScheduleOptions)}


def test_the_choices_are_the_cores() -> None:
    choices = {option.name: option.choices for option in OPTIONS}
    assert choices["balance"] == BALANCE_MODES and choices["microbatch_order"] == ("auto", *MICROBATCH_ORDERS)


def test_the_what_if_tool_help_names_its_own_flags() -> None:
    for option in OPTIONS:
        plan = option.help_in(PLAN_PREFIX)
        assert all(other.flag not in plan for other in OPTIONS if other.mirrored), option.stem
        if "--dp-schedule-max-tokens-per-gpu" in option.help:
            assert "--max-tokens-per-gpu" in plan and "--dp-schedule-max-tokens-per-gpu" not in plan


def test_the_options_give_their_values_and_are_checked_whole() -> None:
    options = DPScheduleOptions(enabled=True, verify="strict", max_tokens_per_gpu=64)
    assert options.option_values(run_time=True) == {"verify": "strict", "prefetch": "on", "over_cap": "warn",
                                                    "changed_resume": "refuse"}
    assert options.option_values(run_time=False)["max_tokens_per_gpu"] == 64
    options.check()
    with pytest.raises(ValueError, match="^--dp-schedule-balance-growth must be between 0 and 10; got 11") as raised:
        DPScheduleOptions(balance_growth=11).check()
    assert raised.value.option == "--dp-schedule-balance-growth"
    assert options.counts_padding and not DPScheduleOptions(max_tokens_per_gpu=64, cap_counts="tokens").counts_padding
    assert not DPScheduleOptions().counts_padding  # static batching: no cap


@pytest.mark.parametrize("option", MIRRORED, ids=lambda option: option.stem)
def test_plan_mirrors_the_option_with_its_default_and_choices(option) -> None:
    action = _plan_actions()[PLAN_PREFIX + option.stem]
    assert action.dest == option.name and action.default == option.default
    assert (tuple(action.choices) if action.choices else None) == option.choices
    assert option.help_in(PLAN_PREFIX) in action.help.replace("%%", "%") and TRAINING_PREFIX not in action.help


def test_plan_has_no_option_of_training_under_another_name() -> None:
    flags = set(_plan_actions())
    for option in OPTIONS:
        assert (PLAN_PREFIX + option.stem in flags) == option.mirrored, option.stem
    assert "--microbatch-overhead" not in flags  # seconds, default 0: replaced by --microbatch-overhead-ms


def _bad_values(option) -> list[str]:
    if option.choices is not None:
        return ["nonsense"]
    bad = [repr(option.minimum - 1)]
    if option.maximum is not None:
        bad.append(repr(option.maximum * 2 + 1))
    return [*bad, "nan"]


@pytest.mark.parametrize("option", [o for o in MIRRORED if o.kind is not str or o.choices],
                         ids=lambda option: option.stem)
def test_a_bad_value_of_every_mirrored_option_names_the_flag(option, tmp_path, capsys) -> None:
    (tmp_path / "lengths.txt").write_text("10 20 30 40")
    layout = LAYOUT if option.stem != "max-tokens-per-gpu" else LAYOUT[:4]
    for value in _bad_values(option):
        assert main(["plan", str(tmp_path / "lengths.txt"), *layout, PLAN_PREFIX + option.stem, value]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"megatron-dpsched: error: argument {PLAN_PREFIX + option.stem}: "), err
        assert len(err.splitlines()) == 1


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind is not str or o.choices],
                         ids=lambda option: option.stem)
def test_check_names_the_training_flag(option) -> None:
    for value in ("nonsense",) if option.choices else (option.minimum - 1, float("nan"), "3"):
        with pytest.raises(ValueError, match=f"^{option.flag} must be ") as raised:
            option.check(value)
        assert raised.value.option == option.flag


@pytest.mark.parametrize(("kwargs", "argument", "stem"), [
    (dict(balance_growth=11.0), "balance_growth", "balance-growth"),
    (dict(balance="flops"), "balance", "balance"),
    (dict(microbatch_order="random"), "microbatch_order", "microbatch-order"),
    (dict(max_tokens_per_gpu=0), "max_tokens_per_gpu", "max-tokens-per-gpu"),
    (dict(max_tokens_per_gpu=8, pad_multiple=16), "pad_multiple", "cap-counts"),
    (dict(vpp_size=2), "vpp_size", None),
])
def test_the_planner_names_the_argument_and_the_fields_map_it_to_an_option(kwargs, argument, stem) -> None:
    base = dict(dp_size=2, global_batch_size=4, max_tokens_per_gpu=100)
    with pytest.raises(ArgumentError) as raised:
        ScheduleConfig(**{**base, **kwargs})
    assert raised.value.argument == argument
    assert config_flags().get(argument) == (None if stem is None else TRAINING_PREFIX + stem)
    assert config_flags(prefix=PLAN_PREFIX).get(argument) == (None if stem is None else PLAN_PREFIX + stem)


def test_docs_page_is_generated_from_the_fields() -> None:
    committed = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    assert committed == markdown(), "regenerate: python -m megatron_dpsched.options --markdown > docs/options.md"
    for option in OPTIONS:
        (row,) = [line for line in committed.splitlines() if line.startswith(f"| `{option.flag}` |")]
        assert (f"`{PLAN_PREFIX + option.stem}`" in row) == option.mirrored
        assert option.help.replace("|", "\\|") in row


def test_the_options_module_and_its_markdown_run_without_torch() -> None:
    code = ("import sys; from megatron_dpsched.options import main; main(['--markdown']); "
            "assert 'torch' not in sys.modules and 'megatron' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == markdown()
