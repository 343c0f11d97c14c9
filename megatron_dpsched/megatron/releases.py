"""The Megatron releases the plugin runs on, and one adapter per difference between them.

Supported: megatron-core 0.17.1, 0.18.2 and 0.19.2 (PyPI) and Megatron-LM main. Each adapter is named
after the release that changed what it bridges (``compat_0_19_*``: 0.19 changed it, the adapter also
serves 0.17 and 0.18; ``compat_0_18_*``: 0.18 changed it, the adapter serves 0.17). The entry point
(``scripts/pretrain_gpt_dpsched.py``), the examples, the CPU dry run (``testing/cpu_shim.py``) and the
tests call Megatron through them where releases differ. Replacing names inside Megatron stays the patch
registry's job (:mod:`~megatron_dpsched.megatron.patch`, whose rows say which releases they belong to).

=========================================================  =======  ==========================================
difference                                                 changed  adapter
=========================================================  =======  ==========================================
``setup_model_and_optimizer``: ``model_type`` and          0.19     :func:`compat_0_19_setup_model_and_optimizer`
``model_provider_func`` swapped (0.17, 0.18: provider                (by keyword)
first)
``pretrain``: ``model_provider`` moved behind              0.19     :func:`compat_0_19_pretrain` (by keyword)
``forward_step_func``
``pretrain(cfg_container, ...)`` and                       0.18     :func:`compat_0_19_pretrain`: where it takes
``pretrain_cfg_container_from_args`` (0.17's ``pretrain``           one; 0.17.1: refused (``ValueError``)
parses the command line itself)
``arguments.parse_and_validate_args``                      0.18     :func:`compat_0_18_parse_and_validate_args`
``initialize_megatron`` reads the parsed arguments (0.17:  0.18     :func:`compat_0_18_initialize_megatron`
parses ``sys.argv`` unless given ``parsed_args``)
``vocab_utils.calculate_padded_vocab_size``                0.18     :func:`compat_0_18_padded_vocab_size`
``training.update_seqlen_stats_from_cu_seqlens``           0.18     :func:`compat_0_18_update_seqlen_stats`
(real-token TFLOP/s)                                                (0.17.1: skipped, said once: :data:`LACKING`)
MoE loss logging ``get_moe_metrics_tracker().report``      0.18     the registry's ``track_moe_metrics`` row
(0.17: ``track_moe_metrics(loss_scale=...)``)                       (``before=(0, 18)``)
source patch ``patches/megatron_training_dpsched.patch``   0.19     ``megatron_training_dpsched_0.18.patch``
(the lines the hooks replace)                                       and ``_0.17.patch``, picked by
                                                                    ``scripts/apply_megatron_patch.sh``
=========================================================  =======  ==========================================
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

LACKING: dict[str, tuple[tuple[int, int], str]] = {
    "update_seqlen_stats_from_cu_seqlens": (
        (0, 18), "Megatron's logged TFLOP/s count --seq-length per sample, not the real tokens; training, the "
                 "plan and its log lines are unchanged"),
}
"""A name of ``megatron.training.training`` the plugin calls -> (the release that added it, what works without it)."""
_said: set[str] = set()
"""The names of :data:`LACKING` whose absence was said already (once per process)."""


def megatron_core_version() -> tuple[int, int]:
    """(major, minor) of the megatron-core imported (``megatron.core.package_info``)."""
    from megatron.core import package_info

    found = re.match(r"(\d+)\.(\d+)", package_info.__version__)
    if found is None:
        raise RuntimeError(f"dp-schedule: megatron-core's version {package_info.__version__!r} is not MAJOR.MINOR...")
    return int(found.group(1)), int(found.group(2))


def lacking_notices(module: Any) -> list[str]:
    """One line per name of :data:`LACKING` that ``module`` (``megatron.training.training``) lacks: which name,
    since which release, and what works without it."""
    return [f"dp-schedule: this Megatron's {module.__name__} lacks {name} (added in megatron-core "
            f"{since[0]}.{since[1]}): {works}" for name, (since, works) in LACKING.items() if not hasattr(module, name)]


def say_lacking_once(module: Any) -> None:
    """Print :func:`lacking_notices` on rank 0, each once per process."""
    from megatron_dpsched.runtime.ranks import print_rank_0

    for name, line in zip([n for n in LACKING if not hasattr(module, n)], lacking_notices(module)):
        if name not in _said:
            _said.add(name)
            print_rank_0(line)


# --- 0.19: setup_model_and_optimizer's and pretrain's parameters --------------------------------


def compat_0_19_setup_model_and_optimizer(model_provider: Callable[..., Any]) -> tuple[Any, Any, Any]:
    """Megatron's ``setup_model_and_optimizer`` for a decoder-only model, by keyword (0.19 swapped
    ``model_type`` and ``model_provider_func``); looked up when called, so the registry's row applies."""
    from megatron.core.enums import ModelType
    from megatron.training import training

    return training.setup_model_and_optimizer(model_type=ModelType.encoder_or_decoder,
                                              model_provider_func=model_provider)


def compat_0_19_pretrain(args: argparse.Namespace, *, datasets_provider: Callable[..., Any],
                         forward_step: Callable[..., Any], model_provider: Callable[..., Any]) -> Any:
    """Megatron's ``pretrain`` for a decoder-only model, by keyword (0.19 moved ``model_provider``), with
    ``cfg_container`` where it takes one (0.18+). 0.17's ``pretrain`` parses the command line again and sets
    Megatron's globals itself, which drops what ``args`` carries: ``ValueError``."""
    from megatron.core.enums import ModelType
    from megatron.training import training

    if "cfg_container" not in inspect.signature(training.pretrain).parameters:
        raise ValueError("this megatron-core's pretrain() parses the command line again (0.17 and older), dropping "
                         "the settings --dp-schedule makes; use megatron-core 0.18.2 or newer for pretrain(), or "
                         "--cpu-dry-run")
    from megatron.training.argument_utils import pretrain_cfg_container_from_args

    return training.pretrain(cfg_container=pretrain_cfg_container_from_args(args),
                             train_valid_test_dataset_provider=datasets_provider,
                             model_type=ModelType.encoder_or_decoder, forward_step_func=forward_step,
                             model_provider=model_provider)


# --- 0.18: parsing, initialization, vocabulary padding, sequence statistics --------------------


def compat_0_18_parse_and_validate_args(extra_args_provider: Callable[..., Any]) -> argparse.Namespace:
    """Megatron's ``parse_and_validate_args`` (0.18+): parse, validate, set the globals. 0.17 has none: its
    parts (without ``--use-checkpoint-args`` and ``--yaml-cfg``, which 0.17 reads in ``initialize_megatron``)."""
    from megatron.training import arguments

    if hasattr(arguments, "parse_and_validate_args"):
        return arguments.parse_and_validate_args(extra_args_provider=extra_args_provider)
    from megatron.training.global_vars import set_global_variables

    args = arguments.parse_args(extra_args_provider)
    if args.use_checkpoint_args or args.yaml_cfg is not None:
        raise ValueError("--use-checkpoint-args and --yaml-cfg need megatron-core 0.18 or newer with this entry point")
    arguments.validate_args(args)
    set_global_variables(args)
    return args


def compat_0_18_initialize_megatron(args: argparse.Namespace) -> None:
    """Megatron's globals for validated ``args`` (no tokenizer), then what ``initialize_megatron`` sets up before
    the model-parallel groups (logging, the rerun state machine). 0.18+ reads the globals; 0.17's parses
    ``sys.argv`` or validates ``parsed_args`` again (which validated arguments fail), so on 0.17 its two
    steps are called here."""
    from megatron.training import initialize
    from megatron.training.global_vars import set_global_variables

    set_global_variables(args, build_tokenizer=False)
    if "parsed_args" not in inspect.signature(initialize.initialize_megatron).parameters:
        initialize.initialize_megatron(allow_no_cuda=True, skip_mpu_initialization=True)
        return
    from megatron.core import tensor_parallel
    from megatron.core.rerun_state_machine import (
        RerunDiagnostic,
        RerunErrorInjector,
        RerunMode,
        initialize_rerun_state_machine,
    )

    def restore(state: dict[str, Any]) -> None:
        if state["rng_tracker_states"]:
            tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])

    initialize.setup_logging()
    initialize_rerun_state_machine(
        state_save_func=lambda: {"rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()},
        state_restore_func=restore, mode=RerunMode(args.rerun_mode),
        error_injector=RerunErrorInjector(error_injection_rate=args.error_injection_rate,
                                          error_injection_type=RerunDiagnostic(args.error_injection_type)),
        result_rejected_tracker_filename=args.result_rejected_tracker_filename)


def compat_0_18_padded_vocab_size(vocab_size: int, args: argparse.Namespace) -> int:
    """``vocab_size`` padded to ``--make-vocab-size-divisible-by`` x TP, as Megatron pads it (0.18 moved the
    function to ``megatron.training.vocab_utils``; 0.17 pads in the tokenizer builder, from the same rule)."""
    try:
        from megatron.training.vocab_utils import calculate_padded_vocab_size
    except ModuleNotFoundError:
        multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
        return int(math.ceil(vocab_size / multiple) * multiple)
    return calculate_padded_vocab_size(vocab_size, args.make_vocab_size_divisible_by,
                                       args.tensor_model_parallel_size, logging_enabled=False)


def compat_0_18_update_seqlen_stats(cu_seqlens: Any) -> None:
    """Megatron's ``update_seqlen_stats_from_cu_seqlens`` (0.18+); on 0.17 skipped, and said once
    (:func:`say_lacking_once`)."""
    from megatron.training import training

    if hasattr(training, "update_seqlen_stats_from_cu_seqlens"):
        training.update_seqlen_stats_from_cu_seqlens(cu_seqlens)
    else:
        say_lacking_once(training)
