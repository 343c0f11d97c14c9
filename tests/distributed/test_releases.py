"""Every supported Megatron release trains with ``--dp-schedule``: megatron-core 0.17.1 and 0.18.2 from PyPI
(``bash scripts/test.sh`` installs each apart, without dependencies, under ``DPSCHED_RELEASES_DIR``) and a
Megatron-LM checkout named by ``DPSCHED_MEGATRON_LM_SRC`` (skipped without one). 0.19.2, the venv's own,
runs every other test.

Per release, with the same torch and the release first on ``PYTHONPATH``: the scenarios ``dp2`` and
``pp2_vpp2`` (the monkey-patch in Megatron's real ``train()``) train like the one-process whole-batch
``reference`` (losses, gradients, weights, every sample once), and the entry point's ``--cpu-dry-run``
(2 ranks, DP 2) saves at step 2 and resumes with the same steps as the uninterrupted run; the examples run (every
launch recipe's flags checked, the RL controller trains two rollouts and saves its state); the version check
picks the release's registry rows and names what it lacks. And the source patch the applier picks for the
release: its patched ``training.py`` trains DP 2 exactly like the monkey-patch and like the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from entry import assert_resumed_like_uninterrupted, corpus_rows, errors, tiny_gpt_argv, torchrun
from registry import REPO, LaunchResults, case
from train_checks import RTOL, assert_same_training, assert_trained_like_reference

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
    assert_resumed_like_uninterrupted(full, resumed, save_at=SAVE_AT)


_CHECK = """
import json
import megatron.training.training as training
from megatron_dpsched.megatron import patch, releases
patch.check_megatron(training)
refused = None
if releases.megatron_core_version() < (0, 18):
    try:
        releases.compat_0_19_pretrain(None, datasets_provider=None, forward_step=None, model_provider=None)
    except ValueError as error:
        refused = str(error)
print(json.dumps({"version": releases.megatron_core_version(), "rows": [row.name for row in patch.rows_of()],
                  "lacking": releases.lacking_notices(training), "pretrain_refused": refused}))
"""
"""The version check, the rows chosen for the release, what it lacks, and 0.17's ``pretrain`` refused."""


@pytest.mark.parametrize("release", RELEASES)
def test_version_check_picks_the_releases_rows_and_names_what_it_lacks(release: str) -> None:
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": _python_path(_release_folder(release)), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", _CHECK], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    old = release == "0.17.1"
    assert ("track_moe_metrics" in found["rows"], "get_moe_metrics_tracker" in found["rows"]) == (old, not old)
    assert len(found["lacking"]) == old
    if old:
        assert "lacks update_seqlen_stats_from_cu_seqlens (added in megatron-core 0.18)" in found["lacking"][0]
        assert "use megatron-core 0.18.2 or newer for pretrain()" in found["pretrain_refused"]


SOURCE_PATCHES = {"0.17.1": "megatron_training_dpsched_0.17.patch", "0.18.2": "megatron_training_dpsched_0.18.patch",
                  "main": "megatron_training_dpsched.patch"}
"""The source patch the applier picks for each release (0.19.2's: ``test_source_patch.py``)."""


@pytest.mark.parametrize("release", RELEASES)
def test_source_patched_release_trains_like_the_monkey_patch(release_launches, tmp_path_factory,
                                                             release: str) -> None:
    """The release's source patch applies (``--check``, then for real) to a copy of its ``megatron/training``;
    the patched ``training.py``, first on ``PYTHONPATH``, trains DP 2 exactly like the monkey-patch on the same
    release and like the reference, ``enable()`` never called (``DPSCHED_HOOK_MODE=source``)."""
    import shutil
    import subprocess

    from harness import HOOK_MODE_ENV, PATCHED_MEGATRON_ENV

    folder = _release_folder(release)
    patched = tmp_path_factory.mktemp(f"patched_{release}")
    shutil.copytree(folder / "megatron" / "training", patched / "megatron" / "training",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = patched / "megatron" / "training" / "training.py"
    script = ["bash", str(REPO / "scripts" / "apply_megatron_patch.sh"), "--target", str(patched)]
    check = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "# megatron-dpsched" not in target.read_text(), check.stderr
    pristine = target.read_text()
    proc = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    patch_file = REPO / "patches" / SOURCE_PATCHES[release]
    assert subprocess.run(["git", "apply", "--check", "--reverse", str(patch_file)], cwd=patched,
                          env={**os.environ, "GIT_CEILING_DIRECTORIES": str(patched.parent)}).returncode == 0, \
        f"the applier picked another patch than {patch_file.name}"
    assert target.read_text().count("# megatron-dpsched") == sum(
        line.startswith("+") and not line.startswith("+++") for line in patch_file.read_text().splitlines())
    assert pristine != target.read_text()
    env = {HOOK_MODE_ENV: "source", PATCHED_MEGATRON_ENV: str(patched),
           "PYTHONPATH": os.pathsep.join([str(patched), _python_path(folder)])}
    source = LaunchResults(tmp_path_factory.mktemp(f"source_{release}"), env=env, only=("dp2",)).get("dp2")
    assert all(r["hook_mode"] == "source" and Path(r["training_file"]).is_relative_to(patched) for r in source)
    monkey, (reference,) = release_launches(release).get("dp2"), release_launches(release).get("reference")
    assert [r["hook_mode"] for r in monkey] == ["monkey"] * len(monkey)
    for src, ref in zip(source, monkey, strict=True):
        assert_same_training(src, ref)
    assert_trained_like_reference(source, reference, rtol=RTOL)


@pytest.mark.parametrize("release", RELEASES)
def test_examples_run_on_the_release(tmp_path: Path, release: str) -> None:
    """The examples on the release: every launch recipe's flags pass Megatron's parsing and validation and the
    entry point's ``--dp-schedule`` checks (``examples/check_recipes.py``), and the RL controller plans two
    rollouts and trains them on 2 gloo ranks, saving its state."""
    env = {**os.environ, "PYTHONPATH": _python_path(_release_folder(release))}
    recipes = subprocess.run([sys.executable, str(REPO / "examples" / "check_recipes.py")], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=600)
    lines = [line for line in recipes.stdout.splitlines() if line.strip()]
    assert recipes.returncode == 0 and lines and all(line.startswith("OK ") for line in lines), \
        (recipes.stdout + recipes.stderr)[-3000:]
    out = tmp_path / "rl"
    controller = subprocess.run([sys.executable, str(REPO / "examples" / "rl_controller.py"), "--out", str(out),
                                 "--rollouts", "2", "--save-state-after", "1"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=600)
    assert controller.returncode == 0, (controller.stdout + controller.stderr)[-4000:]
    assert (out / "state_after_1").is_dir()
