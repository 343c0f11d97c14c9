#!/usr/bin/env python
"""Pretrain a Megatron GPT on a variable-length JSONL corpus, with or without ``--dp-schedule``.

Launch with ``torchrun`` like Megatron's own GPT entry point (see ``examples/``)::

    torchrun --nproc-per-node 8 scripts/pretrain_gpt_dpsched.py <Megatron flags> \\
        --data-path corpus.jsonl --tokenizer-type NullTokenizer --vocab-size V \\
        --dp-schedule --dp-schedule-max-tokens-per-gpu 16384 --micro-batch-size 1

Data, as Megatron reads its flags: ``--data-path P`` or a blend ``--data-path W1 P1 W2 P2 ...``
cut into train/valid/test by ``--split`` (Megatron's default 969,30,1; ``--split 100,0,0`` trains on
all of it), or ``--train-data-path`` / ``--valid-data-path`` / ``--test-data-path``, each a prefix or a
blend. A prefix is a ``.jsonl`` file (one ``{"tokens": [id, ...]}`` per line) or a Megatron indexed
dataset (``PREFIX.bin``/``PREFIX.idx``, one sample per stored sequence; lengths come from the index).
A sequence of ``L`` ids is a sample of ``L - 1`` positions; every sample must fit ``--seq-length``.
``--dataloader-type single`` reads one pass in order, ``cyclic`` a seeded permutation per epoch
(``megatron_dpsched.data.sampling``).

``--sft`` reads Megatron's SFT conversation JSONL instead (``{"messages": [...]}`` per line), one
conversation per sample, tokenized and masked by Megatron's own tokenizer (``--tokenizer-type
SFTTokenizer --tokenizer-model DIR --sft-tokenizer-prompt-format FORMAT``); the planner packs, nothing
is pre-packed. This entry point handles ``--sft`` itself and turns Megatron's ``args.sft`` off (its
``SFTDataset`` packing is not used, and its per-micro-batch validation average would depend on the plan),
so validation losses are per-token like training's. JSONL rows may carry ``"loss_mask"``, or be
``{"input_ids", "labels"}`` with -100 for untrained tokens; indexed datasets may have a sidecar mask
``PREFIX_mask.bin``/``.idx``. JSONL files are read by byte offset through a length index cached beside
them (or in ``$DPSCHED_CACHE_DIR``).

* With ``--dp-schedule`` each step's ``--global-batch-size`` samples are planned globally
  (token cap, micro-batch count per step, DP balance) by ``ScheduledDatasetLoader``, which
  Megatron gets as an external data loader (the feed implements ``--dataloader-type``; one
  iterator per virtual pipeline chunk, all from one feed).
* Without it: Megatron's ordinary path, samples right-padded to ``--seq-length``,
  ``MegatronPretrainingSampler``, ``--micro-batch-size`` fixed micro-batches.

Both use the same per-token loss (``calculate_per_token_loss`` is always on), so on the same
data and global batch size the two runs train the same maths.

Runs on megatron-core 0.17.1, 0.18.2, 0.19.2 and Megatron-LM main: where they differ, it calls Megatron
through ``megatron_dpsched.megatron.releases`` (one adapter per difference).

GPU runs go through Megatron's plain ``pretrain()`` (megatron-core 0.18 and newer: 0.17's parses the
command line again, and is refused). ``--cpu-dry-run`` is a CPU-only
dry run for demos and tests (``scripts/demo.py``): it refuses to start where CUDA is
available, installs ``megatron_dpsched.testing.cpu_shim`` (maps CUDA placement to CPU),
initializes Megatron with ``initialize_megatron_on_cpu`` on a gloo group, then runs
Megatron's real ``setup_model_and_optimizer``, data-iterator builder and ``train()``.
``--step-stats-dir DIR`` writes per-step, per-rank statistics (``megatron_dpsched.megatron.step_recorder``).
``--quiet`` hides Megatron's argument dump and per-step lines (``megatron_dpsched.megatron.quiet``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import linecache
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_dpsched.data import (  # noqa: E402
    PaddedSampleDataset,
    open_corpus,
)
from megatron_dpsched.data.compose import split_and_blend  # noqa: E402
from megatron_dpsched.data.sampling import parse_blend, parse_split  # noqa: E402
from megatron_dpsched.megatron import (  # noqa: E402
    ScheduledForwardStep,
    add_dp_schedule_args,
    quiet,
    scheduled_datasets_provider,
    setup_dp_schedule,
)
from megatron_dpsched.megatron.checks import (  # noqa: E402
    check_before_validate_args,
    check_training_data,
    exit_on_bad_flags,
)
from megatron_dpsched.megatron.failures import debug_requested, exit_with_line, one_line_errors  # noqa: E402
from megatron_dpsched.megatron.step_recorder import StepRecorder, record_steps, write_plan  # noqa: E402
from megatron_dpsched.runtime.ranks import print_rank_0  # noqa: E402

DRY_RUN_FLAG = "--cpu-dry-run"
_state: dict[str, Any] = {}
"""Process-wide objects: the corpus and the recorder."""


# --- arguments --------------------------------------------------------------------------------


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The plugin's ``--dp-schedule*`` flags (a bad flag of Megatron's is one line per job too) plus this entry
    point's own."""
    add_dp_schedule_args(parser)
    group = parser.add_argument_group(title="pretrain_gpt_dpsched")
    group.add_argument(DRY_RUN_FLAG, action="store_true",
                       help="CPU-only dry run (demo/tests): CUDA shim + gloo + Megatron's real train(). "
                            "Refused where CUDA is available.")
    group.add_argument("--step-stats-dir", default=None,
                       help="Write per-step statistics to DIR/rank<r>.jsonl.")
    group.add_argument(quiet.QUIET_FLAG, action="store_true",
                       help="Quiet mode: hide Megatron's argument dump and per-step lines, keep the plugin's lines, "
                            "warnings, errors, checkpoint saves and loads and the last step's line "
                            "(megatron_dpsched.megatron.quiet).")
    return parser


DATA_FLAGS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def adjust_args(args: argparse.Namespace) -> None:
    """Check the data flags and set what this entry point needs (after Megatron's validation)."""
    args.sft_conversations = bool(args.sft)
    args.sft = False  # conversations are read here, one per sample; Megatron's SFT path stays off
    given = [name for name in DATA_FLAGS if getattr(args, name, None)]
    if not given:
        raise ValueError("give --data-path (with --split) or --train-data-path [--valid-data-path] [--test-data-path]")
    for name in given:
        flag = "--" + name.replace("_", "-")
        for prefix in parse_blend(getattr(args, name), flag=flag)[0]:
            _check_corpus_path(flag, prefix, conversations=args.sft_conversations)
    if args.data_path:
        parse_split(args.split)  # Megatron sets 969,30,1 when --split is not given
    check_training_data(args)
    if args.sft_conversations and args.tokenizer_type != "SFTTokenizer":
        raise ValueError(f"--sft needs --tokenizer-type SFTTokenizer (Megatron's tokenizer that masks prompts as "
                         f"--sft-tokenizer-prompt-format says) and --tokenizer-model; got {args.tokenizer_type}")
    args.calculate_per_token_loss = True
    if args.eval_interval is None:  # no validation set is built; Megatron still divides by it
        args.eval_interval = args.train_iters or 1
    if args.eval_iters and not _has_validation_data(args):
        # no validation set: Megatron would still evaluate (its do_valid tests a list holding None)
        # and fail on the missing iterator; validation is off instead
        from megatron.training.utils import print_rank_0

        print_rank_0(f"no validation data (--valid-data-path, or a --split share): validation is off "
                     f"(--eval-iters {args.eval_iters} -> 0)")
        args.eval_iters = 0
    setup_dp_schedule(args)  # validates the --dp-schedule flags and installs the hooks
    open_corpora(args)


def open_corpora(args: argparse.Namespace) -> None:
    """Open (index and check every row or conversation of) the data files now, so that a bad row stops the run
    before the model is built."""
    corpora = _state.setdefault("corpora", {})
    for name in DATA_FLAGS:
        values = getattr(args, name, None)
        for prefix in parse_blend(values, flag="--" + name.replace("_", "-"))[0] if values else ():
            if prefix not in corpora:
                corpora[prefix] = open_data(args, prefix)
                _warn_no_loss_samples(corpora[prefix])


def _warn_no_loss_samples(dataset: Any) -> None:
    """Rank 0 (``RANK``: before Megatron initializes torch.distributed) names the samples with no loss token."""
    notice = dataset.no_loss_notice()
    if notice is not None:
        print_rank_0(notice)


def _has_validation_data(args: argparse.Namespace) -> bool:
    """``--valid-data-path``, or ``--data-path`` with a validation share in ``--split``."""
    return bool(args.valid_data_path) or bool(args.data_path and parse_split(args.split)[1] > 0)


def _check_corpus_path(flag: str, prefix: str, *, conversations: bool = False) -> None:
    """A ``.jsonl`` file or the prefix of an indexed dataset (``.bin``/``.idx``); with ``--sft`` a ``.jsonl`` file."""
    path = Path(prefix)
    if conversations and path.suffix != ".jsonl":
        raise ValueError(f"{flag} {path}: --sft reads a .jsonl file of conversations")
    if path.suffix == ".jsonl" and not path.is_file():
        raise ValueError(f"{flag} {path} does not exist")
    if path.suffix != ".jsonl" and not path.with_name(path.name + ".idx").is_file():
        raise ValueError(f"{flag} {path}: neither a .jsonl file nor the prefix of {path.name}.bin/.idx")


def parse_arguments(dry_run: bool) -> argparse.Namespace:
    """Megatron's parse + validate (+ global variables on the ``pretrain`` path), then ours."""
    from megatron.training.arguments import parse_args, validate_args

    from megatron_dpsched.megatron.releases import compat_0_18_parse_and_validate_args

    with megatron_argument_checks():
        if dry_run:
            start_cpu_dry_run()  # before validate_args, which asks the device about TP/CP settings
            args = parse_args(extra_args_provider)
            check_before_validate_args(args)  # what validate_args would assert on, as one line naming the flags
            validate_args(args)
        else:
            check_before_validate_args(parse_args(extra_args_provider))
            args = compat_0_18_parse_and_validate_args(extra_args_provider)
    adjust_args(args)
    return args


@contextlib.contextmanager
def megatron_argument_checks() -> Iterator[None]:
    """Megatron's own argument checks (``validate_args`` asserts) as one line per job, like ours, instead of a
    traceback on every rank."""
    try:
        yield
    except AssertionError as error:
        if debug_requested():
            raise
        frame = error.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        code = frame.tb_frame.f_code.co_filename if frame is not None else ""
        source = linecache.getline(code, frame.tb_lineno).strip() if frame is not None else ""
        where = f" ({'/'.join(Path(code).parts[-3:])}:{frame.tb_lineno})" if frame is not None else ""
        text = " ".join(str(error).split()) or source or "an assertion without a message"
        raise ValueError(f"Megatron's argument check refused the arguments{where}: {text}") from None


# --- model ------------------------------------------------------------------------------------


def layer_spec(args: argparse.Namespace, *, config: Any, vp_stage: int | None) -> Any:
    """``--spec MODULE NAME`` (a layer spec, or a function returning one), else the Transformer Engine
    layer spec with ``--transformer-impl transformer_engine``, else Megatron's local one."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    from megatron_dpsched.megatron.spec import import_layer_spec

    if args.spec:
        return import_layer_spec(args.spec, config=config, vp_stage=vp_stage)
    options = {"num_experts": args.num_experts, "moe_grouped_gemm": args.moe_grouped_gemm,
               "qk_layernorm": args.qk_layernorm}
    if args.transformer_impl == "transformer_engine":
        return specs.get_gpt_layer_with_transformer_engine_spec(**options)
    return specs.get_gpt_layer_local_spec(**options)


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None,
                   config: Any = None, pg_collection: Any = None) -> Any:
    """A ``GPTModel`` built from Megatron's arguments."""
    from megatron.core.models.gpt import GPTModel
    from megatron.training.arguments import core_transformer_config_from_args
    from megatron.training.global_vars import get_args

    args = get_args()
    config = config or core_transformer_config_from_args(args)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(args, config=config, vp_stage=vp_stage),
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        vp_stage=vp_stage,
        pg_collection=pg_collection,
    )


# --- data -------------------------------------------------------------------------------------


def open_data(args: argparse.Namespace, path: str) -> Any:
    """A corpus (:func:`open_corpus`) or, with ``--sft``, a conversation file read with Megatron's tokenizer."""
    if not getattr(args, "sft_conversations", False):
        return open_corpus(path, vocab_size=known_padded_vocab_size(args))  # every id checked when opened
    from megatron_dpsched.data import ConversationJsonlDataset, sft_format_from_args

    if "sft_format" not in _state:
        _state["sft_format"] = sft_format_from_args(args)
    return ConversationJsonlDataset(path, _state["sft_format"])


def known_padded_vocab_size(args: argparse.Namespace) -> int | None:
    """The padded vocabulary if known yet (``--vocab-size`` padded as Megatron pads it), else ``None``."""
    from megatron_dpsched.megatron.releases import compat_0_18_padded_vocab_size

    found = getattr(args, "padded_vocab_size", None)
    return found or (compat_0_18_padded_vocab_size(args.vocab_size, args) if args.vocab_size else None)


def corpus(prefix: str) -> Any:
    """The corpus at ``prefix``, opened once per process (its length index is built or read), its ids checked
    against the padded vocabulary (known once Megatron built its tokenizer)."""
    from megatron.training.global_vars import get_args

    corpora = _state.setdefault("corpora", {})
    if prefix not in corpora:
        corpora[prefix] = open_data(get_args(), prefix)
    if hasattr(corpora[prefix], "check_vocabulary"):
        corpora[prefix].check_vocabulary(known_padded_vocab_size(get_args()))
    return corpora[prefix]


def build_datasets(args: argparse.Namespace, num_samples: Sequence[int | None]) -> list[Any]:
    """Train, valid and test datasets of the data flags, with Megatron's semantics: ``--data-path`` is
    one prefix or a blend (``W1 P1 W2 P2 ...``) cut by ``--split``; ``--train/valid/test-data-path``
    each a prefix or a blend. A blend of one split holds the samples Megatron reads from it
    (``num_samples``); ``--dataloader-type cyclic`` lets a blend read a dataset again, ``single`` refuses."""
    repeat = getattr(args, "dp_schedule_dataloader_type", args.dataloader_type) == "cyclic"
    sizes = list(num_samples) if num_samples is not None else [None, None, None]
    if args.data_path:
        return split_and_blend(args.data_path, flag="--data-path", open_dataset=corpus,
                               split=parse_split(args.split), sizes=sizes, repeat=repeat)
    built: list[Any] = []
    for role, name in enumerate(DATA_FLAGS[1:]):
        values = getattr(args, name, None)
        flag = "--" + name.replace("_", "-")
        built.append(None if not values else split_and_blend(
            values, flag=flag, open_dataset=corpus, split=None, sizes=[sizes[role]], repeat=repeat)[0])
    return built


def datasets_provider(num_samples: Any) -> tuple[Any, Any, Any]:
    """Training, validation and test data (see :func:`build_datasets`), built once per process: the raw
    samples for ``--dp-schedule`` (their ``lengths`` drive the plan), else padded to ``--seq-length``."""
    from megatron.training.global_vars import get_args

    args = get_args()
    if "datasets" not in _state:
        flags = ("--data-path",) * 3 if args.data_path else ("--train-data-path", "--valid-data-path",
                                                            "--test-data-path")
        built = build_datasets(args, num_samples)
        _state["datasets"] = [None if d is None else _fitting(d, args, flag) for d, flag in zip(built, flags)]
    train, valid, test = _state["datasets"]
    if args.dp_schedule:
        return train, valid, test
    pad = functools.partial(PaddedSampleDataset, seq_length=args.seq_length)
    return tuple(None if d is None else pad(d) for d in (train, valid, test))


def _fitting(samples: Any, args: argparse.Namespace, flag: str) -> Any:
    longest = max(samples.lengths)
    if longest > args.seq_length:
        raise ValueError(f"--seq-length {args.seq_length} is shorter than the longest sample "
                         f"({longest} tokens) of {flag} {samples.path}")
    return samples


train_valid_test_datasets_provider = scheduled_datasets_provider(datasets_provider)




# --- forward step -----------------------------------------------------------------------------


_forward = ScheduledForwardStep()


def forward_step(data_iterator: Any, model: torch.nn.Module, return_schedule_plan: bool = False) -> Any:
    """Megatron's GPT forward step (:class:`ScheduledForwardStep`) for both data paths; records chunk 0's
    micro-batches with ``--step-stats-dir``."""
    recorder = _state.get("recorder")
    chunk = getattr(getattr(data_iterator, "iterable", data_iterator), "chunk", 0)
    if recorder is None or chunk != 0:
        return _forward(data_iterator, model, return_schedule_plan=return_schedule_plan)
    return _recording_forward(data_iterator, model, return_schedule_plan=return_schedule_plan)


def _recording_forward(data_iterator: Any, model: torch.nn.Module, *, return_schedule_plan: bool) -> Any:
    batch = next(data_iterator)
    _state["recorder"].on_batch(batch)
    return _forward(iter([batch]), model, return_schedule_plan=return_schedule_plan)


def install_recorder(args: argparse.Namespace) -> None:
    """``--step-stats-dir``: record per-step statistics (needs the model-parallel groups)."""
    from megatron.core import parallel_state as mpu

    if not args.step_stats_dir or "recorder" in _state:
        return
    ranks = {"dp_rank": mpu.get_data_parallel_rank(), "pp_rank": mpu.get_pipeline_model_parallel_rank(),
             "tp_rank": mpu.get_tensor_model_parallel_rank(), "dp_size": mpu.get_data_parallel_world_size(),
             "pp_size": mpu.get_pipeline_model_parallel_world_size(),
             "vpp_size": args.virtual_pipeline_model_parallel_size or 1,
             "tp_size": mpu.get_tensor_model_parallel_world_size(), "cp_size": mpu.get_context_parallel_world_size()}
    _state["recorder"] = StepRecorder(args.step_stats_dir, rank=torch.distributed.get_rank(), ranks=ranks)
    record_steps(_state["recorder"])  # the train_step row that setup_dp_schedule installed records from now on


def record_plan(args: argparse.Namespace) -> None:
    """With ``--step-stats-dir`` and ``--dp-schedule``: store the trained steps' plans, asked afresh."""
    recorder = _state.get("recorder")
    feed = train_valid_test_datasets_provider.feeds.get("train")
    if recorder is not None and feed is not None:
        write_plan(args.step_stats_dir, rank=torch.distributed.get_rank(), feed=feed, num_steps=recorder.step)


@contextlib.contextmanager
def recording_plans(args: argparse.Namespace) -> Iterator[None]:
    """:func:`record_plan` once training ends: normally, or by the ``sys.exit`` of Megatron's ``--exit-interval``
    and ``--exit-duration`` (exit code 0)."""
    try:
        yield
    except SystemExit as stop:
        if not stop.code:
            record_plan(args)
        raise
    record_plan(args)


# --- the two ways in --------------------------------------------------------------------------


def run_pretrain(args: argparse.Namespace) -> None:
    """The GPU path: Megatron's ``pretrain()``."""
    from megatron_dpsched.megatron.releases import compat_0_19_pretrain

    with recording_plans(args):
        compat_0_19_pretrain(args, datasets_provider=train_valid_test_datasets_provider, forward_step=forward_step,
                             model_provider=_model_provider_with_recorder)


def _model_provider_with_recorder(*args: Any, **kwargs: Any) -> Any:
    """``model_provider``; the first call (model-parallel groups exist by then) starts the recorder."""
    from megatron.training.global_vars import get_args

    install_recorder(get_args())
    return model_provider(*args, **kwargs)


def start_cpu_dry_run() -> None:
    """Refuse a GPU machine, then install the CPU device shim (test-only; never on the ``pretrain`` path)."""
    if torch.cuda.is_available():
        raise ValueError(f"{DRY_RUN_FLAG} is a CPU-only dry run and refuses to start where CUDA is "
                         f"available; drop the flag to train with pretrain()")
    from megatron_dpsched.testing import cpu_shim

    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # what Megatron asks of TP/CP jobs
    cpu_shim.install()


def run_cpu_dry_run(args: argparse.Namespace) -> None:
    """CPU-only dry run: gloo + CUDA shim + Megatron's real model/optimizer set-up, data path and ``train()``."""
    if args.distributed_backend != "gloo":
        raise ValueError(f"{DRY_RUN_FLAG} needs --distributed-backend gloo; got {args.distributed_backend}")
    from megatron.core.utils import get_model_config
    from megatron.training import training

    from megatron_dpsched.megatron.releases import compat_0_18_padded_vocab_size, compat_0_19_setup_model_and_optimizer
    from megatron_dpsched.testing import cpu_shim

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.distributed.init_process_group("gloo")
    vocab_size = args.vocab_size
    if vocab_size is None and args.sft_conversations:  # pretrain() gets it from the tokenizer it builds
        vocab_size = corpus(args).format.tokenizer.vocab_size
    args.padded_vocab_size = compat_0_18_padded_vocab_size(vocab_size, args)
    cpu_shim.initialize_megatron_on_cpu(args)
    install_recorder(args)
    model, optimizer, scheduler = compat_0_19_setup_model_and_optimizer(model_provider)
    train_iter, valid_iter = _data_iterators(len(model))
    try:
        with recording_plans(args):
            training.train(forward_step, model, optimizer, scheduler, train_iter, valid_iter, None,
                           get_model_config(model[0]), {}, None)
    except SystemExit:
        # --exit-interval / --exit-duration: train() ends the job with sys.exit after a barrier on every rank. A
        # gloo group left to interpreter shutdown can abort the process (SIGABRT) while its worker threads free
        # tensors, so it is destroyed here, as on the normal way out.
        torch.distributed.destroy_process_group()
        raise
    torch.distributed.destroy_process_group()


def _data_iterators(num_chunks: int) -> tuple[Any, Any]:
    """Megatron's ``build_train_valid_test_data_iterators``, once per model chunk as ``pretrain`` does."""

    from megatron.training.training import build_train_valid_test_data_iterators

    if num_chunks == 1:
        train_iter, valid_iter, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        return train_iter, valid_iter
    built = []
    for stage in range(num_chunks):  # as pretrain() does under a virtual pipeline
        if "vp_stage" not in inspect.signature(train_valid_test_datasets_provider).parameters:
            raise AssertionError("vp_stage must be a kwarg of the datasets provider (Megatron asserts it)")
        provider = functools.partial(train_valid_test_datasets_provider, vp_stage=stage)
        provider.is_distributed = True
        built.append(build_train_valid_test_data_iterators(provider))
    return [b[0] for b in built], [b[1] for b in built]


def main() -> None:
    """Parse and check the flags (a bad one: one line naming it, before anything is built), then train; what
    the plugin refuses while training is one line too (``dp-schedule: rank R step S: ...``, exit code 2;
    ``DPSCHED_DEBUG=1`` shows the traceback). ``--quiet``: :mod:`megatron_dpsched.megatron.quiet`."""
    if quiet.QUIET_FLAG in sys.argv[1:]:
        quiet.install()
    exit_on_bad_flags(sys.argv[1:], prog=Path(sys.argv[0]).name)  # one line, before Megatron's argument dump
    dry_run = DRY_RUN_FLAG in sys.argv[1:]
    try:
        args = parse_arguments(dry_run)
    except ValueError as error:
        if debug_requested():
            raise
        exit_with_line(error, prefix=f"{Path(sys.argv[0]).name}: error: ")
    with one_line_errors(also_from=[__file__]):
        if dry_run:
            run_cpu_dry_run(args)
        else:
            run_pretrain(args)


if __name__ == "__main__":
    main()
