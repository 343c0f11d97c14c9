"""The one registry of the names the plugin replaces in Megatron's training loops, and the one way in.

:data:`LOOPS` maps a training loop (the module holding it: ``megatron.training.training`` today; a
second loop such as Megatron-Bridge's ``megatron.bridge.training.train`` is one more key, see
:func:`register`) to its rows, one :class:`Replacement` per name: how the replacement is made from
the original (a one-line adapter around a hook function: all behaviour lives in
:mod:`~megatron_dpsched.megatron.hooks` and the modules it names), the hook functions it calls, the
loop's functions that must use the name (the version check) and when it is installed: on every job
(the job checks, the step recorder) or with ``--dp-schedule``, and the megatron-core releases it belongs
to (``since`` / ``before``: where a release names a thing differently, one row per name; :func:`rows_of`
picks the release's, see :mod:`~megatron_dpsched.megatron.releases`). The rows of
``megatron.training.training`` are listed in ``docs/patch.md``, generated from :data:`LOOPS`
(``python -m megatron_dpsched.megatron.patch --markdown``; a test compares).

:func:`enable` installs a loop's rows (idempotent; ``dp_schedule=False``: only the rows of every job)
after one version check, :func:`check_megatron`, which names every name the Megatron release lacks or
no longer uses in one ``RuntimeError``, and says once which name the plugin calls outside the registry the
release lacks and what works without it (``releases.LACKING``). The originals are kept in one store keyed
by (loop, name); :func:`disable` puts every one back and forgets the hooks' state. The source patch
(``patches/megatron_training_dpsched.patch``; megatron-core 0.17 and 0.18: ``..._0.17.patch`` /
``..._0.18.patch``) calls the same hook functions from ``training.py``, every row's of its release; with it,
:func:`enable` installs nothing.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from megatron_dpsched.megatron import hooks, job_checks, releases

_PACKAGE = Path(__file__).resolve().parents[1]
"""The installed ``megatron_dpsched`` folder."""
MEGATRON_LM = "megatron.training.training"
"""Megatron-LM's training loop (``pretrain``, ``train``, ``train_step``, ``evaluate``)."""
When = Literal["always", "dp_schedule"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Replacement:
    """One name the plugin replaces in a training loop's module."""

    name: str
    """The name in the loop's module."""
    make: Callable[[Any], Any]
    """The replacement, made from the original (a one-line adapter around a hook function)."""
    calls: tuple[str, ...]
    """The hook functions (of :mod:`~megatron_dpsched.megatron.hooks`) it calls; the source patch calls the same."""
    used_by: tuple[str, ...]
    """Functions of the loop's module that must use ``name`` (else the version check refuses the release)."""
    when: When
    """``always``: every job, with or without ``--dp-schedule``; ``dp_schedule``: jobs with it."""
    parameters: tuple[str, ...] = ()
    """The original's leading parameters, which the replacement reads by position (the version check)."""
    since: tuple[int, int] | None = None
    """The first megatron-core release (major, minor) the row belongs to; ``None``: no lower bound."""
    before: tuple[int, int] | None = None
    """The first megatron-core release the row no longer belongs to (another row replaces it); ``None``: none."""

    def belongs_to(self, release: tuple[int, int]) -> bool:
        """Whether the row is installed on megatron-core ``release`` (major, minor)."""
        return (self.since is None or release >= self.since) and (self.before is None or release < self.before)


# --- the adapters: one per row, each around a hook function ------------------------------------


def _get_forward_backward_func(original: Callable[..., Any]) -> Callable[..., Any]:
    """Its result goes through `forward_backward_func` (scheduled iterators run the planned micro-batch count)."""
    return lambda *args, **kwargs: hooks.forward_backward_func(original(*args, **kwargs))


def _get_num_microbatches(original: Callable[..., Any]) -> Callable[..., Any]:
    """`num_microbatches`: during a scheduled step, its samples in Megatron's units (LR, consumed samples)."""
    return hooks.num_microbatches


def _update_num_microbatches(original: Callable[..., Any]) -> Callable[..., Any]:
    """`on_update_num_microbatches` (the scheduled step is over), then the original."""

    def update(*args: Any, **kwargs: Any) -> Any:
        hooks.on_update_num_microbatches()
        return original(*args, **kwargs)

    return update


def _get_moe_metrics_tracker(original: Callable[..., Any]) -> Callable[..., Any]:
    """Its tracker's `report` gets `loss_scale = 1 / microbatches_run()` (the micro-batches the step ran)."""
    return lambda *args, **kwargs: _ScaledByMicroBatchesRun(original(*args, **kwargs), "report")


def _track_moe_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    """It gets `loss_scale = 1 / microbatches_run()` (megatron-core 0.17's MoE loss logging)."""

    def track(*args: Any, **kwargs: Any) -> Any:
        scale = 1 / hooks.microbatches_run()
        if args and "loss_scale" not in kwargs:
            return original(scale, *args[1:], **kwargs)
        return original(*args, **{**kwargs, "loss_scale": scale})

    return track


def _mtp_loss_logging_helper(original: Any) -> Any:
    """Its `track_mtp_metrics` gets `loss_scale = 1 / microbatches_run()`."""
    return _ScaledByMicroBatchesRun(original, "track_mtp_metrics")


def _dsa_indexer_loss_logging_helper(original: Any) -> Any:
    """Its `track_indexer_metrics` gets `loss_scale = 1 / microbatches_run()`."""
    return _ScaledByMicroBatchesRun(original, "track_indexer_metrics")


def _training_log(original: Callable[..., Any]) -> Callable[..., Any]:
    """The original, then `on_training_log(iteration)` (the plan's figures of the step just trained)."""

    def log(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        hooks.on_training_log(kwargs["iteration"] if "iteration" in kwargs else args[3])
        return result

    return log


class _ScaledByMicroBatchesRun:
    """``target`` whose ``method`` gets ``loss_scale = 1 / hooks.microbatches_run()`` (first argument)."""

    def __init__(self, target: Any, method: str) -> None:
        self._target, self._method = target, method

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if name != self._method:
            return attribute

        def scaled(*args: Any, **kwargs: Any) -> Any:
            scale = 1 / hooks.microbatches_run()
            if "loss_scale" in kwargs:
                kwargs["loss_scale"] = scale
            else:
                args = (scale, *args[1:])
            return attribute(*args, **kwargs)

        return scaled


# --- the registry ------------------------------------------------------------------------------


LOOPS: dict[str, tuple[Replacement, ...]] = {MEGATRON_LM: (
    Replacement(name="get_forward_backward_func", make=_get_forward_backward_func, calls=("forward_backward_func",),
                used_by=("train", "evaluate"), when="dp_schedule"),
    Replacement(name="get_num_microbatches", make=_get_num_microbatches, calls=("num_microbatches",),
                used_by=("train", "train_step"), when="dp_schedule"),
    Replacement(name="update_num_microbatches", make=_update_num_microbatches,
                calls=("on_update_num_microbatches",), used_by=("train",), when="dp_schedule"),
    Replacement(name="get_moe_metrics_tracker", make=_get_moe_metrics_tracker, calls=("microbatches_run",),
                used_by=("training_log",), when="dp_schedule", since=(0, 18)),
    Replacement(name="track_moe_metrics", make=_track_moe_metrics, calls=("microbatches_run",),
                used_by=("training_log",), when="dp_schedule", parameters=("loss_scale",), before=(0, 18)),
    Replacement(name="MTPLossLoggingHelper", make=_mtp_loss_logging_helper, calls=("microbatches_run",),
                used_by=("training_log",), when="dp_schedule"),
    Replacement(name="DSAIndexerLossLoggingHelper", make=_dsa_indexer_loss_logging_helper,
                calls=("microbatches_run",), used_by=("training_log",), when="dp_schedule"),
    Replacement(name="training_log", make=_training_log, calls=("on_training_log",), used_by=("train",),
                when="dp_schedule", parameters=("loss_dict", "total_loss_dict", "learning_rate", "iteration")),
    Replacement(name="setup_model_and_optimizer", make=hooks.with_job_checks, calls=("with_job_checks",),
                used_by=("pretrain",), when="always"),
    Replacement(name="save_checkpoint", make=hooks.with_state_file, calls=("with_state_file",),
                used_by=("save_checkpoint_and_time",), when="always", parameters=("iteration",)),
    Replacement(name="train_step", make=hooks.with_step_stats, calls=("with_step_stats",), used_by=("train",),
                when="always", parameters=("forward_step_func", "data_iterator", "model", "optimizer",
                                           "opt_param_scheduler", "config", "forward_backward_func")),
)}
"""Training loop (its module's name) -> the names replaced in it."""

_originals: dict[tuple[str, str], Any] = {}
"""(loop, name) -> Megatron's object, for every name :func:`enable` replaced."""


def register(loop: str, rows: Sequence[Replacement]) -> None:
    """Add a training loop (the name of its module) and its rows; ``ValueError`` if it has rows already."""
    if loop in LOOPS:
        raise ValueError(f"dp-schedule: the training loop {loop} is registered already")
    names = [row.name for row in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"dp-schedule: {loop}: a name is replaced twice in {names}")
    LOOPS[loop] = tuple(rows)


def rows_of(loop: str = MEGATRON_LM) -> tuple[Replacement, ...]:
    """The rows of ``loop`` that belong to the megatron-core release imported (:meth:`Replacement.belongs_to`)."""
    release = releases.megatron_core_version()
    return tuple(row for row in LOOPS[loop] if row.belongs_to(release))


# --- the version check -------------------------------------------------------------------------


def check_megatron(module: Any = None, *, loop: str = MEGATRON_LM, rows: Iterable[Replacement] | None = None) -> None:
    """Raise ``RuntimeError`` naming, in one message, every name of ``rows`` (default: all of ``loop``'s) that
    ``module`` (default: the loop's) lacks or no longer uses as the rows expect."""
    module = importlib.import_module(loop) if module is None else module
    kept = {name: original for (of, name), original in _originals.items() if of == loop}
    found = _Found(module, kept if module is sys.modules.get(loop) else {})
    for row in rows_of(loop) if rows is None else rows:
        found.check(row)
    if found.problems():
        raise RuntimeError(f"dp-schedule: unsupported Megatron version: {loop} does not fit the plugin's patch: "
                           f"{'; '.join(found.problems())}")


class _Found:
    """What a training loop's module lacks or no longer uses, row by row."""

    def __init__(self, module: Any, originals: dict[str, Any]) -> None:
        self.module, self.originals = module, originals
        self.lacks: dict[str, None] = {}  # a dict keeps the order and drops repeats
        self.unused: dict[str, list[str]] = {}
        self.changed: list[str] = []

    def get(self, name: str) -> Any:
        """Megatron's object called ``name``, also where :func:`enable` has replaced it."""
        return self.originals[name] if name in self.originals else getattr(self.module, name, None)

    def check(self, row: Replacement) -> None:
        if not callable(self.get(row.name)):
            self.lacks[row.name] = None
        for function in row.used_by:
            code = getattr(self.get(function), "__code__", None)
            if code is None:
                self.lacks[function] = None
            elif row.name not in code.co_names:
                self.unused.setdefault(function, []).append(row.name)
        code = getattr(self.get(row.name), "__code__", None)
        if row.parameters and code is not None and code.co_varnames[:len(row.parameters)] != row.parameters:
            self.changed.append(f"{row.name} no longer takes ({', '.join(row.parameters)}, ...) first")

    def problems(self) -> list[str]:
        return ([f"it lacks {', '.join(self.lacks)}"] if self.lacks else []) + [
            f"{function} no longer uses {', '.join(names)}" for function, names in self.unused.items()] + self.changed


# --- enable / disable ----------------------------------------------------------------------------


def enable(*, dp_schedule: bool = True, loop: str = MEGATRON_LM) -> None:
    """Replace ``loop``'s names: the rows of every job, and with ``dp_schedule`` the ``--dp-schedule`` rows.

    Idempotent (a name replaced already stays as it is); nothing when the loop's source carries the
    patch (:func:`is_source_patched`). Refuses, before replacing anything, a Megatron whose loop does not
    fit the rows (:func:`check_megatron`).
    """
    module = importlib.import_module(loop)
    if is_source_patched(module):
        require_current_source_patch(module, loop=loop)
        return
    rows = [row for row in rows_of(loop)
            if (loop, row.name) not in _originals and (dp_schedule or row.when == "always")]
    check_megatron(module, loop=loop, rows=rows)
    if loop == MEGATRON_LM:
        releases.say_lacking_once(module)
    for row in rows:
        original = getattr(module, row.name)
        _originals[(loop, row.name)] = original
        setattr(module, row.name, row.make(original))


def disable(loop: str | None = None) -> None:
    """Put back every original (of ``loop``, or of every loop) and forget the hooks' state (idempotent)."""
    for key in [key for key in _originals if loop in (None, key[0])]:
        setattr(importlib.import_module(key[0]), key[1], _originals.pop(key))
    hooks.on_update_num_microbatches()
    job_checks.reset()


def installed(loop: str = MEGATRON_LM) -> tuple[str, ...]:
    """The names of ``loop`` that :func:`enable` has replaced, in the registry's order."""
    return tuple(row.name for row in LOOPS[loop] if (loop, row.name) in _originals)


def is_enabled() -> bool:
    """Whether :func:`enable` has installed the ``--dp-schedule`` rows of Megatron-LM's training loop."""
    return any(row.when == "dp_schedule" and row.name in installed() for row in LOOPS[MEGATRON_LM])


def is_source_patched(module: Any = None) -> bool:
    """Whether ``megatron.training.training`` (or ``module``) was built from a source-patched file."""
    module = module or importlib.import_module(MEGATRON_LM)
    return getattr(module, "dpsched_hooks", None) is hooks


def require_current_source_patch(module: Any, *, loop: str = MEGATRON_LM) -> None:
    """Refuse a source-patched ``module`` whose every-job names are not the hooks' (``RuntimeError``): a
    ``training.py`` patched by an older source patch, which called the ``--dp-schedule`` hooks but not the job
    checks or the step recorder; with it the job would run without them, unnoticed."""
    stale = [row.name for row in LOOPS[loop] if row.when == "always" and not _is_hook(getattr(module, row.name, None))]
    if stale:
        verb = "is" if len(stale) == 1 else "are"
        raise RuntimeError(
            f"dp-schedule: {getattr(module, '__file__', loop)} carries an older megatron-dpsched source patch: "
            f"{', '.join(stale)} {verb} not wrapped by the plugin's hooks (job checks, step recorder). Revert it "
            "and apply this release's source patch again (scripts/apply_megatron_patch.sh picks it, patches/README.md)")


def _is_hook(replacement: Any) -> bool:
    """Whether ``replacement`` is a function of this package (a hook's wrapper; ``functools.wraps`` copies the
    original's name and module, not its code)."""
    code = getattr(replacement, "__code__", None)
    return code is not None and Path(code.co_filename).resolve().is_relative_to(_PACKAGE)


# --- the docs' table ---------------------------------------------------------------------------

MARKDOWN_COMMAND = "python -m megatron_dpsched.megatron.patch --markdown"


def markdown(loop: str = MEGATRON_LM) -> str:
    """The rows of ``loop`` as a Markdown table (``docs/patch.md``)."""
    lines = [f"<!-- Generated by `{MARKDOWN_COMMAND}` from `megatron_dpsched/megatron/patch.py`; do not edit. -->",
             "",
             f"| name in `{loop}` | installed | must be used by | calls (`hooks.`) | the replacement |",
             "| --- | --- | --- | --- | --- |"]
    for row in LOOPS[loop]:
        when = ("every job" if row.when == "always" else "with `--dp-schedule`") + _releases(row)
        lines.append(f"| `{row.name}` | {when} | {', '.join(f'`{f}`' for f in row.used_by)} | "
                     f"{', '.join(f'`{c}`' for c in row.calls)} | {_first_line(row.make)} |")
    return "\n".join(lines) + "\n"


def _releases(row: Replacement) -> str:
    """``row``'s releases for the docs' table: empty for every release."""
    bounds = ([f">= {row.since[0]}.{row.since[1]}"] if row.since else []) + (
        [f"< {row.before[0]}.{row.before[1]}"] if row.before else [])
    return f", megatron-core {' and '.join(bounds)}" if bounds else ""


def _first_line(function: Callable[..., Any]) -> str:
    """The first line of ``function``'s docstring in Markdown (reST roles and double backquotes dropped)."""
    line = (function.__doc__ or "").strip().splitlines()[0]
    line = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", line)
    return line.replace("``", "`")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m megatron_dpsched.megatron.patch --markdown``: print the table of ``docs/patch.md``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m megatron_dpsched.megatron.patch")
    parser.add_argument("--markdown", action="store_true", required=True, help="print docs/patch.md's table")
    parser.parse_args(argv)
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
