"""The step's accounting in Megatron's units, the check of a resumed job's first plan, and
``--dp-schedule-verify check``, each against a one-line bug the rest of the suite let through (issue 27,
"Tests that catch"). One process, real megatron-core arguments and the real feeds; no launch."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import harness
import pytest

from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.megatron import hooks, job_checks
from megatron_dpsched.megatron.accounting import close_window, open_window
from megatron_dpsched.megatron.collate import CollateConfig
from megatron_dpsched.megatron.feeds import ScheduledDatasetLoader

pytestmark = pytest.mark.distributed

SAMPLES = 20
"""Two steps of 8 and a short trailing step of 4."""
CONFIG = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=40)
PACKED = CollateConfig(format="thd")
"""Packed micro-batches: the plan's cap (no pad multiple, no padded rows) bounds what collate makes."""


def _loader(**kwargs: object) -> ScheduledDatasetLoader:
    return ScheduledDatasetLoader(harness.make_sample, lengths=harness.LENGTHS[:SAMPLES], rank=0, config=CONFIG,
                                  collate=PACKED, vocab_size=harness.VOCAB, **kwargs)


@pytest.fixture
def megatron_args(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Megatron's global arguments for a job of 2 data-parallel ranks, micro-batch size 1, global batch 8."""
    from megatron.training import global_vars

    args = types.SimpleNamespace(micro_batch_size=1, data_parallel_size=2, global_batch_size=8, dp_schedule=True)
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", args)
    return args


def test_a_short_trailing_step_counts_its_own_samples(megatron_args: types.SimpleNamespace) -> None:
    """Steps of 8, 8 and 4 samples: the feed's consumed samples grow by 8, 8, 4, and during each step Megatron's
    ``get_num_microbatches()`` (the LR scheduler's and ``consumed_train_samples``' increment, times micro-batch
    size x DP) answers 4, 4 and 2."""
    feed = _loader()
    counts, consumed = [], []
    for _ in range(3):
        step = feed.begin_step()
        open_window(feed, step)
        try:
            counts.append(hooks.num_microbatches())
        finally:
            close_window()
        feed.end_step()
        consumed.append(feed.consumed_samples)
    assert consumed == [8, 16, 20]
    assert counts == [8 // (1 * 2), 8 // (1 * 2), 4 // (1 * 2)]
    with pytest.raises(StopIteration):
        feed.begin_step()


class BrokenPlans(ScheduledDatasetLoader):
    """The real loader, whose plans claim samples four times longer than the ones planned (so they break the
    token cap): what ``--dp-schedule-verify check`` is there to find."""

    def plan_step_at(self, consumed_samples: int):  # noqa: ANN201 - the parent's type
        batches, plan = super().plan_step_at(consumed_samples)
        return batches, dataclasses.replace(plan, lengths=tuple(4 * n for n in plan.lengths))


OVER_THE_CAP = r"^invariant 2: rank 0, step 0, .* > max_tokens_per_gpu \* cp_size = 40"


def test_verify_check_runs_the_invariant_checker_on_every_step() -> None:
    from megatron_dpsched.core.invariants import ScheduleInvariantError

    lenient = BrokenPlans(harness.make_sample, lengths=harness.LENGTHS[:SAMPLES], rank=0, config=CONFIG,
                          collate=PACKED, vocab_size=harness.VOCAB, verify="off")
    assert lenient.begin_step().num_samples == 8  # off: the plan is not checked
    for verify in ("check", "strict"):
        checked = BrokenPlans(harness.make_sample, lengths=harness.LENGTHS[:SAMPLES], rank=0, config=CONFIG,
                              collate=PACKED, vocab_size=harness.VOCAB, verify=verify)
        with pytest.raises(ScheduleInvariantError, match=OVER_THE_CAP):
            checked.begin_step()


def _identity_args(tmp_path: Path) -> object:
    args = harness.parse_megatron_args(harness.base_argv())
    args.save, args.load = str(tmp_path / "checkpoint"), None
    args.consumed_train_samples, args.iteration = 8, 0
    return args


def test_a_resumed_jobs_first_plan_is_compared_with_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """Save after step 0 of a feed; resume with the same data: the first step passes. Resume with samples of the
    same lengths but other tokens (nothing in the job's flags or files says so): the first step stops, naming
    the step, the position and both fingerprints."""
    from megatron.training import global_vars

    args = _identity_args(tmp_path)
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", args)
    monkeypatch.setattr(job_checks, "_state", {})
    identity = job_checks.agree_on_this_job(args)
    saved = _loader()
    saved.begin_step()
    job_checks.write_state(1, train_data_iterator=saved.chunks[0])
    args.load, args.iteration = args.save, 1

    job_checks.check_resume(args, identity, iteration=1)
    same = _loader(consumed_samples=8)
    job_checks.check_resumed_step(same, same.begin_step())  # the plan the checkpoint expects

    def other_tokens(sample_id: int) -> dict:
        sample = harness.make_sample(sample_id)
        return {key: (value + 1) % harness.VOCAB for key, value in sample.items()}

    monkeypatch.setattr(job_checks, "_state", {})  # a second job resuming the same checkpoint
    job_checks.check_resume(args, identity, iteration=1)
    other = ScheduledDatasetLoader(other_tokens, lengths=harness.LENGTHS[:SAMPLES], rank=0, config=CONFIG,
                                   collate=PACKED, vocab_size=harness.VOCAB, consumed_samples=8)
    step = other.begin_step()
    expected = same.current.fingerprint
    with pytest.raises(ValueError, match=rf"^dp-schedule: the checkpoint \(.*iter_0000001.*\) expects step 1 at "
                                         rf"consumed_samples=8 with plan fingerprint {expected:#018x}; this job plans "
                                         rf"step 1 at consumed_samples=8 with fingerprint {step.fingerprint:#018x}"):
        job_checks.check_resumed_step(other, step)
