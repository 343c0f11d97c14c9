"""Step 5's ``U`` made only where a decision needs it (``planning._GlobalCount``): the any-fit bound it uses
holds for the global packing, ``below`` answers as the packing's count does (padded rows: always the packing's
count), and a step whose decisions the bound settles plans without the global packing, the same plan as with ``U``
made at once."""

from __future__ import annotations

import random

import numpy as np
import pytest
from plan_lists import plan_step

from megatron_dpsched.core import planning
from megatron_dpsched.core.config import ScheduleConfig
from megatron_dpsched.core.padding import array_tuple


def _sizes(rng: random.Random, cap: int) -> list[int]:
    kind = rng.randrange(5)
    count = rng.randint(1, 400)
    if kind == 4:  # sizes of 0 (all in one micro-batch) and 1
        return [rng.choice((0, 0, 1)) for _ in range(rng.randint(1, 3))]
    if kind == 0:
        return [rng.randint(1, cap) for _ in range(count)]
    if kind == 1:
        return [rng.choice((rng.randint(0, cap // 8), rng.randint(cap // 2, cap))) for _ in range(count)]
    if kind == 2:
        return [rng.randint(cap // 3, cap // 2 + 1) for _ in range(count)]
    return [rng.randint(1, cap) if rng.random() > 0.05 else rng.randint(cap + 1, 3 * cap) for _ in range(count)]


@pytest.mark.parametrize("seed", range(200))
def test_any_fit_bound_and_below(seed: int) -> None:
    rng = random.Random(f"global-count-{seed}")
    cap = rng.choice((16, 100, 1000))
    sizes = _sizes(rng, cap)
    config = ScheduleConfig(dp_size=rng.choice((1, 2, 3, 8)), global_batch_size=len(sizes), max_tokens_per_gpu=cap,
                            pp_size=rng.choice((1, 2, 4)), padded_rows=seed % 5 == 0)
    bins = planning._global_packing(sizes, config)
    if not config.padded_rows:  # at most one micro-batch at most half full
        fills = sorted(sum(sizes[i] for i in b) for b in bins)
        assert all(2 * fill > cap for fill in fills[1:]), fills
        assert len(bins) <= 2 * sum(sizes) // cap + 1
    exact = planning._bins_count(bins, config)
    for count in range(1, exact + 6):
        assert planning._GlobalCount(array_tuple(sizes, np.int64), config).below(count) == (exact < count)


def test_a_step_the_bound_settles_skips_the_global_packing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bimodal lengths on many ranks: the busiest rank stays above balance at every count (three long samples on
    some ranks, two on others), and the tail's ``B`` exceeds the any-fit bound, so ``U`` is never needed."""
    rng = random.Random(5)
    lengths = [rng.randint(1, 100) if rng.random() < 0.7 else rng.randint(600, 819) for _ in range(2048)]
    config = ScheduleConfig(dp_size=256, global_batch_size=len(lengths), max_tokens_per_gpu=819)
    costs = array_tuple([n + n * n / 2000 for n in lengths], np.float64)
    with monkeypatch.context() as patch:  # ``U`` made at once, as step 5 made it before it was made lazily
        start = planning._GlobalCount.__init__

        def eager(self: planning._GlobalCount, *args: object) -> None:
            start(self, *args)
            self.exact()

        patch.setattr(planning._GlobalCount, "__init__", eager)
        expected = plan_step(range(len(lengths)), lengths=lengths, costs=costs, config=config)
    made, refined = [], []
    packing, refine = planning._global_packing, planning._refine
    monkeypatch.setattr(planning, "_global_packing", lambda sizes, config: made.append(1) or packing(sizes, config))
    monkeypatch.setattr(planning, "_refine", lambda *args, **kwargs: refined.append(1) or refine(*args, **kwargs))
    assert plan_step(range(len(lengths)), lengths=lengths, costs=costs, config=config) == expected
    assert not made
    assert len(refined) >= 2  # unbalanced at two counts or more: where ``U`` was made before it was made lazily
