"""Per-step, per-rank statistics of a Megatron training run, measured while it trains.

:class:`StepRecorder` sees every micro-batch a rank's forward step reads (``on_batch``)
and wraps ``megatron.training.training.train_step`` (:meth:`install`, after
``patch.enable()``), so each optimizer step writes one JSON line to
``<dir>/rank<global rank>.jsonl``::

    {"step", "rank", "dp_rank", "pp_rank", "tp_rank", "iteration", "consumed_samples", "fingerprint",
     "micro_batches", "samples", "tokens", "padded_tokens", "step_time_s", "loss", "lr", "peak_memory_bytes",
     "data_wait_s" [, "micro_batch_ids"]}

``tokens`` are loss tokens (real sample positions), ``padded_tokens`` the
positions the micro-batch tensors hold (padding included); ``loss`` is
Megatron's reduced ``lm loss`` (``None`` off the last pipeline stage) and
``lr`` the learning rate the step used; ``step_time_s`` the wall time of
``train_step`` (with CUDA, up to a device synchronize at its end);
``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated()`` since the process
started (``None`` without CUDA, as in the CPU dry run); ``iteration`` and
``consumed_samples`` Megatron's counters before the step, ``fingerprint`` the
scheduled step's plan fingerprint (``None`` on the padded path); ``data_wait_s`` the seconds
the training thread waited for the step's plan and micro-batches (``StepFeed.step_wait_seconds``;
``None`` on the padded path); ``micro_batch_ids``
(scheduled batches only) the global sample ids of each micro-batch. :func:`write_plan`
stores, next to them, what the planner gives for the same steps when asked again
(``plan.rank<r>.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch


class StepRecorder:
    """Collects one rank's micro-batches per step and appends a JSON line per trained step."""

    def __init__(self, directory: str | Path, *, rank: int, ranks: Mapping[str, int]) -> None:
        self.path = Path(directory) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.ranks = {"rank": rank, **ranks}
        self.step = 0
        self._batches: list[tuple[int, int, int]] = []
        self._ids: list[list[int]] = []

    def on_batch(self, batch: Mapping[str, Any]) -> None:
        """Record one micro-batch: (samples, loss tokens, padded positions)."""
        mask = batch["loss_mask"]
        ids = batch.get("sample_ids")
        samples = ids.numel() if ids is not None else batch["tokens"].shape[0]
        self._batches.append((int(samples), int(mask.sum().item()), int(batch["tokens"].numel())))
        if ids is not None:
            self._ids.append([int(i) for i in ids.tolist()])

    def install(self, module: Any) -> None:
        """Wrap ``module.train_step`` (call after ``patch.enable()``, which checks the original)."""
        module.train_step = self.wrap(module.train_step)

    def wrap(self, train_step: Callable[..., Any]) -> Callable[..., Any]:
        """``train_step`` that times the step and records its loss and learning rate."""

        def timed_train_step(*args: Any, **kwargs: Any) -> Any:
            from megatron.training.global_vars import get_args

            optimizer = kwargs.get("optimizer", args[3] if len(args) > 3 else None)
            position = {"iteration": get_args().curr_iteration, "consumed_samples": get_args().consumed_train_samples}
            lr = _learning_rate(optimizer)
            start = time.perf_counter()
            result = train_step(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the step's kernels are part of its time
            self.write_step(time.perf_counter() - start, result[0], lr, position=position)
            return result

        return timed_train_step

    def write_step(
        self, seconds: float, loss_dict: Mapping[str, Any], lr: float | None, *, position: Mapping[str, int]
    ) -> None:
        """Append the step's line and start the next step."""
        from megatron_dpsched.megatron.hooks import active_feed, active_step

        loss = loss_dict.get("lm loss") if loss_dict else None
        scheduled, feed = active_step(), active_feed()
        record = {
            "step": self.step, **self.ranks, **position,
            "fingerprint": None if scheduled is None else scheduled.fingerprint,
            "micro_batches": len(self._batches),
            "samples": sum(b[0] for b in self._batches),
            "tokens": sum(b[1] for b in self._batches),
            "padded_tokens": sum(b[2] for b in self._batches),
            "step_time_s": seconds,
            "loss": None if loss is None else float(loss),
            "lr": lr,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
            "data_wait_s": None if feed is None else feed.step_wait_seconds,
        }
        if self._ids:
            record["micro_batch_ids"] = self._ids
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        self.step += 1
        self._batches = []
        self._ids = []


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
