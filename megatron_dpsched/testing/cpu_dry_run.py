"""Try a training script on CPU: a dry run of your own ``pretrain()`` script (the README's three-line
integration) on gloo, the way the GPT entry point's ``--cpu-dry-run`` runs its own::

    torchrun --nproc-per-node 2 -m megatron_dpsched.testing.cpu_dry_run my_pretrain_gpt.py <Megatron flags> \\
        --distributed-backend gloo --use-cpu-initialization --no-gradient-accumulation-fusion ... \\
        --dp-schedule --dp-schedule-max-tokens-per-gpu 256

Test-only, like :mod:`.cpu_shim` (which no product module imports): it refuses to start where CUDA is
available, installs the CPU device shim, lets Megatron's ``initialize_megatron`` start without CUDA (the gloo
group first, the model-parallel groups as on one device, the random seeds into the CPU tracker, no C++ dataset
helpers compiled), then runs the script as ``__main__`` with the remaining arguments. The model must run on
CPU: a tiny fp32 model with Megatron's local layer spec (``--transformer-impl local`` and the ``--no-*-fusion``
flags; see ``tests/distributed/three_line_script.py``).
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from megatron_dpsched.testing import cpu_shim

USAGE = "usage: python -m megatron_dpsched.testing.cpu_dry_run SCRIPT [ARGS ...] (under torchrun)"


def main(argv: Sequence[str]) -> None:
    """Run ``argv[0]`` (a training script) with ``argv[1:]`` as its command line, on CPU."""
    if not argv or argv[0].startswith("-"):
        raise SystemExit(USAGE)
    if torch.cuda.is_available():
        raise SystemExit("megatron_dpsched.testing.cpu_dry_run is a CPU-only dry run and refuses to start where "
                         "CUDA is available; run the script itself")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # what Megatron asks of TP/CP jobs
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cpu_shim.install()
    start_megatron_on_cpu()
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        # a gloo group left to interpreter shutdown can abort the process while its threads free tensors
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def start_megatron_on_cpu() -> None:
    """Let Megatron's ``initialize_megatron`` (which ``pretrain`` calls) start on CPU (see the module doc)."""
    from megatron.training import initialize, training

    training.initialize_megatron = functools.partial(initialize.initialize_megatron, allow_no_cuda=True)
    initialize._initialize_distributed = _on_gloo(initialize._initialize_distributed)
    initialize._set_random_seed = _seeded_on_cpu(initialize._set_random_seed)
    if hasattr(initialize, "_compile_dependencies"):
        initialize._compile_dependencies = lambda *args, **kwargs: None  # the C++ dataset helpers need a build


def _on_gloo(initialize_distributed: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``_initialize_distributed`` on a gloo group started first, seeing one device."""

    @functools.wraps(initialize_distributed)
    def started(*args: Any, **kwargs: Any) -> Any:
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group("gloo")
        with cpu_shim.pretend_one_device():
            return initialize_distributed(*args, **kwargs)

    return started


def _seeded_on_cpu(set_random_seed: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``_set_random_seed``, seeding the CPU RNG tracker as it seeds a device's."""

    @functools.wraps(set_random_seed)
    def seeded(seed: int, *args: Any, **kwargs: Any) -> Any:
        cpu_shim.reset_rng_tracker(seed)
        with cpu_shim.pretend_one_device():
            return set_random_seed(seed, *args, **kwargs)

    return seeded


if __name__ == "__main__":
    main(sys.argv[1:])
