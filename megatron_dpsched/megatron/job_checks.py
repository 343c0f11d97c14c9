"""Every rank agrees on what the job is before the model is built; a resume knows what it resumes.

Two hook functions wrap names of ``megatron.training.training``; they are rows of the patch registry
(:mod:`~megatron_dpsched.megatron.patch`), installed on every job (``setup_dp_schedule`` on every rank, with
or without ``--dp-schedule``), and the source patch wraps the same names with them:

1. :func:`with_job_checks` wraps ``setup_model_and_optimizer``: first, every rank of the default process
   group agrees on the :class:`~megatron_dpsched.runtime.job_identity.JobIdentity` of its arguments
   (:func:`identity_from_args`: ``--dp-schedule`` on or off, the ``--dp-schedule-*`` options, the planner
   config, the data flags and their files' sizes and checksums): one all-reduce of a vector of field digests
   with MAX (and of their negatives), on the GPU with NCCL, on the host with gloo. A field that differs
   raises the same ``ValueError`` on every rank, naming the field and the ranks of each value, before any
   model exists (a rank without ``--dp-schedule`` fails as fast as the others instead of leaving them
   waiting in a collective that it never joins). On a resume with ``--dp-schedule`` the state file
   (:data:`~megatron_dpsched.runtime.job_identity.STATE_FILE`) of the checkpoint Megatron is about to load
   (:func:`iteration_to_load`) is compared with this job before Megatron's function loads it (whose own asserts,
   such as its learning-rate scheduler's on another ``--global-batch-size``, would fire first): a change of data
   or options raises ``ValueError`` naming it, unless ``--dp-schedule-changed-resume allow``, which logs what
   changed. Then the checks of :data:`BEFORE_MODEL` (the datasets' ``lengths``), then Megatron's function (which
   builds the model and loads ``--load``).
2. :func:`with_state_file` wraps ``save_checkpoint``: after Megatron's save, global rank 0 writes the
   state file into the iteration folder: the job identity and the fingerprint of the plan of the step
   that follows (which a resume compares with the plan of its first step).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.megatron.arguments import DPScheduleOptions, PlanSetup, plan_setup_from_args
from megatron_dpsched.megatron.feeds import ScheduledDatasetLoader, StepBatches, StepFeed, find_step_feed
from megatron_dpsched.runtime.job_identity import (
    DATA_CONTENT_FIELD,
    DATA_PATHS_FIELD,
    DATA_SIZES_FIELD,
    ENABLED_FIELD,
    FIELDS,
    OPTIONS_FIELD,
    PLANNER_FIELD,
    RUN_TIME_OPTIONS_FIELD,
    STATE_FILE,
    SUMMARY_CHARS,
    JobIdentity,
    content_summary,
    data_files,
    job_disagreement_message,
    mismatched_fields,
    read_state,
    resolved_words,
    resume_changes,
    sizes_summary,
    state_json,
)
from megatron_dpsched.runtime.ranks import global_rank, print_rank_0

DATA_FLAGS = ("data_path", "train_data_path", "valid_data_path", "test_data_path", "split", "data_args_path",
              "per_split_data_args_path", "mock_data")
"""Megatron's arguments that say which data the job reads."""
ALLOW_FLAG = "--dp-schedule-changed-resume allow"

BEFORE_MODEL: list[Callable[[], None]] = []
"""More checks :func:`with_job_checks` runs (once each, then drops) after the job checks, before the next model is
built (each ``scheduled_datasets_provider`` adds the check of its datasets: ``lengths`` before the model exists)."""
_state: dict[str, Any] = {}
"""``identity``: this job's, once agreed; ``resume``: what a checked resume expects of its first step."""


def with_job_checks(setup_model_and_optimizer: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``setup_model_and_optimizer`` after every rank agrees on the job, then the resume check."""

    @functools.wraps(setup_model_and_optimizer)
    def checked(*args: Any, **kwargs: Any) -> Any:
        from megatron.training.global_vars import get_args

        identity = agree_on_this_job(get_args())
        check_resume(get_args(), identity, iteration=iteration_to_load(get_args()))  # before Megatron's asserts
        while BEFORE_MODEL:  # each runs once, for the next model built
            BEFORE_MODEL.pop(0)()
        result = setup_model_and_optimizer(*args, **kwargs)
        check_resume(get_args(), identity, iteration=get_args().iteration)  # the one loaded, if not known before
        return result

    return checked


def with_state_file(save_checkpoint: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``save_checkpoint``, then the checkpoint's state file (:func:`write_state`)."""

    @functools.wraps(save_checkpoint)
    def save(*args: Any, **kwargs: Any) -> Any:
        result = save_checkpoint(*args, **kwargs)
        iteration = args[0] if args else kwargs["iteration"]
        if not (kwargs.get("non_persistent_ckpt") or kwargs.get("release")):
            write_state(iteration, train_data_iterator=kwargs.get("train_data_iterator"))
        return result

    return save


def reset() -> None:
    """Forget this job's identity and any pending resume check (the patch registry's ``disable()``)."""
    _state.clear()


# --- 1. the job identity, agreed before the model is built ---------------------------------------


def identity_from_args(args: Any) -> JobIdentity:
    """The fields of this job (see :mod:`megatron_dpsched.runtime.job_identity`) from Megatron's ``args``."""
    options = DPScheduleOptions.from_args(args)
    enabled = options.enabled
    flags = {flag: getattr(args, flag, None) for flag in DATA_FLAGS if getattr(args, flag, None) not in (None, False)}
    files = data_files(word for value in flags.values() for word in _words(value))
    setup = plan_setup_from_args(args, data_parallel_size=args.data_parallel_size) if enabled else None
    return JobIdentity(fields=(
        (ENABLED_FIELD, "on" if enabled else "off"),
        (OPTIONS_FIELD, _listing(options.option_values(run_time=False)) if enabled else "-"),
        (RUN_TIME_OPTIONS_FIELD, _listing(options.option_values(run_time=True)) if enabled else "-"),
        (PLANNER_FIELD, planner_summary(setup, args=args) if setup is not None else "-"),
        (DATA_PATHS_FIELD, _listing({flag: resolved_words(value) for flag, value in flags.items()})),
        (DATA_SIZES_FIELD, sizes_summary(files)),
        (DATA_CONTENT_FIELD, content_summary(files)),
    ))


def planner_summary(setup: PlanSetup, *, args: Any) -> str:
    """The planner's options (``setup``: data-parallel size, batch, cap, cost model...) and the sample order
    (``args``: ``--dataloader-type``, and ``--seed`` when cyclic)."""
    config = setup.config
    options: dict[str, Any] = {field.name: getattr(config, field.name) for field in dataclasses.fields(ScheduleConfig)
                               if field.name != "drop_last"}  # the feeds plan one step at a time
    options["cost_model"] = setup.cost_model
    options["dataloader_type"] = getattr(args, "dp_schedule_dataloader_type", None) or args.dataloader_type
    if options["dataloader_type"] == "cyclic":
        options["seed"] = args.seed
    return _listing(options)


def agree_on_job(identity: JobIdentity) -> None:
    """Raise ``ValueError`` on every rank unless every rank of the default group holds ``identity``."""
    import torch.distributed as dist

    from megatron_dpsched.megatron.agreement import group_device

    if not (dist.is_available() and dist.is_initialized()):
        return
    digests = identity.digests()
    bounds = torch.tensor([*digests, *(-d for d in digests)], dtype=torch.int64, device=group_device())
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    values = bounds.tolist()
    if not mismatched_fields(values[:len(FIELDS)], [-v for v in values[len(FIELDS):]]):
        return
    held: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(held, identity)
    raise ValueError(job_disagreement_message(held))


def agree_on_this_job(args: Any) -> JobIdentity:
    """:func:`agree_on_job` on the identity of Megatron's ``args``, remembered for :func:`write_state`."""
    started = time.perf_counter()
    identity = identity_from_args(args)
    agree_on_job(identity)
    _state["identity"] = identity
    if getattr(args, "dp_schedule", False):
        print_rank_0(f"dp-schedule: every rank agrees on the job ({', '.join(FIELDS)}) "
                      f"in {(time.perf_counter() - started) * 1e3:.1f} ms")
    return identity


# --- 2. what a checkpoint remembers, and what a resume compares ---------------------------------


def write_state(iteration: int, *, train_data_iterator: Any) -> None:
    """On global rank 0 with ``--dp-schedule``: the state file of the checkpoint of ``iteration``."""
    from megatron.training.global_vars import get_args

    args = get_args()
    identity = _state.get("identity")
    if not getattr(args, "dp_schedule", False) or identity is None or global_rank() not in (None, 0) or not args.save:
        return
    feed = find_step_feed(train_data_iterator)
    next_step = next_step_of(feed, int(args.consumed_train_samples)) if feed is not None else None
    folder = os.path.join(args.save, f"iter_{iteration:07d}")
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{STATE_FILE}.{os.getpid()}")
    with open(temporary, "w") as out:
        out.write(state_json(identity, iteration=iteration, next_step=next_step))
    os.replace(temporary, os.path.join(folder, STATE_FILE))


def next_step_of(feed: StepFeed, consumed_samples: int) -> dict[str, int] | None:
    """Step, position and fingerprint of the plan that starts after ``consumed_samples`` (``None`` for a
    shipped plan, whose steps need not start at Megatron's position, or when the data is used up)."""
    if not isinstance(feed, ScheduledDatasetLoader):
        return None
    try:
        batches, _ = feed.plan_step_at(consumed_samples)
    except StopIteration:
        return None
    return {"step": batches.step, "consumed_samples": consumed_samples, "fingerprint": batches.fingerprint}


def iteration_to_load(args: Any) -> int | None:
    """The iteration Megatron's ``load_checkpoint`` will load from ``--load`` (``--ckpt-step``, else the
    checkpoint folder's tracker file), read before it loads; ``None`` where none will be (no ``--load``,
    ``--finetune``, a release checkpoint, no tracker file)."""
    if not getattr(args, "load", None) or getattr(args, "finetune", False):
        return None
    if getattr(args, "ckpt_step", None) is not None:
        return int(args.ckpt_step)
    from megatron.training.checkpointing import get_checkpoint_tracker_filename

    try:
        text = Path(get_checkpoint_tracker_filename(args.load)).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def check_resume(args: Any, identity: JobIdentity, *, iteration: int | None) -> None:
    """On a resume (``--load`` at ``iteration``: the one Megatron will load or has loaded): the checkpoint's job
    must be this one. Each iteration is checked once."""
    if not getattr(args, "dp_schedule", False) or not iteration or not args.load \
            or _state.get("resume_checked") == iteration:
        return
    _state["resume_checked"] = iteration
    path = os.path.join(args.load, f"iter_{iteration:07d}", STATE_FILE)
    state = read_state(path)
    if state is None:
        print_rank_0(f"dp-schedule: WARNING: {path} does not exist (a checkpoint saved without --dp-schedule): "
                      f"this resume cannot be checked against the data and options it was saved with")
        return
    changes = [_narrowed(change, saved=state["job"], identity=identity)
               for change in resume_changes(state["job"], identity)]
    allowed = DPScheduleOptions.from_args(args).changed_resume == "allow"
    where = f"iteration {iteration} of {args.load}"
    if changes and not allowed:
        raise ValueError(f"dp-schedule: resuming {where} with other data or options: {'; '.join(changes)}. "
                         f"Resume with what the checkpoint was saved with, or give {ALLOW_FLAG} to go on with "
                         f"the changes")
    if changes:
        print_rank_0(f"dp-schedule: WARNING: resuming {where} with changes ({ALLOW_FLAG}): {'; '.join(changes)}")
    _state["resume"] = {"changes": changes, "next_step": state.get("next_step"), "path": path, "allowed": allowed}


def check_resumed_step(feed: StepFeed, step: StepBatches) -> None:
    """At a resumed job's first training step: its plan must be the one the checkpoint expected next."""
    resume = _state.get("resume")
    if resume is None or feed.name != "train" or feed.steps_begun != 1:
        return
    del _state["resume"]
    saved = resume["next_step"]
    if saved is None or resume["changes"]:
        return  # nothing recorded (a shipped plan), or changes were allowed and the plan may differ
    now = {"step": step.step, "consumed_samples": feed.start_position, "fingerprint": step.fingerprint}
    if now == saved:
        return
    message = (f"the checkpoint ({resume['path']}) expects step {saved['step']} at consumed_samples="
               f"{saved['consumed_samples']} with plan fingerprint {saved['fingerprint']:#018x}; this job plans "
               f"step {now['step']} at consumed_samples={now['consumed_samples']} with fingerprint "
               f"{now['fingerprint']:#018x}: the samples' content or the planner changed")
    if not resume["allowed"]:
        raise ValueError(f"dp-schedule: {message}. Resume with the data and version the checkpoint was saved "
                         f"with, or give {ALLOW_FLAG} to go on")
    print_rank_0(f"dp-schedule: WARNING: {message} ({ALLOW_FLAG})")


# --- helpers ---------------------------------------------------------------------------------------


def _narrowed(change: str, *, saved: dict[str, str], identity: JobIdentity) -> str:
    """A change of a field whose summaries are too long to show whole (the planner config's listing ``a=1, b=2,
    ...``) shown as the items that differ (``planner config: 'global_batch_size=8' -> 'global_batch_size=16'``);
    other changes as they are."""
    name = change.split(":", 1)[0]
    before, after = saved.get(name), dict(identity.fields).get(name)
    if before is None or after is None or max(len(before), len(after)) <= SUMMARY_CHARS:
        return change
    old, new = before.split(", "), after.split(", ")
    gone, added = ", ".join(i for i in old if i not in new), ", ".join(i for i in new if i not in old)
    return f"{name}: {gone or '(none)'!r} -> {added or '(none)'!r}" if gone or added else change


def _words(value: Any) -> list[str]:
    if value is None or isinstance(value, bool):
        return []
    return [str(word) for word in value] if isinstance(value, (list, tuple)) else [str(value)]


def _listing(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in sorted(values.items()))


