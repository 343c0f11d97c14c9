"""The token cap bounds the collated tensors: plans from Megatron's own arguments (TP2+SP, CP2, CP2+TP2+SP, FP8;
thd and bshd), every micro-batch of every rank collated by the project's collate. No process group is needed."""

from __future__ import annotations

import random
from typing import Any

import harness
import pytest
import torch

from megatron_dpsched import plan_schedule
from megatron_dpsched.megatron.arguments import plan_setup_from_args
from megatron_dpsched.megatron.collate import (
    CollateConfig,
    collate_micro_batch,
    gemm_alignment_for,
    pad_multiple_for,
    require_padding_agreement,
)
from megatron_dpsched.megatron.provider import collate_config_from_args
from megatron_dpsched.testing import cpu_shim

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CAP = 256
GLOBAL_BATCH = 64
LAYOUTS = {  # layout -> (flags, pad multiple collate uses)
    "tp2_sp": (["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2),
    "cp2": (["--context-parallel-size", "2"], 4),
    "cp2_tp2_sp": (["--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"], 8),
    "fp8": (["--fp8-format", "hybrid"], 16),
}


def _lengths(cap: int, count: int = 4 * GLOBAL_BATCH) -> list[int]:
    """Mostly short samples, some near the cap, a few over it (seeded)."""
    rng = random.Random(7)
    pick = [lambda: rng.randint(1, 40), lambda: rng.randint(cap // 3, cap), lambda: rng.randint(cap - 20, 2 * cap)]
    return [rng.choices(pick, weights=(6, 3, 1))[0]() for _ in range(count)]


def _megatron_args(monkeypatch: pytest.MonkeyPatch, flags: list[str], *extra: str) -> Any:
    """Megatron's parse_args + validate_args + the dp-schedule validation, as an 8-GPU job."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    argv = harness.base_argv(extra=[*flags, "--dp-schedule-max-tokens-per-gpu", str(CAP), "--global-batch-size",
                                    str(GLOBAL_BATCH), "--spec", "megatron_dpsched.testing.cpu_attention",
                                    "gpt_layer_spec", *extra])
    with cpu_shim.cpu_device_shim():  # Megatron's validation asks the (absent) GPU for its capability
        return harness.parse_megatron_args(argv)


def _sample(length: int) -> dict[str, torch.Tensor]:
    tokens = torch.arange(length) % harness.VOCAB
    return {"tokens": tokens, "labels": tokens.roll(-1), "loss_mask": torch.ones(length)}


def _collated_sizes(args: Any, lengths: list[int]) -> list[tuple[int, int]]:
    """``(samples, numel of the collated token tensor)`` of every micro-batch of every rank of the plan."""
    setup = plan_setup_from_args(args, data_parallel_size=args.data_parallel_size)
    collate = collate_config_from_args(args)
    plan = plan_schedule(lengths, config=setup.config, cost_model=setup.cost_model)
    plan.check()
    sizes = []
    for rank in range(plan.dp_size):
        for step in range(plan.num_steps):
            for mb in plan.rank_step_micro_batches(rank, step):
                batch = collate_micro_batch([_sample(lengths[i]) for i in mb], mb, collate)
                assert batch["tokens"].size(-1) % collate.pad_multiple == 0
                sizes.append((len(mb), batch["tokens"].numel()))
    return sizes


@pytest.mark.parametrize("collate_format", ["thd", "bshd"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_collated_micro_batch_fits_the_cap(monkeypatch: pytest.MonkeyPatch, layout: str,
                                                 collate_format: str) -> None:
    flags, multiple = LAYOUTS[layout]
    args = _megatron_args(monkeypatch, flags, "--dp-schedule-collate-format", collate_format)
    collate = collate_config_from_args(args)
    assert collate == CollateConfig(format=collate_format, pad_multiple=multiple)
    config = plan_setup_from_args(args, data_parallel_size=args.data_parallel_size).config
    assert (config.pad_multiple, config.padded_rows) == (multiple, collate_format == "bshd")
    require_padding_agreement(pad_multiple=multiple, padded_rows=collate_format == "bshd", collate=collate,
                              counts_padding=True)
    cap = CAP * args.context_parallel_size  # the cap is per GPU; a CP group shares each micro-batch
    sizes = _collated_sizes(args, _lengths(cap))
    over = [(count, numel) for count, numel in sizes if numel > cap]
    assert all(count == 1 for count, _ in over), over  # only a sample longer than the cap on its own
    assert len(sizes) > len(over) > 0


@pytest.mark.parametrize("layout", ["fp8", "cp2"])
def test_counting_real_tokens_overflows_the_collated_tensors(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """The old meaning, kept behind --dp-schedule-cap-counts tokens: bshd rows and padding go past the cap."""
    args = _megatron_args(monkeypatch, LAYOUTS[layout][0], "--dp-schedule-collate-format", "bshd",
                          "--dp-schedule-cap-counts", "tokens")
    config = plan_setup_from_args(args, data_parallel_size=args.data_parallel_size).config
    assert (config.pad_multiple, config.padded_rows) == (1, False)
    cap = CAP * args.context_parallel_size
    assert any(count > 1 and numel > cap for count, numel in _collated_sizes(args, _lengths(cap)))


def test_plan_and_collate_must_agree_on_the_padding() -> None:
    collate = CollateConfig(format="thd", pad_multiple=8)
    require_padding_agreement(pad_multiple=8, padded_rows=False, collate=collate, counts_padding=True)
    require_padding_agreement(pad_multiple=1, padded_rows=False, collate=collate, counts_padding=False)
    with pytest.raises(ValueError, match="collate pads every sequence to a multiple of 8"):
        require_padding_agreement(pad_multiple=4, padded_rows=False, collate=collate, counts_padding=True)
    with pytest.raises(ValueError, match="padded_rows=True"):
        require_padding_agreement(pad_multiple=8, padded_rows=False, counts_padding=True,
                                  collate=CollateConfig(format="bshd", pad_multiple=8))


def test_pad_multiple_covers_megatron_cores_rules() -> None:
    assert gemm_alignment_for() == 1
    assert gemm_alignment_for(fp8="hybrid") == gemm_alignment_for(fp8="e4m3", fp8_recipe="delayed") == 16
    assert gemm_alignment_for(fp8="e4m3", fp8_recipe="mxfp8") == gemm_alignment_for(fp4="e2m1") == 32
    layouts = [(1, 1, False), (2, 1, True), (1, 2, False), (2, 2, True), (4, 1, False), (8, 4, True)]
    for tp, cp, sp in layouts:
        for alignment in (1, 16, 32):
            multiple = pad_multiple_for(tensor_parallel_size=tp, context_parallel_size=cp, sequence_parallel=sp,
                                        gemm_alignment=alignment)
            megatron_core = tp * cp * 2 if sp and cp > 1 else cp * 2 if cp > 1 else tp if sp else alignment
            assert multiple % megatron_core == 0 and multiple % alignment == 0, (tp, cp, sp, alignment)
