"""Test-only Megatron set-up on CPU/gloo: a tiny GPT, real ``setup_model_and_optimizer``.

Used inside the processes spawned by :mod:`tests.distributed.launcher`.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VOCAB = 64
NUM_LAYERS = 4
GLOBAL_BATCH = 8
TRAIN_ITERS = 3
MAX_TOKENS = 40
LR = 0.5

# Three steps of eight samples whose plans need different micro-batch counts.
LENGTHS: tuple[int, ...] = (
    4, 5, 3, 4, 6, 2, 4, 3,            # step 0: 31 tokens, one micro-batch per rank
    30, 25, 20, 18, 12, 9, 6, 3,       # step 1: 123 tokens, mixed
    30, 28, 31, 27, 29, 26, 32, 25,    # step 2: 228 tokens, one sample per micro-batch
    7, 33, 2, 15, 28, 11, 5, 24,       # step 3 (only used by the resume check)
)


def make_sample(sample_id: int) -> dict[str, torch.Tensor]:
    """Deterministic token sequence for ``sample_id`` (length ``LENGTHS[sample_id]``)."""
    gen = torch.Generator().manual_seed(1000 + sample_id)
    seq = torch.randint(1, VOCAB, (LENGTHS[sample_id] + 1,), generator=gen)
    return {"tokens": seq[:-1], "labels": seq[1:]}


STAND_IN_SPEC = ("megatron_dpsched.testing.cpu_attention", "gpt_layer_spec")
"""The test-only layer spec: packed / context-parallel core attention and sequence-parallel norms."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A parallel layout to run."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    """``--context-parallel-size``."""
    ep: int = 1
    """``--expert-model-parallel-size``."""
    sequence_parallel: bool = False
    group: int | None = None
    """``--microbatch-group-size-per-virtual-pipeline-stage``."""
    static_micro_batch_size: int | None = None
    """Static batching: this ``--micro-batch-size`` and no token cap (``None``: the token cap)."""
    collate: str = "bshd"
    """``--dp-schedule-collate-format``."""
    extra: tuple[str, ...] = ()
    """More Megatron flags (MoE, the distributed optimizer, bf16 ...)."""

    @property
    def stand_in(self) -> bool:
        """Whether the model needs the test-only spec (packed sequences, CP, sequence-parallel norms)."""
        return self.collate == "thd" or self.cp > 1 or self.sequence_parallel

    def argv(self) -> list[str]:
        """Megatron flags for this layout."""
        flags = ["--tensor-model-parallel-size", str(self.tp), "--pipeline-model-parallel-size", str(self.pp),
                 "--context-parallel-size", str(self.cp), "--expert-model-parallel-size", str(self.ep),
                 "--dp-schedule-collate-format", self.collate]
        if self.static_micro_batch_size is not None:
            flags += ["--micro-batch-size", str(self.static_micro_batch_size)]
        if self.vpp > 1:
            per_stage = NUM_LAYERS // (self.pp * self.vpp)
            flags += ["--num-layers-per-virtual-pipeline-stage", str(per_stage)]
        if self.group is not None:
            flags += ["--microbatch-group-size-per-virtual-pipeline-stage", str(self.group)]
        if self.sequence_parallel:
            flags.append("--sequence-parallel")
        if self.stand_in:
            flags += ["--spec", *STAND_IN_SPEC]
        return [*flags, *self.extra]


def base_argv(*, train_iters: int = TRAIN_ITERS, extra: Sequence[str] = (), token_cap: bool = True) -> list[str]:
    """Tiny fp32 GPT, SGD, no dropout, dp-schedule with a token cap (or static batching)."""
    return [
        "--num-layers", str(NUM_LAYERS), "--hidden-size", "16", "--num-attention-heads", "2",
        "--ffn-hidden-size", "32", "--seq-length", "64", "--max-position-embeddings", "64",
        "--micro-batch-size", "1", "--global-batch-size", str(GLOBAL_BATCH),
        "--train-iters", str(train_iters), "--lr", str(LR), "--min-lr", str(LR),
        "--lr-decay-style", "constant", "--optimizer", "sgd", "--sgd-momentum", "0.0",
        "--weight-decay", "0.0", "--clip-grad", "0.0",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--position-embedding-type", "learned_absolute", "--untie-embeddings-and-output-weights",
        "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
        "--use-cpu-initialization", "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(VOCAB), "--log-interval", "1000", "--eval-iters", "0", "--seed", "1234",
        "--dp-schedule", *(["--dp-schedule-max-tokens-per-gpu", str(MAX_TOKENS)] if token_cap else []),
        "--dp-schedule-verify", "strict",
        *extra,
    ]


def parse_megatron_args(argv: Sequence[str]) -> Any:
    """Megatron's own ``parse_args`` + ``validate_args`` + ``validate_dp_schedule_args``."""
    from megatron.training.arguments import parse_args, validate_args

    from megatron_dpsched.megatron.arguments import add_dp_schedule_args
    from megatron_dpsched.megatron.checks import validate_dp_schedule_args

    saved = sys.argv
    sys.argv = ["pretrain", *argv]
    try:
        args = parse_args(extra_args_provider=add_dp_schedule_args)
    finally:
        sys.argv = saved
    validate_args(args)
    validate_dp_schedule_args(args)
    args.padded_vocab_size = VOCAB
    return args


def initialize(args: Any) -> None:
    """Set Megatron's globals and model-parallel groups on the already-initialized gloo group."""
    from megatron_dpsched.testing import cpu_shim

    cpu_shim.initialize_megatron_on_cpu(args)


def teardown() -> None:
    """Undo :func:`initialize` so another scenario can run in the same process."""
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from megatron.core.rerun_state_machine import destroy_rerun_state_machine
    from megatron.training.global_vars import destroy_global_vars

    parallel_state.destroy_model_parallel()
    destroy_num_microbatches_calculator()
    destroy_global_vars()
    destroy_rerun_state_machine()


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None,
                   config: Any = None, pg_collection: Any = None) -> Any:
    """Tiny GPT: the ``--spec`` layer spec if given, else Megatron's local one (MoE from the args)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.training.arguments import core_transformer_config_from_args
    from megatron.training.global_vars import get_args

    from megatron_dpsched.megatron.spec import import_layer_spec

    args = get_args()
    config = config or core_transformer_config_from_args(args)
    if args.spec:
        spec = import_layer_spec(args.spec, config=config, vp_stage=vp_stage)
    else:
        spec = get_gpt_layer_local_spec(num_experts=args.num_experts)
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
        post_process=post_process, share_embeddings_and_output_weights=False,
        position_embedding_type=args.position_embedding_type, vp_stage=vp_stage, pg_collection=pg_collection,
        mtp_block_spec=_mtp_block_spec(args, config, spec, vp_stage),
    )


def _mtp_block_spec(args: Any, config: Any, spec: Any, vp_stage: int | None) -> Any:
    """Megatron's local multi-token prediction block spec with ``--mtp-num-layers``, else ``None``."""
    if args.mtp_num_layers is None:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    return get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False, vp_stage=vp_stage)


def build_model_and_optimizer() -> tuple[list[Any], Any, Any]:
    """Megatron's real ``setup_model_and_optimizer``, then a layout-independent initialisation."""
    from megatron_dpsched.megatron.releases import compat_0_19_setup_model_and_optimizer

    model, optimizer, scheduler = compat_0_19_setup_model_and_optimizer(model_provider)
    with torch.no_grad():
        for name, param in global_named_parameters(model).items():
            param.copy_(local_shard(deterministic_value(name, full_shape(param)), param))
    if hasattr(optimizer, "reload_model_params"):
        optimizer.reload_model_params()  # main (fp32 / sharded) copies follow the new weights
    return model, optimizer, scheduler


def deterministic_value(name: str, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """Initial value of the parameter called ``name`` in every layout (norm weights near 1)."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    value = torch.randn(tuple(shape), generator=gen) * 0.2
    return value + 1.0 if "norm" in name and name.endswith("weight") else value


def _tensor_parallel_group(param: torch.nn.Parameter) -> Any:
    """The group a tensor-parallel parameter is split over (expert TP for experts), else ``None``."""
    from megatron.core import parallel_state

    if not getattr(param, "tensor_model_parallel", False):
        return None
    assert getattr(param, "partition_stride", 1) == 1, "strided tensor-parallel splits are not supported"
    if getattr(param, "allreduce", True):
        return parallel_state.get_tensor_model_parallel_group()
    return parallel_state.get_expert_tensor_parallel_group()


def full_shape(param: torch.nn.Parameter) -> tuple[int, ...]:
    """The parameter's shape without tensor parallelism."""
    shape = list(param.shape)
    group = _tensor_parallel_group(param)
    if group is not None:
        shape[param.partition_dim] *= group.size()
    return tuple(shape)


def local_shard(value: torch.Tensor, param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's part of the unsplit ``value`` of ``param``."""
    group = _tensor_parallel_group(param)
    if group is None:
        return value
    return value.chunk(group.size(), dim=param.partition_dim)[group.rank()]


def gather_full(tensor: torch.Tensor, param: torch.nn.Parameter) -> torch.Tensor:
    """The unsplit tensor (a parameter's value or gradient) from every tensor-parallel rank's part."""
    group = _tensor_parallel_group(param)
    if group is None or group.size() == 1:
        return tensor.detach().clone()
    parts = [torch.empty_like(tensor) for _ in range(group.size())]
    torch.distributed.all_gather(parts, tensor.detach().contiguous(), group=group)
    return torch.cat(parts, dim=param.partition_dim)


def global_named_parameters(model: Sequence[Any]) -> dict[str, torch.nn.Parameter]:
    """Parameters keyed by a layout-independent name (global decoder layer and expert numbers)."""
    from megatron.core.utils import unwrap_model

    named = {}
    for chunk in model:
        core = unwrap_model(chunk)
        layers = {f"decoder.layers.{i}.": f"decoder.layers.{layer.layer_number - 1}."
                  for i, layer in enumerate(core.decoder.layers)}
        for name, param in core.named_parameters():
            for local, glob in layers.items():
                if name.startswith(local):
                    name = glob + name[len(local):]
                    break
            named[global_expert_name(name)] = param
    return named


_LOCAL_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def global_expert_name(name: str) -> str:
    """Expert parallelism: local expert ``j`` on expert-parallel rank ``r`` is global expert ``r * E_local + j``."""
    match = _LOCAL_EXPERT.search(name)
    if match is None:
        return name
    from megatron.core import parallel_state
    from megatron.training.global_vars import get_args

    ep = parallel_state.get_expert_model_parallel_world_size()
    number = parallel_state.get_expert_model_parallel_rank() * (get_args().num_experts // ep) + int(match[1])
    return f"{name[:match.start()]}.local_experts.{number}.{name[match.end():]}"


def env_for_rank(rank: int, world_size: int) -> None:
    """The environment Megatron's ``parse_args`` reads."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")


HOOK_MODE_ENV = "DPSCHED_HOOK_MODE"
"""``monkey`` (default): ``patch.enable()``; ``source``: the source-patched ``training.py`` calls the hooks."""
PATCHED_MEGATRON_ENV = "DPSCHED_PATCHED_MEGATRON"
"""In source mode: the directory whose ``megatron/training/training.py`` must be the one imported."""


def hook_mode() -> str:
    """How this process gets the dp-schedule hooks into Megatron (from ``DPSCHED_HOOK_MODE``)."""
    mode = os.environ.get(HOOK_MODE_ENV, "monkey")
    if mode not in ("monkey", "source"):
        raise ValueError(f"{HOOK_MODE_ENV}={mode!r}; expected 'monkey' or 'source'")
    return mode


def install_hooks() -> None:
    """Monkey mode: ``patch.enable()``. Source mode: check that the patched ``training.py`` is imported."""
    import megatron.training.training as training

    from megatron_dpsched.megatron import patch

    if hook_mode() == "monkey":
        patch.enable()
        assert patch.is_enabled(), f"{training.__file__} is source-patched; monkey mode cannot test enable()"
        return
    if not patch.is_source_patched(training):
        raise RuntimeError(f"source hook mode, but {training.__file__} does not carry the source patch")
    expected = os.environ.get(PATCHED_MEGATRON_ENV)
    if expected and not Path(training.__file__).resolve().is_relative_to(Path(expected).resolve()):
        raise RuntimeError(f"source hook mode imported {training.__file__}, not the copy under {expected}")


def remove_hooks() -> None:
    """Undo :func:`install_hooks` (and forget any open scheduled step)."""
    from megatron_dpsched.megatron import hooks, patch

    patch.disable()
    hooks.on_update_num_microbatches()


def training_file() -> str:
    """The ``megatron/training/training.py`` this process imported."""
    import megatron.training.training as training

    return str(Path(training.__file__).resolve())
