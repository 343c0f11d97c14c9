"""Training's flags and the ``plan`` what-if tool follow the option fields: same defaults and choices on Megatron's
real parser and on ``plan``'s, errors that name the flag, and the same plan for the same inputs."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from pathlib import Path

import harness
import pytest

from megatron_dpsched import build_dp_schedule, plan_schedule
from megatron_dpsched.cli import build_parser, main
from megatron_dpsched.megatron.arguments import DPScheduleOptions, add_dp_schedule_args, plan_setup_from_args
from megatron_dpsched.megatron.checks import validate_dp_schedule_args
from megatron_dpsched.megatron.feeds import ScheduledDataIterator
from megatron_dpsched.options import OPTIONS, PLAN_PREFIX, OptionError
from megatron_dpsched.whatif.inputs import load_sample_lengths

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

MT_BENCH = str(Path(__file__).resolve().parents[2] / "megatron_dpsched" / "data" / "mt_bench_answers.txt")
SHAPE = {"hidden-size": "4096", "num-layers": "32", "num-attention-heads": "32", "ffn-hidden-size": "14336",
         "vocab-size": str(harness.VOCAB)}
"""A model shape both tools read under the same flag names (Megatron's); large enough that the step-time
objective's micro-batch counts differ from the fewest."""


def _megatron_parser() -> argparse.ArgumentParser:
    """Megatron's own parser with the dp-schedule flags (captured from ``parse_args``)."""
    import sys

    from megatron.training.arguments import parse_args

    captured = []

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        captured.append(add_dp_schedule_args(parser))
        return parser

    saved, sys.argv = sys.argv, ["pretrain"]
    try:
        parse_args(extra_args_provider=provider)
    finally:
        sys.argv = saved
    return captured[0]


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return _actions(action.choices["plan"])
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_both_parsers_walk_the_fields_with_the_same_defaults_and_choices() -> None:
    megatron = _actions(_megatron_parser())
    plan = _actions(build_parser())
    unset = DPScheduleOptions.from_args(argparse.Namespace(dp_schedule=True))
    for option in OPTIONS:
        action = megatron[option.flag]
        assert action.dest == option.attribute and action.default is None  # unset can be told from given
        assert action.type is option.kind and (tuple(action.choices) if action.choices else None) == option.choices
        assert getattr(unset, option.name) == option.default
        if option.mirrored:
            mirror = plan[PLAN_PREFIX + option.stem]
            assert mirror.default == getattr(unset, option.name), option.stem
            assert mirror.choices == action.choices and mirror.metavar == action.metavar
        else:
            assert PLAN_PREFIX + option.stem not in plan


def test_one_list_of_values_per_option() -> None:
    from megatron_dpsched.megatron import collate
    from megatron_dpsched.options import BY_NAME

    assert collate.FORMATS == BY_NAME["collate_format"].choices
    with pytest.raises(OptionError, match="^--dp-schedule-verify must be one of off, check, strict; got 'loud'"):
        ScheduledDataIterator(build_dp_schedule([3, 4], dp_size=1, global_batch_size=2, micro_batch_size=1), rank=0,
                              samples=[], verify="loud", vocab_size=None)
    with pytest.raises(OptionError, match="^--dp-schedule-cap-counts must be one of padded, tokens; got 'all'"):
        ScheduledDataIterator(build_dp_schedule([3, 4], dp_size=1, global_batch_size=2, micro_batch_size=1), rank=0,
                              samples=[], cap_counts="all", vocab_size=None)


@pytest.fixture(scope="module")
def megatron_args() -> argparse.Namespace:
    return harness.parse_megatron_args(harness.base_argv())


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind is not str or o.choices], ids=lambda o: o.stem)
def test_every_bad_value_fails_validation_naming_its_flag(option, megatron_args) -> None:
    bad = ["nonsense"] if option.choices else [option.minimum - 1, float("nan"), "3"]
    for value in bad:
        args = copy.deepcopy(megatron_args)
        setattr(args, option.attribute, value)
        with pytest.raises(OptionError, match=f"^{option.flag} must be ") as raised:
            validate_dp_schedule_args(args)
        assert raised.value.option == option.flag


@pytest.mark.parametrize("given", [
    {},  # every option at its default
    {"balance": "tokens", "balance-growth": "0.25", "objective": "step-time", "microbatch-overhead-ms": "5",
     "microbatch-order": "none", "collate-format": "thd", "cap-counts": "tokens"},
    {"objective": "micro-batches", "collate-format": "bshd"},
], ids=["defaults", "all-given", "fewest"])
def test_plan_and_training_plan_the_same(given, tmp_path, monkeypatch) -> None:
    """MT-Bench, DP 8, PP 4, cap 16384: ``megatron-dpsched plan -o`` and training's flags give the same plan."""
    monkeypatch.setenv("WORLD_SIZE", "32")
    shape = [arg for name, value in SHAPE.items() for arg in (f"--{name}", value)]
    out = tmp_path / "plan.json"
    argv = ["plan", MT_BENCH, "--dp-size", "8", "--pp-size", "4", "--global-batch-size", "256",
            "--max-tokens-per-gpu", "16384", *shape, "-o", str(out)]
    assert main([*argv, *(arg for stem, value in given.items() for arg in (PLAN_PREFIX + stem, value))]) == 0
    training = harness.base_argv(extra=[
        "--pipeline-model-parallel-size", "4", "--global-batch-size", "256", "--dp-schedule-max-tokens-per-gpu",
        "16384", *shape, "--transformer-impl", "transformer_engine",  # Megatron's default backend
        *(arg for stem, value in given.items() for arg in (f"--dp-schedule-{stem}", value))])
    args = harness.parse_megatron_args(training)
    assert args.data_parallel_size == 8
    setup = plan_setup_from_args(args, data_parallel_size=args.data_parallel_size)
    lengths, _ = load_sample_lengths(MT_BENCH)
    ours = json.loads(json.dumps(plan_schedule(lengths, config=setup.config, cost_model=setup.cost_model).to_dict()))
    theirs = json.loads(out.read_text())
    assert theirs["num_microbatches"] == ours["num_microbatches"]
    assert theirs["micro_batch_indices"] == ours["micro_batch_indices"]
    assert theirs == ours  # config (step-time model, padding) and costs too
    if not given:  # the step-time objective with training's 2 ms per micro-batch, more than the fewest
        assert ours["config"]["step_time_model"]["seconds_per_microbatch"] == 0.002
        fewest = plan_schedule(lengths, config=dataclasses.replace(setup.config, step_time_model=None),
                               cost_model=setup.cost_model)
        assert sum(ours["num_microbatches"]) > sum(fewest.num_microbatches)
