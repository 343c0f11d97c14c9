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
optimizer state). Takes about half a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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


def run_controller(options: Options, state: ControllerState, trainers: Any) -> None:
    """Make, plan, ship and train rollouts until ``options.rollouts``; save the state where asked."""
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
            _save_controller(options.out / f"state_after_{state.next_rollout}", state)


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
        for queue in self.inbox:
            queue.put((str(path), None if save_dir is None else str(save_dir)))
        reports = sorted((self._receive() for _ in self.inbox), key=lambda r: r["rank"])
        return reports

    def _receive(self) -> dict[str, Any]:
        report = self.outbox.get(timeout=600)
        if "error" in report:
            self.close()
            raise RuntimeError(f"trainer rank {report['rank']} failed:\n{report['error']}")
        return report

    def close(self) -> None:
        for queue in self.inbox:
            queue.put(None)
        for process in self.processes:
            process.join(timeout=60)
        self.init_file.unlink(missing_ok=True)


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
    import traceback

    try:
        trainer = _Trainer(rank, options, init_file)
    except BaseException:  # noqa: BLE001 - reported to the controller
        outbox.put({"rank": rank, "error": traceback.format_exc()})
        return
    while (message := inbox.get()) is not None:
        try:
            outbox.put(trainer.train_plan(Path(message[0]), save_dir=message[1]))
        except BaseException:  # noqa: BLE001 - reported to the controller
            outbox.put({"rank": rank, "error": traceback.format_exc()})
            return
    trainer.finish()


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

        quiet.install(keep=("rollout ", "trained rollouts"))
    return options


def _check(parser: argparse.ArgumentParser, options: Options) -> None:
    for name in ("rollouts", "prompts", "samples_per_prompt", "dp", "max_tokens_per_gpu"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if options.samples_per_prompt % options.dp:
        parser.error("--samples-per-prompt must be a multiple of --dp (the last rollout trains a partial step)")
    if options.resume is not None and not (options.resume / "controller.json").is_file():
        parser.error(f"--resume {options.resume}: no controller.json there")


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_options(argv)
    sys.path.insert(0, str(REPO))
    if options.out.exists() and options.resume is None:
        shutil.rmtree(options.out / "plans", ignore_errors=True)
    options.out.mkdir(parents=True, exist_ok=True)
    state = ControllerState()
    if options.resume is not None:
        state = ControllerState(**json.loads((options.resume / "controller.json").read_text()))
    first = state.next_rollout
    trainers = Trainers(options)
    try:
        run_controller(options, state, trainers)
    finally:
        trainers.close()
    print(f"trained rollouts {first}..{state.next_rollout - 1}; records in {options.out}/records.rank*.json")


if __name__ == "__main__":
    main()
