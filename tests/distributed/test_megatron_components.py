"""Single-process checks of the Megatron-side pieces (flags, patch, collate, iterators)."""


from __future__ import annotations

import argparse
import types

import harness
import pytest
import torch

from megatron_dpsched import ScheduleConfig, build_dp_schedule
from megatron_dpsched.megatron import (
    CollateConfig,
    ScheduledDataIterator,
    ScheduledDatasetLoader,
    StepBatches,
    add_dp_schedule_args,
    collate_micro_batch,
    pad_multiple_for,
    patch,
    validate_dp_schedule_args,
)
from megatron_dpsched.megatron.accounting import accounting_count
from megatron_dpsched.megatron.hooks import check_interleaved_count, scheduled_forward_backward

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _args(*argv: str, **overrides: object) -> argparse.Namespace:
    args = add_dp_schedule_args(argparse.ArgumentParser()).parse_args(["--dp-schedule", *argv])
    defaults = dict(micro_batch_size=1, pipeline_model_parallel_size=1,
                    virtual_pipeline_model_parallel_size=None, microbatch_group_size_per_vp_stage=None,
                    overlap_p2p_comm=True, calculate_per_token_loss=False, global_batch_size=8)
    return argparse.Namespace(**{**vars(args), **defaults, **overrides})


# --- the package's names ----------------------------------------------------------------------


def test_every_name_of_the_package_is_the_one_its_module_holds() -> None:
    import importlib

    import megatron_dpsched.megatron as package

    namespace: dict[str, object] = {}
    exec("from megatron_dpsched.megatron import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(package.__all__)
    for name in package.__all__:
        module = importlib.import_module(f"megatron_dpsched.megatron.{package._EXPORTS[name]}")
        assert namespace[name] is (module if name == "patch" else getattr(module, name)), name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        package.not_a_name  # noqa: B018


def test_megatron_state_reads_megatrons_global_arguments_and_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.training import global_vars

    from megatron_dpsched.runtime.megatron_state import megatron_args, megatron_timers

    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", None)
    monkeypatch.setattr(global_vars, "_GLOBAL_TIMERS", None)
    assert megatron_args() is None and megatron_timers() is None
    args, timers = types.SimpleNamespace(dp_schedule=True), object()
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", args)
    monkeypatch.setattr(global_vars, "_GLOBAL_TIMERS", timers)
    assert megatron_args() is global_vars.get_args() is args and megatron_timers() is global_vars.get_timers()


# --- arguments -------------------------------------------------------------------------------


def test_cost_balance_plans_with_a_flops_model_of_the_configured_gpt() -> None:
    from megatron_dpsched import CostModel, plan_schedule
    from megatron_dpsched.megatron import plan_setup_from_args

    dims = dict(hidden_size=64, num_layers=2, num_attention_heads=4, group_query_attention=True,
                num_query_groups=2, ffn_hidden_size=128, padded_vocab_size=256, swiglu=False)
    args = _args("--dp-schedule-max-tokens-per-gpu", "64", "--dp-schedule-balance-growth", "0.25", **dims)
    setup = plan_setup_from_args(args, data_parallel_size=2)
    assert setup.cost_model == CostModel(hidden_size=64, num_layers=2, num_attention_heads=4,
                                         num_query_groups=2, ffn_hidden_size=128, vocab_size=256)
    assert setup.config.balance_growth == 0.25 and setup.config.dp_size == 2
    tokens = plan_setup_from_args(_args("--dp-schedule-balance", "tokens", **dims), data_parallel_size=2)
    assert tokens.cost_model is None
    plan_schedule([5, 60, 7, 30], config=setup.config, cost_model=setup.cost_model).check()


@pytest.mark.parametrize(("flags", "extra_flops_per_token"), [
    (["--swiglu", "--group-query-attention", "--num-query-groups", "1"], lambda args: 0),
    (["--kv-channels", "16"], lambda args: 0),
    # the router's 2*h*E per MoE layer, which Megatron's count leaves out
    (["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "8",
      "--moe-shared-expert-intermediate-size", "24", "--moe-layer-freq", "([0]+[1]*3)", "--swiglu"],
     lambda args: 3 * 2 * args.hidden_size * 4 * 3),
    # Megatron also counts the query and key/value LoRA norms (q_lora_rank + kv_lora_rank per layer)
    (["--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "8", "--qk-head-dim", "8",
      "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--position-embedding-type", "rope"],
     lambda args: -3 * 2 * args.num_layers * (12 + 8)),
])
def test_cost_model_from_real_megatron_args_matches_megatron_flops(flags, extra_flops_per_token) -> None:
    """Megatron's parse_args + validate_args, then CostModel against Megatron's own FLOPs count."""
    import copy

    from megatron.training.training import num_floating_point_operations

    from megatron_dpsched import CostModel

    assert harness.NUM_LAYERS == 4
    args = harness.parse_megatron_args(harness.base_argv(extra=flags))
    model = CostModel.from_megatron_args(args)
    for length in (1, 48):
        theirs = num_floating_point_operations(copy.deepcopy(args), 1, seqlen_squared_sum_in_batch=length**2,
                                               total_real_tokens_in_batch=length)
        assert model(length) == theirs + length * extra_flops_per_token(args)


def test_step_time_objective_is_the_default_with_pipelining_and_a_token_cap() -> None:
    from megatron_dpsched import plan_schedule
    from megatron_dpsched.core import StepTimeModel
    from megatron_dpsched.megatron import plan_setup_from_args

    def step_time_model(args: argparse.Namespace) -> StepTimeModel | None:
        return plan_setup_from_args(args, data_parallel_size=2).config.step_time_model

    dims = dict(hidden_size=64, num_layers=2, num_attention_heads=4, tensor_model_parallel_size=2)
    cap = ("--dp-schedule-max-tokens-per-gpu", "64")
    piped = plan_setup_from_args(_args(*cap, pipeline_model_parallel_size=4, **dims), data_parallel_size=2)
    model = piped.config.step_time_model
    assert isinstance(model, StepTimeModel) and model.seconds_per_microbatch == 0.002
    assert model.seconds_per_token == piped.cost_model.linear_flops_per_token / (2 * 4e14)
    plan_schedule([5, 60, 7, 30, 64, 9, 12, 40], config=piped.config, cost_model=piped.cost_model).check()
    assert step_time_model(_args(*cap, **dims)) is None
    off = _args(*cap, "--dp-schedule-objective", "micro-batches", pipeline_model_parallel_size=4, **dims)
    assert step_time_model(off) is None
    on = _args(*cap, "--dp-schedule-objective", "step-time", "--dp-schedule-microbatch-overhead-ms", "0", **dims)
    assert step_time_model(on).seconds_per_microbatch == 0
    static = _args("--dp-schedule-objective", "step-time", pipeline_model_parallel_size=4, **dims)
    with pytest.raises(ValueError, match="--dp-schedule-objective: .*needs max_tokens_per_gpu"):
        validate_dp_schedule_args(static)
    assert step_time_model(_args(pipeline_model_parallel_size=4, **dims)) is None  # static: micro-batches


def test_validation_turns_on_per_token_loss_and_variable_lengths_under_pp() -> None:
    args = _args("--dp-schedule-max-tokens-per-gpu", "64", pipeline_model_parallel_size=2)
    validate_dp_schedule_args(args)
    assert args.calculate_per_token_loss and args.variable_seq_lengths
    assert args.moe_token_dispatcher_type == "alltoall"


@pytest.mark.parametrize(("argv", "overrides", "flag"), [
    (("--dp-schedule-max-tokens-per-gpu", "0"), {}, "--dp-schedule-max-tokens-per-gpu"),
    (("--dp-schedule-max-tokens-per-gpu", "64"), {"micro_batch_size": 2}, "--micro-batch-size"),
    ((), {"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2,
          "microbatch_group_size_per_vp_stage": 2}, "--microbatch-group-size-per-virtual-pipeline-stage"),
    ((), {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
          "overlap_p2p_comm": False}, "--no-overlap-p2p-communication"),
    ((), {"rampup_batch_size": [1, 1, 10]}, "--rampup-batch-size"),
    ((), {"decrease_batch_size_if_needed": True}, "--decrease-batch-size-if-needed"),
    ((), {"cuda_graph_impl": "full_iteration"}, "--cuda-graph-impl"),
    (("--dp-schedule-max-tokens-per-gpu", "64", "--dp-schedule-balance-growth", "-1"), {},
     "--dp-schedule-balance-growth"),
    ((), {"full_validation": True}, "--full-validation"),
    ((), {"moe_expert_rank_capacity_factor": 1.0}, "--moe-expert-rank-capacity-factor"),
    (("--dp-schedule-collate-format", "thd"), {"transformer_impl": "local"}, "--transformer-impl local"),
])
def test_bad_flags_fail_naming_the_flag(argv: tuple, overrides: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        validate_dp_schedule_args(_args(*argv, **overrides))


def _megatron_argv(*extra: str, dp_schedule: bool = True) -> list[str]:
    """The harness's tiny GPT flags through Megatron's own parser; without ``--dp-schedule`` if asked."""
    argv = harness.base_argv(extra=list(extra))
    if not dp_schedule:
        for flag in ("--dp-schedule-max-tokens-per-gpu", "--dp-schedule-verify"):
            index = argv.index(flag)
            del argv[index : index + 2]
        argv.remove("--dp-schedule")
    return argv


@pytest.mark.parametrize(("extra", "message"), [
    (("--dp-schedule-balance", "tokens"), "--dp-schedule-balance given without --dp-schedule"),
    (("--dp-schedule-max-tokens-per-gpu", "64", "--dp-schedule-verify", "strict"),
     "--dp-schedule-max-tokens-per-gpu, --dp-schedule-verify given without --dp-schedule"),
    (("--dp-schedule-balance-growth", "0.1"), "--dp-schedule-balance-growth given without --dp-schedule"),
])
def test_dp_schedule_options_without_the_switch_are_refused(extra: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        harness.parse_megatron_args(_megatron_argv(*extra, dp_schedule=False))


def test_plain_megatron_arguments_pass_without_the_switch() -> None:
    args = harness.parse_megatron_args(_megatron_argv(dp_schedule=False))
    assert not args.dp_schedule and args.dp_schedule_balance is None


@pytest.mark.parametrize(("extra", "token_cap", "message"), [
    (("--dp-schedule-balance-growth", "50"), True, "--dp-schedule-balance-growth must be between 0 and 10"),
    (("--dp-schedule-balance-growth", "0.5"), False,
     "--dp-schedule-balance-growth has no effect without --dp-schedule-max-tokens-per-gpu"),
    (("--dp-schedule-max-tokens-per-gpu", str(2**31)), True,
     "--dp-schedule-max-tokens-per-gpu must be between 1 and 2147483647; got 2147483648"),
])
def test_planner_options_are_validated_at_argument_time(extra: tuple, token_cap: bool, message: str) -> None:
    argv = harness.base_argv(extra=list(extra), token_cap=token_cap)
    with pytest.raises(ValueError, match=message):
        harness.parse_megatron_args(argv)


def test_a_vpp_group_without_vpp_is_ignored_as_megatron_ignores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_dpsched import plan_schedule
    from megatron_dpsched.megatron import plan_setup_from_args

    monkeypatch.setenv("WORLD_SIZE", "2")

    argv = harness.base_argv(extra=["--pipeline-model-parallel-size", "2",
                                    "--microbatch-group-size-per-virtual-pipeline-stage", "1",
                                    "--dp-schedule-cap-counts", "tokens"])  # the cap counts real tokens here
    args = harness.parse_megatron_args(argv)
    setup = plan_setup_from_args(args, data_parallel_size=args.data_parallel_size)
    assert setup.config.microbatch_group_size_per_vp_stage is None and setup.config.pp_size == 2
    plan = plan_schedule(list(harness.LENGTHS[:8]), config=setup.config, cost_model=setup.cost_model)
    assert plan.num_microbatches == (1,)  # 31 tokens, cap 40


def test_thd_is_accepted_with_a_layer_spec_and_the_default_follows_the_backend() -> None:
    args = _args("--dp-schedule-collate-format", "thd", transformer_impl="local", spec=["my.module", "spec"])
    validate_dp_schedule_args(args)
    assert args.dp_schedule_collate_format == "thd"
    local = _args(transformer_impl="local")
    validate_dp_schedule_args(local)
    assert local.dp_schedule_collate_format == "bshd"
    engine = _args(transformer_impl="transformer_engine")
    validate_dp_schedule_args(engine)
    import importlib.util

    has_te = importlib.util.find_spec("transformer_engine") is not None
    assert engine.dp_schedule_collate_format == ("thd" if has_te else "bshd")


def test_validation_is_a_no_op_without_dp_schedule() -> None:
    args = argparse.Namespace(dp_schedule=False, calculate_per_token_loss=False)
    validate_dp_schedule_args(args)
    assert not args.calculate_per_token_loss


def test_megatron_parse_args_accepts_the_flags() -> None:
    args = harness.parse_megatron_args(harness.base_argv(extra=["--dp-schedule-balance", "tokens"]))
    assert args.dp_schedule and args.dp_schedule_balance == "tokens" and args.calculate_per_token_loss


# --- patch -----------------------------------------------------------------------------------


def test_enable_disable_are_idempotent_and_restore_the_originals() -> None:
    import megatron.training.training as training

    patch.disable()
    originals = {row.name: getattr(training, row.name) for row in patch.rows_of()}
    patch.enable()
    patch.enable()
    assert all(getattr(training, name) is not originals[name] for name in originals)
    patch.disable()
    patch.disable()
    assert all(getattr(training, name) is originals[name] for name in originals)


def test_check_megatron_rejects_an_unexpected_training_loop() -> None:
    import megatron.training.training as training

    fake = types.SimpleNamespace(**{name: getattr(training, name) for name in dir(training)})
    fake.train_step = lambda forward_step_func, data_iterator: None
    with pytest.raises(RuntimeError, match="train_step"):
        patch.check_megatron(fake)


def test_interleaved_count_is_checked_before_the_schedule_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import parallel_state

    model = [types.SimpleNamespace(config=types.SimpleNamespace(microbatch_group_size_per_vp_stage=2))] * 2
    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr("megatron.core.utils.get_model_config", lambda m: m.config)
    check_interleaved_count(4, model)
    with pytest.raises(ValueError, match="--microbatch-group-size-per-virtual-pipeline-stage"):
        check_interleaved_count(3, model)


def test_sample_count_must_be_expressible_in_megatron_units(monkeypatch: pytest.MonkeyPatch) -> None:
    args = types.SimpleNamespace(micro_batch_size=1, data_parallel_size=2, gtp_weight_remat_size=1)
    monkeypatch.setattr("megatron.training.global_vars.get_args", lambda: args)
    assert accounting_count(StepBatches(step=0, micro_batches=((),), num_samples=8, fingerprint=0)) == 4
    with pytest.raises(ValueError, match="--global-batch-size"):
        accounting_count(StepBatches(step=3, micro_batches=((),), num_samples=7, fingerprint=0))


# --- collate ---------------------------------------------------------------------------------


def _sample(length: int, start: int = 1) -> dict[str, torch.Tensor]:
    tokens = torch.arange(start, start + length)
    return {"tokens": tokens, "labels": tokens + 1}


def test_bshd_pads_right_and_needs_no_attention_mask() -> None:
    batch = collate_micro_batch([_sample(3), _sample(5)], [7, 9], CollateConfig(format="bshd", pad_multiple=4))
    assert batch["tokens"].shape == (2, 8)
    assert batch["loss_mask"].sum(dim=1).tolist() == [3.0, 5.0]
    assert batch["attention_mask"] is None  # causal + right padding: no real token sees padding
    assert batch["padding_mask"].tolist() == [[False] * 3 + [True] * 5, [False] * 5 + [True] * 3]
    assert batch["tokens"][0, :3].tolist() == [1, 2, 3] and batch["tokens"][0, 3:].tolist() == [0] * 5
    assert batch["sample_ids"].tolist() == [7, 9]


def test_context_parallel_slices_keep_each_sequences_balanced_chunks() -> None:
    from megatron_dpsched.megatron.collate import slice_for_context_parallel

    thd = collate_micro_batch([_sample(3, start=10), _sample(7, start=20)], [0, 1],
                              CollateConfig(format="thd", pad_multiple=4))
    assert thd["packed_seq_params"].cu_seqlens_q_padded.tolist() == [0, 4, 12]
    ranks = [slice_for_context_parallel(thd, cp_size=2, cp_rank=r) for r in range(2)]
    # sequence 1: tokens 10 11 12 <pad>, chunks of 1: rank 0 keeps 0 and 3, rank 1 keeps 1 and 2
    # sequence 2: tokens 20..26 <pad>, chunks of 2: rank 0 keeps 0-1 and 6-7, rank 1 keeps 2-5
    assert ranks[0]["tokens"].tolist() == [[10, 0, 20, 21, 26, 0]]
    assert ranks[1]["tokens"].tolist() == [[11, 12, 22, 23, 24, 25]]
    assert ranks[0]["loss_mask"].tolist() == [[1, 0, 1, 1, 1, 0]]
    assert ranks[1]["position_ids"].tolist() == [[1, 2, 2, 3, 4, 5]]
    assert ranks[0]["packed_seq_params"] is thd["packed_seq_params"]  # whole sequences for the attention
    bshd = collate_micro_batch([_sample(4, start=1)], [0], CollateConfig(format="bshd", pad_multiple=4))
    assert slice_for_context_parallel(bshd, cp_size=2, cp_rank=1)["tokens"].tolist() == [[2, 3]]


def test_thd_packs_with_cu_seqlens_and_per_sequence_padding() -> None:
    multiple = pad_multiple_for(tensor_parallel_size=2, context_parallel_size=2, sequence_parallel=True)
    assert multiple == 8
    batch = collate_micro_batch([_sample(3), _sample(10)], [0, 1], CollateConfig(format="thd", pad_multiple=4))
    params = batch["packed_seq_params"]
    assert params.cu_seqlens_q.tolist() == [0, 3, 13]
    assert params.cu_seqlens_q_padded.tolist() == [0, 4, 16]
    assert batch["tokens"].shape == (1, 16) and batch["loss_mask"].sum() == 13
    assert batch["position_ids"][0, 4:7].tolist() == [0, 1, 2]


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_empty_micro_batch_is_a_zero_weight_dummy(fmt: str) -> None:
    batch = collate_micro_batch([], [], CollateConfig(format=fmt, pad_multiple=2))
    assert batch["tokens"].numel() == 2 and batch["loss_mask"].sum() == 0
    assert batch["sample_ids"].numel() == 0


# --- iterators -------------------------------------------------------------------------------


def _schedule():
    """A plan for the feeds' default collate (bshd: padded rows counted against the cap)."""
    return build_dp_schedule(harness.LENGTHS[:16], dp_size=2, global_batch_size=8, max_tokens_per_gpu=40,
                             padded_rows=True)


def test_precomputed_iterator_walks_steps_per_chunk_and_resets() -> None:
    schedule = _schedule()
    feed = ScheduledDataIterator(schedule, rank=1, samples=harness.make_sample, num_chunks=2, verify="strict",
                                 vocab_size=harness.VOCAB)
    for step in range(schedule.num_steps):
        planned = feed.begin_step()
        assert planned.micro_batches == schedule.rank_step_micro_batches(1, step)
        for chunk in feed.chunks:
            ids = [tuple(chunk.get_next(["tokens"])["sample_ids"].tolist()) for _ in planned.micro_batches]
            assert ids == list(planned.micro_batches)
        feed.end_step()
    with pytest.raises(StopIteration):
        feed.begin_step()
    feed.reset()
    assert feed.begin_step().step == 0


def test_get_next_returns_only_the_requested_keys() -> None:
    feed = ScheduledDataIterator(_schedule(), rank=0, samples=harness.make_sample, vocab_size=harness.VOCAB)
    feed.begin_step()
    assert set(feed.chunks[0].get_next(["labels", "loss_mask"])) == {"labels", "loss_mask", "sample_ids"}


def test_strict_verify_catches_a_chunk_that_skipped_micro_batches() -> None:
    feed = ScheduledDataIterator(_schedule(), rank=0, samples=harness.make_sample, num_chunks=2,
                                 verify="strict", vocab_size=harness.VOCAB)
    planned = feed.begin_step()
    for _ in planned.micro_batches:
        next(feed.chunks[0])
    with pytest.raises(RuntimeError, match="strict"):
        feed.end_step()
    with pytest.raises(RuntimeError, match="micro-batch"):
        for _ in range(planned.num_microbatches + 1):
            next(feed.chunks[1])


def test_loader_matches_the_whole_plan_and_resumes_mid_way() -> None:
    schedule = _schedule()
    config = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=40, padded_rows=True)
    loader = ScheduledDatasetLoader(harness.make_sample, lengths=harness.LENGTHS[:16], rank=0,
                                    config=config, vocab_size=harness.VOCAB)
    steps = [loader.begin_step() for _ in range(2)]
    assert [s.micro_batches for s in steps] == [schedule.rank_step_micro_batches(0, s) for s in range(2)]
    assert loader.consumed_samples == 16
    resumed = ScheduledDatasetLoader(harness.make_sample, lengths=harness.LENGTHS[:16], rank=0,
                                     config=config, consumed_samples=8, vocab_size=harness.VOCAB)
    assert resumed.begin_step() == steps[1]


def test_a_rerun_replays_the_same_step_instead_of_advancing(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core.rerun_state_machine import RerunDataIterator

    monkeypatch.setattr("megatron_dpsched.megatron.hooks._open_step", lambda feed, step, count_tokens: None)
    feed = ScheduledDataIterator(_schedule(), rank=0, samples=harness.make_sample, vocab_size=harness.VOCAB)
    wrapped = RerunDataIterator(feed.chunks[0])
    seen = []

    def schedule(*, data_iterator, model, num_microbatches, forward_only=False):
        seen.append((feed.current.step, num_microbatches))

    run = scheduled_forward_backward(schedule)
    run(data_iterator=wrapped, model=[object()], num_microbatches=99)
    wrapped.replaying = True
    run(data_iterator=wrapped, model=[object()], num_microbatches=99)
    wrapped.replaying = False
    run(data_iterator=wrapped, model=[object()], num_microbatches=99)
    assert [s for s, _ in seen] == [0, 0, 1]
    assert [m for _, m in seen] == [len(feed.schedule.rank_step_micro_batches(0, s)) for s in (0, 0, 1)]


# --- provider ----------------------------------------------------------------------------------


def test_setup_dp_schedule_does_nothing_without_the_flag() -> None:
    from megatron_dpsched.megatron import setup_dp_schedule

    args = _args(dataloader_type="single")
    args.dp_schedule = False
    setup_dp_schedule(args)
    assert args.dataloader_type == "single" and not patch.is_enabled()
    assert patch.installed() == ("setup_model_and_optimizer", "save_checkpoint", "train_step")  # every job's rows


def test_setup_dp_schedule_validates_then_hooks_in() -> None:
    from megatron_dpsched.megatron import setup_dp_schedule

    with pytest.raises(ValueError, match="--dp-schedule-max-tokens-per-gpu"):
        setup_dp_schedule(_args("--dp-schedule-max-tokens-per-gpu", "0", dataloader_type="single"))
    assert not patch.is_enabled()
    args = _args("--dp-schedule-max-tokens-per-gpu", "64", dataloader_type="single")
    try:
        setup_dp_schedule(args)
        assert args.dataloader_type == "external" and args.calculate_per_token_loss and patch.is_enabled()
    finally:
        patch.disable()


def test_scheduled_data_needs_per_sample_lengths() -> None:
    from megatron_dpsched.megatron.checks import dataset_lengths

    class NoLengths(list):
        pass

    with pytest.raises(ValueError, match="'lengths' sequence with one entry per sample"):
        dataset_lengths(NoLengths([1, 2, 3]))
    dataset = NoLengths([1, 2, 3])
    dataset.lengths = [5, 6]
    with pytest.raises(ValueError, match="'lengths'"):
        dataset_lengths(dataset)


# --- corpora ---------------------------------------------------------------------------------


def test_indexed_dataset_corpus_round_trip(tmp_path) -> None:
    from megatron_dpsched.data import IndexedTokenDataset, open_corpus, write_token_indexed

    rows = [[5, 6, 7], [1, 2], [9, 8, 7, 6, 5]]
    prefix = write_token_indexed(tmp_path / "corpus", rows)
    data = open_corpus(prefix)
    assert isinstance(data, IndexedTokenDataset)
    assert data.lengths == [2, 1, 4] and len(data) == 3
    assert data[2]["tokens"].tolist() == [9, 8, 7, 6] and data[2]["labels"].tolist() == [8, 7, 6, 5]
    with pytest.raises(ValueError, match="no missing.bin"):
        IndexedTokenDataset(tmp_path / "missing")
    with pytest.raises(ValueError, match="at least 2 token ids"):
        IndexedTokenDataset(write_token_indexed(tmp_path / "short", [[1, 2], [3]]))


def test_product_path_never_imports_the_test_stand_ins() -> None:
    import subprocess
    import sys

    code = ("import sys, megatron_dpsched.megatron as m; m.enable(); m.disable(); "
            "assert not [name for name in sys.modules if name.startswith('megatron_dpsched.testing')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_shipped_plan_is_checked_when_its_feed_is_built_whatever_verify_says() -> None:
    """step_num_samples [16, 8] for two steps of 12 would step the scheduler by the wrong samples."""
    import dataclasses

    schedule = build_dp_schedule(harness.LENGTHS[:24], dp_size=2, global_batch_size=12, max_tokens_per_gpu=40,
                                 padded_rows=True)
    broken = dataclasses.replace(schedule, step_num_samples=(16, 8))
    with pytest.raises(ValueError, match="the shipped plan is broken: invariant 5: step 0 trains 12 samples"):
        ScheduledDataIterator(broken, rank=1, samples=harness.make_sample, verify="off",
                              vocab_size=harness.VOCAB)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        ScheduledDataIterator(schedule, rank=2, samples=harness.make_sample, vocab_size=harness.VOCAB)


def test_a_loader_refuses_bad_dataset_lengths_before_planning() -> None:
    config = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=40, padded_rows=True)
    with pytest.raises(ValueError, match=r"function.lengths\[3\] must be a positive integer"):
        ScheduledDatasetLoader(harness.make_sample, lengths=[4, 5, 3, 0, 6], rank=0, config=config,
                               vocab_size=harness.VOCAB)
