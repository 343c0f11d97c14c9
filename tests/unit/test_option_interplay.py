"""Every option acts or is refused: the fields' ``needs`` rules, finite numbers, training's flags checked before
Megatron parses them (:func:`check_argv`), and the what-if tool's refusals (no torch)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from megatron_dpsched import options
from megatron_dpsched.cli import MAX_PARALLEL, build_parser, main
from megatron_dpsched.options import (
    BY_NAME,
    GIVEN,
    OPTIONS,
    PLAN_PREFIX,
    DPScheduleOptions,
    OptionError,
    Setting,
    check_setting,
)

CAP = ["--dp-schedule-max-tokens-per-gpu", "64"]
NUMBERS = [option for option in OPTIONS if option.kind is not str]


def _setting(given: dict[str, object], *, pp_size: int = 1, has_model: bool = True) -> Setting:
    names = {stem.replace("-", "_"): value for stem, value in given.items()}
    return Setting(options=DPScheduleOptions(enabled=True, **names), given=frozenset(names), pp_size=pp_size,
                   has_model=has_model)


# (given options, pp size, the option refused, the other flag its error names); None: every given option acts
CASES = [
    ({"balance-growth": 0.5}, 1, "balance-growth", "--dp-schedule-max-tokens-per-gpu"),
    ({"balance-growth": 0.0}, 1, "balance-growth", "--dp-schedule-max-tokens-per-gpu"),  # any value given
    ({"balance-growth": 0.5, "max-tokens-per-gpu": 64}, 1, None, None),
    ({"cap-counts": "tokens"}, 4, "cap-counts", "--dp-schedule-max-tokens-per-gpu"),
    ({"over-cap": "refuse"}, 1, "over-cap", "--dp-schedule-max-tokens-per-gpu"),
    ({"over-cap": "refuse", "max-tokens-per-gpu": 64}, 1, None, None),
    ({"microbatch-overhead-ms": 1.0, "max-tokens-per-gpu": 64}, 1, "microbatch-overhead-ms",
     "--pipeline-model-parallel-size 1"),
    ({"microbatch-overhead-ms": 1.0, "max-tokens-per-gpu": 64, "objective": "micro-batches"}, 4,
     "microbatch-overhead-ms", "--dp-schedule-objective micro-batches"),
    ({"microbatch-overhead-ms": 1.0, "max-tokens-per-gpu": 64, "balance": "none"}, 4, "microbatch-overhead-ms",
     "--dp-schedule-balance none"),
    ({"microbatch-overhead-ms": 1.0}, 4, "microbatch-overhead-ms", "--dp-schedule-max-tokens-per-gpu"),
    ({"microbatch-overhead-ms": 1.0, "max-tokens-per-gpu": 64}, 4, None, None),
    ({"microbatch-overhead-ms": 1.0, "max-tokens-per-gpu": 64, "objective": "step-time"}, 1, None, None),
    ({"microbatch-overhead-ms": 1.0, "max-tokens-per-gpu": 64, "cost-model": "c.json"}, 4,
     "microbatch-overhead-ms", "--dp-schedule-cost-model"),
    ({"cost-model": "c.json", "balance": "tokens"}, 1, "cost-model", "--dp-schedule-balance tokens"),
    ({"cost-model": "c.json", "balance": "none", "max-tokens-per-gpu": 64}, 4, "cost-model",
     "--dp-schedule-balance none"),
    ({"cost-model": "c.json"}, 1, None, None),  # balance cost
    ({"cost-model": "c.json", "balance": "tokens", "max-tokens-per-gpu": 64}, 4, None, None),  # step-time
]


@pytest.mark.parametrize(("given", "pp_size", "refused", "other"), CASES)
def test_a_given_option_that_would_not_act_is_refused_naming_it_and_the_deciding_flag(given, pp_size, refused,
                                                                                       other) -> None:
    setting = _setting(given, pp_size=pp_size)
    if refused is None:
        check_setting(setting)
        return
    with pytest.raises(OptionError, match=f"^--dp-schedule-{refused} has no effect ") as raised:
        check_setting(setting)
    assert raised.value.option == f"--dp-schedule-{refused}" and other in str(raised.value)


def test_options_without_a_rule_act_under_any_flags() -> None:
    free = {"max-tokens-per-gpu": 64, "balance": "none", "objective": "micro-batches", "microbatch-order":
            "pipeline", "collate-format": "bshd", "verify": "strict", "prefetch": "off"}
    assert all(BY_NAME[stem.replace("-", "_")].needs is None for stem in free)
    for pp_size in (1, 4):
        check_setting(_setting(free, pp_size=pp_size))
        check_setting(_setting({stem: value for stem, value in free.items() if stem != "max-tokens-per-gpu"}))


def test_the_what_if_tool_times_every_step_so_the_step_time_options_always_act_there() -> None:
    setting = Setting(options=DPScheduleOptions(balance="tokens"), given=frozenset({"microbatch_overhead_ms",
                      "cost_model"}), prefix=PLAN_PREFIX, pp_flag="--pp-size", times_every_step=True)
    check_setting(setting)
    capped = Setting(options=DPScheduleOptions(), given=frozenset({"cap_counts"}), prefix=PLAN_PREFIX,
                     times_every_step=True)
    with pytest.raises(OptionError, match="^--cap-counts has no effect without --max-tokens-per-gpu "):
        check_setting(capped)


@pytest.mark.parametrize("option", NUMBERS, ids=lambda option: option.stem)
def test_every_number_is_finite_and_in_range_on_both_sides(option) -> None:
    for value in (math.nan, math.inf, -math.inf, option.minimum - 1):
        assert option.problem(value) is not None
        with pytest.raises(argparse.ArgumentTypeError):
            option.parse(repr(value) if not math.isfinite(value) else str(value))
    assert option.problem(math.nan) == option.problem(math.inf) == "must be a finite number" or option.kind is int


def test_the_docs_say_when_each_option_acts() -> None:
    page = options.markdown()
    for option in OPTIONS:
        (row,) = [line for line in page.splitlines() if line.startswith(f"| `{option.flag}` |")]
        assert ("refused otherwise" in row) == (option.needs is not None), option.stem
        if option.needs is not None:
            assert option.needs_text in row


@pytest.mark.parametrize(("argv", "message"), [
    (["--dp-schedule", "--dp-schedule-balanse", "cost"], "unknown option --dp-schedule-balanse; did you mean "
                                                         "--dp-schedule-balance?"),
    (["--dp-schedule", "--dp-schedule-overcap=warn"], "did you mean --dp-schedule-over-cap?"),
    (["--dp-schedule", "--dp-schedule-zzzzzzzzzzzzzzzzzz", "1"], "unknown option --dp-schedule-zzzzzzzzzzzzzzzzzz; "
                                                                 "see docs/options.md"),
    (["--dp-schedule", "--dp-schedule-microbatch-overhead-ms", "nan"], "--dp-schedule-microbatch-overhead-ms "
                                                                       "must be a finite number; got nan"),
    (["--dp-schedule", *CAP, "--dp-schedule-microbatch-overhead-ms=-1"], "must be between 0 and 1000000"),
    (["--dp-schedule", "--dp-schedule-balance-growth", "inf"], "--dp-schedule-balance-growth must be a finite"),
    (["--dp-schedule", "--dp-schedule-balance", "flops"], "argument --dp-schedule-balance: invalid choice"),
    (["--dp-schedule-balance", "tokens", "--lr", "1e-3"], "--dp-schedule-balance given without --dp-schedule"),
    (["--dp-schedule", *CAP, "--hidden-size", "8", "--dp-schedule-microbatch-overhead-ms", "3"],
     "--dp-schedule-microbatch-overhead-ms has no effect with the micro-batches objective "
     "(--pipeline-model-parallel-size 1)"),
    (["--dp-schedule", "--dp-schedule-cost-model", "c.json", "--dp-schedule-balance", "tokens"],
     "--dp-schedule-cost-model has no effect with --dp-schedule-balance tokens"),
])
def test_check_argv_refuses_our_bad_flags_in_one_line(argv, message) -> None:
    with pytest.raises(OptionError) as raised:
        options.check_argv(argv)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert raised.value.option.startswith("--dp-schedule")


@pytest.mark.parametrize("argv", [
    [],
    ["--lr", "-1", "--data-path", "1", "a.jsonl", "--split", "90,10,0", "--unknown-megatron-flag"],
    ["--dp-schedule", *CAP, "--pipeline-model-parallel-size", "2", "--hidden-size", "8",
     "--dp-schedule-microbatch-overhead-ms", "3", "--dp-schedule-over-cap", "refuse"],
    ["--dp-schedule", *CAP, "--pipeline-model-parallel-size=4", "--hidden-size", "8", "--dp-schedule-cost-model",
     "c.json", "--dp-schedule-balance", "tokens"],
    # Megatron reads the layout from the YAML file: the rules that need it wait for validate_dp_schedule_args
    ["--dp-schedule", *CAP, "--yaml-cfg", "run.yaml", "--dp-schedule-microbatch-overhead-ms", "3"],
])
def test_check_argv_leaves_megatron_flags_and_acting_options_alone(argv) -> None:
    options.check_argv(argv)


def test_exit_on_bad_flags_prints_one_line_and_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        options.exit_on_bad_flags(["--dp-schedule", "--dp-schedule-verify", "loud"], prog="train.py")
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("train.py: error: argument --dp-schedule-verify: invalid choice: 'loud'")
    options.exit_on_bad_flags(["--dp-schedule", "--dp-schedule-verify", "check"], prog="train.py")


# --- the what-if tool --------------------------------------------------------------------------------------


def _one_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "inf" not in captured.out and "nan" not in captured.out
    return captured.err.strip()


@pytest.fixture
def lengths(tmp_path: Path) -> str:
    path = tmp_path / "lengths.txt"
    path.write_text("10 20 30 400 50 60 70 80")
    return str(path)


LAYOUT = ["--dp-size", "2", "--global-batch-size", "4"]


def test_plan_records_which_options_were_given() -> None:
    args = build_parser().parse_args(["plan", "x", *LAYOUT, "--max-tokens-per-gpu", "9", "--balance", "cost"])
    assert getattr(args, GIVEN) == {"max_tokens_per_gpu", "balance"}
    assert args.balance_growth == BY_NAME["balance_growth"].default


@pytest.mark.parametrize(("extra", "message"), [
    (["--micro-batch-size", "1", "--balance-growth", "0.5"],
     "--balance-growth has no effect without --max-tokens-per-gpu (static batching: no token cap); drop it"),
    (["--micro-batch-size", "1", "--cap-counts", "tokens"], "--cap-counts has no effect without --max-tokens-per-gpu"),
    (["--max-tokens-per-gpu", "100", "--cp-size", str(MAX_PARALLEL + 1)],
     f"argument --cp-size: must be at most {MAX_PARALLEL}, got '{MAX_PARALLEL + 1}'"),
    (["--max-tokens-per-gpu", "100", "--dp-size", "1000000000"], "argument --dp-size: must be at most"),
    (["--max-tokens-per-gpu", "2147483647", "--cp-size", "2"],
     "--cp-size 2: the token cap --max-tokens-per-gpu x --cp-size = 4294967294 is over 2147483647"),
    (["--max-tokens-per-gpu", "100", "--flops-per-gpu", "1e-300"], "error: --flops-per-gpu 1e-300: "),
    (["--max-tokens-per-gpu", "100", "--flops-per-gpu", "1e-295"],
     "error: --flops-per-gpu 1e-295: a simulated step takes inf seconds"),
    (["--max-tokens-per-gpu", "100", "--flops-per-gpu", "1e-297"], "error: --flops-per-gpu 1e-297: "),
    (["--max-tokens-per-gpu", "100", "--pp-size", "2", "--flops-per-gpu", "1e-297"], "error: --flops-per-gpu "),
    (["--max-tokens-per-gpu", "100", "--microbatch-overhead-ms", "1e308"],
     "argument --microbatch-overhead-ms: must be between 0 and 1000000"),
])
def test_plan_refuses_what_would_not_act_or_would_print_inf_or_nan(extra, message, lengths, capsys) -> None:
    layout = ["--global-batch-size", "4", *([] if "--dp-size" in extra else ["--dp-size", "2"])]
    assert message in _one_line(capsys, ["plan", lengths, *layout, *extra])


def test_plan_keeps_the_step_time_options_at_pp_1(lengths, capsys) -> None:
    assert main(["plan", lengths, *LAYOUT, "--max-tokens-per-gpu", "100", "--microbatch-overhead-ms", "5",
                 "--objective", "micro-batches", "--json"]) == 0
    assert '"seconds"' in capsys.readouterr().out
