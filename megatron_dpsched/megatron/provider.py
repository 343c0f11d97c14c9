"""Turning an existing Megatron training script onto the ``--dp-schedule`` data path.

Three changes to a ``pretrain_gpt.py``-style script (and optionally
``megatron_dpsched.megatron.checks.exit_on_bad_flags(sys.argv[1:], prog=...)`` first: a bad
``--dp-schedule*`` flag in one line, before Megatron's argument dump; ``docs/checks.md``)::

    args = parse_and_validate_args(extra_args_provider=add_dp_schedule_args)   # 1. the flags
    setup_dp_schedule(args)                                                     # 2. validate + hooks
    pretrain(cfg, scheduled_datasets_provider(train_valid_test_datasets_provider), ...)  # 3. the data

Wrapped in ``with one_line_errors():`` (:mod:`.failures`), what the plugin refuses while training prints one
line per job (``dp-schedule: rank R step S: ...``, exit code 2) instead of a traceback per rank.

``scheduled_datasets_provider`` wraps the script's dataset provider. Without
``--dp-schedule`` it is the provider itself. With it, each dataset the provider
returns (a map-style dataset of variable-length samples with a ``lengths``
attribute: token count per sample) is fed by a :class:`ScheduledDatasetLoader`,
and Megatron receives its chunk iterators as an external data loader (one per
virtual pipeline stage, all from one feed). Packing decisions stay in the core;
this module only wires datasets, ranks and flags together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from megatron_dpsched.data.sampling import SampleOrder
from megatron_dpsched.megatron.arguments import (
    DPScheduleOptions,
    collate_format_from_args,
    pad_multiple_from_args,
    plan_setup_from_args,
)
from megatron_dpsched.megatron.checkpoint_rng import keep_checkpoint_rng_layout
from megatron_dpsched.megatron.checks import (
    check_dataset_size,
    check_over_cap,
    dataset_lengths,
    padded_vocab_size,
    validate_dp_schedule_args,
)
from megatron_dpsched.megatron.collate import CollateConfig, require_padding_agreement
from megatron_dpsched.megatron.feeds import ScheduledDatasetLoader
from megatron_dpsched.runtime.ranks import print_rank_0

DatasetsProvider = Callable[..., tuple[Any, Any, Any]]


def setup_dp_schedule(args: Any) -> None:
    """After Megatron's argument validation: check the ``--dp-schedule*`` flags and install the hooks.

    Call it on every rank, with or without ``--dp-schedule``: it always installs the job check
    (:mod:`~megatron_dpsched.megatron.job_checks`: before the model is built, every rank agrees on
    ``--dp-schedule``, its options and the data, so a rank that differs fails every rank at once
    instead of hanging them). Nothing else without ``--dp-schedule``. Run it before the model is
    built (it turns on per-token loss and variable sequence lengths under PP). Resuming a checkpoint
    saved without per-rank RNG states keeps ``--data-parallel-random-init`` off
    (:func:`~megatron_dpsched.megatron.checkpoint_rng.keep_checkpoint_rng_layout`).
    """
    validate_dp_schedule_args(args)
    from megatron_dpsched.megatron import patch

    patch.enable(dp_schedule=bool(getattr(args, "dp_schedule", False)))  # the job checks always, hooks with the flag
    if not getattr(args, "dp_schedule", False):
        return
    keep_checkpoint_rng_layout(args)  # a checkpoint saved without per-rank RNG states stays loadable
    if getattr(args, "dp_schedule_dataloader_type", None) is None:
        args.dp_schedule_dataloader_type = dataloader_semantics(args.dataloader_type)
    args.dataloader_type = "external"  # Megatron hands the feed's iterators through; the feed samples


def dataloader_semantics(dataloader_type: str | None) -> str:
    """What the feed does for ``--dataloader-type``: ``single`` (one pass in order, the default and what
    ``external`` gets: the provider's datasets are read as they are) or ``cyclic`` (a seeded permutation
    per epoch, wrapping around)."""
    if dataloader_type in (None, "single", "external"):
        return "single"
    if dataloader_type == "cyclic":
        return "cyclic"
    raise ValueError(f"--dataloader-type must be single, cyclic or external; got {dataloader_type!r}")


ROLES = ("train", "valid", "test")


def scheduled_datasets_provider(provider: DatasetsProvider) -> DatasetsProvider:
    """Wrap a ``train_valid_test_datasets_provider`` so ``--dp-schedule`` feeds its datasets by the plan.

    One feed per role (train, valid, test), built on the first call: Megatron calls the
    provider once per virtual pipeline stage, and every stage must read the same feed
    even when the provider builds fresh dataset objects each time. With ``--dp-schedule`` the
    provider is first called before the model is built (a job check,
    :data:`~megatron_dpsched.megatron.job_checks.BEFORE_MODEL`, with the sample counts Megatron will ask for and
    the random states kept), so a dataset without ``lengths`` fails before the model exists; Megatron's own call
    then gets those datasets.
    """
    from megatron_dpsched.megatron import job_checks

    feeds: dict[str, ScheduledDatasetLoader] = {}
    takes_vp_stage = "vp_stage" in inspect.signature(provider).parameters
    early: dict[str, Any] = {}

    def datasets_of(num_samples: Any, vp_stage: int | None) -> tuple[Any, Any, Any]:
        if early.get("key") == (_counts(num_samples), vp_stage):
            early.pop("key")
            return early.pop("datasets")
        return provider(num_samples, vp_stage=vp_stage) if takes_vp_stage else provider(num_samples)

    def check_before_model() -> None:
        from megatron.training.global_vars import get_args

        args = get_args()
        num_samples = _megatron_num_samples(args) if getattr(args, "dp_schedule", False) else None
        if num_samples is None:
            return
        vp_stage = 0 if args.virtual_pipeline_model_parallel_size is not None else None
        with _random_states_kept():
            early.update(key=(_counts(num_samples), vp_stage), datasets=datasets_of(num_samples, vp_stage))
        for role, dataset in zip(ROLES, early["datasets"]):
            if dataset is not None:
                dataset_lengths(dataset, role=role)
                bound_ids(dataset, args=args)

    def wrapped(num_samples: Any, vp_stage: int | None = None) -> tuple[Any, Any, Any]:
        from megatron.training.global_vars import get_args

        args = get_args()
        datasets = datasets_of(num_samples, vp_stage)
        if not getattr(args, "dp_schedule", False):
            return datasets
        needed = list(num_samples) if isinstance(num_samples, (list, tuple)) else [None] * len(ROLES)
        return tuple(
            _chunk_of(feeds, role, dataset, args=args, vp_stage=vp_stage, num_samples=count)
            for role, dataset, count in zip(ROLES, datasets, needed)
        )

    wrapped.__name__ = getattr(provider, "__name__", "scheduled_datasets_provider")
    wrapped.__doc__ = provider.__doc__
    wrapped.is_distributed = True  # every tensor-parallel rank builds the same feed itself
    wrapped.feeds = feeds  # role -> feed, built on first use
    job_checks.BEFORE_MODEL.append(check_before_model)
    return wrapped


def bound_ids(dataset: Any, *, args: Any) -> None:
    """A corpus opened without the vocabulary (``open_corpus(path)``: it recorded each row's largest id when it was
    indexed) is checked whole against Megatron's padded vocabulary before any step, naming the first row past it
    (``file:line`` or the sequence); one opened with ``vocab_size=`` keeps its own bound."""
    check = getattr(dataset, "check_vocabulary", None)
    if check is not None and getattr(dataset, "vocab_size", None) is None:
        check(padded_vocab_size(args))


def _counts(num_samples: Any) -> Any:
    return tuple(num_samples) if isinstance(num_samples, (list, tuple)) else num_samples


def _megatron_num_samples(args: Any) -> tuple[int | None, ...] | None:
    """The sample counts Megatron's ``build_train_valid_test_datasets`` will ask the provider for (its
    ``get_train_valid_test_num_samples``), where they do not depend on the checkpoint still to be loaded; else
    ``None``."""
    from megatron.training import training

    if getattr(args, "phase_transition_iterations", None) or getattr(args, "eval_interval", None) is None:
        return None
    try:
        return tuple(training.get_train_valid_test_num_samples())
    except (AssertionError, AttributeError, TypeError):
        return None


@contextlib.contextmanager
def _random_states_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's random states (this device's too) as they were before the block: the
    provider's early call does not change the model's initialisation."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])


def _chunk_of(
    feeds: dict[str, ScheduledDatasetLoader],
    role: str,
    dataset: Any,
    *,
    args: Any,
    vp_stage: int | None,
    num_samples: int | None,
) -> Any:
    """The ``vp_stage`` chunk iterator of the feed for ``role`` (built once, shared by all stages)."""
    if dataset is None:
        return None
    if role not in feeds:
        feeds[role] = build_feed(dataset, args=args, role=role, num_samples=num_samples)
    return feeds[role].chunks[vp_stage or 0]


def build_feed(
    dataset: Any, *, args: Any, role: str = "train", num_samples: int | None = None
) -> ScheduledDatasetLoader:
    """A :class:`ScheduledDatasetLoader` for this process's data-parallel rank, from Megatron's ``args``.

    ``role`` picks Megatron's position and batch size: training data starts at
    ``consumed_train_samples`` with ``--global-batch-size``; validation at
    ``consumed_valid_samples`` (0 with ``--skip-train``) and test at 0, both with
    ``--eval-global-batch-size``, which is what ``evaluate()`` advances by.
    ``num_samples`` (what Megatron asks the provider for: ``--train-iters x
    --global-batch-size`` for training) must fit the dataset, or a ``ValueError``
    gives both numbers before training.
    """
    from megatron.core import parallel_state as mpu

    lengths = dataset_lengths(dataset, role=role)
    bound_ids(dataset, args=args)
    order = sample_order_from_args(args, num_samples=len(lengths), groups=getattr(dataset, "groups", None))
    if not order.cyclic:
        check_dataset_size(role, len(lengths), num_samples, args=args)
    if role == "train":
        _warn_if_nothing_was_loaded(args)
    setup = plan_setup_from_args(args, data_parallel_size=mpu.get_data_parallel_world_size())
    config = setup.config if role == "train" else dataclasses.replace(
        setup.config, global_batch_size=getattr(args, "eval_global_batch_size", None) or args.global_batch_size)
    options = DPScheduleOptions.from_args(args)
    check_over_cap(lengths if order.cyclic or num_samples is None else lengths[:num_samples], config=config,
                   policy=options.over_cap, role=role)
    collate = collate_config_from_args(args)
    require_padding_agreement(pad_multiple=config.pad_multiple, padded_rows=config.padded_rows, collate=collate,
                              counts_padding=options.counts_padding)
    return ScheduledDatasetLoader(
        dataset,
        lengths=lengths,
        rank=mpu.get_data_parallel_rank(),
        config=config,
        cost_model=setup.cost_model,
        consumed_samples=_start_of(role, args),
        order=order,
        trained_tokens=getattr(dataset, "trained_tokens", None),
        num_chunks=args.virtual_pipeline_model_parallel_size or 1,
        collate=collate,
        verify=options.verify,
        name=role,
        prefetch=options.prefetch == "on",
        vocab_size=padded_vocab_size(args),
        cap_counts=options.cap_counts,
    )


def sample_order_from_args(args: Any, *, num_samples: int, groups: Sequence[Any] | None = None) -> SampleOrder:
    """The stream ``--dataloader-type`` gives (``cyclic``: permuted per epoch from ``--seed``); a dataset's
    ``groups`` (a group id per sample) are kept whole and shuffled as units."""
    semantics = getattr(args, "dp_schedule_dataloader_type", None) or dataloader_semantics(args.dataloader_type)
    return SampleOrder(num_samples, cyclic=semantics == "cyclic", seed=int(args.seed), groups=groups)


def collate_config_from_args(args: Any) -> CollateConfig:
    """``--dp-schedule-collate-format`` with the sequence multiple the TP/SP/CP/FP8 layout needs (the multiple
    the plan counts, :func:`~megatron_dpsched.megatron.arguments.pad_multiple_from_args`)."""
    return CollateConfig(format=collate_format_from_args(args),
                         pad_multiple=pad_multiple_from_args(args))


def _warn_if_nothing_was_loaded(args: Any) -> None:
    """``--load`` without a checkpoint in it starts from scratch; say so where the resume would be logged."""
    nothing = getattr(args, "load", None) and not getattr(args, "finetune", False) and not args.iteration
    if nothing:
        print_rank_0(f"dp-schedule: WARNING: --load {args.load} was given but no checkpoint was loaded (iteration 0); "
                     f"training starts from scratch at step 0")


def _start_of(role: str, args: Any) -> int:
    if role == "train":
        return int(args.consumed_train_samples)
    if role == "valid" and not getattr(args, "skip_train", False):
        return int(args.consumed_valid_samples)
    return 0
