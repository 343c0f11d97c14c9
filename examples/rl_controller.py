"""An RL controller that plans every rollout globally and ships the plan to Megatron trainer ranks (CPU, gloo).

    .venv/bin/python examples/rl_controller.py --out out/rl               # 3 rollouts on 2 trainer ranks
    .venv/bin/python examples/rl_controller.py --out out/rl --save-state-after 2
    .venv/bin/python examples/rl_controller.py --out out/rl_resumed --resume out/rl/state_after_2

The controller (this process, no torch needed for the planning) makes one rollout at a time: ``--prompts``
prompts, ``--samples-per-prompt`` responses each (a GRPO group) of random prompt and response lengths,
and drops the groups whose made-up rewards are all equal (no advantage, as DAPO's dynamic sampling
does). It plans the kept groups with ``compute_dynamic_global_batch_size`` (one optimizer step per rollout:
a multiple of the DP size in groups, so every step trains a multiple of the DP size in samples) and
``build_dp_schedule(groups=..., padded_rows=True)`` under a token cap (the trainers collate ``bshd``, so the
cap counts rows x the longest row, what the micro-batch tensors hold); the groups of a trailing partial step
(``schedule.dropped``) wait for the next rollout, and the last rollout trains them all. The plan and the
rollout's token ids (loss on response tokens only) are written as JSON (``<out>/plans/rollout_<r>.json``)
and the path is sent to the trainer ranks.

The trainer ranks (``--dp`` processes, gloo, CPU through the test-only device shim
``megatron_dpsched.testing.cpu_shim``) build a tiny Megatron GPT with Megatron's own
``setup_model_and_optimizer``, read each shipped plan with ``DPSchedule.from_dict``, and train every step
with Megatron's real ``train_step`` through ``ScheduledDataIterator`` (``setup_dp_schedule`` installs the
hooks), which checks every shipped sample against the sample contract (ids in the model's vocabulary, a 0/1
loss mask, the planned length) and every micro-batch against the cap before the model sees it. Each rank
writes what it trained to ``<out>/records.rank<r>.json``: per step the sample keys of its micro-batches, the
loss, the learning rate, Megatron's iteration and ``consumed_train_samples``.

Resume: ``--save-state-after K`` saves after rollout ``K - 1`` the controller's state (next rollout,
waiting groups) and every rank's model, LR scheduler, iteration and consumed samples
(``<out>/state_after_K``); ``--resume DIR`` starts a new job from there, which plans and trains the next
rollouts exactly as the uninterrupted job did (same plans, same losses: SGD without momentum keeps no
optimizer state). At the end the controller says where it saved (plans, records, the state) and, for a
resumed job, whether it matched the job that saved the state: the same plans, and on every rank the same
micro-batches, losses, learning rates, iterations and consumed samples for the rollouts both trained (read
from that job's ``--out``, the state directory's parent; exit code 1 when they differ). A trainer rank
that refuses its input (a bad sample, a plan for another data-parallel size, a ``rank=`` that is not the
process's data-parallel rank) ends the job with that one line and exit code 2. Takes about half a minute on
two CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import random
import shutil
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VOCAB = 64
SEQ_LENGTH = 64
DIFFERS_EXIT_CODE = 1
"""Exit code of a resumed job that did not match the job that saved its state."""
PEER_FAILURE_WAIT_S = 10.0
"""Seconds the controller waits, after a rank's traceback, for a peer's one-line refusal (the root cause: a rank
whose peer refused fails in its next collective)."""
TRAINED = ("micro_batches", "loss", "lr", "iteration", "consumed_train_samples", "scheduler_num_steps")
"""What a resumed job must train as the job that saved its state did (the fields of a step's record)."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """The example's command line."""

    out: Path
    rollouts: int = 3
    prompts: int = 5
    samples_per_prompt: int = 4
    dp: int = 2
    max_tokens_per_gpu: int = 64
    seed: int = 0
    save_state_after: int | None = None
    resume: Path | None = None
    quiet: bool = False


@dataclass(kw_only=True)
class ControllerState:
    """What the controller carries from one rollout to the next (saved for a resume)."""

    next_rollout: int = 0
    waiting: list[dict[str, Any]] = field(default_factory=list)
    """Samples of groups planned into a trailing partial step, trained with the next rollout."""


# ----------------------------------------------------------------------------------------------- controller


def make_rollout(rollout: int, options: Options) -> list[dict[str, Any]]:
    """Samples of the kept groups of one rollout: key, group, token ids, labels, loss mask (response only)."""
    rng = random.Random(options.seed * 100_003 + rollout)
    samples = []
    for prompt in range(options.prompts):
        rewards = [rng.random() < 0.5 for _ in range(options.samples_per_prompt)]
        prompt_len = rng.randint(4, 12)
        group = [_sample(rng, f"r{rollout}.p{prompt}", k, prompt_len) for k in range(options.samples_per_prompt)]
        if len(set(rewards)) > 1:  # a group whose rewards are all equal has no advantage: dropped
            samples.extend(group)
    return samples


def _sample(rng: random.Random, group: str, k: int, prompt_len: int) -> dict[str, Any]:
    length = prompt_len + rng.randint(1, 40)
    ids = [rng.randrange(1, VOCAB) for _ in range(length + 1)]
    return {"key": f"{group}.s{k}", "group": group, "tokens": ids[:-1], "labels": ids[1:],
            "loss_mask": [0] * (prompt_len - 1) + [1] * (length - prompt_len + 1)}


def plan_rollout(samples: Sequence[dict[str, Any]], *, dp: int, cap: int, last: bool) -> tuple[Any, list[int]]:
    """The rollout's plan and the positions of the samples left for the next rollout."""
    from megatron_dpsched import build_dp_schedule, compute_dynamic_global_batch_size

    groups = [s["group"] for s in samples]
    num_groups = len(set(groups))
    gbs = num_groups if last else compute_dynamic_global_batch_size(num_groups, dp)
    schedule = build_dp_schedule([len(s["tokens"]) for s in samples], dp_size=dp, global_batch_size=gbs,
                                 max_tokens_per_gpu=cap, groups=groups, drop_last=not last, balance="tokens",
                                 padded_rows=True)  # the trainers collate bshd: the cap counts rows x longest
    return schedule, list(schedule.dropped)


def run_controller(options: Options, state: ControllerState, trainers: Any) -> Path | None:
    """Make, plan, ship and train rollouts until ``options.rollouts``; save the state where asked (the directory
    saved, or ``None``)."""
    saved = None
    plans = options.out / "plans"
    plans.mkdir(parents=True, exist_ok=True)
    while state.next_rollout < options.rollouts:
        rollout = state.next_rollout
        samples = state.waiting + make_rollout(rollout, options)
        if not samples:
            state.next_rollout += 1
            continue
        schedule, waiting = plan_rollout(samples, dp=options.dp, cap=options.max_tokens_per_gpu,
                                         last=rollout == options.rollouts - 1)
        path = plans / f"rollout_{rollout}.json"
        path.write_text(json.dumps({"rollout": rollout, "schedule": schedule.to_dict(), "samples": samples}))
        state.waiting = [samples[i] for i in waiting]
        state.next_rollout += 1
        save = state.next_rollout == options.save_state_after
        reports = trainers.train(path, save_dir=options.out / f"state_after_{state.next_rollout}" if save else None)
        print(f"rollout {rollout}: {len(samples)} samples, {schedule.num_steps} step(s), "
              f"{sum(schedule.num_microbatches)} micro-batch(es) per rank, {len(waiting)} waiting; "
              f"loss {reports[0]['losses']}", flush=True)
        if save:
            saved = options.out / f"state_after_{state.next_rollout}"
            _save_controller(saved, state)
    return saved


def _save_controller(directory: Path, state: ControllerState) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "controller.json").write_text(json.dumps({"next_rollout": state.next_rollout,
                                                           "waiting": state.waiting}))


# ------------------------------------------------------------------------------------------------- trainers


class Trainers:
    """``dp`` spawned trainer processes; ``train(path)`` has every rank train one shipped plan."""

    def __init__(self, options: Options) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        init_file = self.init_file = options.out.resolve() / "gloo_init"  # absolute: file:// reads a host
        init_file.unlink(missing_ok=True)
        self.inbox = [context.Queue() for _ in range(options.dp)]
        self.outbox = context.Queue()
        self.processes = [
            context.Process(target=trainer_main, args=(rank, options, str(init_file), self.inbox[rank], self.outbox))
            for rank in range(options.dp)
        ]
        for process in self.processes:
            process.start()

    def train(self, path: Path, *, save_dir: Path | None) -> list[dict[str, Any]]:
        for inbox in self.inbox:
            inbox.put((str(path), None if save_dir is None else str(save_dir)))
        reports = sorted((self._receive() for _ in self.inbox), key=lambda r: r["rank"])
        return reports

    def _receive(self) -> dict[str, Any]:
        report = self.outbox.get(timeout=600)
        if "line" in report or "error" in report:
            raise TrainerFailed(self._root_cause(report))
        return report

    def _root_cause(self, first: dict[str, Any]) -> str:
        """The one-line refusal among the failures reported (a rank whose peer refused fails in its next
        collective, with a traceback), else the first rank's traceback."""
        reports = [first]
        with contextlib.suppress(queue.Empty):
            while not any("line" in report for report in reports):
                reports.append(self.outbox.get(timeout=PEER_FAILURE_WAIT_S))
        line = next((report["line"] for report in reports if "line" in report), None)
        return line or f"trainer rank {first['rank']} failed:\n{first['error']}"

    def close(self, *, failed: bool = False) -> None:
        """Let every rank write its records and leave (``failed``: stop the ranks, which may wait in a
        collective for a peer that has gone)."""
        for inbox in self.inbox:
            inbox.put(None)
        for process in self.processes:
            if failed:
                process.terminate()
            process.join(timeout=60)
        self.init_file.unlink(missing_ok=True)


class TrainerFailed(Exception):
    """A trainer rank failed; the message is its one-line refusal, or its traceback for anything else."""


def megatron_argv(options: Options) -> list[str]:
    """A tiny fp32 GPT trained with SGD, no dropout, ``--dp-schedule`` with the controller's token cap."""
    return [
        "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--ffn-hidden-size", "32",
        "--seq-length", str(SEQ_LENGTH), "--max-position-embeddings", str(SEQ_LENGTH),
        "--micro-batch-size", "1", "--global-batch-size", str(options.dp), "--train-iters", "1000",
        "--lr", "0.01", "--min-lr", "0.01", "--lr-decay-style", "constant", "--optimizer", "sgd",
        "--sgd-momentum", "0.0", "--weight-decay", "0.0", "--clip-grad", "0.0",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--position-embedding-type", "learned_absolute",
        "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
        "--use-cpu-initialization", "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(VOCAB), "--log-interval", "1000", "--eval-iters", "0", "--seed", str(1234),
        "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", str(options.max_tokens_per_gpu),
        "--dp-schedule-collate-format", "bshd", "--dp-schedule-verify", "strict",
    ]


def trainer_main(rank: int, options: Options, init_file: str, inbox: Any, outbox: Any) -> None:
    """One trainer rank: set up Megatron on CPU, then train every plan the controller sends."""
    try:
        trainer = _Trainer(rank, options, init_file)
    except BaseException as error:  # noqa: BLE001 - reported to the controller
        outbox.put(_failure(rank, error))
        return
    while (message := inbox.get()) is not None:
        try:
            outbox.put(trainer.train_plan(Path(message[0]), save_dir=message[1]))
        except BaseException as error:  # noqa: BLE001 - reported to the controller
            outbox.put(_failure(rank, error))
            return
    trainer.finish()


def _failure(rank: int, error: BaseException) -> dict[str, Any]:
    """What a failed rank reports: the plugin's refusal (a ``ValueError`` it raised) as its one line, anything else
    (or everything, with ``DPSCHED_DEBUG=1``) as its traceback."""
    import traceback

    from megatron_dpsched.megatron.failures import PACKAGE, debug_requested, failure_line, raised_by

    if isinstance(error, ValueError) and not debug_requested() and raised_by(error, [PACKAGE]):
        return {"rank": rank, "line": failure_line(error, rank=rank, step=None)}
    return {"rank": rank, "error": "".join(traceback.format_exception(error))}


class _Trainer:
    """Megatron state of one trainer rank."""

    def __init__(self, rank: int, options: Options, init_file: str) -> None:
        import torch
        import torch.distributed as dist

        warnings.filterwarnings("ignore")
        logging.getLogger("megatron").setLevel(logging.WARNING)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(options.dp), LOCAL_RANK=str(rank),
                          CUDA_DEVICE_MAX_CONNECTIONS="1")
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=options.dp,
                                timeout=timedelta(seconds=300))
        torch.set_num_threads(1)
        from megatron_dpsched.testing import cpu_shim

        cpu_shim.install()
        self.rank, self.options = rank, options
        self.args = _megatron_args(options)
        self.model, self.optimizer, self.scheduler = _build_model()
        self.records_path = options.out / f"records.rank{rank}.json"
        self.records: list[dict[str, Any]] = []
        if options.resume is not None:
            self._load(options.resume)

    def train_plan(self, path: Path, *, save_dir: str | None) -> dict[str, Any]:
        """Train every step of one shipped plan with Megatron's ``train_step``."""
        from megatron.core import parallel_state

        from megatron_dpsched import DPSchedule
        from megatron_dpsched.megatron import CollateConfig, ScheduledDataIterator

        shipped = json.loads(path.read_text())
        schedule = DPSchedule.from_dict(shipped["schedule"])
        samples = shipped["samples"]
        feed = ScheduledDataIterator(schedule, rank=parallel_state.get_data_parallel_rank(),
                                     samples=_SampleTensors(samples), num_chunks=len(self.model),
                                     collate=CollateConfig(format="bshd"), verify="strict", vocab_size=VOCAB)
        losses = [self._train_step(feed, shipped["rollout"], samples) for _ in range(schedule.num_steps)]
        if save_dir is not None:
            self._save(Path(save_dir))
        return {"rank": self.rank, "losses": losses}

    def _train_step(self, feed: Any, rollout: int, samples: list[dict[str, Any]]) -> float:
        from megatron.core.utils import get_model_config
        from megatron.training import training

        from megatron_dpsched.megatron import ScheduledForwardStep

        trained: list[list[str]] = []
        forward_step = ScheduledForwardStep(
            on_batch=lambda batch: trained.append([samples[i]["key"] for i in batch["sample_ids"].tolist()]))
        self.args.curr_iteration = self.args.iteration
        result = training.train_step(forward_step, feed.megatron_iterators(), self.model, self.optimizer,
                                     self.scheduler, get_model_config(self.model[0]),
                                     training.get_forward_backward_func(), iteration=self.args.iteration)
        step = feed.current
        self.args.iteration += 1
        self.args.consumed_train_samples += step.num_samples
        loss = float(result[0]["lm loss"]) if result[0] else float("nan")
        self.records.append({"rollout": rollout, "step": step.step, "micro_batches": trained, "loss": loss,
                             "lr": self.scheduler.get_lr(self.optimizer.param_groups[0]),
                             "iteration": self.args.iteration,
                             "consumed_train_samples": self.args.consumed_train_samples,
                             "scheduler_num_steps": self.scheduler.num_steps})
        return loss

    def _save(self, directory: Path) -> None:
        import torch

        directory.mkdir(parents=True, exist_ok=True)
        torch.save({"model": [chunk.state_dict() for chunk in self.model], "scheduler": self.scheduler.state_dict(),
                    "iteration": self.args.iteration, "consumed_train_samples": self.args.consumed_train_samples},
                   directory / f"rank{self.rank}.pt")

    def _load(self, directory: Path) -> None:
        import torch

        saved = torch.load(directory / f"rank{self.rank}.pt", weights_only=False)
        for chunk, state in zip(self.model, saved["model"], strict=True):
            chunk.load_state_dict(state)
        if hasattr(self.optimizer, "reload_model_params"):
            self.optimizer.reload_model_params()
        self.scheduler.load_state_dict(saved["scheduler"])
        self.args.iteration = saved["iteration"]
        self.args.consumed_train_samples = saved["consumed_train_samples"]

    def finish(self) -> None:
        import torch.distributed as dist

        self.records_path.write_text(json.dumps(self.records, indent=1))
        dist.barrier()
        dist.destroy_process_group()


class _SampleTensors:
    """Sample id -> the tensors the collate step reads, from the shipped token ids."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        self.samples = samples

    def __call__(self, sample_id: int) -> dict[str, Any]:
        import torch

        sample = self.samples[sample_id]
        return {key: torch.tensor(sample[key], dtype=torch.long) for key in ("tokens", "labels", "loss_mask")}


def _megatron_args(options: Options) -> Any:
    """Megatron's ``parse_args`` + ``validate_args``, then the CPU set-up and ``setup_dp_schedule``."""
    from megatron.training.arguments import parse_args, validate_args

    from megatron_dpsched.megatron import add_dp_schedule_args, setup_dp_schedule
    from megatron_dpsched.testing import cpu_shim

    saved, sys.argv = sys.argv, ["rl_controller", *megatron_argv(options)]
    try:
        args = parse_args(extra_args_provider=add_dp_schedule_args)
    finally:
        sys.argv = saved
    validate_args(args)
    setup_dp_schedule(args)
    args.padded_vocab_size = VOCAB
    args.iteration, args.consumed_train_samples = 0, 0
    cpu_shim.initialize_megatron_on_cpu(args)
    return args


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None,
                   config: Any = None, pg_collection: Any = None) -> Any:
    """The tiny GPT (Megatron's local layer spec)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.training.arguments import core_transformer_config_from_args
    from megatron.training.global_vars import get_args

    args = get_args()
    return GPTModel(config=config or core_transformer_config_from_args(args),
                    transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=SEQ_LENGTH, pre_process=pre_process, post_process=post_process,
                    position_embedding_type="learned_absolute", vp_stage=vp_stage, pg_collection=pg_collection)


def _build_model() -> tuple[list[Any], Any, Any]:
    from megatron_dpsched.megatron.releases import compat_0_19_setup_model_and_optimizer

    return compat_0_19_setup_model_and_optimizer(model_provider)


# --------------------------------------------------------------------------------------------------- main


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output directory (plans, records, states)")
    parser.add_argument("--rollouts", type=int, default=3, help="rollouts in the whole job (default 3)")
    parser.add_argument("--prompts", type=int, default=5, help="prompts per rollout (default 5)")
    parser.add_argument("--samples-per-prompt", type=int, default=4, help="responses per prompt, a group (default 4)")
    parser.add_argument("--dp", type=int, default=2, help="trainer ranks, data-parallel (default 2)")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=64, help="token cap per micro-batch (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="rollout seed (default 0)")
    parser.add_argument("--save-state-after", type=int, metavar="K", help="save the job's state after K rollouts")
    parser.add_argument("--resume", type=Path, metavar="DIR", help="continue from a saved state_after_K directory")
    parser.add_argument("--quiet", action="store_true", help="only the example's own lines, the plugin's, warnings "
                        "and errors (no Megatron argument dump or step lines; megatron_dpsched.megatron.quiet)")
    values = vars(parser.parse_args(argv))
    options = Options(**values)
    _check(parser, options)
    if options.quiet:  # the spawned trainers inherit DPSCHED_QUIET and run quiet from add_dp_schedule_args on
        from megatron_dpsched.megatron import quiet

        quiet.install(keep=("rollout ", "trained rollouts", "saved: ", "resume: "))
    return options


def _check(parser: argparse.ArgumentParser, options: Options) -> None:
    for name in ("rollouts", "prompts", "samples_per_prompt", "dp", "max_tokens_per_gpu"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if options.samples_per_prompt % options.dp:
        parser.error("--samples-per-prompt must be a multiple of --dp (the last rollout trains a partial step)")
    if options.resume is not None and not (options.resume / "controller.json").is_file():
        parser.error(f"--resume {options.resume}: no controller.json there")


# ---------------------------------------------------------------------------------------- what the job says


def read_job(out: Path, *, dp: int) -> dict[str, Any] | None:
    """The plans and per-rank records a job wrote to ``out`` (``None`` without records of every rank)."""
    paths = [out / f"records.rank{rank}.json" for rank in range(dp)]
    if not all(path.is_file() for path in paths):
        return None
    plans = {int(path.stem.removeprefix("rollout_")): json.loads(path.read_text())
             for path in sorted((out / "plans").glob("rollout_*.json"))}
    return {"records": [json.loads(path.read_text()) for path in paths], "plans": plans}


def saved_line(options: Options, saved: Path | None) -> str:
    """Where the job saved: plans, records and (if it saved one) the state to resume from."""
    outputs = f"plans in {options.out / 'plans'}, per-rank records in {options.out}/records.rank*.json"
    if saved is not None:
        return f"saved: the state after {options.save_state_after} rollouts in {saved} (continue with --resume " \
               f"{saved}); {outputs}"
    if options.save_state_after is not None:
        return f"saved: {outputs}; no state: this job trained no rollout after which --save-state-after " \
               f"{options.save_state_after} saves"
    return f"saved: {outputs}; no state (--save-state-after K saves one)"


def resume_line(options: Options, *, before: dict[str, Any] | None, rollouts: range) -> tuple[str, bool]:
    """Whether this resumed job matched the job that saved its state (``before``: that job's plans and records)
    on the rollouts both trained; the line to print and whether it matched (or could not be compared)."""
    source = f"the job that saved {options.resume} (its --out {options.resume.parent})"
    if not rollouts:
        return f"resume: not compared: this job trained no rollout (the state is after rollout {rollouts.start - 1})", \
            True
    after = read_job(options.out, dp=options.dp)
    common = [r for r in rollouts if before is not None and r in before["plans"]
              and all(any(rec["rollout"] == r for rec in rank) for rank in before["records"])]
    if not common or after is None:
        return f"resume: not compared: {source} has no records of rollouts {rollouts.start}..{rollouts[-1]}", True
    for rollout in common:
        difference = _difference(before, after, rollout=rollout)
        if difference is not None:
            return f"resume: DIFFERS from {source}: rollout {rollout}: {difference}", False
    return (f"resume: matches {source}: rollouts {common[0]}..{common[-1]} planned the same, and trained with the "
            f"same micro-batches, losses, learning rates, iterations and consumed samples on {options.dp} ranks"), True


def _difference(before: dict[str, Any], after: dict[str, Any], *, rollout: int) -> str | None:
    """How ``after`` trained ``rollout`` otherwise than ``before`` (``None``: the same)."""
    if after["plans"].get(rollout, {}).get("schedule") != before["plans"][rollout]["schedule"]:
        return "another plan"
    for rank, (old, new) in enumerate(zip(before["records"], after["records"], strict=True)):
        olds, news = ([rec for rec in records if rec["rollout"] == rollout] for records in (old, new))
        for step, (was, now) in enumerate(zip(olds, news, strict=False)):
            changed = [key for key in TRAINED if was[key] != now[key]]
            if changed:
                return f"rank {rank}, step {step}: {changed[0]} {now[changed[0]]!r}, was {was[changed[0]]!r}"
        if len(olds) != len(news):
            return f"rank {rank}: {len(news)} steps, was {len(olds)}"
    return None


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_options(argv)
    sys.path.insert(0, str(REPO))
    if options.out.exists() and options.resume is None:
        shutil.rmtree(options.out / "plans", ignore_errors=True)
    options.out.mkdir(parents=True, exist_ok=True)
    state, before = ControllerState(), None
    if options.resume is not None:
        state = ControllerState(**json.loads((options.resume / "controller.json").read_text()))
        before = read_job(options.resume.parent, dp=options.dp)  # read before this job writes (maybe there)
    first, failed, trainers = state.next_rollout, True, Trainers(options)
    try:
        saved = run_controller(options, state, trainers)
        failed = False
    except TrainerFailed as failure:
        print(failure, file=sys.stderr, flush=True)
    finally:
        trainers.close(failed=failed)
    if failed:
        from megatron_dpsched.megatron.failures import EXIT_CODE

        sys.exit(EXIT_CODE)  # a refused run, as the plugin's one-line errors end
    print(f"trained rollouts {first}..{state.next_rollout - 1} on {options.dp} ranks", flush=True)
    print(saved_line(options, saved), flush=True)
    if options.resume is not None:
        line, matched = resume_line(options, before=before, rollouts=range(first, state.next_rollout))
        print(line, flush=True)
        if not matched:
            sys.exit(DIFFERS_EXIT_CODE)


if __name__ == "__main__":
    main()
