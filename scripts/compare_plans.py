"""Compare the plans of two checkouts on random cases: a speed change must leave every plan as it was.

Draws ``--cases`` random planner calls (seeded: data-parallel sizes 1-100, 1-33 samples per rank, 1-5 steps,
uniform / bimodal / log-normal / rare giants past the cap / equal lengths, caps 512-4096, padded rows,
``balance="none"``, PP 2 and 4 with and without VPP 2 and a step-time model, ``drop_last``), plans each with
:func:`megatron_dpsched.build_dp_schedule` in a process whose ``PYTHONPATH`` is that checkout, and compares the
SHA-1 of each plan's ``to_dict()`` (or the error a call raised) between the two::

    git archive BASE megatron_dpsched | tar -x -C /tmp/base
    python scripts/compare_plans.py /tmp/base . --cases 500 --seed 11

It prints the number of cases, plans and errors, and each case that differs; exit status 1 when one does.
``tests/unit/test_plan_digests.py`` keeps fixed plans; this draws new ones each seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

DISTRIBUTIONS = ("uniform", "bimodal", "lognormal", "giants", "equal")


def draw_lengths(rng: random.Random, count: int, *, cap: int, distribution: str) -> list[int]:
    """``count`` lengths of one distribution under (and, for giants and the log-normal tail, past) ``cap``."""
    if distribution == "uniform":
        return [rng.randint(1, cap) for _ in range(count)]
    if distribution == "bimodal":
        return [rng.choice([rng.randint(1, cap // 8), rng.randint(cap // 2, cap)]) for _ in range(count)]
    if distribution == "lognormal":
        return [max(1, min(4 * cap, int(rng.lognormvariate(5, 1.2)))) for _ in range(count)]
    if distribution == "giants":
        return [rng.randint(2 * cap, 5 * cap) if rng.random() < 0.03 else rng.randint(1, cap // 3)
                for _ in range(count)]
    return [cap // 3 + 1] * count


def draw_case(rng: random.Random) -> tuple[list[int], dict[str, Any]]:
    """One planner call: the lengths and the keyword arguments (the step-time model as its three numbers)."""
    dp, per_rank = rng.choice([1, 2, 3, 8, 16, 64, 100]), rng.choice([1, 2, 3, 5, 8, 16, 33])
    steps = rng.choice([1, 2, 5])
    cap = rng.choice([512, 1024, 4096])
    count = dp * per_rank * steps - rng.choice([0, 0, 1, dp // 2])
    lengths = draw_lengths(rng, count, cap=cap, distribution=rng.choice(DISTRIBUTIONS))
    kwargs: dict[str, Any] = {"dp_size": dp, "global_batch_size": dp * per_rank, "max_tokens_per_gpu": cap}
    shape = rng.random()
    if shape < 0.15:
        kwargs.update(padded_rows=True, pad_multiple=rng.choice([1, 8]))
    elif shape < 0.25:
        kwargs["balance"] = "none"
    pp = rng.choice([1, 1, 2, 4])
    if pp > 1:
        kwargs["pp_size"] = pp
        if rng.random() < 0.5:
            kwargs["vpp_size"] = 2
        if rng.random() < 0.7:
            kwargs["step_time_model"] = [1e-6, rng.choice([0.0, 1e-9]), rng.choice([0.0, 1e-3, 1e-2])]
    if rng.random() < 0.2:
        kwargs["drop_last"] = True
    return lengths, kwargs


def plan_digests(seed: int, cases: int) -> list[str]:
    """Each case's plan digest, or its error's type and first words (in this process's checkout)."""
    from megatron_dpsched import build_dp_schedule
    from megatron_dpsched.core import StepTimeModel

    rng, out = random.Random(seed), []
    for _ in range(cases):
        lengths, kwargs = draw_case(rng)
        if "step_time_model" in kwargs:
            token, pair, micro_batch = kwargs["step_time_model"]
            kwargs["step_time_model"] = StepTimeModel(seconds_per_token=token, seconds_per_token_pair=pair,
                                                      seconds_per_microbatch=micro_batch)
        try:
            text = json.dumps(build_dp_schedule(lengths, **kwargs).to_dict(), sort_keys=True, default=str)
            out.append(hashlib.sha1(text.encode()).hexdigest())
        except ValueError as error:
            out.append(f"error {type(error).__name__}: {str(error)[:80]}")
    return out


def run_in(checkout: Path, seed: int, cases: int) -> list[str]:
    """:func:`plan_digests` in a fresh process planning with ``checkout``'s package."""
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    done = subprocess.run([sys.executable, __file__, "--digests", "--seed", str(seed), "--cases", str(cases)],
                          env=env, check=True, capture_output=True, text=True)
    return done.stdout.splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, nargs="?", help="the checkout (a folder holding megatron_dpsched/) before")
    parser.add_argument("head", type=Path, nargs="?", help="the checkout after")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--digests", action="store_true", help=argparse.SUPPRESS)  # this process's digests
    args = parser.parse_args(argv)
    if args.digests:
        print("\n".join(plan_digests(args.seed, args.cases)))
        return 0
    if args.base is None or args.head is None:
        parser.error("give the two checkouts to compare")
    base, head = run_in(args.base, args.seed, args.cases), run_in(args.head, args.seed, args.cases)
    differ = [case for case, (a, b) in enumerate(zip(base, head, strict=True)) if a != b]
    errors = sum(line.startswith("error ") for line in head)
    print(f"{args.cases} cases (seed {args.seed}): {args.cases - errors} plans, {errors} refused with an error; "
          f"{len(differ)} differ" + "".join(f"\n  case {c}: {base[c]} -> {head[c]}" for c in differ))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
