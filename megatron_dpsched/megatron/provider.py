"""Turning an existing Megatron training script onto the ``--dp-schedule`` data path.

Three changes to a ``pretrain_gpt.py``-style script::

    args = parse_and_validate_args(extra_args_provider=add_dp_schedule_args)   # 1. the flags
    setup_dp_schedule(args)                                                     # 2. validate + hooks
    pretrain(cfg, scheduled_datasets_provider(train_valid_test_datasets_provider), ...)  # 3. the data

``scheduled_datasets_provider`` wraps the script's dataset provider. Without
``--dp-schedule`` it is the provider itself. With it, each dataset the provider
returns (a map-style dataset of variable-length samples with a ``lengths``
attribute: token count per sample) is fed by a :class:`ScheduledDatasetLoader`,
and Megatron receives its chunk iterators as an external data loader (one per
virtual pipeline stage, all from one feed). Packing decisions stay in the core;
this module only wires datasets, ranks and flags together.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from megatron_dpsched.megatron.arguments import (
    DPScheduleOptions,
    schedule_kwargs_from_args,
    validate_dp_schedule_args,
)
from megatron_dpsched.megatron.collate import CollateConfig, pad_multiple_for
from megatron_dpsched.megatron.iterator import ScheduledDatasetLoader

DatasetsProvider = Callable[..., tuple[Any, Any, Any]]


def setup_dp_schedule(args: Any) -> None:
    """After Megatron's argument validation: check the ``--dp-schedule*`` flags and install the hooks.

    A no-op without ``--dp-schedule``. Run it before the model is built (it
    turns on per-token loss and variable sequence lengths under PP).
    """
    validate_dp_schedule_args(args)
    if not getattr(args, "dp_schedule", False):
        return
    args.dataloader_type = "external"
    from megatron_dpsched.megatron.patch import enable

    enable()


def scheduled_datasets_provider(provider: DatasetsProvider) -> DatasetsProvider:
    """Wrap a ``train_valid_test_datasets_provider`` so ``--dp-schedule`` feeds its datasets by the plan."""
    feeds: dict[int, ScheduledDatasetLoader] = {}
    takes_vp_stage = "vp_stage" in inspect.signature(provider).parameters

    @functools.wraps(provider)
    def wrapped(num_samples: Any, vp_stage: int | None = None) -> tuple[Any, Any, Any]:
        from megatron.training.global_vars import get_args

        args = get_args()
        datasets = provider(num_samples, vp_stage=vp_stage) if takes_vp_stage else provider(num_samples)
        if not getattr(args, "dp_schedule", False):
            return datasets
        consumed = (args.consumed_train_samples, args.consumed_valid_samples, 0)
        return tuple(
            _chunk_of(feeds, dataset, args=args, consumed_samples=start, vp_stage=vp_stage)
            for dataset, start in zip(datasets, consumed)
        )

    wrapped.is_distributed = True  # every tensor-parallel rank builds the same feed itself
    wrapped.feeds = feeds  # the feeds built so far, training data first
    return wrapped


def _chunk_of(
    feeds: dict[int, ScheduledDatasetLoader],
    dataset: Any,
    *,
    args: Any,
    consumed_samples: int,
    vp_stage: int | None,
) -> Any:
    """The ``vp_stage`` chunk iterator of the feed for ``dataset`` (one feed per dataset)."""
    if dataset is None:
        return None
    if id(dataset) not in feeds:
        feeds[id(dataset)] = build_feed(dataset, args=args, consumed_samples=consumed_samples)
    return feeds[id(dataset)].chunks[vp_stage or 0]


def build_feed(dataset: Any, *, args: Any, consumed_samples: int) -> ScheduledDatasetLoader:
    """A :class:`ScheduledDatasetLoader` for this process's data-parallel rank, from Megatron's ``args``."""
    from megatron.core import parallel_state as mpu

    lengths = _lengths_of(dataset)
    multiple = pad_multiple_for(tensor_parallel_size=args.tensor_model_parallel_size,
                                context_parallel_size=args.context_parallel_size,
                                sequence_parallel=args.sequence_parallel)
    return ScheduledDatasetLoader(
        dataset,
        lengths=lengths,
        rank=mpu.get_data_parallel_rank(),
        schedule_kwargs=schedule_kwargs_from_args(args, data_parallel_size=mpu.get_data_parallel_world_size()),
        consumed_samples=consumed_samples,
        num_chunks=args.virtual_pipeline_model_parallel_size or 1,
        collate=CollateConfig(format=DPScheduleOptions.from_args(args).collate_format, pad_multiple=multiple),
        verify=args.dp_schedule_verify,
    )


def _lengths_of(dataset: Any) -> Sequence[int]:
    lengths = getattr(dataset, "lengths", None)
    if lengths is None or len(lengths) != len(dataset):
        raise ValueError(
            f"--dp-schedule needs the token count of every sample: give {type(dataset).__name__} a "
            f"'lengths' sequence with one entry per sample (got {type(lengths).__name__})"
        )
    return lengths
