"""Every ``--dp-schedule*`` option, written once as a field of :class:`DPScheduleOptions` (no torch).

Standard library and the pure core only: the what-if tool imports it.

A field is an option: its name (``balance_growth``; training's flag ``--dp-schedule-balance-growth``, the
attribute ``args.dp_schedule_balance_growth``), its type (a ``Literal`` lists the choices), its default, its help
(the docstring under it, in training's flag names) and the facts :func:`option` puts in its metadata (range,
when it acts, whether the what-if tool mirrors it, whether it only changes how a step runs, what it sets).
Generated from the fields (:data:`OPTIONS`, one :class:`Option` per field):

* training's flags ``--dp-schedule-<stem>`` (:func:`add_options`, which
  :func:`megatron_dpsched.megatron.arguments.add_dp_schedule_args` calls), their range checks
  (:meth:`DPScheduleOptions.check`) and the refusal of options that would not act (:func:`check_setting`);
* the what-if tool's mirrored flags ``--<stem>``: same default, range and choices, the help with the mirrored
  flags renamed (:func:`add_plan_options`);
* the flag behind a planner argument (:func:`config_flags`) and the job identity's option fields;
* ``docs/options.md``: ``python -m megatron_dpsched.options --markdown > docs/options.md``.

Defaults that depend on the run are resolved by one rule each, used by both sides:
:meth:`DPScheduleOptions.resolve_objective`, :func:`resolve_collate_format`, :meth:`DPScheduleOptions.planned_padding`.
:func:`check_argv` checks training's flags before Megatron parses them (``megatron_dpsched.megatron.checks``
re-exports it with the other checks).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import importlib.util
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.validation import MAX_TOKENS
from megatron_dpsched.runtime.ranks import report_failure

TRAINING_PREFIX = "--dp-schedule-"
"""Training's flags: ``--dp-schedule-<stem>``."""
PLAN_PREFIX = "--"
"""The what-if tool's mirrored flags: ``--<stem>``."""
ATTRIBUTE_PREFIX = "dp_schedule_"
"""An option's attribute in Megatron's ``args``: ``dp_schedule_<name>``."""

NOMINAL_FLOPS_PER_GPU = 4e14
"""Sustained FLOP/s of one GPU assumed by the step-time objective (training) and the what-if tool's default
``--flops-per-gpu``: with the cost model it turns FLOPs into seconds."""

Balance = Literal["cost", "tokens", "none"]
"""What the planner balances (the core's ``BALANCE_MODES``)."""
Objective = Literal["step-time", "micro-batches"]
MicrobatchOrder = Literal["auto", "pipeline", "none"]
"""``auto`` and the core's ``MICROBATCH_ORDERS``."""
CollateFormat = Literal["bshd", "thd"]
CapCounts = Literal["padded", "tokens"]
VerifyLevel = Literal["off", "check", "strict"]
Switch = Literal["on", "off"]
OverCapPolicy = Literal["allow", "warn", "refuse"]
ChangedResume = Literal["refuse", "allow"]

COLLATE_FORMATS: tuple[str, ...] = typing.get_args(CollateFormat)
"""The micro-batch layouts collate builds."""


class OptionError(ValueError):
    """A bad option value; ``option`` is the flag as the user typed it (``--dp-schedule-balance-growth``)."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True, kw_only=True, slots=True)
class OptionFacts:
    """What a field's metadata says about its option (written with :func:`option`)."""

    minimum: float | None = None
    """Smallest allowed value of a number."""
    maximum: float | None = None
    """Largest allowed value of a number."""
    metavar: str | None = None
    """Placeholder in ``--help``."""
    mirrored: bool = False
    """Whether the ``plan`` what-if tool has it too (as ``--<stem>``, same default, range and choices)."""
    run_time: bool = False
    """It changes how a step runs, not what it trains: a resume may change it (the job identity keeps it apart)."""
    needs: Callable[[Setting], str | None] | None = None
    """When the option acts: given the other flags (a :class:`Setting`), why it would not (``"without
    --dp-schedule-max-tokens-per-gpu"``, naming the flag that decides), or ``None`` when it acts; ``None``:
    it always acts. A given option that would not act is refused (:func:`check_setting`)."""
    needs_text: str = ""
    """When it acts, for the docs (``"with --dp-schedule-max-tokens-per-gpu"``); set with ``needs``."""
    default_text: str = ""
    """How the docs state the default when the default alone does not say it."""
    config: tuple[str, ...] = ()
    """The :class:`~megatron_dpsched.core.config.ScheduleConfig` fields it sets: the planner's errors about them
    name this option (:func:`config_flags`)."""
    sets: tuple[str, ...] = ()
    """What else it sets (``ScheduledDatasetLoader.verify``), for the docs."""


FACTS = "dp_schedule_option"
"""The metadata key of a field's :class:`OptionFacts`."""


def option(default: Any = None, **facts: Any) -> Any:
    """A :class:`DPScheduleOptions` field with ``default`` and the :class:`OptionFacts` ``facts``."""
    return field(default=default, metadata={FACTS: OptionFacts(**facts)})


# --- when an option acts ----------------------------------------------------------------------------------------


def _needs_token_cap(setting: Setting) -> str | None:
    if setting.options.max_tokens_per_gpu is not None:
        return None
    return f"without {setting.flag('max_tokens_per_gpu')} (static batching: no token cap)"


def _why_not_step_time(setting: Setting) -> str | None:
    """The flag that makes the objective ``micro-batches`` (``"--pipeline-model-parallel-size 1"``); ``None``
    for ``step-time``."""
    options = setting.options
    if setting.objective == "step-time":
        return None
    if "objective" in setting.given:
        return f"{setting.flag('objective')} micro-batches"
    if options.max_tokens_per_gpu is None:
        return f"no {setting.flag('max_tokens_per_gpu')}"
    if options.balance == "none":
        return f"{setting.flag('balance')} none"
    return f"{setting.pp_flag} 1" if setting.pp_size == 1 else "no --hidden-size"


def _needs_step_time_objective(setting: Setting) -> str | None:
    if setting.times_every_step:
        return None
    if "cost_model" in setting.given:
        return (f"with {setting.flag('cost_model')}, whose step-time model has its own measured seconds per "
                "micro-batch")
    cause = _why_not_step_time(setting)
    return None if cause is None else (f"with the micro-batches objective ({cause}): it times micro-batches for "
                                       "the step-time objective only")


def _needs_cost_balance_or_step_time(setting: Setting) -> str | None:
    if setting.times_every_step or setting.options.balance == "cost":
        return None
    cause = _why_not_step_time(setting)
    if cause is None:
        return None
    balance = f"{setting.flag('balance')} {setting.options.balance}"
    objective = "the micro-batches objective" + ("" if cause == balance else f" ({cause})")
    return f"with {balance} and {objective}: it acts with balance cost or the step-time objective"


_EVERY_STEP = "(the what-if tool: always, it times every step)"


# --- the options ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class DPScheduleOptions:
    """The ``--dp-schedule*`` flags: ``enabled`` (``--dp-schedule``) and one field per ``--dp-schedule-<stem>``
    option (``docs/options.md``); read from Megatron's ``args`` with :meth:`from_args` (unset ones hold the
    default). The docstring under each field is its help text."""

    enabled: bool = False
    """Plan each step's micro-batches globally across data-parallel ranks (variable micro-batch count per step,
    per-token loss). The other --dp-schedule-* flags need it."""
    max_tokens_per_gpu: int | None = option(minimum=1, maximum=MAX_TOKENS, metavar="CAP", mirrored=True,
                                            config=("max_tokens_per_gpu",), default_text="unset (static batching)")
    """Dynamic batching: at most this many tokens per micro-batch per GPU (x CP per data-parallel rank). Unset:
    static batching with --micro-batch-size."""
    balance: Balance = option("cost", mirrored=True, config=("balance",))
    """What the planner balances across data-parallel ranks: a FLOPs model of the GPT (cost; dense, GQA, SwiGLU, MoE
    and MLA from the model flags, or the --dp-schedule-cost-model file's measured cost), raw token counts (tokens)
    or nothing (none)."""
    balance_growth: float = option(0.0, minimum=0.0, maximum=10.0, metavar="F", mirrored=True,
                                   config=("balance_growth",), needs=_needs_token_cap,
                                   needs_text="with --dp-schedule-max-tokens-per-gpu")
    """With --dp-schedule-max-tokens-per-gpu: share (0 to 10) of extra micro-batches per step the planner may spend
    to balance ranks when the token cap keeps them apart (heavy tails at high fill); 0: no more than one global
    packing needs, unless the busiest rank stays over 5% above max(mean rank, dearest sample) (a tail past the cap):
    then up to one sample per micro-batch on the fullest rank. With the step-time objective it caps the extra
    micro-batches that objective adds."""
    objective: Objective | None = option(
        mirrored=True, config=("step_time_model",),
        default_text="step-time with PP > 1, a token cap and balance cost or tokens, else micro-batches")
    """step-time: per step, the micro-batch count (and packing) with the smallest simulated step time of Megatron's
    pipeline schedule, from the cost model at a nominal 400 TFLOP/s per GPU plus
    --dp-schedule-microbatch-overhead-ms per micro-batch; needs --dp-schedule-max-tokens-per-gpu and balance cost or
    tokens. micro-batches: the fewest micro-batches that balance the ranks."""
    microbatch_overhead_ms: float = option(
        2.0, minimum=0.0, maximum=1e6, metavar="MS", mirrored=True, sets=("StepTimeModel.seconds_per_microbatch",),
        needs=_needs_step_time_objective,
        needs_text=f"with the step-time objective and no --dp-schedule-cost-model {_EVERY_STEP}")
    """Step-time objective: fixed forward milliseconds of every micro-batch over the whole model (kernel launches,
    pipeline hand-offs)."""
    cost_model: str | None = option(
        metavar="FILE", mirrored=True, sets=("CostModelFile",), default_text="unset",
        needs=_needs_cost_balance_or_step_time,
        needs_text=f"with --dp-schedule-balance cost or the step-time objective {_EVERY_STEP}")
    """A cost-model file written by 'megatron-dpsched calibrate' (measured seconds per token, per sum of squared
    lengths and per micro-batch): balance cost balances its per-sample cost instead of the FLOPs model, and the
    step-time objective uses its step-time model instead of the nominal FLOP/s and
    --dp-schedule-microbatch-overhead-ms."""
    microbatch_order: MicrobatchOrder = option("auto", mirrored=True, config=("microbatch_order",))
    """Micro-batch order within a step: pipeline (cheap micro-batches at both ends), none, or auto (pipeline
    when PP > 1)."""
    collate_format: CollateFormat | None = option(
        mirrored=True, sets=("CollateConfig.format",), config=("padded_rows",),
        default_text="thd when Transformer Engine is installed (and --transformer-impl is transformer_engine, "
                     "Megatron's default), else bshd")
    """Micro-batch layout: packed sequences with cu_seqlens (thd: no padding; needs an attention backend that takes
    packed sequences: Transformer Engine, or a --spec layer spec) or padded rows (bshd: any attention backend; rows
    are padded to the micro-batch's longest sample, which the token cap counts: rows x longest, see
    --dp-schedule-cap-counts)."""
    cap_counts: CapCounts = option("padded", mirrored=True, config=("pad_multiple", "padded_rows"),
                                   needs=_needs_token_cap, needs_text="with --dp-schedule-max-tokens-per-gpu")
    """What --dp-schedule-max-tokens-per-gpu bounds. padded: the collated micro-batch, what memory and compute see:
    every sequence rounded up to the multiple the layout pads to (2 x CP, times TP with --sequence-parallel, and a
    multiple of 16 with --fp8-format, 32 with --fp8-recipe mxfp8 or --fp4-format), and with the bshd layout the row
    count times the longest row. tokens: real tokens only (the collated tensor can exceed the cap; bshd by several
    times)."""
    verify: VerifyLevel = option("off", run_time=True, sets=("ScheduledDatasetLoader.verify",))
    """check: run schedule.check() every step; strict: also verify every model chunk consumed exactly the planned
    micro-batches. Sample lengths and the plan's agreement across ranks are always checked."""
    prefetch: Switch = option("on", run_time=True, sets=("ScheduledDatasetLoader.prefetch",))
    """on: plan and collate the next step in one background thread while the current step trains (at most one step
    ahead; errors are raised on the training thread when their micro-batch is due); off: both on the training
    thread. Results are the same either way."""
    over_cap: OverCapPolicy = option("warn", run_time=True, sets=("build_feed's over-cap check",),
                                     needs=_needs_token_cap, needs_text="with --dp-schedule-max-tokens-per-gpu")
    """A sample longer than the token cap (its planned size: what --dp-schedule-cap-counts counts) trains alone in a
    micro-batch over the cap, which may not fit in memory. allow: say nothing; warn: one warning per dataset before
    training (rank 0) with the count, the longest and the first ids; refuse: stop before training naming them. Every
    step's log line and TensorBoard scalars count them either way."""
    changed_resume: ChangedResume = option("refuse", run_time=True, sets=("job_checks.check_resume",))
    """A resume (--load) whose data or --dp-schedule options differ from what the checkpoint was saved with (its
    dp_schedule_state.json): refuse: stop before training naming each change; allow: log the changes as a warning
    and train on."""

    @classmethod
    def from_args(cls, args: Any) -> DPScheduleOptions:
        """The options in Megatron's ``args`` (``dp_schedule`` and ``dp_schedule_<name>``; unset ones, ``None``,
        take the default)."""
        given = {option.name: getattr(args, option.attribute, None) for option in OPTIONS}
        return cls(enabled=bool(getattr(args, "dp_schedule", False)),
                   **{name: value for name, value in given.items() if value is not None})

    def option_values(self, *, run_time: bool) -> dict[str, Any]:
        """The options' values by name: those that only change how a step runs (``run_time``; a resume may
        change them), or those that change what it trains."""
        return {option.name: getattr(self, option.name) for option in OPTIONS if option.run_time == run_time}

    def check(self) -> None:
        """Every value against its option's range or choices: :class:`OptionError` naming training's flag."""
        for option in OPTIONS:
            value = getattr(self, option.name)
            if value is not None or option.default is not None:
                option.check(value)

    @property
    def counts_padding(self) -> bool:
        """Whether the plan counts collate's padding against the cap: a token cap and ``cap_counts`` padded."""
        BY_NAME["cap_counts"].check(self.cap_counts)
        return self.max_tokens_per_gpu is not None and self.cap_counts == "padded"

    def resolve_objective(self, *, pp_size: int, has_model: bool) -> str:
        """The objective given, or by default ``step-time`` with PP > 1, a token cap, balance ``cost`` or
        ``tokens`` and a model to time (where more micro-batches can shrink pipeline bubbles)."""
        if self.objective is not None:
            return self.objective
        timed = pp_size > 1 and self.max_tokens_per_gpu is not None and self.balance != "none" and has_model
        return "step-time" if timed else "micro-batches"

    def planned_padding(self, *, pad_multiple: int, collate_format: str) -> dict[str, Any]:
        """``ScheduleConfig``'s ``pad_multiple`` and ``padded_rows``: the layout's multiple, and padded rows with
        ``bshd``, when the cap counts padding (:attr:`counts_padding`); else ``1`` and ``False``."""
        if not self.counts_padding:
            return {"pad_multiple": 1, "padded_rows": False}
        return {"pad_multiple": pad_multiple, "padded_rows": collate_format == "bshd"}


def resolve_collate_format(collate_format: str | None, *, transformer_impl: str = "transformer_engine") -> str:
    """The layout given, or by default ``thd`` where the attention backend takes packed sequences (Transformer
    Engine installed and ``--transformer-impl transformer_engine``, Megatron's default), else ``bshd``."""
    if collate_format is not None:
        return collate_format
    engine = transformer_impl == "transformer_engine"
    return "thd" if engine and importlib.util.find_spec("transformer_engine") is not None else "bshd"


# --- each field as an option --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Option(OptionFacts):
    """One ``--dp-schedule-<stem>`` option: a field of :class:`DPScheduleOptions` with its facts."""

    name: str
    """The field: ``balance_growth``."""
    kind: type
    """Value type: ``int``, ``float`` or ``str``."""
    default: Any
    """Value when it is not given; ``None``: unset, or resolved from the run (see ``default_text``)."""
    choices: tuple[str, ...] | None
    """Allowed values (the field's ``Literal``), or ``None``."""
    help: str
    """Help text in training's flag names (the field's docstring)."""

    @property
    def stem(self) -> str:
        """``balance-growth``: the flag after ``--dp-schedule-`` (training) or ``--`` (the what-if tool)."""
        return self.name.replace("_", "-")

    @property
    def attribute(self) -> str:
        """Attribute in Megatron's ``args``: ``dp_schedule_balance_growth``."""
        return ATTRIBUTE_PREFIX + self.name

    @property
    def flag(self) -> str:
        """Training's flag: ``--dp-schedule-balance-growth``."""
        return TRAINING_PREFIX + self.stem

    @property
    def targets(self) -> tuple[str, ...]:
        """What it sets, for the docs: ``sets`` and ``ScheduleConfig.<field>`` of each of ``config``."""
        return (*self.sets, *(f"ScheduleConfig.{name}" for name in self.config))

    def flag_in(self, prefix: str) -> str:
        """The flag with ``prefix`` (:data:`TRAINING_PREFIX` or :data:`PLAN_PREFIX`)."""
        return prefix + self.stem

    def help_in(self, prefix: str) -> str:
        """The help text with the flag names of the parser that shows it (mirrored flags as ``--<stem>`` in the
        what-if tool)."""
        return self.help if prefix == TRAINING_PREFIX else in_plan_terms(self.help)

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

    @property
    def default_shown(self) -> str:
        """The default as the docs and ``--help`` state it."""
        if self.default_text:
            return self.default_text
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


def _number(value: float) -> str:
    """``2147483647``, ``0``, ``0.5``: whole numbers without exponent or decimal point."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls``, read from its source (once), on one line."""
    tree = ast.parse(Path(sys.modules[cls.__module__].__file__ or "").read_text(encoding="utf-8"))
    (node,) = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == cls.__name__]
    docs = {}
    for statement, following in zip(node.body, node.body[1:]):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[statement.target.id] = " ".join(str(following.value.value).split())
    return docs


def _kind_and_choices(hint: Any) -> tuple[type, tuple[str, ...] | None]:
    """``int | None`` -> ``(int, None)``; ``Literal["a", "b"] | None`` -> ``(str, ("a", "b"))``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) is Literal:
        return str, typing.get_args(hint)
    return hint, None


def _options() -> tuple[Option, ...]:
    hints = typing.get_type_hints(DPScheduleOptions)
    docs = field_docstrings(DPScheduleOptions)
    found = []
    for entry in dataclasses.fields(DPScheduleOptions):
        if FACTS not in entry.metadata:
            continue  # enabled: the switch
        facts = entry.metadata[FACTS]
        kind, choices = _kind_and_choices(hints[entry.name])
        found.append(Option(name=entry.name, kind=kind, default=entry.default, choices=choices, help=docs[entry.name],
                            **{fact.name: getattr(facts, fact.name) for fact in dataclasses.fields(OptionFacts)}))
    return tuple(found)


OPTIONS: tuple[Option, ...] = _options()
"""The ``--dp-schedule-*`` options, one per field of :class:`DPScheduleOptions` but ``enabled``, in field order."""
BY_NAME: Mapping[str, Option] = {option.name: option for option in OPTIONS}
"""The options by field name."""
SWITCH_HELP = field_docstrings(DPScheduleOptions)["enabled"]
"""Help of ``--dp-schedule`` itself, the switch the other options configure."""

assert {name for option in OPTIONS for name in option.config} <= {f.name for f in dataclasses.fields(ScheduleConfig)}, \
    "an option's config names ScheduleConfig fields"

_MIRRORED_STEMS = "|".join(re.escape(option.stem) for option in OPTIONS if option.mirrored)
_MIRRORED_FLAG = re.compile(f"{re.escape(TRAINING_PREFIX)}({_MIRRORED_STEMS})(?![\\w-])")
"""A mirrored option's training flag, whole (``--dp-schedule-balance`` does not match in
``--dp-schedule-balance-growth``)."""


def in_plan_terms(text: str) -> str:
    """``text`` with the mirrored options' training flags as the what-if tool spells them (``--<stem>``)."""
    return _MIRRORED_FLAG.sub(lambda match: PLAN_PREFIX + match.group(1), text)


def config_flags(*, prefix: str = TRAINING_PREFIX) -> dict[str, str]:
    """``ScheduleConfig`` field -> the flag of the option that sets it (the first, in field order; with
    :data:`PLAN_PREFIX` the mirrored options only): how a planner error (``ArgumentError.argument``) names a flag."""
    flags: dict[str, str] = {}
    for option in OPTIONS:
        if prefix == TRAINING_PREFIX or option.mirrored:
            for name in option.config:
                flags.setdefault(name, option.flag_in(prefix))
    return flags


# --- when options act -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What decides whether an option acts: the options and the few layout facts the rules read, from training's
    flags (:meth:`from_args`, :func:`check_argv`) or the what-if tool's."""

    options: DPScheduleOptions
    """Every option's value: the given one, else the default."""
    given: frozenset[str]
    """Names of the options given on the command line."""
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

    @classmethod
    def from_args(cls, args: Any) -> Setting:
        """The setting of Megatron's ``args`` (the options given are those not ``None``)."""
        given = frozenset(option.name for option in OPTIONS if getattr(args, option.attribute, None) is not None)
        return cls(options=DPScheduleOptions.from_args(args), given=given,
                   pp_size=getattr(args, "pipeline_model_parallel_size", 1) or 1,
                   has_model=getattr(args, "hidden_size", None) is not None or "cost_model" in given)

    def flag(self, name: str) -> str:
        """Option ``name``'s flag in this tool."""
        return BY_NAME[name].flag_in(self.prefix)

    @property
    def objective(self) -> str:
        """The objective these options give (:meth:`DPScheduleOptions.resolve_objective`)."""
        return self.options.resolve_objective(pp_size=self.pp_size, has_model=self.has_model)


def check_setting(setting: Setting) -> None:
    """Refuse a given option that would not act under the other flags (its ``needs``): an :class:`OptionError`
    naming the option and the flag that decides."""
    for option in OPTIONS:
        if option.needs is not None and option.name in setting.given:
            reason = option.needs(setting)
            if reason is not None:
                flag = setting.flag(option.name)
                raise OptionError(f"{flag} has no effect {reason}; drop it", option=flag)


def without_switch(flags: Sequence[str]) -> str:
    """The error for ``--dp-schedule-*`` options given without ``--dp-schedule``."""
    return f"{', '.join(flags)} given without --dp-schedule, which they configure; add --dp-schedule or drop them"


# --- training's flags before Megatron parses them ------------------------------------------------------------------


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
    left to Megatron. It lives here, with the fields it is made from, because it runs without torch."""
    known, rest = _pre_parser().parse_known_args(list(argv))
    _refuse_unknown(rest)
    given = {o.name: getattr(known, o.attribute) for o in OPTIONS if getattr(known, o.attribute) is not None}
    for name, value in given.items():
        BY_NAME[name].check(value)
    if not known.dp_schedule:
        if given:
            flags = [BY_NAME[name].flag for name in given]
            raise OptionError(without_switch(flags), option=flags[0])
        return
    pp = known.pipeline_model_parallel_size
    if known.yaml_cfg is not None or (pp is not None and not pp.isdigit()):
        return  # Megatron reads (or refuses) the layout; validate_dp_schedule_args checks the rest
    check_setting(Setting(options=DPScheduleOptions(enabled=True, **given), given=frozenset(given),
                          pp_size=int(pp or 1), has_model=known.hidden_size is not None or "cost_model" in given))


def _refuse_unknown(rest: Sequence[str]) -> None:
    """An unknown ``--dp-schedule-*`` flag among the arguments the options do not know."""
    flags = [option.flag for option in OPTIONS]
    for word in rest:
        name = word.split("=", 1)[0]
        if name.startswith(TRAINING_PREFIX) and name not in flags:
            close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else "; see docs/options.md"
            raise OptionError(f"unknown option {name}{hint}", option=name)


def exit_on_bad_flags(argv: Sequence[str], *, prog: str) -> None:
    """:func:`check_argv`, for an entry point's first line: a bad flag ends the job in one line before Megatron's
    argument dump (:func:`exit_with_flag_error`)."""
    try:
        check_argv(argv)
    except OptionError as error:
        exit_with_flag_error(str(error), prog=prog)


def one_line_parser_errors(parser: argparse.ArgumentParser, *, prog: str) -> argparse.ArgumentParser:
    """Make ``parser`` (Megatron's, handed to an ``extra_args_provider``) report a bad flag as one line
    ``<prog>: error: ...`` once per job (:func:`exit_with_flag_error`) instead of its usage and error on every
    rank; an unknown or bad ``--dp-schedule*`` flag in the command line gets :func:`check_argv`'s message (the
    closest known flag) instead of "unrecognized arguments". Returns ``parser``."""

    def error(message: str) -> NoReturn:
        try:
            check_argv(sys.argv[1:])  # what the parser parses
        except OptionError as ours:
            message = str(ours)
        exit_with_flag_error(message, prog=prog)

    parser.error = error  # type: ignore[method-assign]
    return parser


def exit_with_flag_error(message: str, *, prog: str) -> NoReturn:
    """Report ``<prog>: error: <message>`` (one line) once per job
    (:func:`~megatron_dpsched.runtime.ranks.report_failure`: rank 0 prints it, every rank records it for torchrun's
    summary) and exit with status 2, as ``argparse`` does for a bad flag."""
    report_failure(f"{prog}: error: {' '.join(message.split())}", same_on_every_rank=True)
    raise SystemExit(2)


# --- argparse: training's group and the what-if tool's mirror -----------------------------------------------------


GIVEN = "given_options"
"""The what-if tool's namespace attribute: the names of the options given (:class:`_StoreGiven`)."""


class _StoreGiven(argparse.Action):
    """``store``, and the option's name added to ``namespace.given_options`` (the defaults are the fields', so a
    given option cannot be told from an unset one by its value)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.dest})


def add_options(group: Any, *, prefix: str, options: Iterable[Option] = OPTIONS,
                unset_defaults: bool) -> list[argparse.Action]:
    """Add ``options`` to an ``argparse`` group as ``<prefix><stem>`` and return their actions;
    ``unset_defaults``: every default is ``None`` (training tells a given option from an unset one), else the
    field's default (and the names given are recorded in the namespace's ``given_options``)."""
    return [
        group.add_argument(option.flag_in(prefix), dest=option.attribute if prefix == TRAINING_PREFIX
                           else option.name, default=None if unset_defaults else option.default,
                           action="store" if unset_defaults else _StoreGiven,
                           type=option.kind if prefix == TRAINING_PREFIX else _checked(option),
                           choices=option.choices, metavar=option.metavar,
                           help=f"{option.help_in(prefix)} Default: {option.default_shown}.".replace("%", "%%"))
        for option in options
    ]


def _checked(option: Option) -> Callable[[str], Any]:
    """The what-if tool's ``type``: a number in range (:meth:`Option.parse`), else the text."""
    return str if option.choices is not None or option.kind is str else option.parse


def add_plan_options(group: Any, *, skip: Iterable[str] = ()) -> None:
    """The what-if tool's mirrored options (``--<stem>``), except the names in ``skip``."""
    add_options(group, prefix=PLAN_PREFIX, unset_defaults=False,
                options=[option for option in OPTIONS if option.mirrored and option.name not in skip])


def plan_options(args: argparse.Namespace) -> DPScheduleOptions:
    """The options of the what-if tool's ``args`` (the mirrored ones; the others at their default)."""
    return DPScheduleOptions(enabled=True, **{o.name: getattr(args, o.name) for o in OPTIONS if o.mirrored})


# --- docs/options.md ---------------------------------------------------------------------------------------------


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
        lines.append(f"| `{option.flag}` | {plan} | {_values(option)} | {_cell(option.default_shown)} | "
                     f"{', '.join(f'`{target}`' for target in option.targets)} | {_cell(_described(option))} |")
    return "\n".join(lines) + "\n"


def _described(option: Option) -> str:
    """The help text, and when the option acts (refused otherwise)."""
    if not option.needs_text:
        return option.help
    return f"{option.help} Acts only {option.needs_text}; refused otherwise."


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
