"""The over-cap message's count, at the edge of the listed samples (issue 27, "Tests that catch")."""

from __future__ import annotations

import pytest

from megatron_dpsched.runtime.over_cap import describe, find_over_cap, over_cap_notice


@pytest.mark.parametrize("count", [1, 4, 5, 6, 12])
def test_the_message_counts_every_over_cap_sample_and_the_ones_it_does_not_list(count: int) -> None:
    lengths = [10] * 3 + [101 + i for i in range(count)] + [20]
    text = describe(find_over_cap(lengths, token_cap=100), dataset="train")
    assert text.startswith(f"{count} sample(s) of the train dataset are over the token cap of 100")
    listed = min(count, 5)
    assert text.count(" tokens)") == listed
    if count > listed:
        assert f" and {count - listed} more;" in text
    else:
        assert " more;" not in text
    with pytest.raises(ValueError, match=f"^--dp-schedule-over-cap refuse: {count} sample\\(s\\) of the valid dataset"):
        over_cap_notice(find_over_cap(lengths, token_cap=100), policy="refuse", dataset="valid")
