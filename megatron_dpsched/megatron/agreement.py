"""Every rank of the job holds the same plan for the step it is about to run, or every rank stops.

Each rank plans (or reads) the step itself, so nothing but a check ties the ranks
together: a rank that read its lengths in another order, or from another file,
would train other samples (some twice, some never), or run another micro-batch
count and hang or crash in a pipeline transfer. Before each scheduled step the
ranks of the default process group (the whole DP x PP x CP x TP x EP world)
all-reduce ``[fingerprint, -fingerprint]`` with MAX, one two-element integer
collective: equal plans give ``max == min``. On a mismatch every rank learns it
from the same collective, gathers who holds what (a second collective, only on
this error path) and raises the same ``ValueError`` naming the step and the
ranks of each plan, before any micro-batch runs. The fingerprint covers the
content of the step's samples too (a digest of every sample's token ids), so
ranks that read the same lengths from other data disagree here; the message
then says that the content differs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from megatron_dpsched.megatron.feeds import StepBatches, StepFeed
from megatron_dpsched.runtime.job_identity import rank_ranges


def group_device() -> torch.device:
    """Where the default group's collectives run: the current GPU with NCCL, else the host."""
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_on_step(feed: StepFeed, step: StepBatches) -> None:
    """Raise ``ValueError`` on every rank unless every rank of the job holds ``step.fingerprint``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    device = group_device()
    bounds = torch.tensor([step.fingerprint, -step.fingerprint], dtype=torch.int64, device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    highest, lowest = int(bounds[0]), -int(bounds[1])
    if highest == lowest == step.fingerprint:
        return
    mine = torch.tensor([step.step, step.fingerprint, step.content], dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    held = [(int(s), int(f)) for s, f, _ in everyone]
    raise ValueError(plan_disagreement_message(feed.name, held, contents=[int(c) for _, _, c in everyone]))


def plan_disagreement_message(feed_name: str, held: list[tuple[int, int]], *, contents: list[int] | None = None) -> str:
    """One message naming, for each distinct (step, fingerprint), the global ranks that hold it; with
    ``contents`` (each rank's digest of its step's sample content) that differ, the ranks of each content."""
    ranks: dict[tuple[int, int], list[int]] = defaultdict(list)
    for rank, key in enumerate(held):
        ranks[key].append(rank)
    parts = [f"ranks {rank_ranges(members)} step {step} fingerprint {fingerprint:#018x}"
             for (step, fingerprint), members in sorted(ranks.items(), key=lambda item: item[1][0])]
    steps = sorted({step for step, _ in held})
    return (f"dp-schedule: the ranks hold different plans for {feed_name} step {'/'.join(map(str, steps))} "
            f"({'; '.join(parts)}){_content_part(contents)}; every rank must plan from the same lengths, in the "
            "same order, with the same flags. Nothing of this step ran.")


def _content_part(contents: list[int] | None) -> str:
    """``", and other sample content (ranks 0 content 0x..; ranks 1 content 0x..)"`` where contents differ."""
    if not contents or len(set(contents)) == 1:
        return ""
    ranks: dict[int, list[int]] = defaultdict(list)
    for rank, content in enumerate(contents):
        ranks[content].append(rank)
    parts = [f"ranks {rank_ranges(members)} content {content:#018x}"
             for content, members in sorted(ranks.items(), key=lambda item: item[1][0])]
    return f", and other sample content: the same planned lengths hold other token ids ({'; '.join(parts)})"


def log_first_step(feed: StepFeed, step: StepBatches, *, print_fn: Any = print) -> None:
    """On global rank 0, once per feed: where it starts (or resumes) and its first plan's fingerprint."""
    import torch.distributed as dist

    if feed.steps_begun != 1 or (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0):
        return
    verb = "resumes" if feed.start_position else "starts"
    print_fn(f"dp-schedule: {feed.name} feed {verb} at step {step.step} (consumed_samples={feed.start_position}); "
             f"{step.num_microbatches} micro-batches per rank, plan fingerprint {step.fingerprint:#018x}. "
             f"Megatron's constant 'number of microbatches' is only its sample-accounting unit here: each step "
             f"runs its plan's count (logged as 'dp-schedule step ...: micro-batches per rank')", flush=True)
