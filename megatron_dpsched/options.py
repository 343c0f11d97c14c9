"""Every ``--dp-schedule*`` option, declared once (standard library and the pure core only, no torch).

Each :class:`Option` row gives the flag's stem, type, default, range or choices, help text, which planner or
feed field it sets and whether the ``megatron-dpsched plan`` what-if tool mirrors it. Generated from the table:

* training's flags: ``--dp-schedule-<stem>`` (:func:`megatron_dpsched.megatron.arguments.add_dp_schedule_args`),
  their defaults (``OPTION_DEFAULTS``), range checks and the ``ScheduleConfig`` built from them;
* the what-if tool's mirrored flags: ``--<stem>``, same default, range and choices (:func:`add_plan_options`);
* ``docs/options.md``: ``python -m megatron_dpsched.options --markdown > docs/options.md``.

Defaults that depend on the run (the objective, the collate format) are resolved by one rule each, used by
both sides: :func:`resolve_objective`, :func:`resolve_collate_format`, :func:`planned_padding`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from megatron_dpsched.core.config import BALANCE_MODES
from megatron_dpsched.core.ordering import MICROBATCH_ORDERS
from megatron_dpsched.core.validation import MAX_TOKENS

TRAINING_PREFIX = "--dp-schedule-"
"""Training's flags: ``--dp-schedule-<stem>``."""
PLAN_PREFIX = "--"
"""The what-if tool's mirrored flags: ``--<stem>``."""

VERIFY_LEVELS = ("off", "check", "strict")
COLLATE_FORMATS = ("bshd", "thd")
OBJECTIVES = ("step-time", "micro-batches")
CAP_COUNTS = ("padded", "tokens")
OVER_CAP = ("allow", "warn", "refuse")
SWITCH = ("on", "off")
ORDERS = ("auto", *MICROBATCH_ORDERS)

NOMINAL_FLOPS_PER_GPU = 4e14
"""Sustained FLOP/s of one GPU assumed by the step-time objective (training) and the what-if tool's default
``--flops-per-gpu``: with the cost model it turns FLOPs into seconds."""

SWITCH_HELP = ("Plan each step's micro-batches globally across data-parallel ranks (variable micro-batch count "
               "per step, per-token loss). The other --dp-schedule-* flags need it.")
"""Help of ``--dp-schedule`` itself, the switch the other options configure."""


class OptionError(ValueError):
    """A bad option value; ``option`` is the flag as the user typed it (``--dp-schedule-balance-growth``)."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True, kw_only=True)
class Option:
    """One ``--dp-schedule-<stem>`` option."""

    stem: str
    """Flag name after ``--dp-schedule-`` in training and after ``--`` in the what-if tool."""
    help: str
    """Help text; ``{p}`` stands for the flag prefix of the parser it is shown in (``--dp-schedule-`` or ``--``)."""
    sets: tuple[str, ...]
    """The planner or feed fields it sets (``ScheduleConfig.balance``); errors about them name this option."""
    kind: type = str
    """Value type: ``int``, ``float`` or ``str``."""
    default: Any = None
    """Value when it is not given; ``None``: unset, or resolved from the run (see ``default_text``)."""
    default_text: str = ""
    """How the docs state the default when ``default`` alone does not say it."""
    choices: tuple[str, ...] | None = None
    """Allowed values, or ``None``."""
    minimum: float | None = None
    """Smallest allowed value of a number."""
    maximum: float | None = None
    """Largest allowed value of a number."""
    metavar: str | None = None
    """Placeholder in ``--help``."""
    mirrored: bool = False
    """Whether the ``plan`` what-if tool has it too (as ``--<stem>``, same default, range and choices)."""
    needs: Callable[[Setting], str | None] | None = None
    """When the option acts: given the other flags (a :class:`Setting`), why it would not (``"without
    --dp-schedule-max-tokens-per-gpu"``, naming the flag that decides), or ``None`` when it acts; ``None``:
    it always acts. A given option that would not act is refused (:func:`check_setting`)."""
    needs_text: str = ""
    """When it acts, for the docs (``"with {p}max-tokens-per-gpu"``); set with ``needs``."""

    @property
    def name(self) -> str:
        """``balance-growth`` -> ``balance_growth`` (the what-if tool's ``dest``)."""
        return self.stem.replace("-", "_")

    @property
    def attribute(self) -> str:
        """Attribute in Megatron's ``args``: ``dp_schedule_balance_growth``."""
        return "dp_schedule_" + self.name

    @property
    def flag(self) -> str:
        """Training's flag: ``--dp-schedule-balance-growth``."""
        return TRAINING_PREFIX + self.stem

    def flag_in(self, prefix: str) -> str:
        """The flag with ``prefix`` (:data:`TRAINING_PREFIX` or :data:`PLAN_PREFIX`)."""
        return prefix + self.stem

    def help_in(self, prefix: str) -> str:
        """The help text with the flag names of the parser that shows it."""
        return self.help.format(p=prefix)

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (``"must be between 0 and 10"``), or ``None``."""
        if self.choices is not None:
            return None if value in self.choices else f"must be one of {', '.join(self.choices)}"
        if self.kind is str:
            return None if isinstance(value, str) else "must be a string"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.kind is int
                                                                             and not isinstance(value, int)):
            return f"must be {'an integer' if self.kind is int else 'a number'}"
        if not math.isfinite(value):
            return "must be a finite number"
        low, high = self.minimum, self.maximum
        if low is not None and high is not None and not low <= value <= high:
            return f"must be between {_number(low)} and {_number(high)}"
        if low is not None and not low <= value:
            return f"must be >= {_number(low)}"
        return None

    def check(self, value: Any, *, prefix: str = TRAINING_PREFIX) -> Any:
        """``value`` if allowed, else :class:`OptionError` naming the flag."""
        problem = self.problem(value)
        if problem is not None:
            flag = self.flag_in(prefix)
            raise OptionError(f"{flag} {problem}; got {value!r}", option=flag)
        return value

    def parse(self, text: str) -> Any:
        """An ``argparse`` ``type``: the text as ``kind``, in range (``ArgumentTypeError`` otherwise)."""
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if self.kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        problem = self.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
        return value


def _number(value: float) -> str:
    """``2147483647``, ``0``, ``0.5``: whole numbers without exponent or decimal point."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What decides whether an option acts: the options given and the few layout facts the rules read, from
    training's flags (:func:`megatron_dpsched.megatron.arguments.setting_from_args`, :func:`check_argv`) or the
    what-if tool's."""

    given: frozenset[str]
    """Stems of the options given on the command line."""
    values: Mapping[str, Any]
    """Every option's value by stem: the given one, else the row's default."""
    pp_size: int = 1
    """Pipeline-parallel stages."""
    has_model: bool = True
    """Whether there is a model to time (``--hidden-size`` or a cost-model file)."""
    prefix: str = TRAINING_PREFIX
    """The flag prefix of the tool that reads the options (errors name flags with it)."""
    pp_flag: str = "--pipeline-model-parallel-size"
    """The flag that sets ``pp_size`` (``--pp-size`` in the what-if tool)."""
    times_every_step: bool = False
    """The what-if tool: it times every step of every strategy with the step-time figures, whatever the
    objective, so the step-time options always act there."""

    def flag(self, stem: str) -> str:
        """``stem``'s flag in this tool."""
        return self.prefix + stem

    @property
    def objective(self) -> str:
        """The objective these options give (:func:`resolve_objective`)."""
        values = self.values
        return resolve_objective(values["objective"], pp_size=self.pp_size, token_cap=values["max-tokens-per-gpu"]
                                 is not None, balance=values["balance"], has_model=self.has_model)


def _needs_token_cap(setting: Setting) -> str | None:
    if setting.values["max-tokens-per-gpu"] is not None:
        return None
    return f"without {setting.flag('max-tokens-per-gpu')} (static batching: no token cap)"


def _why_not_step_time(setting: Setting) -> str | None:
    """The flag that makes the objective ``micro-batches`` (``"--pipeline-model-parallel-size 1"``); ``None``
    for ``step-time``."""
    values = setting.values
    if setting.objective == "step-time":
        return None
    if "objective" in setting.given:
        return f"{setting.flag('objective')} micro-batches"
    if values["max-tokens-per-gpu"] is None:
        return f"no {setting.flag('max-tokens-per-gpu')}"
    if values["balance"] == "none":
        return f"{setting.flag('balance')} none"
    return f"{setting.pp_flag} 1" if setting.pp_size == 1 else "no --hidden-size"


def _needs_step_time_objective(setting: Setting) -> str | None:
    if setting.times_every_step:
        return None
    if "cost-model" in setting.given:
        return (f"with {setting.flag('cost-model')}, whose step-time model has its own measured seconds per "
                "micro-batch")
    cause = _why_not_step_time(setting)
    return None if cause is None else (f"with the micro-batches objective ({cause}): it times micro-batches for "
                                       "the step-time objective only")


def _needs_cost_balance_or_step_time(setting: Setting) -> str | None:
    if setting.times_every_step or setting.values["balance"] == "cost":
        return None
    cause = _why_not_step_time(setting)
    if cause is None:
        return None
    balance = f"{setting.flag('balance')} {setting.values['balance']}"
    objective = "the micro-batches objective" + ("" if cause == balance else f" ({cause})")
    return f"with {balance} and {objective}: it acts with balance cost or the step-time objective"


OPTIONS: tuple[Option, ...] = (
    Option(stem="max-tokens-per-gpu", kind=int, minimum=1, maximum=MAX_TOKENS, metavar="CAP", mirrored=True,
           sets=("ScheduleConfig.max_tokens_per_gpu",), default_text="unset (static batching)",
           help="Dynamic batching: at most this many tokens per micro-batch per GPU (x CP per data-parallel rank). "
                "Unset: static batching with --micro-batch-size."),
    Option(stem="balance", choices=BALANCE_MODES, default="cost", mirrored=True, sets=("ScheduleConfig.balance",),
           help="What the planner balances across data-parallel ranks: a FLOPs model of the GPT (cost; dense, GQA, "
                "SwiGLU, MoE and MLA from the model flags, or the {p}cost-model file's measured cost), raw token "
                "counts (tokens) or nothing (none)."),
    Option(stem="balance-growth", kind=float, default=0.0, minimum=0.0, maximum=10.0, metavar="F", mirrored=True,
           sets=("ScheduleConfig.balance_growth",), needs=_needs_token_cap, needs_text="with {p}max-tokens-per-gpu",
           help="With {p}max-tokens-per-gpu: share (0 to 10) of extra micro-batches per step the planner may spend "
                "to balance ranks when the token cap keeps them apart (heavy tails at high fill); 0: no more "
                "than one global packing needs, unless the busiest rank stays over 5% above max(mean rank, "
                "dearest sample) (a tail past the cap): then up to one sample per micro-batch on the fullest "
                "rank. With the step-time objective it caps the extra micro-batches that objective adds."),
    Option(stem="objective", choices=OBJECTIVES, mirrored=True, sets=("ScheduleConfig.step_time_model",),
           default_text="step-time with PP > 1, a token cap and balance cost or tokens, else micro-batches",
           help="step-time: per step, the micro-batch count (and packing) with the smallest simulated step time "
                "of Megatron's pipeline schedule, from the cost model at a nominal 400 TFLOP/s per GPU plus "
                "{p}microbatch-overhead-ms per micro-batch; needs {p}max-tokens-per-gpu and balance cost or "
                "tokens. micro-batches: the fewest micro-batches that balance the ranks."),
    Option(stem="microbatch-overhead-ms", kind=float, default=2.0, minimum=0.0, maximum=1e6, metavar="MS",
           mirrored=True, sets=("StepTimeModel.seconds_per_microbatch",), needs=_needs_step_time_objective,
           needs_text="with the step-time objective and no {p}cost-model (the what-if tool: always, it times every "
                      "step)",
           help="Step-time objective: fixed forward milliseconds of every micro-batch over the whole model "
                "(kernel launches, pipeline hand-offs)."),
    Option(stem="cost-model", metavar="FILE", mirrored=True, sets=("CostModelFile",), default_text="unset",
           needs=_needs_cost_balance_or_step_time,
           needs_text="with {p}balance cost or the step-time objective (the what-if tool: always, it times every "
                      "step)",
           help="A cost-model file written by 'megatron-dpsched calibrate' (measured seconds per token, per sum "
                "of squared lengths and per micro-batch): balance cost balances its per-sample cost instead of "
                "the FLOPs model, and the step-time objective uses its step-time model instead of the nominal "
                "FLOP/s and {p}microbatch-overhead-ms."),
    Option(stem="microbatch-order", choices=ORDERS, default="auto", mirrored=True,
           sets=("ScheduleConfig.microbatch_order",),
           help="Micro-batch order within a step: pipeline (cheap micro-batches at both ends), none, or auto "
                "(pipeline when PP > 1)."),
    Option(stem="collate-format", choices=COLLATE_FORMATS, mirrored=True,
           sets=("CollateConfig.format", "ScheduleConfig.padded_rows"),
           default_text="thd when Transformer Engine is installed (and --transformer-impl is transformer_engine, "
                        "Megatron's default), else bshd",
           help="Micro-batch layout: packed sequences with cu_seqlens (thd: no padding; needs an attention backend "
                "that takes packed sequences: Transformer Engine, or a --spec layer spec) or padded rows (bshd: "
                "any attention backend; rows are padded to the micro-batch's longest sample, which the token cap "
                "counts: rows x longest, see {p}cap-counts)."),
    Option(stem="cap-counts", choices=CAP_COUNTS, default="padded", mirrored=True,
           sets=("ScheduleConfig.pad_multiple", "ScheduleConfig.padded_rows"), needs=_needs_token_cap,
           needs_text="with {p}max-tokens-per-gpu",
           help="What {p}max-tokens-per-gpu bounds. padded: the collated micro-batch, what memory and compute "
                "see: every sequence rounded up to the multiple the layout pads to (2 x CP, times TP with "
                "--sequence-parallel, and a multiple of 16 with --fp8-format, 32 with --fp8-recipe mxfp8 or "
                "--fp4-format), and with the bshd layout the row count times the longest row. tokens: real "
                "tokens only (the collated tensor can exceed the cap; bshd by several times)."),
    Option(stem="verify", choices=VERIFY_LEVELS, default="off", sets=("ScheduledDatasetLoader.verify",),
           help="check: run schedule.check() every step; strict: also verify every model chunk consumed exactly "
                "the planned micro-batches. Sample lengths and the plan's agreement across ranks are always "
                "checked."),
    Option(stem="prefetch", choices=SWITCH, default="on", sets=("ScheduledDatasetLoader.prefetch",),
           help="on: plan and collate the next step in one background thread while the current step trains (at "
                "most one step ahead; errors are raised on the training thread when their micro-batch is due); "
                "off: both on the training thread. Results are the same either way."),
    Option(stem="over-cap", choices=OVER_CAP, default="warn", sets=("build_feed's over-cap check",),
           needs=_needs_token_cap, needs_text="with {p}max-tokens-per-gpu",
           help="A sample longer than the token cap (its planned size: what {p}cap-counts counts) trains alone in "
                "a micro-batch over the cap, which may not fit in memory. allow: say nothing; warn: one warning "
                "per dataset before training (rank 0) with the count, the longest and the first ids; refuse: stop "
                "before training naming them. Every step's log line and TensorBoard scalars count them either "
                "way."),
    Option(stem="changed-resume", choices=("refuse", "allow"), default="refuse",
           sets=("job_checks.check_resume",),
           help="A resume (--load) whose data or --dp-schedule options differ from what the checkpoint was saved "
                "with (its dp_schedule_state.json): refuse: stop before training naming each change; allow: log "
                "the changes as a warning and train on."),
)
"""The ``--dp-schedule-*`` options (``--dp-schedule`` itself is the switch, :data:`SWITCH_HELP`)."""

BY_STEM: Mapping[str, Option] = {option.stem: option for option in OPTIONS}
"""The rows by stem."""


def check_setting(setting: Setting) -> None:
    """Refuse a given option that would not act under the other flags (its row's ``needs``): an
    :class:`OptionError` naming the option and the flag that decides."""
    for option in OPTIONS:
        if option.needs is not None and option.stem in setting.given:
            reason = option.needs(setting)
            if reason is not None:
                flag = setting.flag(option.stem)
                raise OptionError(f"{flag} has no effect {reason}; drop it", option=flag)


def without_switch(flags: Sequence[str]) -> str:
    """The error for ``--dp-schedule-*`` options given without ``--dp-schedule``."""
    return f"{', '.join(flags)} given without --dp-schedule, which they configure; add --dp-schedule or drop them"


class _RaisingParser(argparse.ArgumentParser):
    """Errors raise :class:`OptionError` (one line) instead of printing the usage and exiting."""

    def error(self, message: str) -> NoReturn:
        """``argument --dp-schedule-balance: invalid choice: ...``: ``option`` is the flag the message names."""
        named = message.removeprefix("argument ").split(":", 1)[0] if message.startswith("argument ") else ""
        raise OptionError(message, option=named or TRAINING_PREFIX.rstrip("-"))


def _pre_parser() -> argparse.ArgumentParser:
    """Training's ``--dp-schedule*`` flags and the Megatron flags the ``needs`` rules read, nothing else."""
    parser = _RaisingParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--dp-schedule", action="store_true")
    add_options(parser, prefix=TRAINING_PREFIX, unset_defaults=True)
    for flag in ("--pipeline-model-parallel-size", "--hidden-size", "--yaml-cfg"):
        parser.add_argument(flag)
    return parser


def check_argv(argv: Sequence[str]) -> None:
    """Training's ``--dp-schedule*`` flags in ``argv``, checked before Megatron parses (and prints) its own: an
    unknown one (with the closest known flag), a bad value, options without ``--dp-schedule``, and options that
    would not act (:func:`check_setting`). Raises :class:`OptionError` naming the flag; Megatron's flags are
    left to Megatron."""
    known, rest = _pre_parser().parse_known_args(list(argv))
    _refuse_unknown(rest)
    given = {o.stem: getattr(known, o.attribute) for o in OPTIONS if getattr(known, o.attribute) is not None}
    for stem, value in given.items():
        BY_STEM[stem].check(value)
    if not known.dp_schedule:
        if given:
            raise OptionError(without_switch([BY_STEM[stem].flag for stem in given]), option=BY_STEM[next(
                iter(given))].flag)
        return
    pp = known.pipeline_model_parallel_size
    if known.yaml_cfg is not None or (pp is not None and not pp.isdigit()):
        return  # Megatron reads (or refuses) the layout; validate_dp_schedule_args checks the rest
    check_setting(Setting(given=frozenset(given), values={o.stem: given.get(o.stem, o.default) for o in OPTIONS},
                          pp_size=int(pp or 1), has_model=known.hidden_size is not None or "cost-model" in given))


def _refuse_unknown(rest: Sequence[str]) -> None:
    """An unknown ``--dp-schedule-*`` flag among the arguments the option table does not know."""
    flags = [option.flag for option in OPTIONS]
    for word in rest:
        name = word.split("=", 1)[0]
        if name.startswith(TRAINING_PREFIX) and name not in flags:
            close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else "; see docs/options.md"
            raise OptionError(f"unknown option {name}{hint}", option=name)


def exit_on_bad_flags(argv: Sequence[str], *, prog: str) -> None:
    """:func:`check_argv`, for an entry point's first line: a bad flag prints ``<prog>: error: ...`` (one line,
    before Megatron's argument dump) and exits with status 2."""
    try:
        check_argv(argv)
    except OptionError as error:
        print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def option_for_field(field: str) -> Option | None:
    """The option whose value sets ``ScheduleConfig.<field>`` (the first such row), or ``None``."""
    return next((option for option in OPTIONS if f"ScheduleConfig.{field}" in option.sets), None)


def default_text(option: Option) -> str:
    """The default as the docs and ``--help`` state it."""
    if option.default_text:
        return option.default_text
    return f"{option.default:g}" if isinstance(option.default, float) else str(option.default)


GIVEN = "given_options"
"""The what-if tool's namespace attribute: the stems of the options given (:class:`_StoreGiven`)."""


class _StoreGiven(argparse.Action):
    """``store``, and the option's stem added to ``namespace.given_options`` (the defaults are the table's, so a
    given option cannot be told from an unset one by its value)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.dest.replace("_", "-")})


def add_options(group: Any, *, prefix: str, options: Iterable[Option] = OPTIONS,
                unset_defaults: bool) -> list[argparse.Action]:
    """Add ``options`` to an ``argparse`` group as ``<prefix><stem>`` and return their actions;
    ``unset_defaults``: every default is ``None`` (training tells a given option from an unset one), else the
    table's default (and the stems given are recorded in the namespace's ``given_options``)."""
    return [
        group.add_argument(option.flag_in(prefix), dest=option.attribute if prefix == TRAINING_PREFIX
                           else option.name, default=None if unset_defaults else option.default,
                           action="store" if unset_defaults else _StoreGiven,
                           type=option.kind if prefix == TRAINING_PREFIX else _checked(option),
                           choices=option.choices, metavar=option.metavar,
                           help=f"{option.help_in(prefix)} Default: {default_text(option)}.")
        for option in options
    ]


def _checked(option: Option) -> Callable[[str], Any]:
    """The what-if tool's ``type``: a number in range (:meth:`Option.parse`), else the text."""
    return str if option.choices is not None or option.kind is str else option.parse


def add_plan_options(group: Any, *, skip: Iterable[str] = ()) -> None:
    """The what-if tool's mirrored options (``--<stem>``), except the stems in ``skip``."""
    add_options(group, prefix=PLAN_PREFIX, unset_defaults=False,
                options=[option for option in OPTIONS if option.mirrored and option.stem not in skip])


def resolve_objective(objective: str | None, *, pp_size: int, token_cap: bool, balance: str,
                      has_model: bool) -> str:
    """The objective given, or by default ``step-time`` with PP > 1, a token cap, balance ``cost`` or
    ``tokens`` and a model to time (where more micro-batches can shrink pipeline bubbles)."""
    if objective is not None:
        return objective
    return "step-time" if pp_size > 1 and token_cap and balance != "none" and has_model else "micro-batches"


def resolve_collate_format(collate_format: str | None, *, transformer_impl: str = "transformer_engine") -> str:
    """The layout given, or by default ``thd`` where the attention backend takes packed sequences (Transformer
    Engine installed and ``--transformer-impl transformer_engine``, Megatron's default), else ``bshd``."""
    if collate_format is not None:
        return collate_format
    engine = transformer_impl == "transformer_engine"
    return "thd" if engine and importlib.util.find_spec("transformer_engine") is not None else "bshd"


def counts_padding(*, cap_counts: str, token_cap: bool) -> bool:
    """Whether the plan counts collate's padding against the cap: a token cap and ``cap-counts padded``."""
    BY_STEM["cap-counts"].check(cap_counts)
    return token_cap and cap_counts == "padded"


def planned_padding(*, cap_counts: str, token_cap: bool, pad_multiple: int, collate_format: str) -> dict[str, Any]:
    """``ScheduleConfig``'s ``pad_multiple`` and ``padded_rows``: the layout's multiple, and padded rows with
    ``bshd``, when the cap counts padding (:func:`counts_padding`); else ``1`` and ``False``."""
    if not counts_padding(cap_counts=cap_counts, token_cap=token_cap):
        return {"pad_multiple": 1, "padded_rows": False}
    return {"pad_multiple": pad_multiple, "padded_rows": collate_format == "bshd"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """``docs/options.md``: every option with its flags, values, default, what it sets and its help."""
    lines = [
        "# `--dp-schedule` options",
        "",
        "<!-- Generated by `python -m megatron_dpsched.options --markdown > docs/options.md`; do not edit. -->",
        "",
        "Training takes `--dp-schedule` (the switch) and the `--dp-schedule-<stem>` options below; the what-if "
        "tool `megatron-dpsched plan` mirrors the ones with a plan flag, as `--<stem>`, with the same default, "
        "range and choices, so that it plans what training runs.",
        "",
        f"`--dp-schedule`: {SWITCH_HELP}",
        "",
        "| training flag | plan flag | values | default | sets | description |",
        "|---|---|---|---|---|---|",
    ]
    for option in OPTIONS:
        plan = f"`{option.flag_in(PLAN_PREFIX)}`" if option.mirrored else "-"
        lines.append(f"| `{option.flag}` | {plan} | {_values(option)} | {_cell(default_text(option))} | "
                     f"{', '.join(f'`{field}`' for field in option.sets)} | "
                     f"{_cell(_described(option))} |")
    return "\n".join(lines) + "\n"


def _described(option: Option) -> str:
    """The help text, and when the option acts (refused otherwise)."""
    text = option.help_in(TRAINING_PREFIX)
    if not option.needs_text:
        return text
    return f"{text} Acts only {option.needs_text.format(p=TRAINING_PREFIX)}; refused otherwise."


def _values(option: Option) -> str:
    if option.choices is not None:
        return " \\| ".join(f"`{choice}`" for choice in option.choices)
    if option.kind is str:
        return option.metavar or "text"
    kind = "integer" if option.kind is int else "number"
    if option.maximum is not None:
        return f"{kind} {_number(option.minimum)} to {_number(option.maximum)}"
    return f"{kind} >= {_number(option.minimum)}"


def main(argv: list[str] | None = None) -> int:
    """``python -m megatron_dpsched.options --markdown``: print ``docs/options.md``."""
    parser = argparse.ArgumentParser(prog="python -m megatron_dpsched.options", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", required=True, help="print docs/options.md")
    parser.parse_args(argv)
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
