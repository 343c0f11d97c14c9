"""Every supported Megatron release trains with ``--dp-schedule``: megatron-core 0.17.1 and 0.18.2 from PyPI
(``bash scripts/test.sh`` installs each apart, without dependencies, under ``DPSCHED_RELEASES_DIR``) and a
Megatron-LM checkout named by ``DPSCHED_MEGATRON_LM_SRC`` (skipped without one). 0.19.2, the venv's own,
runs every other test.

Per release, with the same torch and the release first on ``PYTHONPATH``: the scenarios ``dp2`` and
``pp2_vpp2`` (the monkey-patch in Megatron's real ``train()``) train like the one-process whole-batch
``reference`` (losses, gradients, weights, every sample once), and the entry point's ``--cpu-dry-run``
(2 ranks, DP 2) saves at step 2 and resumes with the same steps as the uninterrupted run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from entry import corpus_rows, errors, tiny_gpt_argv, torchrun
from registry import REPO, LaunchResults, case
from train_checks import RTOL, assert_trained_like_reference

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron.step_recorder import load_step_records

pytestmark = pytest.mark.distributed

RELEASES_DIR_ENV = "DPSCHED_RELEASES_DIR"
"""Where ``scripts/test.sh`` installs the PyPI releases, one folder per version."""
CHECKOUT_ENV = "DPSCHED_MEGATRON_LM_SRC"
"""A Megatron-LM checkout (its root holds ``megatron/``)."""
PYPI_RELEASES = ("0.17.1", "0.18.2")
LAYOUTS = ("dp2", "pp2_vpp2")
TRAIN_ITERS, SAVE_AT, GLOBAL_BATCH = 4, 2, 8
COMPARED = ("micro_batch_ids", "loss", "lr", "consumed_samples", "fingerprint", "micro_batches", "tokens")


def _release_folder(release: str) -> Path | None:
    if release == "main":
        source = os.environ.get(CHECKOUT_ENV)
        return Path(source) if source else None
    root = os.environ.get(RELEASES_DIR_ENV)
    return Path(root) / release if root else None


def _release_param(release: str) -> pytest.param:
    folder = _release_folder(release)
    reason = (f"set {CHECKOUT_ENV} to a Megatron-LM checkout" if release == "main" else
              f"megatron-core {release} is not installed under ${RELEASES_DIR_ENV} (bash scripts/test.sh installs it)")
    present = folder is not None and (folder / "megatron" / "training" / "training.py").is_file()
    return pytest.param(release, marks=() if present else pytest.mark.skip(reason=reason))


RELEASES = [_release_param(release) for release in (*PYPI_RELEASES, "main")]


def _python_path(folder: Path) -> str:
    return os.pathsep.join([str(REPO), str(folder)])


@pytest.fixture(scope="module")
def release_launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], LaunchResults]:
    """The release's launches of the whole-batch scenarios (each started on first use)."""
    made: dict[str, LaunchResults] = {}

    def get(release: str) -> LaunchResults:
        if release not in made:
            made[release] = LaunchResults(tmp_path_factory.mktemp(f"release_{release}"), only=(*LAYOUTS, "reference"),
                                          env={"PYTHONPATH": _python_path(_release_folder(release))})
        return made[release]

    return get


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_release_trains_like_the_whole_batch_reference(release_launches, release: str, layout: str) -> None:
    launches = release_launches(release)
    results, (reference,) = launches.get(layout), launches.get("reference")
    folder = _release_folder(release).resolve()
    assert all(Path(r["training_file"]).resolve().is_relative_to(folder) for r in [*results, reference]), \
        f"the scenarios must import Megatron from {folder}"
    assert_trained_like_reference(results, reference, num_chunks=case(layout).vpp, rtol=RTOL)


def _argv(corpus: Path, stats: Path, *extra: str) -> list[str]:
    return [*tiny_gpt_argv(num_layers=4), "--data-path", str(corpus), "--global-batch-size", str(GLOBAL_BATCH),
            "--train-iters", str(TRAIN_ITERS), "--lr", "1e-3", "--attention-dropout", "0.1", "--hidden-dropout",
            "0.1", "--eval-iters", "0", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48",
            "--step-stats-dir", str(stats), "--ckpt-format", "torch", *extra]


def _run(argv: list[str], folder: Path) -> str:
    proc = torchrun(argv, nproc=2, env={"PYTHONPATH": _python_path(folder)})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    return log


def _records(stats: Path) -> dict[tuple[int, int], dict]:
    return {(r["rank"], r["iteration"]): r for r in load_step_records(stats)}


@pytest.mark.parametrize("release", RELEASES)
def test_entry_point_trains_saves_and_resumes_on_the_release(tmp_path: Path, release: str) -> None:
    folder = _release_folder(release)
    corpus = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows(48))
    full_log = _run(_argv(corpus, tmp_path / "full"), folder)
    lacking = "lacks update_seqlen_stats_from_cu_seqlens (added in megatron-core 0.18)"
    assert full_log.count(lacking) == (1 if release == "0.17.1" else 0), "0.17.1's missing name is said once"
    checkpoint = tmp_path / "checkpoint"
    first = _run(_argv(corpus, tmp_path / "first", "--save", str(checkpoint), "--save-interval", str(SAVE_AT),
                       "--exit-interval", str(SAVE_AT)), folder)
    assert f"successfully saved checkpoint from iteration {SAVE_AT:7d}" in first
    resumed_log = _run(_argv(corpus, tmp_path / "resumed", "--load", str(checkpoint)), folder)
    assert "dp-schedule: train feed resumes at step 2" in resumed_log
    full, resumed = _records(tmp_path / "full"), _records(tmp_path / "resumed")
    expected = {key: record for key, record in full.items() if key[1] >= SAVE_AT}
    assert sorted(resumed) == sorted(expected), "the resumed run must train exactly steps 3 and 4 on every rank"
    for key, record in expected.items():
        for field in COMPARED:
            assert resumed[key][field] == record[field], f"rank {key[0]} iteration {key[1]}: {field}"
    assert any(record["loss"] is not None for record in expected.values())
