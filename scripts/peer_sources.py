"""The peers' real planners, imported from a checkout given on the command line (never copied here).

Each ``*_planner(SRC)`` loads the peer's own module files from the checkout ``SRC`` with :mod:`importlib`
(only the files named below; the packages' ``__init__`` files, which import ray, vLLM, transformers and
the like, are not run) and returns a :class:`PeerPlanner`: ``plan(lengths, config=...)`` gives one step's
micro-batches per DP rank as positions into ``lengths``, exactly as the peer's code made them, or raises
:class:`PeerRefused` where the peer's code raises (a sample over the cap, fewer samples than
micro-batches...).

Stand-ins (:data:`STAND_INS` lists them) replace imports that are not installed here or that need a running
job; none of them decides a plan: loggers, the tensor-gather helper ``tu.index_select_tensor_dict``,
Megatron's ``mpu`` rank/size getters (set to the rank being planned), a tokenizer (only its pad id is
read, for empty bins), type names, and a ``batch``/trainer object carrying the lengths into verl's
``_balance_batch``. What the bench does around the peer's code, also listed there: verl's all-reduce MAX
of the micro-batch count over DP (each rank's count from its own ``rearrange_micro_batches``, then every
rank re-run with ``min_num_micro_batch`` = the MAX), verl's equal-chunk dispatch of the reordered batch,
and empty micro-batches appended where a peer's count is not legal for Megatron's schedule
(``PipelineLayout.align``), as :mod:`megatron_dpsched.baselines` does.

The workload is verl's ``c(L) = 24576 L + L^2`` everywhere: verl computes it itself; slime's
``calculate_fwd_flops`` is run with a model shape (:data:`SLIME_WORKLOAD_SHAPE`) for which it returns
exactly ``2 c(L)``, so its Karmarkar-Karp splits on the same weights.

Megatron's own schedulers take a step's ``(global id, padded length)`` pairs, ordered by DP rank then local
index as Megatron gathers them (rank ``r`` holds samples ``r, r + DP, ...``: one sample per micro-batch of
Megatron's sampler), and return per micro-batch (or group), per DP x CP rank, the ids packed there:
``DpBalancedScheduler`` (Megatron-LM main, from the checkout) packs each DP rank's ids into one micro-batch;
hybrid CP's ``BalancedCPScheduler`` (the installed megatron-core) runs each id as a micro-batch of its own.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import math
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from megatron_dpsched.baselines.megatron_schedulers import (  # noqa: F401 - megatron_order, classes_from_file: API
    HYBRID_CP_PIPELINE_REFUSAL,
    SchedulerRefused,
    classes_from_file,
    dp_balanced_step_plan,
    hybrid_cp_step_plan,
    megatron_order,
)
from megatron_dpsched.baselines.partition import pad_to_legal
from megatron_dpsched.core.config import RankPlan, ScheduleConfig

STAND_INS = {
    "slime": "nothing (dp_schedule.py, seqlen_balancing.py and flops_utils.py run as they are)",
    "verl": "verl.protocol.DataProto (a type name), verl.utils.tensordict_utils (index_select_tensor_dict: the "
            "tensor gather, not the split), verl.utils.device (read only under torch.distributed); a trainer "
            "(_get_dp_size -> DP) and a batch (attention_mask summing to the lengths, reorder) for "
            "RayPPOTrainer._balance_batch, which runs from ray_trainer.py's source; the all-reduce MAX of the "
            "count and the equal-chunk dispatch are done by the bench",
    "nemo_rl": "nemo_rl.data.multimodal_utils (type names for multimodal fields; none here); "
               "BatchedDataDict.shard_by_batch_size and the MFFD packer run as they are",
    "megatron_lm": "megatron.core.utils.log_single_rank (a logger; round_up_to_nearest_multiple is the "
                      "checkout's own), megatron.core.mpu (DP rank/size = the rank planned), the tokenizer (its pad "
                      "id for empty bins), get_nvtx_range, PackedSeqParams and the num-microbatches calculator "
                      "(names only); DpBalancedScheduler: nothing (BasePackingScheduler and DpBalancedScheduler are "
                      "compiled from data_schedule.py's source; get_groups_and_subsamples reads nothing else)",
    "hybrid_cp": "the DP x CP process group (only its size() is read); Megatron's refusal of hybrid CP with PP > 1 "
                 "(arguments.py) is raised by the bench, as is a plan that runs a sample on several ranks with CP > 1 "
                 "(a sample over the cap, or fewer samples than ranks), which the bench cannot time",
}
"""Per peer: what is not the peer's own code (see the module docstring)."""

SLIME_WORKLOAD_SHAPE = dict(
    hidden_size=1, num_attention_heads=1, num_query_groups=0, kv_channels=1, ffn_hidden_size=0,
    vocab_size=24574, num_layers=1, num_experts=None,
)
"""Model shape for slime's ``calculate_fwd_flops``: q 2L + output 2L + LM head 49148L + attention 2L^2 =
``2 (24576 L + L^2)``."""

MEGATRON_LM_MAX_SEQUENCES_PER_BIN = 50
"""``--rl-sequence-packing-max-sequences-per-bin``'s default (megatron/training/arguments.py)."""

NEMO_RL_ALGORITHM = "modified_first_fit_decreasing"
"""NeMo-RL's ``sequence_packing.algorithm`` in its example configs."""


class PeerRefused(Exception):
    """The peer's own code raised on this input (it would stop the job)."""


@dataclass(frozen=True)
class PeerPlanner:
    """A peer's real planner for one step: ``plan(lengths, config=...)`` -> micro-batches per rank."""

    name: str
    plan_step: Callable[[list[int], ScheduleConfig], list[RankPlan]]
    cap_breaking: bool = False
    """Whether the peer may put more than the cap in a micro-batch of several samples."""
    pipeline_refusal: str | None = None
    """What Megatron raises for this peer with PP > 1 (None: it runs with any PP); such steps are refused."""

    def raw_plan(self, lengths: Sequence[int], *, config: ScheduleConfig) -> list[RankPlan]:
        """The peer's micro-batches as its code made them (counts as the peer leaves them); every sample once."""
        if self.pipeline_refusal is not None and config.pp_size > 1:
            raise PeerRefused(self.pipeline_refusal)
        try:
            ranks = self.plan_step([int(n) for n in lengths], config)
        except SchedulerRefused as exc:  # Megatron's schedulers: already their code's first line
            raise PeerRefused(str(exc)) from exc
        except (AssertionError, ValueError, RuntimeError, IndexError) as exc:
            message = str(exc).splitlines()[0][:160] if str(exc) else ""
            raise PeerRefused(f"{type(exc).__name__}: {message}") from exc
        placed = sorted(i for rank in ranks for mb in rank for i in mb)
        assert placed == list(range(len(lengths))), f"{self.name}: the plan does not place every sample once"
        return [[list(mb) for mb in rank] for rank in ranks]

    def plan(self, lengths: Sequence[int], *, config: ScheduleConfig) -> list[RankPlan]:
        """:meth:`raw_plan` with empty micro-batches appended up to Megatron's legal count for the layout."""
        return pad_to_legal(self.raw_plan(lengths, config=config), config.layout)


# --- loading files out of a checkout --------------------------------------------------------------------------


def _package(name: str, **attributes: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package: submodules resolve through sys.modules
    module.__dict__.update(attributes)
    return module


def _module(name: str, **attributes: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


@contextmanager
def stand_ins(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """Put ``modules`` in ``sys.modules`` while a peer file is imported; restore what was there after."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def load_file(path: Path, name: str, modules: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    """Execute one source file of a checkout as module ``name`` (its imports resolved against ``modules``)."""
    if not path.is_file():
        raise ValueError(f"{path} not found: is the path a checkout of the peer?")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    with stand_ins(modules or {}):
        spec.loader.exec_module(module)
    return module


def function_from_file(path: Path, qualname: str, namespace: dict[str, object]) -> Callable:
    """A function (``"f"``) or method (``"Class.f"``) compiled from the checkout's source, globals ``namespace``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    *owners, name = qualname.split(".")
    body = tree.body
    for owner in owners:
        body = next(node for node in body if isinstance(node, ast.ClassDef) and node.name == owner).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
    exec(code, namespace)  # noqa: S102 - the peer's own function, read from the checkout the user named
    return namespace[name]


def _checkout(source: str | Path, marker: str) -> Path:
    root = Path(source).expanduser().resolve()
    if not (root / marker).is_file():
        raise ValueError(f"{root} is not a checkout with {marker}")
    return root


# --- slime --------------------------------------------------------------------------------------------------------


def slime_planner(source: str | Path, *, balance_data: bool, balance_by_flops: bool = False) -> PeerPlanner:
    """slime's ``build_dp_schedule`` (``slime/utils/dp_schedule.py``), dynamic batch size, one step per call."""
    root = _checkout(source, "slime/utils/dp_schedule.py")
    utils = root / "slime" / "utils"
    flops = load_file(utils / "flops_utils.py", "_peer_slime_flops_utils")
    balancing = load_file(utils / "seqlen_balancing.py", "_peer_slime_seqlen_balancing")
    modules = {"slime": _package("slime"), "slime.utils": _package("slime.utils"),
               "slime.utils.flops_utils": flops, "slime.utils.seqlen_balancing": balancing}
    dp_schedule = load_file(utils / "dp_schedule.py", "_peer_slime_dp_schedule", modules)

    def plan_step(lengths: list[int], config: ScheduleConfig) -> list[RankPlan]:
        args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=config.max_tokens_per_gpu,
                               micro_batch_size=None, balance_data=balance_data, balance_by_flops=balance_by_flops,
                               **SLIME_WORKLOAD_SHAPE)
        layout = config.layout
        parallel = {"dp_size": config.dp_size, "cp_size": config.cp_size, "vpp_size": layout.vpp_size,
                    "microbatch_group_size_per_vp_stage": layout.group_size}
        partitions, micro_batch_indices, _, _ = dp_schedule.build_dp_schedule(
            args, parallel, lengths, global_batch_size=len(lengths), rollout_indices=list(range(len(lengths))))
        return [[[partitions[r][k] for k in mb] for mb in micro_batch_indices[r]] for r in range(config.dp_size)]

    name = "slime_flops" if balance_by_flops else ("slime_kk" if balance_data else "slime_strided")
    return PeerPlanner(name=name, plan_step=plan_step, cap_breaking=balance_by_flops)


# --- verl ---------------------------------------------------------------------------------------------------------


class _VerlBatch:
    """What ``_balance_batch`` reads of a ``DataProto``: per-sample token counts, and the reorder it asks for."""

    def __init__(self, torch: types.ModuleType, lengths: list[int]) -> None:
        self.batch = {"attention_mask": torch.tensor(lengths, dtype=torch.int64).view(-1, 1)}
        self.non_tensor_batch: dict = {}
        self.order: list[int] = []

    def reorder(self, index: object) -> None:
        self.order = [int(i) for i in index]


def verl_planner(source: str | Path) -> PeerPlanner:
    """verl's driver ``RayPPOTrainer._balance_batch`` then, per rank, ``rearrange_micro_batches`` (Megatron actor)."""
    import torch

    root = _checkout(source, "verl/utils/seqlen_balancing.py")
    modules = {"verl": _package("verl"), "verl.utils": _package("verl.utils"),
               "verl.protocol": _module("verl.protocol", DataProto=object),
               "verl.utils.tensordict_utils": _module("verl.utils.tensordict_utils",
                                                      index_select_tensor_dict=lambda batch, index: index),
               "verl.utils.device": _module("verl.utils.device", get_device_name=lambda: "cpu")}
    balancing = load_file(root / "verl" / "utils" / "seqlen_balancing.py", "_peer_verl_seqlen_balancing", modules)
    namespace = {"torch": torch, "DataProto": object, "calculate_workload": balancing.calculate_workload,
                 "get_seqlen_balanced_partitions": balancing.get_seqlen_balanced_partitions,
                 "log_seqlen_unbalance": balancing.log_seqlen_unbalance}
    balance_batch = function_from_file(root / "verl" / "trainer" / "ppo" / "ray_trainer.py",
                                       "RayPPOTrainer._balance_batch", namespace)

    def rank_batch(lengths: list[int]) -> dict:
        """A rank's samples as verl's no-padding (nested, jagged) ``input_ids``: only their lengths are read."""
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        values = torch.zeros(int(offsets[-1]), dtype=torch.uint8)
        return {"input_ids": torch.nested.nested_tensor_from_jagged(values, offsets)}

    def rank_micro_batches(batch: dict, config: ScheduleConfig, minimum: int | None) -> list[list[int]]:
        group = config.layout.group_size if config.layout.interleaved else None
        _, parts = balancing.rearrange_micro_batches(batch, max_token_len=config.token_cap,
                                                     num_batches_divided_by=group, min_num_micro_batch=minimum)
        return parts

    def plan_step(lengths: list[int], config: ScheduleConfig) -> list[RankPlan]:
        dp = config.dp_size
        trainer = SimpleNamespace(_get_dp_size=lambda worker_group, role: dp, actor_rollout_wg=None)
        batch = _VerlBatch(torch, lengths)
        balance_batch(trainer, batch, {})
        per_rank = len(lengths) // dp  # the dispatch's equal chunks (verl asserts len % dp == 0 before this)
        if per_rank * dp != len(lengths):
            raise ValueError(f"verl's dispatch splits {len(lengths)} samples into {dp} equal chunks")
        chunks = [batch.order[r * per_rank:(r + 1) * per_rank] for r in range(dp)]
        batches = [rank_batch([lengths[i] for i in chunk]) for chunk in chunks]
        count = max(len(rank_micro_batches(b, config, None)) for b in batches)  # the all-reduce MAX
        return [[[chunk[p] for p in part] for part in rank_micro_batches(b, config, count)]
                for chunk, b in zip(chunks, batches)]

    return PeerPlanner(name="verl", plan_step=plan_step, cap_breaking=True)


# --- NeMo-RL ------------------------------------------------------------------------------------------------------


def nemo_rl_planner(source: str | Path) -> PeerPlanner:
    """NeMo-RL's ``BatchedDataDict.shard_by_batch_size`` with sequence packing (MFFD), one global batch per step."""
    import torch

    root = _checkout(source, "nemo_rl/data/packing/algorithms.py")
    algorithms = load_file(root / "nemo_rl" / "data" / "packing" / "algorithms.py", "_peer_nemo_rl_packing")
    collectives = load_file(root / "nemo_rl" / "distributed" / "collectives.py", "_peer_nemo_rl_collectives")
    modules = {"nemo_rl": _package("nemo_rl"), "nemo_rl.data": _package("nemo_rl.data"),
               "nemo_rl.distributed": _package("nemo_rl.distributed"),
               "nemo_rl.data.packing": _package("nemo_rl.data.packing", get_packer=algorithms.get_packer),
               "nemo_rl.data.multimodal_utils": _module(
                   "nemo_rl.data.multimodal_utils", MULTIMODAL_CONTENT_TYPES=(), NATIVE_MULTIMODAL_KEYS=(),
                   PackedTensor=type("PackedTensor", (), {})),
               "nemo_rl.distributed.collectives": collectives}
    batched = load_file(root / "nemo_rl" / "distributed" / "batched_data_dict.py", "_peer_nemo_rl_batched", modules)

    def plan_step(lengths: list[int], config: ScheduleConfig) -> list[RankPlan]:
        data = batched.BatchedDataDict({"input_lengths": torch.tensor(lengths), "sample": torch.arange(len(lengths))})
        shards, _ = data.shard_by_batch_size(
            config.dp_size, batch_size=len(lengths), allow_uneven_shards=len(lengths) % config.dp_size != 0,
            sequence_packing_args={"max_tokens_per_microbatch": config.token_cap, "input_key": "sample",
                                   "input_lengths_key": "input_lengths", "algorithm": NEMO_RL_ALGORITHM,
                                   "sequence_length_pad_multiple": 1})
        ranks = []
        for shard in shards:
            samples = [int(i) for i in shard["sample"]] if len(shard.micro_batch_indices[0]) else []
            ranks.append([samples[start:end] for start, end in shard.micro_batch_indices[0]])
        return ranks

    return PeerPlanner(name="nemo_rl", plan_step=plan_step)


# --- Megatron-LM --------------------------------------------------------------------------------------------------


def megatron_lm_planner(source: str | Path) -> PeerPlanner:
    """Megatron-LM RL's ``SequencePacker.pack_sequences`` then ``distribute_packed_bins`` (fifo) per DP rank."""
    import torch

    root = _checkout(source, "megatron/rl/sequence_packing_utils.py")
    round_up = function_from_file(root / "megatron" / "core" / "utils.py", "round_up_to_nearest_multiple",
                                  {"math": math})
    mpu = _module("megatron.core.mpu", get_data_parallel_rank=lambda: 0, get_data_parallel_world_size=lambda: 1)
    tokenizer = SimpleNamespace(pad=0)
    modules = {
        "megatron": _package("megatron"), "megatron.core": _package("megatron.core", mpu=mpu),
        "megatron.core.mpu": mpu, "megatron.training": _package("megatron.training"),
        "megatron.core.utils": _module("megatron.core.utils", log_single_rank=lambda *args, **kwargs: None,
                                       round_up_to_nearest_multiple=round_up),
        "megatron.training.global_vars": _module("megatron.training.global_vars", get_tokenizer=lambda: tokenizer),
        "megatron.training.utils": _module("megatron.training.utils", get_nvtx_range=lambda: None),
        "megatron.core.packed_seq_params": _module("megatron.core.packed_seq_params",
                                                   PackedSeqParams=type("PackedSeqParams", (), {})),
        "megatron.core.num_microbatches_calculator": _module(
            "megatron.core.num_microbatches_calculator", get_num_microbatches=None,
            reconfigure_num_microbatches_calculator=None),
    }
    packing = load_file(root / "megatron" / "rl" / "sequence_packing_utils.py", "_peer_megatron_lm_packing", modules)

    def plan_step(lengths: list[int], config: ScheduleConfig) -> list[RankPlan]:
        trajs = (torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.uint8)
        packer = packing.SequencePacker(bin_size=config.token_cap, pad_token=tokenizer.pad,
                                        max_sequences_per_bin=MEGATRON_LM_MAX_SEQUENCES_PER_BIN)
        packed, positions, loss_mask, info = packer.pack_sequences(trajs)
        ranks = []
        for rank in range(config.dp_size):
            mpu.get_data_parallel_rank = lambda rank=rank: rank
            mpu.get_data_parallel_world_size = lambda: config.dp_size
            *_, mine = packing.distribute_packed_bins(packed, positions, loss_mask, info)
            ranks.append([list(b) for b in mine.bin_seq_indices])
        return ranks

    return PeerPlanner(name="megatron_lm_rl", plan_step=plan_step)


# --- Megatron's own schedulers -----------------------------------------------------------------------------------


def dp_balanced_planner(source: str | Path) -> PeerPlanner:
    """Megatron-LM main's ``DpBalancedScheduler`` from the checkout (:func:`dp_balanced_step_plan`)."""
    return PeerPlanner(name="megatron_dp_balanced", plan_step=dp_balanced_step_plan(source))


def hybrid_cp_planner() -> PeerPlanner:
    """Hybrid CP's ``BalancedCPScheduler`` from the installed megatron-core (:func:`hybrid_cp_step_plan`; the
    barrier between groups is not simulated)."""
    return PeerPlanner(name="megatron_hybrid_cp", plan_step=hybrid_cp_step_plan(),
                       pipeline_refusal=HYBRID_CP_PIPELINE_REFUSAL)


REWRITES = {"slime_strided": "slime_strided", "slime_kk": "slime_kk", "verl": "verl", "nemo_rl": "nemo_rl",
            "megatron_lm_rl": "megatron_lm_rl"}
"""Real planner -> its rewrite in :mod:`megatron_dpsched.baselines` (``slime_flops`` has none)."""


def load_peers(sources: dict[str, str | Path | None], *, hybrid_cp: bool = False) -> list[PeerPlanner]:
    """The real planners of the peers whose checkout is given (``sources`` maps slime/verl/nemo_rl/megatron_lm;
    Megatron-LM's gives its RL packer and ``DpBalancedScheduler``), and with ``hybrid_cp`` the installed
    megatron-core's ``BalancedCPScheduler``."""
    out: list[PeerPlanner] = []
    if sources.get("slime"):
        out += [slime_planner(sources["slime"], balance_data=False), slime_planner(sources["slime"], balance_data=True),
                slime_planner(sources["slime"], balance_data=True, balance_by_flops=True)]
    if sources.get("verl"):
        out.append(verl_planner(sources["verl"]))
    if sources.get("nemo_rl"):
        out.append(nemo_rl_planner(sources["nemo_rl"]))
    if sources.get("megatron_lm"):
        out += [megatron_lm_planner(sources["megatron_lm"]), dp_balanced_planner(sources["megatron_lm"])]
    if hybrid_cp:
        out.append(hybrid_cp_planner())
    return out
