"""Scenarios run inside the spawned processes; each returns a picklable result per rank.

A scenario raises on a local failure; cross-rank and cross-layout assertions
live in the pytest tests, which read the saved results. Each is declared once with
``@scenario`` (``registry.py``): its world size and launch.

Tags: ``whole_batch``: trains every sample of ``TRAIN_ITERS`` full steps, compared in
``test_megatron_train.py`` with ``reference``; ``resumes``: also reports the next step from
the feed and from a loader resumed at Megatron's ``consumed_train_samples``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import harness
import torch
from harness import GLOBAL_BATCH, LENGTHS, TRAIN_ITERS, Layout
from registry import scenario


class _GradRecorder:
    """Wraps ``optimizer.step`` to snapshot every parameter's reduced gradient before each update."""

    def __init__(self, optimizer: Any, params: dict[str, torch.nn.Parameter]) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.weights: list[dict[str, torch.Tensor]] = []
        """The weights each step's update starts from (gathered over tensor parallelism)."""
        self._params = params
        self._step = optimizer.step
        optimizer.step = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.steps.append({n: harness.gather_full(_grad_of(p), p) for n, p in self._params.items()})
        self.weights.append({n: harness.gather_full(p, p) for n, p in self._params.items()})
        return self._step(*args, **kwargs)


def _grad_of(param: torch.nn.Parameter) -> torch.Tensor:
    grad = getattr(param, "main_grad", None)
    return grad if grad is not None else param.grad


class _FlopsRecorder:
    """Wraps Megatron's ``num_floating_point_operations`` to record the token figures ``train_step`` passes."""

    def __init__(self) -> None:
        from megatron.training import training

        self.calls: list[tuple[float | None, float | None]] = []
        self._original = training.num_floating_point_operations
        training.num_floating_point_operations = self

    def __call__(self, args: Any, batch_size: int, **figures: float | None) -> float:
        """``figures``: ``seqlen_squared_sum_in_batch`` and ``total_real_tokens_in_batch`` (megatron-core 0.18+)."""
        self.calls.append((figures.get("total_real_tokens_in_batch"), figures.get("seqlen_squared_sum_in_batch")))
        return self._original(args, batch_size, **figures)

    def remove(self) -> None:
        from megatron.training import training

        training.num_floating_point_operations = self._original


class WholeBatchFeed:
    """Reference data: every step is one micro-batch holding all of that step's samples."""

    @staticmethod
    def build(num_steps: int) -> Any:
        from megatron_dpsched.megatron.collate import CollateConfig
        from megatron_dpsched.megatron.feeds import StepBatches, StepFeed

        class _Feed(StepFeed):
            dp_size = 1  # the reference runs on one process

            def __init__(self) -> None:
                super().__init__(collate=CollateConfig(format="bshd"), verify="strict")
                self.next_step = 0

            start_position = 0

            def load_sample(self, sample_id: int) -> Any:
                return harness.make_sample(sample_id)

            def planned_length(self, sample_id: int) -> int:
                return LENGTHS[sample_id]

            def _plan_next_step(self) -> StepBatches:
                step, self.next_step = self.next_step, self.next_step + 1
                assert step < num_steps
                ids = tuple(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))
                return StepBatches(step=step, micro_batches=(ids,), num_samples=GLOBAL_BATCH, fingerprint=step)

        return _Feed()


def _recording_forward_step(records: list[tuple[int, int, tuple[int, ...]]],
                            positions: list[int] | None = None) -> Callable:
    """The scheduled forward step, recording (step, chunk, sample ids) and the positions of every micro-batch."""
    from megatron_dpsched.megatron.forward_step import ScheduledForwardStep

    class _Recording(ScheduledForwardStep):
        def __call__(self, data_iterator: Any, model: Any) -> Any:
            chunk = getattr(data_iterator, "iterable", data_iterator)
            batch_step = chunk.feed.current.step
            item = next(data_iterator)
            records.append((batch_step, chunk.chunk, tuple(item["sample_ids"].tolist())))
            if positions is not None:
                positions.append(item["tokens"].numel())
            return super().__call__(iter([item]), model)

    return _Recording()


def _loader(args: Any, *, num_chunks: int, consumed_samples: int = 0, num_samples: int | None = None,
            lengths: Any = None, prefetch: bool = False, dataset: Any = None) -> Any:
    from megatron.core import parallel_state

    from megatron_dpsched.megatron import ScheduledDatasetLoader, plan_setup_from_args
    from megatron_dpsched.megatron.provider import collate_config_from_args

    setup = plan_setup_from_args(args, data_parallel_size=parallel_state.get_data_parallel_world_size())
    return ScheduledDatasetLoader(
        harness.make_sample if dataset is None else dataset,
        lengths=LENGTHS[:num_samples] if lengths is None else lengths,
        rank=parallel_state.get_data_parallel_rank(),
        config=setup.config,
        cost_model=setup.cost_model,
        consumed_samples=consumed_samples,
        num_chunks=num_chunks,
        collate=collate_config_from_args(args),
        verify=args.dp_schedule_verify,
        prefetch=prefetch,
    )


def _precomputed(args: Any, *, num_chunks: int, resume: bool = False) -> Any:
    """A shipped plan (JSON round trip) with an extra empty micro-batch per rank and step."""
    import json

    from megatron.core import parallel_state

    from megatron_dpsched import DPSchedule, plan_schedule
    from megatron_dpsched.megatron import CollateConfig, ScheduledDataIterator, plan_setup_from_args

    setup = plan_setup_from_args(args, data_parallel_size=parallel_state.get_data_parallel_world_size())
    plan = plan_schedule(LENGTHS[: TRAIN_ITERS * GLOBAL_BATCH], config=setup.config, cost_model=setup.cost_model)
    shipped = json.loads(json.dumps(plan.to_dict()))
    for rank_batches in shipped["micro_batch_indices"]:
        offsets = [0]
        for count in shipped["num_microbatches"]:
            offsets.append(offsets[-1] + count)
        for step in reversed(range(TRAIN_ITERS)):
            rank_batches.insert(offsets[step + 1], [])  # a dummy at the end of every step
    shipped["num_microbatches"] = [m + 1 for m in shipped["num_microbatches"]]
    return ScheduledDataIterator(
        DPSchedule.from_dict(shipped), rank=parallel_state.get_data_parallel_rank(),
        samples=harness.make_sample, num_chunks=num_chunks, collate=CollateConfig(format="bshd"),
        verify=args.dp_schedule_verify, consumed_samples="megatron" if resume else None, prefetch=resume,
    )


def _evaluate_first_batch(model: Any, feed: Any) -> float | None:
    """Megatron's real ``evaluate()`` over one scheduled step; the loss on last-stage ranks."""
    from megatron.core.utils import get_model_config
    from megatron.training.training import evaluate

    losses, _, _ = evaluate(_recording_forward_step([]), feed.megatron_iterators(), model, None,
                            get_model_config(model[0]), eval_iters=1)
    return float(losses["lm loss"]) if losses else None


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedCase:
    """One case of :func:`run_training`: the layout trained and how its feed is made."""

    layout: Layout = field(default_factory=Layout)
    """The parallel layout and Megatron flags."""
    feed: Literal["loader", "shipped_plan", "whole_batch"] = "loader"
    """``loader``: ``ScheduledDatasetLoader`` plans each step when Megatron asks for it; ``shipped_plan``: a
    plan built ahead (JSON round trip) with an extra empty micro-batch per rank and step; ``whole_batch``: the
    one-process reference, every step one micro-batch of all its samples (no plan is reported)."""
    make_feed: Callable[[Any, int], Any] | None = None
    """``make_feed(args, num_chunks)``: a ``feed`` of the scenario's own, for training and (built afresh) for
    evaluation; ``None``: the default feed of that kind."""
    num_samples: int | None = None
    """A ``loader`` over the first ``num_samples`` samples only (a short trailing step); ``None``: all."""
    prefetch: bool = False
    """A ``loader`` that prepares each next step in its background thread."""
    resume: bool = False
    """A ``shipped_plan`` resumed after its step 0: Megatron's counters say step 0 was trained (as a checkpoint
    load sets them), and the feed finds its first step from ``consumed_train_samples`` itself."""

    def __post_init__(self) -> None:
        assert self.feed == "loader" or (self.num_samples is None and not self.prefetch), self
        assert self.feed == "shipped_plan" or not self.resume, self
        assert self.make_feed is None or self.feed != "shipped_plan", self

    @property
    def checks_resume(self) -> bool:
        """Whether the result also holds the next step from the feed and from a loader resumed at Megatron's
        ``consumed_train_samples`` (the default loader over every sample)."""
        return self.feed == "loader" and self.make_feed is None and self.num_samples is None and not self.prefetch


def _training_feed(case: FeedCase, args: Any, *, num_chunks: int) -> Any:
    if case.make_feed is not None:
        return case.make_feed(args, num_chunks)
    if case.feed == "whole_batch":
        return WholeBatchFeed.build(TRAIN_ITERS)
    if case.feed == "loader":
        return _loader(args, num_chunks=num_chunks, num_samples=case.num_samples, prefetch=case.prefetch)
    feed = _precomputed(args, num_chunks=num_chunks, resume=case.resume)
    if case.resume:
        args.iteration, args.consumed_train_samples = 1, feed.schedule.step_num_samples[0]
    return feed


def _evaluation_feed(case: FeedCase, args: Any, *, num_chunks: int) -> Any:
    if case.make_feed is not None:
        return case.make_feed(args, num_chunks)
    return WholeBatchFeed.build(1) if case.feed == "whole_batch" else _loader(args, num_chunks=num_chunks)


def _planned(case: FeedCase, args: Any, feed: Any, *, num_chunks: int) -> dict[str, Any]:
    """What the feed planned for the trained steps (and, where the case checks it, the resumed next step)."""
    if case.feed == "whole_batch":
        return {}
    if case.feed == "shipped_plan":
        return {"plan_micro_batches": [feed.schedule.rank_step_micro_batches(feed.rank, s) for s in range(TRAIN_ITERS)],
                "plan_num_samples": list(feed.schedule.step_num_samples)}
    return _plans_and_resume(args, feed, num_chunks=num_chunks) if case.checks_resume else _plans(feed)


def _ranks_and_hooks() -> dict[str, Any]:
    """This process's ranks and how the training hooks were installed."""
    from megatron.core import parallel_state

    return {
        "dp_rank": parallel_state.get_data_parallel_rank(),
        "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "cp_rank": parallel_state.get_context_parallel_rank(),
        "global_rank": torch.distributed.get_rank(),
        "hook_mode": harness.hook_mode(),
        "training_file": harness.training_file(),
    }


def run_training(case: FeedCase) -> dict[str, Any]:
    """Megatron's real ``train()`` (hence ``train_step``) for TRAIN_ITERS steps of ``case``'s feed, then its
    ``evaluate()`` over one step: what was trained, the weights and gradients, and what the feed planned."""
    from megatron.core.utils import get_model_config
    from megatron.training.global_vars import get_args
    from megatron.training.training import train

    static = case.layout.static_micro_batch_size is not None
    args = harness.parse_megatron_args(harness.base_argv(token_cap=not static) + case.layout.argv())
    harness.initialize(args)
    harness.install_hooks()
    try:
        model, optimizer, scheduler = harness.build_model_and_optimizer()
        params = harness.global_named_parameters(model)
        recorder = _GradRecorder(optimizer, params)
        feed = _training_feed(case, args, num_chunks=len(model))
        records: list[tuple[int, int, tuple[int, ...]]] = []
        positions: list[int] = []
        flops = _FlopsRecorder()
        try:
            train(_recording_forward_step(records, positions), model, optimizer, scheduler,
                  feed.megatron_iterators(), None, None, get_model_config(model[0]), {}, None)
        finally:
            flops.remove()
        args = get_args()
        result = {
            **_ranks_and_hooks(),
            "records": records,
            "positions": positions,
            "flops_token_figures": flops.calls,
            "grads": recorder.steps,
            "weights_before_step": recorder.weights,
            "weights": {n: harness.gather_full(p, p) for n, p in params.items()},
            "consumed_train_samples": args.consumed_train_samples,
            "scheduler_num_steps": scheduler.num_steps,
            "iteration": args.curr_iteration,
            "eval_loss": _evaluate_first_batch(model, _evaluation_feed(case, args, num_chunks=len(model))),
            **_planned(case, args, feed, num_chunks=len(model)),
        }
        feed.close()
        return result
    finally:
        harness.remove_hooks()
        harness.teardown()


def _plans(feed: Any) -> dict[str, Any]:
    """This rank's micro-batches and the sample count of every trained step."""
    plans = [feed.plan_step_at(s * GLOBAL_BATCH)[0] for s in range(TRAIN_ITERS)]
    return {"plan_micro_batches": [p.micro_batches for p in plans], "plan_num_samples": [p.num_samples for p in plans]}


def _plans_and_resume(args: Any, feed: Any, *, num_chunks: int) -> dict[str, Any]:
    """The plans of the trained steps, and the next step from the feed vs a resumed loader."""
    resumed = _loader(args, num_chunks=num_chunks, consumed_samples=args.consumed_train_samples)
    return {
        **_plans(feed),
        "next_step": feed.begin_step().micro_batches,
        "resumed_next_step": resumed.begin_step().micro_batches,
    }


LOADER_LAYOUTS: dict[str, Layout] = {
    "dp2": Layout(),
    "pp2": Layout(pp=2),
    "pp2_vpp2": Layout(pp=2, vpp=2),
    "dp2_static": Layout(static_micro_batch_size=2),
    # 8 samples, micro-batch size 8: Megatron's count is 1, the interleaved schedule needs 2 -> grown
    "pp2_vpp2_static": Layout(pp=2, vpp=2, static_micro_batch_size=8),
}
PARTIAL_STEP_SAMPLES = (TRAIN_ITERS - 1) * GLOBAL_BATCH + 4
"""``dp2_partial_step`` trains the first two full steps and a short trailing step of 4 samples."""


@scenario(world_size=4, cases={"dp2_pp2": Layout(pp=2)}, tags={"whole_batch", "resumes"})
@scenario(world_size=2, cases=LOADER_LAYOUTS, tags={"whole_batch", "resumes"})
def train(layout: Layout) -> dict[str, Any]:
    """The loader feed plans each step when Megatron asks for it."""
    return run_training(FeedCase(layout=layout))


@scenario(world_size=2, cases={"dp2_precomputed": Layout()}, tags={"whole_batch"})
def train_shipped_plan(layout: Layout) -> dict[str, Any]:
    """A shipped plan (JSON round trip) with an extra empty micro-batch per rank and step."""
    return run_training(FeedCase(layout=layout, feed="shipped_plan"))


@scenario(world_size=2)
def dp2_precomputed_resumed() -> dict[str, Any]:
    """The shipped plan, from a checkpoint of step 1 (Megatron's counters)."""
    return run_training(FeedCase(feed="shipped_plan", resume=True))


@scenario(world_size=2)
def dp2_prefetch() -> dict[str, Any]:
    """``dp2`` with the loader preparing each next step in its background thread."""
    return run_training(FeedCase(prefetch=True))


@scenario(world_size=2)
def dp2_partial_step() -> dict[str, Any]:
    """A short trailing step (:data:`PARTIAL_STEP_SAMPLES`)."""
    return run_training(FeedCase(num_samples=PARTIAL_STEP_SAMPLES))


@scenario(world_size=1)
def reference() -> dict[str, Any]:
    """One process, every step one micro-batch of all its samples."""
    return run_training(FeedCase(feed="whole_batch"))


@scenario(world_size=2)
def bad_layout() -> dict[str, Any]:
    """A VPP group below PP must fail before any step, naming the flag."""
    layout = Layout(pp=2, vpp=2, group=1)
    try:
        harness.parse_megatron_args(harness.base_argv() + layout.argv())
    except (ValueError, AssertionError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"error": None}


@scenario(world_size=2)
def dp_mismatch() -> dict[str, Any]:
    """A shipped plan made for 4 data-parallel ranks, run on 2: refused before the first step."""
    from megatron.core.utils import get_model_config
    from megatron.training.training import train

    from megatron_dpsched import build_dp_schedule
    from megatron_dpsched.megatron import ScheduledDataIterator

    args = harness.parse_megatron_args(harness.base_argv())
    harness.initialize(args)
    harness.install_hooks()
    try:
        model, optimizer, scheduler = harness.build_model_and_optimizer()
        plan = build_dp_schedule(LENGTHS[:GLOBAL_BATCH], dp_size=4, global_batch_size=GLOBAL_BATCH,
                                 max_tokens_per_gpu=40, padded_rows=True)  # as the default bshd collate pads
        before = [p.detach().clone() for p in model[0].parameters()]
        try:
            feed = ScheduledDataIterator(plan, rank=0, samples=harness.make_sample)  # refused here, before a step
            train(_recording_forward_step([]), model, optimizer, scheduler, feed.megatron_iterators(),
                  None, None, get_model_config(model[0]), {}, None)
        except ValueError as error:
            unchanged = all(torch.equal(a, b) for a, b in zip(before, model[0].parameters()))
            return {"error": str(error), "unchanged": unchanged}
        return {"error": None, "unchanged": None}
    finally:
        harness.remove_hooks()
        harness.teardown()


def _train_expecting_error(layout: Layout, make_feed: Callable[[Any, int], Any], *,
                           spoil: Callable[[dict[str, torch.nn.Parameter]], None] | None = None) -> dict[str, Any]:
    """Megatron's real ``train()`` on a feed that must be refused: the error, what trained, and the weights.

    ``make_feed(args, num_chunks)`` builds the feed once the model exists; ``spoil(params)`` may then
    change the weights (e.g. to make the loss NaN).
    """
    from megatron.core import parallel_state
    from megatron.core.utils import get_model_config
    from megatron.training.training import train

    args = harness.parse_megatron_args(harness.base_argv() + layout.argv())
    harness.initialize(args)
    harness.install_hooks()
    try:
        model, optimizer, scheduler = harness.build_model_and_optimizer()
        params = harness.global_named_parameters(model)
        if spoil is not None:
            with torch.no_grad():
                spoil(params)
        before = {name: param.detach().clone() for name, param in params.items()}
        feed = make_feed(args, len(model))
        records: list[tuple[int, int, tuple[int, ...]]] = []
        error = None
        try:
            train(_recording_forward_step(records), model, optimizer, scheduler, feed.megatron_iterators(),
                  None, None, get_model_config(model[0]), {}, None)
        except (ValueError, RuntimeError) as raised:
            error = f"{type(raised).__name__}: {raised}"
        return {
            "error": error,
            "records": records,
            "unchanged": all(torch.equal(before[n].isnan(), p.isnan()) and torch.equal(before[n].nan_to_num(),
                             p.nan_to_num()) for n, p in params.items()),
            "dp_rank": parallel_state.get_data_parallel_rank(),
            "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
            "first_micro_batch": feed.current.micro_batches[0] if feed.current else None,
            "global_rank": torch.distributed.get_rank(),
        }
    finally:
        harness.remove_hooks()
        harness.teardown()


LYING_LENGTHS = {
    "shorter": tuple(max(1, n // 4) for n in LENGTHS),  # the dataset says 4x fewer tokens than it holds
    "longer": tuple(2 * n for n in LENGTHS),
}


@scenario(world_size=2, cases={"lying_shorter": "shorter", "lying_longer": "longer"})
def lying_dataset(kind: str) -> dict[str, Any]:
    """A dataset whose ``lengths`` are not its samples' token counts: refused at the first micro-batch."""
    return _train_expecting_error(Layout(), lambda args, chunks: _loader(args, num_chunks=chunks,
                                                                         lengths=LYING_LENGTHS[kind]))


@scenario(world_size=2)
def lying_shipped_plan() -> dict[str, Any]:
    """A shipped plan made from wrong (4x shorter) lengths: refused at the first micro-batch."""
    from megatron.core import parallel_state

    from megatron_dpsched import plan_schedule
    from megatron_dpsched.megatron import ScheduledDataIterator, plan_setup_from_args

    def make_feed(args: Any, chunks: int) -> Any:
        setup = plan_setup_from_args(args, data_parallel_size=parallel_state.get_data_parallel_world_size())
        plan = plan_schedule(LYING_LENGTHS["shorter"][: TRAIN_ITERS * GLOBAL_BATCH], config=setup.config,
                             cost_model=setup.cost_model)
        return ScheduledDataIterator(plan, rank=parallel_state.get_data_parallel_rank(),
                                     samples=harness.make_sample, num_chunks=chunks)

    return _train_expecting_error(Layout(), make_feed)


def _rank_lengths(change: Callable[[list[int]], list[int]]) -> tuple[int, ...]:
    """``LENGTHS`` as this rank reads them: global rank 1 applies ``change`` to step 0's lengths."""
    lengths = list(LENGTHS)
    if torch.distributed.get_rank() == 1:
        lengths[:GLOBAL_BATCH] = change(lengths[:GLOBAL_BATCH])
    return tuple(lengths)


RANK_CHANGES: dict[str, Callable[[list[int]], list[int]]] = {
    "reordered": lambda step: step[::-1],  # rank 1 reads its lengths in another order
    "larger": lambda step: [n + 1 for n in step],  # rank 1's lengths slightly larger
}


def ranks_disagree(layout: Layout, change: str) -> dict[str, Any]:
    """Global rank 1 plans from other lengths: every rank must stop in step 0 with the fingerprint message."""
    return _train_expecting_error(layout, lambda args, chunks: _loader(
        args, num_chunks=chunks, lengths=_rank_lengths(RANK_CHANGES[change])))


@scenario(world_size=2, cases={"dp2_ranks_reordered": Layout(), "pp2_ranks_reordered": Layout(pp=2)})
def ranks_reordered(layout: Layout) -> dict[str, Any]:
    """Rank 1 reads step 0's lengths in another order."""
    return ranks_disagree(layout, "reordered")


@scenario(world_size=2)
def dp2_ranks_larger() -> dict[str, Any]:
    """Rank 1 reads step 0's lengths slightly larger."""
    return ranks_disagree(Layout(), "larger")


def _reversed_sample(sample_id: int) -> dict[str, torch.Tensor]:
    """``make_sample(sample_id)`` with its token ids in reverse order: the same length, other content."""
    return {key: value.flip(0) for key, value in harness.make_sample(sample_id).items()}


@scenario(world_size=2, launch="agree2")
def dp2_ranks_content() -> dict[str, Any]:
    """Global rank 1 reads the same lengths with other token ids: the plans match, the content does not;
    every rank must stop in step 0 naming the content."""
    dataset = _reversed_sample if torch.distributed.get_rank() == 1 else harness.make_sample
    return _train_expecting_error(Layout(), lambda args, chunks: _loader(args, num_chunks=chunks, dataset=dataset))


@scenario(world_size=2)
def nan_loss() -> dict[str, Any]:
    """NaN output weights: Megatron's NaN check on the loss (rerun state machine) stops step 0 on every rank.

    ``--rerun-mode disabled`` makes the rerun state machine raise at once (its default mode reruns the
    step to attribute the fault, then asks Megatron to save a checkpoint and exit).
    """
    def spoil(params: dict[str, torch.nn.Parameter]) -> None:
        params["output_layer.weight"].fill_(float("nan"))

    return _train_expecting_error(Layout(extra=("--rerun-mode", "disabled")),
                                  lambda args, chunks: _loader(args, num_chunks=chunks), spoil=spoil)
