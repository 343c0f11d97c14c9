"""Blends, splits, epochs and prefetching through the GPT entry point (``--cpu-dry-run``, DP=2, gloo).

* A two-file blend ``--data-path 1 A 3 B --split 6,2,2 --dataloader-type cyclic``: the samples each step
  trains, and which file each comes from, are what Megatron's own blending helper (``helpers_cpp``)
  and the documented per-epoch permutation (``random.Random(f"{seed}:{epoch}")``) give, recomputed here.
* ``--dataloader-type cyclic`` over three epochs of a 20-sample corpus: a job saved in the middle of
  epoch 2 and resumed trains what the uninterrupted job trains (sample ids, losses, consumed samples,
  fingerprints, every rank), and ``--dp-schedule-prefetch off`` trains bit-identically to ``on``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest
from entry import errors, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron.step_recorder import load_plans, load_step_records

pytestmark = pytest.mark.distributed

SEED, GLOBAL_BATCH = 1234, 8
A_LENGTHS, B_LENGTHS = [9, 30, 4, 17, 25, 3, 12, 40], [5, 20, 11, 33, 7, 14, 26, 2]


def _rows(lengths: list[int], count: int, base: int) -> list[list[int]]:
    return [[base + (3 * i + j) % 27 for j in range(lengths[i % len(lengths)] + 1)] for i in range(count)]


def _stream(size: int, epochs: int) -> list[int]:
    """The documented cyclic order, written again: epoch ``e`` is ``range(size)`` shuffled by
    ``random.Random(f"{seed}:{e}")``."""
    out = []
    for epoch in range(epochs):
        order = list(range(size))
        random.Random(f"{SEED}:{epoch}").shuffle(order)
        out += order
    return out


def _run(argv: list[str]) -> str:
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    return log


def _argv(data: list[str], stats: Path, *extra: str, train_iters: int) -> list[str]:
    return [*tiny_gpt_argv(), "--data-path", *data, "--global-batch-size", str(GLOBAL_BATCH),
            "--train-iters", str(train_iters), "--lr", "1e-3", "--eval-iters", "0", "--seed", str(SEED),
            "--dataloader-type", "cyclic", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48",
            "--step-stats-dir", str(stats), *extra]


def _steps(records: list[dict]) -> dict[int, list[int]]:
    """Sample ids trained per iteration over all ranks, sorted."""
    ids = defaultdict(list)
    for record in records:
        ids[record["iteration"]] += [i for mb in record["micro_batch_ids"] for i in mb]
    return {iteration: sorted(values) for iteration, values in ids.items()}


def _megatron_blend(weights: list[float], size: int) -> tuple[list[int], list[int]]:
    numpy = pytest.importorskip("numpy")
    helpers = pytest.importorskip("megatron.core.datasets.helpers_cpp")
    shares = numpy.array(weights, dtype=numpy.float64) / numpy.sum(weights)
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    sample_index = numpy.zeros(size, dtype=numpy.int64)
    helpers.build_blending_indices(dataset_index, sample_index, shares, len(weights), size, False)
    return dataset_index.tolist(), sample_index.tolist()


def test_a_split_blend_trains_each_file_in_the_proportions_of_weights_and_seed(tmp_path: Path) -> None:
    a = write_token_jsonl(tmp_path / "a.jsonl", _rows(A_LENGTHS, 50, 0))
    b = write_token_jsonl(tmp_path / "b.jsonl", _rows(B_LENGTHS, 50, 60))
    iters = 3
    _run(_argv(["1", str(a), "3", str(b)], tmp_path / "stats", "--split", "6,2,2", train_iters=iters))
    records = load_step_records(tmp_path / "stats")
    size = iters * GLOBAL_BATCH  # the train blend holds what Megatron reads: --train-iters x --global-batch-size
    dataset_index, sample_index = _megatron_blend([1.0, 3.0], size)
    stream = _stream(size, 1)
    lengths = (A_LENGTHS, B_LENGTHS)
    trained = _steps(records)
    assert sorted(trained) == list(range(iters))
    for iteration, ids in trained.items():
        assert ids == sorted(stream[iteration * GLOBAL_BATCH:(iteration + 1) * GLOBAL_BATCH])
        tokens = sum(r["tokens"] for r in records if r["iteration"] == iteration)
        rows = [(dataset_index[p], sample_index[p]) for p in ids]
        assert all(row < 30 for _, row in rows), "train samples come from each file's train split (60%)"
        assert tokens == sum(lengths[d][row % 8] for d, row in rows)
    files = [dataset_index[p] for ids in trained.values() for p in ids]
    assert (files.count(0), files.count(1)) == (6, 18)  # weights 1:3


@pytest.fixture(scope="module")
def cyclic(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 20-sample corpus; 8 steps of 8 samples = 3.2 epochs, with prefetching on (the default) and off."""
    root = tmp_path_factory.mktemp("cyclic")
    corpus = write_token_jsonl(root / "corpus.jsonl", _rows(A_LENGTHS, 20, 0))
    runs = {}
    for prefetch in ("on", "off"):
        _run(_argv([str(corpus)], root / prefetch, "--split", "100,0,0", "--dp-schedule-prefetch", prefetch,
                   train_iters=8))
        runs[prefetch] = {(r["rank"], r["iteration"]): r for r in load_step_records(root / prefetch)}
    return {"corpus": corpus, "root": root, **runs}


def test_cyclic_epochs_follow_the_seeded_permutation_and_prefetch_changes_nothing(cyclic) -> None:
    full = list(cyclic["on"].values())
    trained = _steps(full)
    stream = _stream(20, 4)
    for iteration, ids in trained.items():
        assert ids == sorted(stream[iteration * GLOBAL_BATCH:(iteration + 1) * GLOBAL_BATCH]), iteration
    assert sorted(cyclic["on"]) == sorted(cyclic["off"])
    for key, record in cyclic["on"].items():
        off = cyclic["off"][key]
        for field in ("micro_batch_ids", "loss", "lr", "consumed_samples", "fingerprint", "tokens"):
            assert record[field] == off[field], f"rank {key[0]} iteration {key[1]}: {field}"
        assert record["data_wait_s"] is not None and off["data_wait_s"] is not None


def test_a_resume_in_the_middle_of_epoch_two_equals_the_uninterrupted_run(cyclic, tmp_path: Path) -> None:
    save_at, checkpoint = 3, tmp_path / "checkpoint"  # 24 samples consumed: epoch 2 holds 20..39
    common = ["--split", "100,0,0", "--ckpt-format", "torch"]
    first = _run(_argv([str(cyclic["corpus"])], tmp_path / "first", *common, "--save", str(checkpoint),
                       "--save-interval", str(save_at), "--exit-interval", str(save_at), train_iters=8))
    assert f"successfully saved checkpoint from iteration {save_at:7d}" in first
    trained = load_step_records(tmp_path / "first")  # --exit-interval ends by sys.exit: the plans are still written
    assert {rank: [[r["micro_batch_ids"] for r in trained if (r["rank"], r["iteration"]) == (rank, it)][0]
                   for it in range(save_at)] for rank in (0, 1)} == load_plans(tmp_path / "first")
    log = _run(_argv([str(cyclic["corpus"])], tmp_path / "resumed", *common, "--load", str(checkpoint),
                     train_iters=8))
    assert "dp-schedule: train feed resumes at step 3 (consumed_samples=24)" in log
    resumed = {(r["rank"], r["iteration"]): r for r in load_step_records(tmp_path / "resumed")}
    expected = {key: record for key, record in cyclic["on"].items() if key[1] >= save_at}
    assert sorted(resumed) == sorted(expected)
    for key, record in expected.items():
        for field in ("micro_batch_ids", "loss", "lr", "consumed_samples", "fingerprint", "tokens"):
            assert resumed[key][field] == record[field], f"rank {key[0]} iteration {key[1]}: {field}"
    assert all(r["loss"] is not None for r in expected.values())


class _Numbered:
    """A dataset of ``count`` samples named ``name`` (``lengths`` only; items are never read here)."""

    def __init__(self, name: str, count: int) -> None:
        self.path, self.lengths = name, [1 + i % 5 for i in range(count)]

    def __len__(self) -> int:
        return len(self.lengths)


def test_a_single_pass_blend_refuses_to_read_a_file_twice_with_the_numbers() -> None:
    from megatron_dpsched.data.compose import BlendedDataset, split_and_blend

    small, large = _Numbered("small.jsonl", 4), _Numbered("large.jsonl", 100)
    with pytest.raises(ValueError, match=r"^--data-path: the blend of 40 samples draws 10 from small.jsonl "
                                         r"\(share 0.25\), which holds 4"):
        BlendedDataset([small, large], weights=[1, 3], size=40, repeat=False)
    repeated = BlendedDataset([small, large], weights=[1, 3], size=40, repeat=True)
    assert [repeated.source(p) for p in range(40) if repeated.dataset_index[p] == 0] == [(0, k % 4) for k in range(10)]
    assert repeated.lengths[:4] == [large.lengths[0], small.lengths[0], large.lengths[1], large.lengths[2]]
    train, valid, test = split_and_blend(["small", "large"], flag="--data-path", split=(0.5, 0.5, 0.0),
                                         open_dataset={"small": small, "large": large}.__getitem__,
                                         sizes=[None, 10, 0], repeat=False)
    assert len(train) == 52 and train.weights == (2.0, 50.0)  # no weights: by size, as Megatron blends
    assert len(valid) == 10 and test is None
