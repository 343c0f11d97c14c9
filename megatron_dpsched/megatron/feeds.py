"""Schedule-driven data iterators for Megatron's forward-backward schedules.

A *feed* owns the plan and the data; it hands out one :class:`ChunkIterator`
per model chunk (one per virtual pipeline stage, a single one without VPP).
For every step all chunk iterators walk the same micro-batches, each with its
own offset, the way Megatron's interleaved schedule expects one iterator per
chunk. Steps advance with :meth:`StepFeed.begin_step`, which the
forward-backward wrapper installed by :mod:`megatron_dpsched.megatron.patch`
calls before each step (a custom loop can call it itself); it returns the
step's :class:`StepBatches`, whose ``num_microbatches`` replaces Megatron's.

Two feeds:

* :class:`ScheduledDataIterator`: a precomputed :class:`~megatron_dpsched.DPSchedule`
  (e.g. shipped as JSON) plus per-sample data, looked up by global sample id.
* :class:`ScheduledDatasetLoader`: a map-style dataset with known per-sample
  lengths. Each step takes the next ``global_batch_size`` samples from
  ``consumed_samples`` on (Megatron's ``MegatronPretrainingSampler``
  semantics) and plans them with ``build_dp_schedule``; every rank computes the
  same plan (deterministic, no collective) and keeps its own part. Resuming with
  the checkpoint's ``consumed_train_samples`` continues exactly.

Checked at run time, always: when a feed is built, a shipped plan's invariants
(``DPSchedule.check()``, O(samples)), that the plan counts the padding its collate adds
(:func:`~megatron_dpsched.megatron.collate.require_padding_agreement`: a plan without
``padded_rows`` collated as ``bshd`` is refused) and that a sized sample source holds every
sample the plan reads; every sample against the sample contract
(:mod:`megatron_dpsched.data.contract`: 1-D integer tokens in the padded vocabulary, labels
in it or -100, a 0/1 loss mask, the planned length) when its micro-batch is collated, and the
collated micro-batch against the token cap before it is handed out (a
:class:`~megatron_dpsched.data.contract.SampleContractError`, a ``ValueError`` naming the
sample, the field, the step and the rank); and (in :mod:`~megatron_dpsched.megatron.hooks`)
the step's fingerprint across ranks: its plan and the content of all its samples (every rank
digests every sample of the step when it plans it: :meth:`StepFeed.content_digest`).

The vocabulary bound: ``vocab_size="megatron"`` (the default) reads Megatron's
``args.padded_vocab_size`` when the feed is built (set by Megatron's initialization); an
integer gives it; ``None`` skips the upper bound on token ids (only when asked for).

Whom a feed feeds: ``rank`` is the data-parallel rank whose part of every step it hands out. Where
Megatron's parallel state is initialised (``megatron.core.parallel_state``), the feed compares ``rank``
and the plan's ``dp_size`` with this process's data-parallel rank and size when it is built (and again
when its first step begins, for a feed built before Megatron's initialisation) and refuses a mismatch in
one line: two ranks fed the same ``rank`` would train the same samples, part of the batch twice and the rest
never. Without it (a trainer outside Megatron) the caller passes its rank in its data-parallel group.

Labels: a sample's ``labels`` are shifted (``labels[i]`` is the token after ``tokens[i]``);
``label_convention="unshifted"`` takes Hugging Face style labels (``labels == tokens`` where trained) and
shifts them and the loss mask (:func:`~megatron_dpsched.megatron.collate.shift_unshifted`). Handed as
shifted, such labels are found (labels equal to tokens at every loss position of a sample) and global rank 0
prints one warning per job.
"""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from megatron_dpsched.core import DPSchedule, ScheduleConfig, ScheduleInvariantError, plan_schedule
from megatron_dpsched.core.cost import CostFunction
from megatron_dpsched.core.validation import is_int, require_int, require_lengths
from megatron_dpsched.data.contract import (
    LABEL_CONVENTIONS,
    Place,
    labels_copy_tokens,
    micro_batch_size,
    require_samples,
    require_within_cap,
    validate_sample,
)
from megatron_dpsched.data.sampling import SampleOrder
from megatron_dpsched.megatron.collate import (
    CollateConfig,
    collate_micro_batch,
    require_padding_agreement,
    sample_tensors,
    shift_unshifted,
)
from megatron_dpsched.megatron.prefetch import PreparedStep, StepPrefetcher
from megatron_dpsched.options import BY_NAME
from megatron_dpsched.runtime.job_identity import fold_digests
from megatron_dpsched.runtime.megatron_state import megatron_args
from megatron_dpsched.runtime.ranks import print_rank_0

SampleSource = Callable[[int], Mapping[str, Any]] | Sequence[Mapping[str, Any]]

_WARNED: set[str] = set()
"""The once-per-job warnings this process has printed (or, on ranks other than 0, would have)."""


@dataclass(frozen=True, kw_only=True)
class StepBatches:
    """One rank's share of one optimizer step."""

    step: int
    """Index of the step in the feed's plan (0 = first step this feed planned from 0 samples)."""
    micro_batches: tuple[tuple[int, ...], ...]
    """This rank's micro-batches as global sample ids, in run order; ``()`` is a dummy."""
    num_samples: int
    """Samples trained in the step over all data-parallel ranks (the LR-scheduler increment)."""
    fingerprint: int
    """63-bit hash of the whole step's plan (all ranks' parts) and of its samples' content (``content``);
    every rank of the job must hold the same."""
    plan: DPSchedule | None = field(default=None, compare=False, repr=False)
    """The plan holding the step (every rank's part), for the step's figures in the logs."""
    plan_step: int = field(default=0, compare=False)
    """The step's index in ``plan``."""
    plan_seconds: float = field(default=0.0, compare=False)
    """Wall time spent planning the step on this rank (not part of equality)."""
    content: int = field(default=0, compare=False)
    """Digest of the token ids of every sample of the step (all ranks'), in stream order, folded into
    ``fingerprint`` (:meth:`StepFeed.content_digest`; 0: not taken)."""
    loss_tokens: int | None = field(default=None, compare=False)
    """Loss tokens of the whole step over all data-parallel ranks, from the dataset's ``trained_tokens`` (every
    rank sums them over the step's samples: no collective); ``None`` where the dataset does not give them. 0:
    the step trains nothing (Megatron steps the optimizer with zero gradients)."""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches every rank runs in this step."""
        return len(self.micro_batches)


class ChunkIterator:
    """The iterator one model chunk's forward steps read (``next(it)`` or ``it.get_next(keys)``)."""

    def __init__(self, feed: StepFeed, chunk: int) -> None:
        self.feed = feed
        self.chunk = chunk
        self.offset = 0

    def __iter__(self) -> ChunkIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        return self.get_next()

    def get_next(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        """The next micro-batch of the current step; only ``keys`` (plus ``sample_ids``) if given."""
        batch = self.feed.micro_batch(self.offset)
        self.offset += 1
        if keys is None:
            return dict(batch)
        return {key: batch[key] for key in (*keys, "sample_ids") if key in batch}


class StepFeed(ABC):
    """Plans steps, loads and collates their micro-batches, and hands them to chunk iterators."""

    length_source = "the lengths the plan was made from"
    """Where the planned lengths came from, for error messages."""

    def __init__(
        self, *, rank: int = 0, num_chunks: int = 1, collate: CollateConfig | None = None, verify: str = "off",
        name: str = "train", prefetch: bool = False, vocab_size: int | str | None = "megatron",
        cap_counts: str = "padded", label_convention: str = "shifted",
    ) -> None:
        if num_chunks < 1:
            raise ValueError(f"num_chunks must be >= 1; got {num_chunks}")
        if label_convention not in LABEL_CONVENTIONS:
            raise ValueError(f"label_convention must be one of {LABEL_CONVENTIONS} ('shifted': labels[i] is the token "
                             f"after tokens[i]; 'unshifted': Hugging Face style, labels == tokens); "
                             f"got {label_convention!r}")
        self.label_convention = label_convention
        """How the samples' labels line up with their tokens (``contract.LABEL_CONVENTIONS``)."""
        BY_NAME["verify"].check(verify)  # the option's choices (OptionError, a ValueError naming the flag)
        BY_NAME["cap_counts"].check(cap_counts)
        self.vocab_size = resolve_vocab_size(vocab_size)
        """Token ids and labels must be below this (the padded vocabulary); ``None``: not bounded above."""
        self.cap_counts = cap_counts
        """What the plan's token cap bounds: ``padded`` (the collated micro-batch) or ``tokens`` (real ones)."""
        self.rank = rank
        self.name = name
        self.collate = collate or CollateConfig()
        self.verify = verify
        self.steps_begun = 0
        self.chunks = [ChunkIterator(self, chunk) for chunk in range(num_chunks)]
        self.current: StepBatches | None = None
        self.prefetch = prefetch
        """Prepare the next step (plan, load, collate) in a background thread while this one trains."""
        self.step_wait_seconds = 0.0
        """Seconds the training thread waited for the current step's plan and micro-batches so far."""
        self._cache: dict[int, dict[str, Any]] = {}
        self._deferred: tuple[int, BaseException] | None = None
        self._prefetcher: StepPrefetcher | None = None
        self._place_checked = False

    @property
    @abstractmethod
    def dp_size(self) -> int:
        """The data-parallel size the plan was made for."""

    @abstractmethod
    def _plan_next_step(self) -> StepBatches:
        """This rank's part of the next step; raise ``StopIteration`` when there is none."""

    @abstractmethod
    def load_sample(self, sample_id: int) -> Mapping[str, Any]:
        """The raw sample with global id ``sample_id``."""

    @abstractmethod
    def planned_length(self, sample_id: int) -> int:
        """The token count sample ``sample_id`` was planned with."""

    @property
    @abstractmethod
    def start_position(self) -> int:
        """Samples consumed before this feed's first step (0 unless resumed)."""

    @property
    def plan_config(self) -> ScheduleConfig | None:
        """The options the feed's plans are made with (the token cap and the padding they count); ``None`` (a
        feed of its own making): no cap to check micro-batches against."""
        return None

    @property
    def token_cap(self) -> int | None:
        """Tokens a micro-batch of more than one sample may hold (``max_tokens_per_gpu * cp_size``), or ``None``."""
        return None if self.plan_config is None else self.plan_config.token_cap

    def _require_agreement(self, *, source: str) -> None:
        """The plan must count the padding collate adds (with ``cap_counts="padded"`` and a token cap)."""
        config = self.plan_config
        if config is None or config.token_cap is None:
            return  # static batching: no cap to bound
        try:
            require_padding_agreement(pad_multiple=config.pad_multiple, padded_rows=config.padded_rows,
                                      collate=self.collate, counts_padding=self.cap_counts == "padded")
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None

    def _require_data_parallel_place(self) -> None:
        """Raise ``ValueError`` (one line naming both) unless ``rank`` and the plan's ``dp_size`` are this process's
        data-parallel rank and size, where Megatron's parallel state is initialised (else nothing to compare)."""
        from megatron.core import parallel_state

        if self._place_checked or not parallel_state.model_parallel_is_initialized():
            return
        size, rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
        feed = type(self).__name__
        if self.dp_size != size:
            raise ValueError(f"dp-schedule: {feed}: the plan was made for dp_size={self.dp_size}, but this job runs "
                             f"{size} data-parallel ranks (megatron.core.parallel_state); plan again with "
                             f"dp_size={size}")
        if self.rank != rank:
            raise ValueError(f"dp-schedule: {feed}(rank={self.rank!r}) on data-parallel rank {rank} of {size} "
                             f"(megatron.core.parallel_state.get_data_parallel_rank()); pass rank={rank}: ranks fed "
                             f"the same rank= train the same samples, part of the batch twice and the rest never")
        self._place_checked = True

    def content_digest(self, sample_ids: Sequence[int]) -> int:
        """63-bit digest of the token ids of ``sample_ids``, in this order (:func:`sample_digest` of each, as
        :meth:`load_sample` reads it): ranks that plan the same lengths from other content disagree."""
        return fold_digests(0, [self._sample_digest(sample_id) for sample_id in sample_ids])

    def _sample_digest(self, sample_id: int) -> int:
        """:func:`sample_digest` of the loaded sample (a feed may take it cheaper from its dataset)."""
        return sample_digest(self.load_sample(sample_id))

    def begin_step(self) -> StepBatches:
        """Advance to the next step and rewind every chunk iterator to its first micro-batch."""
        started = time.perf_counter()
        self._require_data_parallel_place()  # a feed built before Megatron's initialisation
        prepared = self._next_prepared() if self.prefetch else PreparedStep(batches=self._plan_next_step())
        if prepared.batches is None:
            assert prepared.error is not None
            raise prepared.error
        self.current = prepared.batches
        self.steps_begun += 1
        self._cache = dict(prepared.micro_batches)
        self._deferred = None if prepared.failed_at is None else (prepared.failed_at, prepared.error)
        self._on_step_begun(self.current)
        for chunk in self.chunks:
            chunk.offset = 0
        self.step_wait_seconds = time.perf_counter() - started
        return self.current

    def _on_step_begun(self, batches: StepBatches) -> None:
        """The training thread has begun ``batches`` (a feed advances its position here)."""
        del batches  # nothing to advance in general

    def _next_prepared(self) -> PreparedStep:
        """The next step, prepared ahead (the first on this thread, then each in the background)."""
        if self._prefetcher is None:
            prepared = self._prepare_step()
            self._prefetcher = StepPrefetcher(self._prepare_step, name=f"dp-schedule-{self.name}")
            if prepared.batches is not None:
                self._prefetcher.start()
            return prepared
        return self._prefetcher.take()

    def _prepare_step(self) -> PreparedStep:
        """Plan the next step and collate its micro-batches; what fails is kept, not raised."""
        started = time.perf_counter()
        try:
            batches = self._plan_next_step()
        except Exception as error:  # StopIteration too: raised when the step is due
            return PreparedStep(error=error)
        prepared = PreparedStep(batches=batches)
        for index, ids in enumerate(batches.micro_batches):
            try:
                prepared.micro_batches[index] = self._collate(batches, ids)
            except Exception as error:  # raised when micro-batch `index` is due, as without prefetching
                error.add_note("(prepared ahead by --dp-schedule-prefetch; 'off' prepares on the training thread)")
                prepared.error, prepared.failed_at = error, index
                break
        prepared.seconds = time.perf_counter() - started
        return prepared

    def close(self) -> None:
        """Stop preparing ahead (drops a prepared step); the feed can go on without it."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def end_step(self) -> None:
        """Close the step; with ``verify="strict"`` every chunk must have read every micro-batch."""
        assert self.current is not None, "end_step() without begin_step()"
        if self.verify == "strict":
            expected = self.current.num_microbatches
            offsets = [chunk.offset for chunk in self.chunks]
            if any(offset != expected for offset in offsets):
                raise RuntimeError(
                    f"dp-schedule step {self.current.step}: model chunks read {offsets} micro-batches, "
                    f"the plan has {expected} (--dp-schedule-verify strict)"
                )
        self._cache.clear()

    def get_next(self, keys: Sequence[str] | None = None, *, chunk: int = 0) -> dict[str, Any]:
        """``chunks[chunk].get_next(keys)``: the next micro-batch of the current step."""
        return self.chunks[chunk].get_next(keys)

    def micro_batch(self, index: int) -> dict[str, Any]:
        """Micro-batch ``index`` of the current step, collated once and shared by the chunks."""
        if self.current is None:
            raise RuntimeError("no dp-schedule step is active; call begin_step() first")
        if index >= self.current.num_microbatches:
            raise RuntimeError(
                f"dp-schedule step {self.current.step} has {self.current.num_microbatches} "
                f"micro-batches; micro-batch {index} was requested"
            )
        if index not in self._cache:
            if self._deferred is not None and self._deferred[0] == index:
                raise self._deferred[1]
            started = time.perf_counter()
            self._cache[index] = self._collate(self.current, self.current.micro_batches[index])
            self.step_wait_seconds += time.perf_counter() - started
        return self._cache[index]

    def _collate(self, batches: StepBatches, ids: tuple[int, ...]) -> dict[str, Any]:
        """Load, check and collate one micro-batch of ``batches``; check its collated size against the cap."""
        samples = []
        for sample_id in ids:
            try:
                sample = self.load_sample(sample_id)
            except Exception as error:
                error.add_note(f"dp-schedule step {batches.step}, data-parallel rank {self.rank}: "
                               f"loading sample {sample_id} failed")
                raise
            self._check_length(sample_id, sample, step=batches.step)
            samples.append(self._as_trained(sample_id, sample, step=batches.step))
        batch = collate_micro_batch(samples, ids, self.collate)
        size = micro_batch_size(batch["tokens"].shape, lengths=[self.planned_length(i) for i in ids], sample_ids=ids)
        require_within_cap(size, cap=self.token_cap, counts_padding=self.cap_counts == "padded",
                           place=Place(step=batches.step, rank=self.rank))
        return batch

    def _check_length(self, sample_id: int, sample: Mapping[str, Any], *, step: int | None = None) -> None:
        """Raise :class:`~megatron_dpsched.data.contract.SampleContractError` unless the sample keeps the sample
        contract with the length it was planned with (else the cap would not hold); ``step``: the step it
        belongs to (default: the current one)."""
        if step is None:
            assert self.current is not None
            step = self.current.step
        validate_sample(sample, length=self.planned_length(sample_id), vocab_size=self.vocab_size,
                        place=Place(sample_id=sample_id, step=step, rank=self.rank), length_source=self.length_source)

    def _as_trained(self, sample_id: int, sample: Mapping[str, Any], *, step: int) -> Mapping[str, Any]:
        """A checked sample as collate takes it: tensors, shifted labels (``label_convention``). Shifted labels
        that copy the tokens get one warning per job (global rank 0)."""
        sample = sample_tensors(sample)
        if self.label_convention == "unshifted":
            return shift_unshifted(sample)
        if "copied labels" not in _WARNED and labels_copy_tokens(sample, place=Place(sample_id=sample_id)):
            _WARNED.add("copied labels")
            print_rank_0(f"dp-schedule: WARNING: step {step}, data-parallel rank {self.rank}: sample "
                         f"{sample_id}'s labels equal its tokens at every loss position: a sample's labels are "
                         f"shifted (labels[i] is the token after tokens[i]); Hugging Face style labels (labels == "
                         f"tokens) train the model to copy its input: hand them with label_convention='unshifted' "
                         f"(the feed shifts labels and loss_mask). Printed once per job.")
        return sample

    def megatron_iterators(self, *, rerun: bool = True) -> Any:
        """What to pass as Megatron's ``train_data_iterator``: one iterator, or a list with VPP.

        With ``rerun`` each is wrapped in Megatron's ``RerunDataIterator`` (needed by the
        rerun state machine's default ``validate_results`` mode).
        """
        iterators: list[Any] = list(self.chunks)
        if rerun:
            from megatron.core.rerun_state_machine import RerunDataIterator

            iterators = [RerunDataIterator(it) for it in iterators]
        return iterators if len(iterators) > 1 else iterators[0]


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


def _sample_getter(samples: SampleSource, *, name: str) -> Callable[[int], Mapping[str, Any]]:
    """``samples`` read by global sample id: a callable, or a sequence or mapping's ``[]``; a generator, iterator or
    iterable dataset (no reads by id) is refused, naming ``name``."""
    if callable(samples):
        return samples
    if (not hasattr(samples, "__getitem__") or hasattr(samples, "__next__")
            or isinstance(samples, torch.utils.data.IterableDataset)):
        raise ValueError(f"{name} is a {type(samples).__name__}, which cannot be read by sample id (the plan reads "
                         f"samples in its own order); hand a sequence (e.g. list(...)), a mapping from sample id, "
                         f"or a callable sample_id -> sample")
    return samples.__getitem__


def resolve_vocab_size(vocab_size: int | str | None) -> int | None:
    """The padded vocabulary bound of a feed: an integer as given, ``None`` (no upper bound), or ``"megatron"``:
    Megatron's ``args.padded_vocab_size``."""
    if vocab_size is None:
        return None
    if vocab_size == "megatron":
        found = getattr(megatron_args(), "padded_vocab_size", None)
        if found is None:
            raise ValueError("vocab_size='megatron' reads Megatron's args.padded_vocab_size, which is not set "
                             "(Megatron is not initialized); give vocab_size=<the model's padded vocabulary size>, "
                             "or vocab_size=None to leave token ids unbounded above")
        vocab_size = found
    return require_int("vocab_size", vocab_size, minimum=1)


class ScheduledDataIterator(StepFeed):
    """Feed driven by a precomputed :class:`DPSchedule` and per-sample data.

    The plan is checked (``DPSchedule.check()``) when the feed is built, whatever
    ``verify`` says: a broken shipped plan raises ``ValueError`` before any step. So are its
    padding against ``collate`` (a plan for ``bshd`` needs ``padded_rows=True`` and collate's
    ``pad_multiple``; one for ``thd`` the multiple alone; ``cap_counts="tokens"`` accepts a plan
    counting real tokens only) and, for a sized ``samples``, that it holds every sample id.

    Where it starts: ``start_step``, or the step that begins after ``consumed_samples``
    samples of the plan (the plan's ``step_num_samples`` tell which; a count inside a step is
    refused). ``consumed_samples="megatron"`` reads Megatron's ``consumed_train_samples`` when
    the first step begins (after ``setup_model_and_optimizer`` has loaded a checkpoint), for a
    plan that covers the job from its first step. Neither: step 0.
    """

    length_source = "the shipped plan's lengths"

    def __init__(
        self,
        schedule: DPSchedule,
        *,
        rank: int,
        samples: SampleSource,
        start_step: int | None = None,
        consumed_samples: int | str | None = None,
        **feed_kwargs: Any,
    ) -> None:
        super().__init__(rank=rank, **feed_kwargs)
        try:
            schedule.check()
        except ScheduleInvariantError as error:
            raise ValueError(f"dp-schedule: the shipped plan is broken: {error}") from None
        self.schedule = schedule
        self._require_data_parallel_place()
        if not is_int(rank) or not 0 <= rank < schedule.dp_size:
            raise ValueError(f"rank {rank!r} is outside the schedule's dp_size={schedule.dp_size}")
        if start_step is not None and consumed_samples is not None:
            raise ValueError("give start_step or consumed_samples, not both")
        if start_step is not None and (not is_int(start_step) or not 0 <= start_step <= schedule.num_steps):
            raise ValueError(f"start_step={start_step!r} is outside the plan's {schedule.num_steps} steps")
        if consumed_samples is not None and consumed_samples != "megatron":
            start_step = self.step_after(require_int("consumed_samples", consumed_samples, minimum=0),
                                         schedule=schedule)
        elif consumed_samples is None and start_step is None:
            start_step = 0  # a shipped plan starts at its own step 0 unless told otherwise
        self._require_agreement(source="the shipped plan")
        self._get = _sample_getter(samples, name="samples")
        require_samples(samples, needed=len(schedule.lengths), name="samples")
        self._start_step = start_step
        self.next_step: int | None = start_step

    @staticmethod
    def step_after(consumed_samples: int, *, schedule: DPSchedule) -> int:
        """The step of ``schedule`` that begins after ``consumed_samples`` samples; ``ValueError`` inside a step."""
        position = 0
        for step, count in enumerate(schedule.step_num_samples):
            if position == consumed_samples:
                return step
            if position + count > consumed_samples:
                raise ValueError(f"consumed_samples={consumed_samples} falls inside step {step} of the shipped plan "
                                 f"(samples {position}..{position + count - 1}); a resume starts at a step boundary")
            position += count
        if position == consumed_samples:
            return schedule.num_steps
        raise ValueError(f"consumed_samples={consumed_samples} is beyond the shipped plan's {position} samples")

    @property
    def start_step(self) -> int:
        """The first step this feed trains (resolved from Megatron's ``consumed_train_samples`` if asked)."""
        if self._start_step is None:
            self._start_step = self.step_after(_megatron_consumed_train_samples(), schedule=self.schedule)
        return self._start_step

    @property
    def dp_size(self) -> int:
        return self.schedule.dp_size

    @property
    def plan_config(self) -> ScheduleConfig:
        return self.schedule.config

    @property
    def start_position(self) -> int:
        return sum(self.schedule.step_num_samples[: self.start_step])

    def reset(self) -> None:
        """Start again from ``start_step``."""
        self.close()
        self.next_step = self.start_step
        self.current = None
        self._cache.clear()

    def load_sample(self, sample_id: int) -> Mapping[str, Any]:
        return self._get(sample_id)

    def planned_length(self, sample_id: int) -> int:
        return self.schedule.lengths[sample_id]

    def _plan_next_step(self) -> StepBatches:
        if self.next_step is None:
            self.next_step = self.start_step
        step = self.next_step
        if step >= self.schedule.num_steps:
            raise StopIteration(f"the schedule has {self.schedule.num_steps} steps")
        self.next_step += 1
        content = self.content_digest([i for rank in range(self.dp_size)
                                       for mb in self.schedule.rank_step_micro_batches(rank, step) for i in mb])
        return StepBatches(
            step=step,
            micro_batches=self.schedule.rank_step_micro_batches(self.rank, step),
            num_samples=self.schedule.step_num_samples[step],
            fingerprint=fold_digests(self.schedule.step_fingerprint(step), [content]),
            plan=self.schedule,
            plan_step=step,
            content=content,
        )


def _megatron_consumed_train_samples() -> int:
    """Megatron's ``args.consumed_train_samples`` (0 without Megatron's global arguments)."""
    return int(getattr(megatron_args(), "consumed_train_samples", 0) or 0)


class ScheduledDatasetLoader(StepFeed):
    """Feed that plans each step from a map-style dataset with known per-sample lengths.

    ``lengths`` are validated once, when the feed is built (a ``ValueError`` names the
    first bad entry); every step is planned with ``config`` (one step at a time, so without
    ``drop_last``) and ``cost_model`` (what balance ``cost`` balances per sample; ``None``:
    the core's default), e.g. a :class:`~megatron_dpsched.megatron.arguments.PlanSetup`'s.
    ``order`` says which sample sits at each position of the stream (default: one pass in
    dataset order; :class:`~megatron_dpsched.data.sampling.SampleOrder` gives cyclic epochs
    and groups); step after step takes the next ``global_batch_size`` samples (groups) from
    ``consumed_samples`` on, so a resume from any position continues with the same plans.
    ``trained_tokens`` (optional, one per sample: its loss tokens, e.g. the dataset's ``trained_tokens``) gives
    each step's :attr:`StepBatches.loss_tokens` (with ``label_convention="unshifted"``: counted after the shift).
    """

    length_source = "the dataset's lengths"

    def __init__(
        self,
        dataset: SampleSource,
        *,
        lengths: Sequence[int],
        rank: int,
        config: ScheduleConfig,
        cost_model: CostFunction | None = None,
        consumed_samples: int = 0,
        order: SampleOrder | None = None,
        trained_tokens: Sequence[int] | None = None,
        **feed_kwargs: Any,
    ) -> None:
        super().__init__(rank=rank, **feed_kwargs)
        if not isinstance(config, ScheduleConfig):
            raise TypeError(f"config must be a ScheduleConfig; got {type(config).__name__}")
        if config.drop_last:
            raise ValueError("ScheduledDatasetLoader plans one step at a time; drop_last does not apply")
        self.config = config
        self.cost_model = cost_model
        self._require_data_parallel_place()
        if not is_int(rank) or not 0 <= rank < self.config.dp_size:
            raise ValueError(f"rank {rank!r} is outside dp_size={self.config.dp_size}")
        self._require_agreement(source="config")
        self._get = _sample_getter(dataset, name=f"the dataset ({type(dataset).__name__})")
        self._stored_digest = getattr(dataset, "sample_digest", None)
        """The dataset's own 64-bit digest of a sample as stored (``None`` where it has none), e.g. of a JSONL
        line, which is cheaper than parsing it for :func:`sample_digest`."""
        self.lengths = require_lengths(lengths, name=f"{type(dataset).__name__}.lengths")
        require_samples(dataset, needed=len(self.lengths), name=type(dataset).__name__)
        if trained_tokens is not None and len(trained_tokens) != len(self.lengths):
            raise ValueError(f"trained_tokens holds {len(trained_tokens)} entries for {len(self.lengths)} samples")
        self.trained_tokens = trained_tokens
        """The loss tokens of each sample (``None``: not known; steps then carry no ``loss_tokens``)."""
        self.order = SampleOrder(len(self.lengths)) if order is None else order
        if self.order.num_samples != len(self.lengths):
            raise ValueError(f"the sample order covers {self.order.num_samples} samples, the dataset "
                             f"{len(self.lengths)}")
        self.global_batch_size = self.config.global_batch_size
        self.start_consumed_samples = require_int("consumed_samples", consumed_samples, minimum=0)
        self.consumed_samples = consumed_samples
        """Samples of the steps begun so far (Megatron's ``consumed_samples`` after the current step)."""
        self._cursor = consumed_samples  # where the next step to plan starts (ahead with prefetching)

    @property
    def dp_size(self) -> int:
        return self.config.dp_size

    @property
    def plan_config(self) -> ScheduleConfig:
        return self.config

    @property
    def start_position(self) -> int:
        return self.start_consumed_samples

    def reset(self) -> None:
        """Start again from the ``consumed_samples`` given at construction."""
        self.close()
        self.consumed_samples = self._cursor = self.start_consumed_samples
        self.current = None
        self._cache.clear()

    def load_sample(self, sample_id: int) -> Mapping[str, Any]:
        return self._get(sample_id)

    def planned_length(self, sample_id: int) -> int:
        return self.lengths[sample_id]

    def _sample_digest(self, sample_id: int) -> int:
        stored = None if self._stored_digest is None else self._stored_digest(sample_id)
        return super()._sample_digest(sample_id) if stored is None else stored

    def plan_step_at(self, consumed_samples: int) -> tuple[StepBatches, DPSchedule]:
        """The step that starts after ``consumed_samples`` samples (this rank's part, and the plan)."""
        ids, groups = self.order.take(consumed_samples, self.global_batch_size)
        if not ids:
            raise StopIteration(f"all {len(self.lengths)} samples consumed")
        start_time = time.perf_counter()
        plan = plan_schedule([self.lengths[i] for i in ids], config=self.config, groups=groups,
                             cost_model=self.cost_model)
        seconds = time.perf_counter() - start_time
        assert plan.num_steps == 1, "one global batch plans as one step"
        local = plan.rank_step_micro_batches(self.rank, 0)
        fingerprint = plan.step_fingerprint(0, first_sample=consumed_samples)
        fingerprint = fingerprint if self._in_dataset_order() else _with_ids(fingerprint, ids)
        content = self.content_digest(ids)
        batches = StepBatches(
            step=consumed_samples // self.global_batch_size,
            micro_batches=tuple(tuple(ids[i] for i in mb) for mb in local),
            num_samples=plan.step_num_samples[0],
            fingerprint=fold_digests(fingerprint, [content]),
            plan=plan,
            plan_seconds=seconds,
            content=content,
            loss_tokens=None if self.trained_tokens is None else sum(self.trained_tokens[i] for i in ids),
        )
        return batches, plan

    def _in_dataset_order(self) -> bool:
        return not self.order.cyclic and self.order.units is None

    def _plan_next_step(self) -> StepBatches:
        batches, plan = self.plan_step_at(self._cursor)
        if self.verify != "off":
            plan.check()
        self._cursor += plan.step_num_samples[0]
        return batches

    def _on_step_begun(self, batches: StepBatches) -> None:
        self.consumed_samples += batches.num_samples


def sample_digest(sample: Mapping[str, Any]) -> int:
    """64-bit blake2b of a sample's ``tokens`` and ``labels`` (what the step trains on: inputs, targets and
    their masking), from the tensors' bytes."""
    digest = hashlib.blake2b(digest_size=8)
    if not isinstance(sample, Mapping):  # refused by the sample contract when its micro-batch is collated
        digest.update(_content_bytes(sample))
        return int.from_bytes(digest.digest(), "little")
    for key in ("tokens", "labels"):
        value = sample.get(key)
        if value is not None:
            digest.update(_content_bytes(value))
    return int.from_bytes(digest.digest(), "little")


def _content_bytes(value: Any) -> bytes:
    """The bytes a digest covers: a tensor's or numpy array's (any dtype, bfloat16 too; a meta or sparse tensor's
    dtype and shape), else the value's ``repr``. Never raises on a malformed sample: the sample contract refuses
    it, naming it, when its micro-batch is collated."""
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:  # an object array's bytes are its pointers
        return np.ascontiguousarray(value).tobytes()  # as a tensor of its dtype digests
    if not isinstance(value, torch.Tensor):
        return repr(value).encode()
    if value.is_meta or value.layout != torch.strided:
        return repr((value.dtype, tuple(value.shape), value.layout, value.device.type)).encode()
    tensor = value.detach().cpu().contiguous()
    try:
        return tensor.numpy().tobytes()
    except TypeError:  # a dtype numpy lacks (bfloat16): its raw bytes
        return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def _with_ids(fingerprint: int, ids: Sequence[int]) -> int:
    """``fingerprint`` mixed with the dataset ids the step's positions hold (a shuffled or grouped order)."""
    digest = hashlib.blake2b(fingerprint.to_bytes(8, "little"), digest_size=8)
    digest.update(array("q", ids).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1
