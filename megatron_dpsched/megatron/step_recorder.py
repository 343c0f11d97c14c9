"""Per-step, per-rank statistics of a Megatron training run, measured while it trains.

:class:`StepRecorder` sees every micro-batch a rank's forward step reads (``on_batch``)
and, once :func:`record_steps` hands it to the hook :func:`with_step_stats` (which wraps
``megatron.training.training.train_step``: a row of the patch registry, :mod:`~megatron_dpsched.megatron.patch`,
installed on every job; without a recorder it calls ``train_step`` as it is), each optimizer step writes
one JSON line to ``<dir>/rank<global rank>.jsonl``::

    {"step", "rank", "dp_rank", "pp_rank", "tp_rank", "dp_size", "pp_size", "vpp_size", "tp_size", "cp_size",
     "iteration", "consumed_samples", "fingerprint", "micro_batches", "samples", "tokens", "padded_tokens",
     "real_tokens", "sum_sq_lengths", "padded_sum_sq", "step_time_s", "forward_backward_s", "grad_sync_s",
     "compute_s", "forward_backward_cpu_s", "grad_sync_cpu_s", "compute_cpu_s", "loss", "lr", "peak_memory_bytes",
     "data_wait_s", "micro_batch_figures", "micro_batch_seconds" [, "micro_batch_ids"]}

``tokens`` are loss tokens (real sample positions), ``padded_tokens`` the
positions the micro-batch tensors hold (padding included); ``loss`` is
Megatron's reduced ``lm loss`` (``None`` off the last pipeline stage) and
``lr`` the learning rate the step used; ``step_time_s`` the wall time of
``train_step`` (with CUDA, up to a device synchronize at its end);
``real_tokens`` and ``sum_sq_lengths`` are the sum of the step's
sample lengths and of their squares (each sample's real tokens; a dummy micro-batch counts one
one-token sample, as the step-time model does), ``padded_sum_sq`` the same over what the
micro-batch tensors hold (``rows x width**2`` for a padded ``bshd`` micro-batch, the padded
segment lengths for ``thd``); ``micro_batches`` is the micro-batch count of model chunk 0.
``forward_backward_s`` is the wall time of Megatron's ``forward_backward_func`` within the
step (with CUDA, up to a device synchronize), ``grad_sync_s`` the part of it spent in
``config.finalize_model_grads_func`` (the data-parallel gradient reduction, which waits for
the slowest rank) and ``compute_s`` the difference: this rank's own forward and backward
work, what ``megatron-dpsched calibrate`` fits. The ``*_cpu_s`` figures are the same spans in
CPU seconds of the training thread (``time.thread_time``): on CPU runs of a shared machine they
leave out the time other processes held the cores (``calibrate --time compute-cpu``); they do not
see GPU work or waiting. Per micro-batch of chunk 0, in the order read, ``micro_batch_figures`` holds ``[real tokens,
sum of squared lengths, padded tokens, padded sum of squares]`` and ``micro_batch_seconds`` ``[wall, CPU]`` seconds
from reading it to reading the next (the last: to the gradient reduction): with one pipeline stage
its forward and backward (``forward_backward_no_pipelining`` runs them back to back) and the next
micro-batch's loading. ``peak_memory_bytes`` is
``torch.cuda.max_memory_allocated()`` since the process started
(``None`` without CUDA, as in the CPU dry run); ``iteration`` and
``consumed_samples`` Megatron's counters before the step, ``fingerprint`` the
scheduled step's plan fingerprint (``None`` on the padded path); ``data_wait_s`` the seconds
the training thread waited for the step's plan and micro-batches (``StepFeed.step_wait_seconds``;
``None`` on the padded path); ``micro_batch_ids``
(scheduled batches only) the global sample ids of each micro-batch. :func:`write_plan`
stores, next to them, what the planner gives for the same steps when asked again
(``plan.rank<r>.json``).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from megatron_dpsched.megatron.accounting import active_feed, active_step


class StepRecorder:
    """Collects one rank's micro-batches per step and appends a JSON line per trained step."""

    def __init__(self, directory: str | Path, *, rank: int, ranks: Mapping[str, int]) -> None:
        self.path = Path(directory) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.ranks = {"rank": rank, **ranks}
        self.step = 0
        self._batches: list[tuple[int, int, int, int, int, int]] = []
        self._ids: list[list[int]] = []
        self._times: dict[str, float] = {}
        self._stamps: list[tuple[float, float]] = []  # (wall, thread CPU) when each micro-batch was read
        self._sync_start: tuple[float, float] | None = None

    def on_batch(self, batch: Mapping[str, Any]) -> None:
        """Record one micro-batch: samples, loss tokens, padded positions and the length figures."""
        self._stamps.append((time.perf_counter(), time.thread_time()))
        mask = batch["loss_mask"]
        ids = batch.get("sample_ids")
        samples = ids.numel() if ids is not None else batch["tokens"].shape[0]
        real, padded = micro_batch_lengths(batch)
        self._batches.append((int(samples), int(mask.sum().item()), int(batch["tokens"].numel()),
                              sum(real), sum(n * n for n in real), sum(n * n for n in padded)))
        if ids is not None:
            self._ids.append([int(i) for i in ids.tolist()])

    def timed_step(self, train_step: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``train_step(*args, **kwargs)``, timed with its ``forward_backward_func``; writes the step's line."""
        from megatron.training.global_vars import get_args

        optimizer = kwargs.get("optimizer", args[3] if len(args) > 3 else None)
        position = {"iteration": get_args().curr_iteration, "consumed_samples": get_args().consumed_train_samples}
        lr = _learning_rate(optimizer)
        args, kwargs = self._with_timed_forward_backward(args, kwargs)
        start = time.perf_counter()
        result = train_step(*args, **kwargs)
        _synchronize()  # the step's kernels are part of its time
        self.write_step(time.perf_counter() - start, result[0], lr, position=position)
        return result

    def _with_timed_forward_backward(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``train_step``'s arguments with its ``forward_backward_func`` (7th, after ``config``) timed."""
        if "forward_backward_func" in kwargs:
            config = kwargs.get("config", args[5] if len(args) > 5 else None)
            return args, {**kwargs, "forward_backward_func": self.time_forward_backward(
                kwargs["forward_backward_func"], config)}
        if len(args) > 6:
            timed = self.time_forward_backward(args[6], kwargs.get("config", args[5]))
            return (*args[:6], timed, *args[7:]), kwargs
        return args, kwargs

    def time_forward_backward(self, func: Callable[..., Any], config: Any) -> Callable[..., Any]:
        """``func`` timed as a whole and, within it, ``config.finalize_model_grads_func`` (the grad sync)."""

        def timed_forward_backward(*args: Any, **kwargs: Any) -> Any:
            finalize = getattr(config, "finalize_model_grads_func", None)
            if finalize is not None:
                config.finalize_model_grads_func = self._timed("grad_sync_s", finalize)
            try:
                return self._timed("forward_backward_s", func)(*args, **kwargs)
            finally:
                if finalize is not None:
                    config.finalize_model_grads_func = finalize

        return timed_forward_backward

    def _timed(self, key: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            _synchronize()
            start, cpu = time.perf_counter(), time.thread_time()
            if key == "grad_sync_s":
                self._sync_start = (start, cpu)
            try:
                return func(*args, **kwargs)
            finally:
                _synchronize()
                self._times[key] = self._times.get(key, 0.0) + time.perf_counter() - start
                cpu_key = key.replace("_s", "_cpu_s")
                self._times[cpu_key] = self._times.get(cpu_key, 0.0) + time.thread_time() - cpu

        return timed

    def write_step(
        self, seconds: float, loss_dict: Mapping[str, Any], lr: float | None, *, position: Mapping[str, int]
    ) -> None:
        """Append the step's line and start the next step."""
        loss = loss_dict.get("lm loss") if loss_dict else None
        scheduled, feed = active_step(), active_feed()
        record = {
            "step": self.step, **self.ranks, **position,
            "fingerprint": None if scheduled is None else scheduled.fingerprint,
            **self._batch_figures(),
            "step_time_s": seconds,
            **self._step_times(),
            "loss": None if loss is None else float(loss),
            "lr": lr,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
            "data_wait_s": None if feed is None else feed.step_wait_seconds,
        }
        record["micro_batch_figures"] = [[b[3], b[4], b[2], b[5]] for b in self._batches]
        record["micro_batch_seconds"] = self._micro_batch_seconds()
        if self._ids:
            record["micro_batch_ids"] = self._ids
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        self.step += 1
        self._batches = []
        self._ids = []
        self._times = {}
        self._stamps = []
        self._sync_start = None

    def _micro_batch_seconds(self) -> list[list[float]] | None:
        """Per micro-batch, ``[wall, thread CPU]`` seconds from reading it to reading the next (its forward,
        its backward with one pipeline stage, the next one's loading), the last one up to the gradient
        reduction; ``None`` when ``forward_backward_func`` was not timed."""
        if self._sync_start is None or not self._stamps:
            return None
        ends = [*self._stamps[1:], self._sync_start]
        return [[end[0] - start[0], end[1] - start[1]] for start, end in zip(self._stamps, ends, strict=True)]

    def _batch_figures(self) -> dict[str, int]:
        names = ("samples", "tokens", "padded_tokens", "real_tokens", "sum_sq_lengths", "padded_sum_sq")
        return {"micro_batches": len(self._batches),
                **{name: sum(b[i] for b in self._batches) for i, name in enumerate(names)}}

    def _step_times(self) -> dict[str, float | None]:
        figures: dict[str, float | None] = {}
        for clock in ("", "_cpu"):
            total = self._times.get(f"forward_backward{clock}_s")
            sync = self._times.get(f"grad_sync{clock}_s", 0.0)
            figures |= {f"forward_backward{clock}_s": total, f"grad_sync{clock}_s": None if total is None else sync,
                        f"compute{clock}_s": None if total is None else total - sync}
        return figures


_recorder: StepRecorder | None = None
"""The recorder :func:`with_step_stats` writes to (:func:`record_steps`)."""


def record_steps(recorder: StepRecorder | None) -> None:
    """Have every ``train_step`` from now on timed and written by ``recorder`` (``None``: no more)."""
    global _recorder
    _recorder = recorder


def with_step_stats(train_step: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``train_step``, timed and written by the recorder of :func:`record_steps` (as it is without one)."""

    @functools.wraps(train_step)
    def step(*args: Any, **kwargs: Any) -> Any:
        if _recorder is None:
            return train_step(*args, **kwargs)
        return _recorder.timed_step(train_step, args, kwargs)

    return step


def micro_batch_lengths(batch: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """A collated micro-batch's real sample lengths and the lengths its tensors hold (padding included).

    Packed (``thd``) batches give both from ``packed_seq_params``; padded rows from ``padding_mask``
    (else ``loss_mask``), each row holding the batch's full width. A dummy (no ``sample_ids``) counts
    one one-token sample, as :class:`~megatron_dpsched.core.steptime.StepTimeModel` does.
    """
    ids = batch.get("sample_ids")
    if ids is not None and ids.numel() == 0:
        return [1], [int(batch["tokens"].shape[-1])]
    params = batch.get("packed_seq_params")
    if params is not None:
        real = params.cu_seqlens_q.diff().tolist()
        padded = getattr(params, "cu_seqlens_q_padded", None)
        return [int(n) for n in real], [int(n) for n in (real if padded is None else padded.diff().tolist())]
    pad = batch.get("padding_mask")
    kept = ~pad if pad is not None else batch["loss_mask"] > 0
    width = int(batch["tokens"].shape[-1])
    real = [int(n) for n in kept.reshape(-1, width).sum(-1).tolist()]
    return real, [width] * len(real)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _learning_rate(optimizer: Any) -> float | None:
    groups = getattr(optimizer, "param_groups", None)
    return float(groups[0]["lr"]) if groups else None


def write_plan(directory: str | Path, *, rank: int, feed: Any, num_steps: int) -> Path:
    """This rank's micro-batches of the first ``num_steps`` steps, planned afresh by ``feed``."""
    start = feed.start_consumed_samples
    plans = [feed.plan_step_at(start + s * feed.global_batch_size)[0].micro_batches for s in range(num_steps)]
    path = Path(directory) / f"plan.rank{rank}.json"
    path.write_text(json.dumps([[list(mb) for mb in step] for step in plans]))
    return path


def load_plans(directory: str | Path) -> dict[int, list[list[list[int]]]]:
    """``write_plan`` files by global rank."""
    return {int(p.stem.split("rank")[1]): json.loads(p.read_text())
            for p in sorted(Path(directory).glob("plan.rank*.json"))}


def load_step_records(directory: str | Path) -> list[dict[str, Any]]:
    """Every rank's step lines from a run's ``--step-stats-dir``."""
    records = []
    for path in sorted(Path(directory).glob("rank*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records
