"""Dry-run / testing-only device shim: run Megatron's CUDA code paths on CPU.

**Never imported by the product path** (``patch``, ``iterator``, ``collate``,
``forward_step`` do not import it). It exists so that the distributed tests and
the CPU demo can run Megatron's real schedules, DDP, optimizer and
``train_step`` as 2-4 CPU processes on gloo, the way Megatron's own unit tests
fake a device.

What :func:`install` changes (all undone by :func:`uninstall`):

* a ``torch.overrides.TorchFunctionMode`` maps ``device="cuda"`` / ``device=0``
  / ``torch.device("cuda")`` to CPU for every torch call, turns
  ``Tensor.cuda()`` into a no-op and ``Tensor.to("cuda")`` into ``.to("cpu")``,
  and makes ``Tensor.type()`` answer ``torch.cuda.<Type>`` (the optimizer and
  grad-clipping code compare against those names);
* ``pin_memory`` requests are dropped; ``all_to_all_single`` split sizes given as
  tensors become lists (gloo needs them so; on a GPU MoE dispatch passes NumPy copies);
  ``torch.cuda.get_device_capability`` /
  ``get_device_properties`` describe a Hopper-generation device (what Megatron's
  argument validation asks before TP/CP stream settings);
* ``torch.cuda.synchronize`` / ``set_device`` / ``empty_cache`` are no-ops,
  ``current_device`` returns 0, ``Stream`` / ``current_stream`` / ``stream`` /
  ``Event`` are inert stand-ins, ``get_rng_state`` / ``set_rng_state`` use the
  CPU generator (the rerun state machine saves them every step);
* Megatron's tensor-parallel RNG tracker becomes :class:`CpuRNGStatesTracker`,
  which keeps CPU generator states under the same names (data-parallel,
  model-parallel, expert-parallel), so dropout in tensor-parallel regions forks
  its own stream as on a GPU, and checkpoints save and restore every RNG state
  a CPU run has (a plain ``--save`` / ``--load`` resumes bit-exactly).

``torch.cuda.device_count`` and ``is_available`` are left alone (0 / False);
use :func:`pretend_one_device` around Megatron's ``_initialize_distributed``,
which only builds the model-parallel groups when it sees a device.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from megatron.core.tensor_parallel.random import _MODEL_PARALLEL_RNG_TRACKER_NAME as _MODEL_PARALLEL_NAME
from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_saved: dict[str, Any] = {}
_mode: TorchFunctionMode | None = None


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _map_device_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    if _is_cuda_device(kwargs.get("device")):
        kwargs = {**kwargs, "device": _CPU}
    return args, kwargs


def _to_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    # Tensor.to(self, device, ...) / Tensor.to(self, "cuda", dtype) / Tensor.to(self, 0) (a device index, as
    # Megatron-LM main's data_schedule_utils passes torch.cuda.current_device()); later ints are flags
    return tuple(_CPU if i > 0 and _is_cuda_device(a) and (i == 1 or not isinstance(a, int)) else a
                 for i, a in enumerate(args))


def _list_split_sizes(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Split sizes as lists: on a GPU MoE dispatch hands NumPy copies of them, on the host the tensors
    themselves, which gloo's ``all_to_all_single`` does not take."""
    return {key: value.tolist() if key.endswith("split_sizes") and isinstance(value, torch.Tensor) else value
            for key, value in kwargs.items()}


def _cuda_type_name(tensor: torch.Tensor) -> str:
    return tensor.type().replace("torch.", "torch.cuda.", 1)


class CudaToCpuMode(TorchFunctionMode):
    """Route every CUDA placement request to CPU (see the module docstring)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]
        if kwargs.get("pin_memory"):  # pinned host memory needs a CUDA driver
            kwargs = {**kwargs, "pin_memory": False}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _cuda_type_name(args[0])
        if func is torch.Tensor.to:
            args = _to_args(args)
        if func is torch.distributed.all_to_all_single:
            kwargs = _list_split_sizes(kwargs)
        args, kwargs = _map_device_args(args, kwargs)
        return func(*args, **kwargs)


_CPU_DEVICE_PROPERTIES = types.SimpleNamespace(name="cpu dry run", major=9, minor=0, total_memory=0,
                                               multi_processor_count=1)


class _InertStream:
    """Stand-in for ``torch.cuda.Stream`` / ``Event``: every method is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name == "record_event":  # callers wait on the event it returns
            return lambda *args, **kwargs: _InertStream()
        return lambda *args, **kwargs: None

    def query(self) -> bool:
        return True


def _cuda_replacements() -> dict[str, Any]:
    return {
        "synchronize": lambda *a, **k: None,
        "set_device": lambda *a, **k: None,
        "empty_cache": lambda *a, **k: None,
        "current_device": lambda: 0,
        "Stream": _InertStream,
        "Event": _InertStream,
        "current_stream": lambda *a, **k: _InertStream(),
        "default_stream": lambda *a, **k: _InertStream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": lambda *a, **k: None,
        # Megatron's argument validation asks for the GPU generation (TP/CP stream settings): answer Hopper
        "get_device_capability": lambda *a, **k: (9, 0),
        "get_device_properties": lambda *a, **k: _CPU_DEVICE_PROPERTIES,
    }


def install() -> None:
    """Turn the shim on (idempotent)."""
    global _mode
    if _mode is not None:
        return
    for name, replacement in _cuda_replacements().items():
        _saved[name] = getattr(torch.cuda, name)
        setattr(torch.cuda, name, replacement)
    _mode = CudaToCpuMode()
    _mode.__enter__()
    reset_rng_tracker()


def uninstall() -> None:
    """Turn the shim off and restore ``torch.cuda`` (idempotent)."""
    global _mode
    if _mode is None:
        return
    _mode.__exit__(None, None, None)
    _mode = None
    for name, original in _saved.items():
        setattr(torch.cuda, name, original)
    _saved.clear()


class CpuRNGStatesTracker(CudaRNGStatesTracker):
    """Megatron's RNG states tracker with CPU generator states (forks swap the CPU default generator)."""

    def add(self, name: str, seed: int) -> None:
        """Track a new state ``name`` seeded with ``seed`` (same checks as Megatron's tracker)."""
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_NAME) -> Iterator[None]:
        """Run the block on state ``name``, then return to the state it interrupted."""
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def reset_rng_tracker(seed: int = 1234) -> None:
    """Install a :class:`CpuRNGStatesTracker` as Megatron's tracker, seeded as Megatron seeds one GPU."""
    from megatron.core.tensor_parallel import random as tp_random

    tracker = CpuRNGStatesTracker()
    tp_random._CUDA_RNG_STATE_TRACKER = tracker
    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    for offset, name in enumerate((tp_random._DATA_PARALLEL_RNG_TRACKER_NAME, _MODEL_PARALLEL_NAME,
                                   tp_random._EXPERT_PARALLEL_RNG_TRACKER_NAME)):
        tracker.add(name, seed + 2718 * offset)


@contextlib.contextmanager
def pretend_one_device() -> Iterator[None]:
    """Make ``torch.cuda.device_count()`` answer 1 inside the block."""
    original = torch.cuda.device_count
    torch.cuda.device_count = lambda: 1
    try:
        yield
    finally:
        torch.cuda.device_count = original


def initialize_megatron_on_cpu(args: Any) -> None:
    """Megatron's globals and model-parallel groups for ``args`` on an initialized gloo group.

    ``args`` come from Megatron's ``parse_args`` + ``validate_args`` (with
    ``--distributed-backend gloo``). Skips what cannot run on CPU: the dataset
    helpers' ``make``; seeds Megatron's RNG states into the CPU tracker. Call :func:`install` first.
    """
    from megatron.training.initialize import _initialize_distributed, _set_random_seed

    from megatron_dpsched.megatron.releases import compat_0_18_initialize_megatron

    compat_0_18_initialize_megatron(args)
    with pretend_one_device():
        _initialize_distributed(None, None, None)
        reset_rng_tracker(args.seed)
        _set_random_seed(args.seed, args.data_parallel_random_init)  # Megatron's seeding, into the CPU tracker


@contextlib.contextmanager
def cpu_device_shim() -> Iterator[None]:
    """``install()`` for the duration of a ``with`` block."""
    install()
    try:
        yield
    finally:
        uninstall()
