"""Blends, splits and epoch orders (``megatron_dpsched.data.sampling``): Megatron's semantics, pure."""

from __future__ import annotations

import random

import pytest

from megatron_dpsched.data.sampling import (
    SampleOrder,
    blending_indices,
    epoch_permutation,
    parse_blend,
    parse_split,
    split_ranges,
)


@pytest.mark.parametrize(("values", "expected"), [
    (["a.jsonl"], (("a.jsonl",), None)),
    (["a", "b"], (("a", "b"), None)),
    (["30", "a", "70", "b"], (("a", "b"), (30.0, 70.0))),
    (["0.25", " a ", "1e0", "b"], (("a", "b"), (0.25, 1.0))),
    (["a", "b", "c"], (("a", "b", "c"), None)),
])
def test_blend_lists_read_as_megatron_reads_them(values, expected) -> None:
    assert parse_blend(values, flag="--data-path") == expected


@pytest.mark.parametrize(("values", "message"), [
    ([], "--data-path needs at least one dataset prefix"),
    (["1", "a", "b", "c"], "--data-path mixes weights and prefixes"),
    (["0", "a", "1", "b"], "--data-path: every weight must be a finite number > 0; got 0.0"),
    (["-1", "a", "1", "b"], "--data-path: every weight must be a finite number > 0"),
    (["inf", "a", "1", "b"], "--data-path: every weight must be a finite number > 0"),
])
def test_bad_blend_lists_name_the_flag(values, message) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_blend(values, flag="--data-path")


def test_split_parsing_normalizes_and_pads() -> None:
    assert parse_split("969,30,1") == pytest.approx((0.969, 0.030, 0.001))
    assert parse_split("90, 10") == pytest.approx((0.9, 0.1, 0.0))
    assert parse_split("1") == (1.0, 0.0, 0.0)
    for bad in ("", "0,0,0", "1,2,3,4", "abc"):
        with pytest.raises(ValueError, match="^--split takes up to three"):
            parse_split(bad)


def test_split_ranges_are_contiguous_and_rounded_like_megatron() -> None:
    train, valid, test = split_ranges(48, parse_split("969,30,1"))
    assert (train, valid, test) == (range(0, 47), range(47, 48), range(48, 48))
    assert split_ranges(10, parse_split("100,0,0")) == (range(0, 10), None, None)
    assert split_ranges(10, parse_split("6,2,2")) == (range(0, 6), range(6, 8), range(8, 10))


def _greedy(weights: list[float], size: int) -> list[int]:
    """The documented algorithm, written again: the dataset lagging its share most, lowest index on a tie."""
    shares = [w / sum(weights) for w in weights]
    drawn, out = [0] * len(weights), []
    for i in range(size):
        errors = [s * max(i, 1) - n for s, n in zip(shares, drawn)]
        d = errors.index(max(errors))
        out.append(d)
        drawn[d] += 1
    return out


@pytest.mark.parametrize("weights", [[1, 3], [0.3, 0.7], [5, 1, 2]])
def test_blending_follows_the_weights_and_counts_each_dataset(weights) -> None:
    index, sample = blending_indices(weights, 200)
    assert index == _greedy(weights, 200)
    for d in range(len(weights)):
        assert [s for i, s in zip(index, sample) if i == d] == list(range(index.count(d)))
        assert abs(index.count(d) - 200 * weights[d] / sum(weights)) <= 1


@pytest.mark.slow
def test_blending_matches_megatrons_helper_where_it_imports() -> None:
    numpy = pytest.importorskip("numpy")
    helpers = pytest.importorskip("megatron.core.datasets.helpers_cpp")
    for weights in ([1.0, 3.0], [0.3, 0.7], [5.0, 1.0, 2.0]):
        shares = numpy.array(weights) / numpy.sum(weights)
        dataset_index = numpy.zeros(500, dtype=numpy.int16)
        sample_index = numpy.zeros(500, dtype=numpy.int64)
        helpers.build_blending_indices(dataset_index, sample_index, shares, len(weights), 500, False)
        assert (dataset_index.tolist(), sample_index.tolist()) == blending_indices(weights, 500)


def test_epoch_permutations_are_deterministic_and_differ_by_seed_and_epoch() -> None:
    first = epoch_permutation(100, seed=1234, epoch=0)
    assert first == epoch_permutation(100, seed=1234, epoch=0)
    assert sorted(first) == list(range(100))
    expected = list(range(100))
    random.Random("1234:0").shuffle(expected)
    assert first == expected
    assert first != epoch_permutation(100, seed=1234, epoch=1)
    assert first != epoch_permutation(100, seed=1235, epoch=0)


def test_single_order_is_one_pass_in_order() -> None:
    order = SampleOrder(10)
    assert order.take(0, 4) == ([0, 1, 2, 3], None)
    assert order.take(8, 4) == ([8, 9], None)
    assert order.take(10, 4) == ([], None)
    assert order.total == 10


def test_cyclic_order_wraps_with_a_fresh_permutation_per_epoch() -> None:
    order = SampleOrder(10, cyclic=True, seed=7)
    stream = order.take(0, 35)[0]
    epochs = [epoch_permutation(10, seed=7, epoch=e) for e in range(4)]
    assert stream == [i for e in epochs for i in e][:35]
    assert order.total is None
    fresh = SampleOrder(10, cyclic=True, seed=7)  # a resumed job: any position gives the same samples
    assert fresh.take(17, 8)[0] == stream[17:25]


def test_groups_are_permuted_as_units_and_stay_whole() -> None:
    groups = ["a", "a", "b", "c", "c", "c", "d", "b"]  # 'b' is not contiguous in the dataset
    single = SampleOrder(len(groups), groups=groups)
    assert single.take(0, 2) == ([0, 1, 2, 7], [0, 0, 2, 2])
    order = SampleOrder(len(groups), cyclic=True, seed=3, groups=groups)
    units = [[0, 1], [2, 7], [3, 4, 5], [6]]
    for epoch in range(3):
        samples, starts = order.epoch(epoch)
        expected = [units[u] for u in epoch_permutation(4, seed=3, epoch=epoch)]
        assert samples == [i for unit in expected for i in unit]
        assert [samples[a:b] for a, b in zip(starts, starts[1:])] == expected
    ids, keys = order.take(0, 6)  # crosses into epoch 1, whole units only
    assert len(set(keys)) == 6 and ids[:8] == order.epoch(0)[0]
    starts = order.epoch(0)[1]
    inside = next(a + 1 for a, b in zip(starts, starts[1:]) if b - a > 1)
    with pytest.raises(ValueError, match="falls inside a group"):
        order.take(inside, 1)


@pytest.mark.parametrize("text", ["1,-1,1", "-5,1", "1e3,1", "1.2.3", "."])
def test_split_with_signs_exponents_or_malformed_numbers_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--split takes up to three non-negative shares"):
        parse_split(text)


@pytest.mark.parametrize("values", [
    ["1e308", "a", "1e308", "b", "1", "c"],
    ["1.7e308", "a", "1.7e308", "b"],
])
def test_blend_weights_must_have_a_finite_sum(values) -> None:
    with pytest.raises(ValueError, match=r"^--data-path: the weights must have a finite sum .*; got 1"):
        parse_blend(values, flag="--data-path")
    assert parse_blend(["1e307", "a", "1e307", "b"], flag="--data-path")[1] == (1e307, 1e307)


class _Lengths:
    """A dataset of ``count`` samples (``lengths`` only) named ``path``."""

    def __init__(self, path: str, count: int) -> None:
        self.path, self.lengths = path, [1 + i % 7 for i in range(count)]

    def __len__(self) -> int:
        return len(self.lengths)


def _split_and_blend(values: list[str], *, counts: dict[str, int], split: str, sizes: list) -> list:
    from megatron_dpsched.data.compose import split_and_blend

    datasets = {name: _Lengths(name, count) for name, count in counts.items()}
    return split_and_blend(values, flag="--data-path", open_dataset=datasets.__getitem__, split=parse_split(split),
                           sizes=sizes, repeat=True)


def test_a_weighted_component_empty_in_a_split_is_refused_naming_it_and_the_split() -> None:
    # B's 3 samples: train 0:3 (round(0.9 x 3) = 3), validation 3:3, nothing
    with pytest.raises(ValueError, match=r"^--data-path: B.jsonl has no sample in the valid split \(3 samples, "
                                         r"valid range 3:3\) while the blend gives it a weight"):
        _split_and_blend(["0.5", "A.jsonl", "0.5", "B.jsonl"], counts={"A.jsonl": 100, "B.jsonl": 3},
                         split="90,10,0", sizes=[10, 4, 0])
    train, valid, _ = _split_and_blend(["0.5", "A.jsonl", "0.5", "B.jsonl"], counts={"A.jsonl": 100, "B.jsonl": 30},
                                       split="90,10,0", sizes=[10, 4, 0])
    assert set(valid.dataset_index) == {0, 1} and len(train) == 10
    # without weights Megatron weighs by size: an empty part weighs 0, as before
    _, unweighted, _ = _split_and_blend(["A.jsonl", "B.jsonl"], counts={"A.jsonl": 100, "B.jsonl": 3},
                                        split="90,10,0", sizes=[10, 4, 0])
    assert unweighted.path == "A.jsonl[90:100] (valid split)"  # B left out, as before


def test_a_component_the_blend_draws_nothing_from_is_a_warning_naming_it() -> None:
    from megatron_dpsched.data.compose import BlendedDataset

    a, b, c = _Lengths("A.jsonl", 100), _Lengths("B.jsonl", 100), _Lengths("C.jsonl", 100)
    with pytest.warns(UserWarning, match=r"^--data-path: the blend of 4 samples draws none from C.jsonl "
                                         r"\(share 0.001\)") as caught:
        blended = BlendedDataset([a, b, c], weights=[998, 1, 1], size=4, repeat=False)
    assert blended.dataset_index == [0, 1, 0, 0] and len(caught) == 1
