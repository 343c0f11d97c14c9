"""Install the ``--dp-schedule`` data path into ``megatron.training.training``.

``enable()`` replaces three names *in the namespace of*
``megatron.training.training`` (the module that holds ``train``,
``train_step`` and ``evaluate``); nothing else in Megatron is touched, and
``disable()`` puts the originals back. Both are idempotent. No scheduling logic
lives here: the plan comes from the data iterator's feed
(:mod:`megatron_dpsched.megatron.iterator`).

1. ``get_forward_backward_func``: the function it returns is wrapped. When the
   ``data_iterator`` it is called with is a scheduled chunk iterator (or a list
   of them, possibly inside Megatron's ``RerunDataIterator``), the wrapper
   starts the feed's next step, checks the step's micro-batch count against the
   interleaved schedule's rule *before* calling (a rejected call would already
   have entered ``no_sync``), and passes the planned ``num_microbatches``
   instead of the calculator's. When the rerun state machine replays a step
   (``RerunDataIterator.replaying``) the same step is run again, not the next.
   Other iterators pass through untouched. Both ``train()`` and ``evaluate()``
   get their schedule function through this name.
2. ``get_num_microbatches``: during a scheduled training step (from the
   forward-backward call until Megatron next calls ``update_num_microbatches``)
   it answers ``step_num_samples / (micro_batch_size * data_parallel_size)``,
   so ``train_step``'s LR-scheduler increment and ``train()``'s
   ``consumed_train_samples`` grow by exactly the samples the step trained.
   Outside that window it is Megatron's calculator, so ``train()``'s
   "micro-batches never decrease" assert keeps seeing the constant count.
3. ``update_num_microbatches``: closes that window, then calls the original.

``check_megatron()`` verifies that ``train``, ``train_step`` and ``evaluate``
still use these names the way this module expects and raises
``RuntimeError`` otherwise (``enable()`` calls it first).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from megatron_dpsched.megatron.iterator import StepBatches, StepFeed

_TARGET = "megatron.training.training"
_PATCHED = ("get_forward_backward_func", "get_num_microbatches", "update_num_microbatches")
_EXPECTED_USES = {
    "train": ("get_forward_backward_func", "get_num_microbatches", "update_num_microbatches", "train_step"),
    "train_step": ("get_num_microbatches",),
    "evaluate": ("get_forward_backward_func",),
}
_GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"

_originals: dict[str, Any] = {}
_active_step: StepBatches | None = None


def _training_module() -> Any:
    import importlib

    return importlib.import_module(_TARGET)


def check_megatron(module: Any = None) -> None:
    """Raise ``RuntimeError`` if Megatron's training loop does not look as this patch expects."""
    module = module or _training_module()
    for name in _PATCHED:
        if not callable(getattr(module, name, None)):
            raise RuntimeError(f"dp-schedule: {_TARGET}.{name} is missing; unsupported Megatron version")
    for function, names in _EXPECTED_USES.items():
        code = getattr(getattr(module, function, None), "__code__", None)
        missing = [n for n in names if code is None or n not in code.co_names]
        if missing:
            raise RuntimeError(
                f"dp-schedule: {_TARGET}.{function} no longer uses {missing}; unsupported Megatron version"
            )
    if "opt_param_scheduler" not in module.train_step.__code__.co_varnames:
        raise RuntimeError(f"dp-schedule: {_TARGET}.train_step changed its signature; unsupported version")


def enable() -> None:
    """Install the hooks (idempotent)."""
    if _originals:
        return
    module = _training_module()
    check_megatron(module)
    replacements = {
        "get_forward_backward_func": _patched_get_forward_backward_func,
        "get_num_microbatches": _patched_get_num_microbatches,
        "update_num_microbatches": _patched_update_num_microbatches,
    }
    for name, replacement in replacements.items():
        _originals[name] = getattr(module, name)
        setattr(module, name, replacement)


def disable() -> None:
    """Restore Megatron's originals (idempotent)."""
    global _active_step
    if not _originals:
        return
    module = _training_module()
    for name, original in _originals.items():
        setattr(module, name, original)
    _originals.clear()
    _active_step = None


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return bool(_originals)


def active_step() -> StepBatches | None:
    """The scheduled training step whose sample count ``get_num_microbatches`` reports, if any."""
    return _active_step


# --- 1. get_forward_backward_func ------------------------------------------------------------


def _patched_get_forward_backward_func(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    return scheduled_forward_backward(_originals["get_forward_backward_func"](*args, **kwargs))


def scheduled_forward_backward(forward_backward_func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Megatron forward-backward function so scheduled iterators set ``num_microbatches``."""

    @functools.wraps(forward_backward_func)
    def run(**kwargs: Any) -> Any:
        feed = find_step_feed(kwargs.get("data_iterator"))
        if feed is None:
            return forward_backward_func(**kwargs)
        replay = is_replaying(kwargs["data_iterator"])
        step = feed.current if replay else feed.begin_step()
        assert step is not None, "a rerun replays a step that has started"
        check_interleaved_count(step.num_microbatches, kwargs["model"])
        if not kwargs.get("forward_only", False):
            _open_step(step)
        result = forward_backward_func(**{**kwargs, "num_microbatches": step.num_microbatches})
        if not replay:
            feed.end_step()
        return result

    run.dp_schedule_wrapped = forward_backward_func  # type: ignore[attr-defined]
    return run


def find_step_feed(data_iterator: Any) -> StepFeed | None:
    """The :class:`StepFeed` behind Megatron's ``data_iterator`` (one, a list, or rerun-wrapped)."""
    iterators = data_iterator if isinstance(data_iterator, list) else [data_iterator]
    feeds = {id(f): f for f in (_feed_of(it) for it in iterators) if f is not None}
    if not feeds:
        return None
    if len(feeds) > 1 or any(_feed_of(it) is None for it in iterators):
        raise ValueError("dp-schedule: all model chunks' data iterators must come from one feed")
    return next(iter(feeds.values()))


def is_replaying(data_iterator: Any) -> bool:
    """Whether Megatron's rerun state machine is replaying the current step's saved micro-batches."""
    iterators = data_iterator if isinstance(data_iterator, list) else [data_iterator]
    return any(getattr(it, "replaying", False) for it in iterators)


def _feed_of(iterator: Any) -> StepFeed | None:
    inner = getattr(iterator, "iterable", iterator)  # RerunDataIterator keeps the original here
    feed = getattr(inner, "feed", None)
    return feed if isinstance(feed, StepFeed) else None


def check_interleaved_count(num_microbatches: int, model: Any) -> None:
    """Raise ``ValueError`` if Megatron's interleaved schedule would reject this count."""
    if not isinstance(model, list) or len(model) == 1:
        return
    from megatron.core import parallel_state
    from megatron.core.utils import get_model_config

    pp = parallel_state.get_pipeline_model_parallel_world_size()
    group = get_model_config(model[0]).microbatch_group_size_per_vp_stage
    remainder = num_microbatches % group
    if not pp <= group <= num_microbatches or 0 < remainder < pp:
        raise ValueError(
            f"dp-schedule planned {num_microbatches} micro-batches, which the interleaved schedule "
            f"rejects with {_GROUP_FLAG}={group} and PP={pp}; the plan and the model config disagree"
        )


# --- 2. get_num_microbatches / 3. update_num_microbatches ------------------------------------


def _open_step(step: StepBatches) -> None:
    global _active_step
    _accounting_count(step)  # fail before training if the count is not expressible
    _active_step = step


def _accounting_count(step: StepBatches) -> int:
    from megatron.training.global_vars import get_args

    args = get_args()
    remat = getattr(args, "gtp_weight_remat_size", 1)
    per_microbatch = args.micro_batch_size * args.data_parallel_size * remat
    count, remainder = divmod(step.num_samples, per_microbatch)
    if remainder:
        raise ValueError(
            f"dp-schedule step {step.step} trains {step.num_samples} samples, not a multiple of "
            f"--micro-batch-size x data-parallel size = {per_microbatch}; Megatron cannot count it "
            f"(set --global-batch-size to a multiple, or drop the trailing partial step)"
        )
    return count


def _patched_get_num_microbatches() -> int:
    if _active_step is None:
        return _originals["get_num_microbatches"]()
    return _accounting_count(_active_step)


def _patched_update_num_microbatches(*args: Any, **kwargs: Any) -> None:
    global _active_step
    _active_step = None
    return _originals["update_num_microbatches"](*args, **kwargs)
