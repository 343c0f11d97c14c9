"""``calibrate``'s identifiability threshold: a design whose columns are dependent to one part in a billion
cannot tell the coefficients apart (issue 27, "Tests that catch")."""

from __future__ import annotations

import random

import pytest

from megatron_dpsched.calibration import check_identifiable


def _rows(relative_wobble: float) -> list[list[float]]:
    """Tokens and squared lengths that vary freely; the micro-batch column is ``tokens / 500`` times
    ``1 + wobble`` with a wobble of at most ``relative_wobble``: for a tiny wobble the per-micro-batch and
    per-token seconds cannot be told apart."""
    rng = random.Random(7)
    rows = []
    for _ in range(40):
        tokens = rng.randint(1000, 9000)
        squares = rng.randint(10**5, 10**8)
        rows.append([float(tokens), float(squares), tokens / 500 * (1 + rng.uniform(-1, 1) * relative_wobble)])
    return rows


@pytest.mark.parametrize("wobble", [1e-9, 1e-10])
def test_columns_dependent_to_one_part_in_a_billion_are_refused(wobble: float) -> None:
    with pytest.raises(ValueError, match=r"per-micro-batch seconds \(seconds_per_microbatch\) cannot be told from "
                                         r"the per-token seconds"):
        check_identifiable(_rows(wobble))


@pytest.mark.parametrize("wobble", [1e-2, 1e-4])
def test_columns_that_vary_apart_are_accepted(wobble: float) -> None:
    check_identifiable(_rows(wobble))
