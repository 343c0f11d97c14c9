"""The source patch (``patches/megatron_training_dpsched.patch``) against the installed megatron-core.

* the patch applies to the pristine installed ``megatron/training/training.py``,
  ``scripts/apply_megatron_patch.sh`` refuses to apply it twice and reverts it exactly;
* every changed line calls a hook of :mod:`megatron_dpsched.megatron.hooks` and is marked;
* the hooks pass through with ``--dp-schedule`` off;
* Megatron's real ``train()`` with the patched ``training.py`` first on ``PYTHONPATH`` and
  monkey-patching off (``DPSCHED_HOOK_MODE=source``) gives the same micro-batches,
  gradients, weights, LR steps and consumed samples as the monkey-patch, and matches the
  whole-batch reference.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import types
from pathlib import Path

import pytest
import torch
from harness import GLOBAL_BATCH, HOOK_MODE_ENV, PATCHED_MEGATRON_ENV, TRAIN_ITERS
from registry import REPO, LaunchResults
from scenarios import PARTIAL_STEP_SAMPLES
from train_checks import assert_close, merged

from megatron_dpsched.megatron import hooks

pytestmark = pytest.mark.distributed

PATCH = REPO / "patches" / "megatron_training_dpsched.patch"
SCRIPT = REPO / "scripts" / "apply_megatron_patch.sh"
MARK = "# megatron-dpsched"
SOURCE_SCENARIOS = ("dp2", "dp2_precomputed", "pp2_vpp2", "dp2_partial_step")
"""Scenarios re-run in source mode: plain DP, a shipped plan with empty micro-batches, interleaved PP,
and a short trailing step (4 of 8 samples), where the LR/consumed-samples hook changes the count."""
REFERENCE_SCENARIOS = SOURCE_SCENARIOS[:-1]


def _installed_training_dir() -> Path:
    spec = importlib.util.find_spec("megatron.training")
    assert spec is not None and spec.origin is not None, "megatron.training is not installed"
    return Path(spec.origin).parent


def _copy_training(root: Path) -> Path:
    """``root/megatron/training``: a copy of the installed package (``megatron`` is a namespace package)."""
    installed = _installed_training_dir()
    assert MARK not in (installed / "training.py").read_text(), f"{installed} is already patched"
    shutil.copytree(installed, root / "megatron" / "training", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="session")
def patched_megatron(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A patched copy of the installed ``megatron/training`` (applied with the script)."""
    root = _copy_training(tmp_path_factory.mktemp("patched_megatron"))
    proc = _script("--target", str(root))
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture(scope="session")
def source_launches(tmp_path_factory: pytest.TempPathFactory, patched_megatron: Path) -> LaunchResults:
    """Launches whose processes import the patched ``training.py`` and never call ``enable()``."""
    python_path = os.pathsep.join(p for p in (str(patched_megatron), os.environ.get("PYTHONPATH", "")) if p)
    env = {HOOK_MODE_ENV: "source", PATCHED_MEGATRON_ENV: str(patched_megatron), "PYTHONPATH": python_path}
    return LaunchResults(tmp_path_factory.mktemp("dp_schedule_source_launches"), env=env, only=SOURCE_SCENARIOS)


# --- the patch file and the script -----------------------------------------------------------


def test_git_apply_check_succeeds_on_the_pristine_installed_file(tmp_path: Path) -> None:
    (tmp_path / "megatron" / "training").mkdir(parents=True)
    shutil.copy(_installed_training_dir() / "training.py", tmp_path / "megatron" / "training")
    proc = subprocess.run(["git", "apply", "--check", str(PATCH)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)})
    assert proc.returncode == 0, proc.stderr


def test_every_changed_line_is_a_marked_hook_call() -> None:
    lines = PATCH.read_text().splitlines()
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    assert added and all(line.rstrip().endswith(MARK) and "dpsched_hooks" in line for line in added)
    assert all("get_num_microbatches()" in line for line in removed)
    called = set(re.findall(r"dpsched_hooks\.(\w+)\(", PATCH.read_text()))
    assert called == {"forward_backward_func", "num_microbatches", "on_update_num_microbatches", "microbatches_run",
                      "on_training_log"}
    assert all(callable(getattr(hooks, name)) for name in called)


def test_applying_twice_is_refused_and_reverse_restores_the_original(patched_megatron: Path,
                                                                     tmp_path: Path) -> None:
    patched = (patched_megatron / "megatron" / "training" / "training.py").read_text()
    again = _script("--target", str(patched_megatron / "megatron"))
    assert again.returncode == 1 and "already applied" in again.stderr
    assert (patched_megatron / "megatron" / "training" / "training.py").read_text() == patched
    root = _copy_training(tmp_path)
    target = root / "megatron" / "training" / "training.py"
    pristine = target.read_text()
    assert _script("--target", str(root), "--check").returncode == 0
    assert target.read_text() == pristine, "--check changed the file"
    assert _script("--target", str(root)).returncode == 0
    assert _script("--target", str(root), "--reverse").returncode == 0
    assert target.read_text() == pristine
    not_applied = _script("--target", str(root), "--reverse")
    assert not_applied.returncode == 1 and "not applied" in not_applied.stderr


def test_patch_applies_to_a_megatron_lm_checkout_and_reverts_exactly(tmp_path: Path) -> None:
    """``DPSCHED_MEGATRON_LM_SRC``: a Megatron-LM checkout (e.g. ``main``, 0.20.0) to apply the patch to."""
    source = os.environ.get("DPSCHED_MEGATRON_LM_SRC")
    if not source:
        pytest.skip("set DPSCHED_MEGATRON_LM_SRC to a Megatron-LM checkout (e.g. main) to check the patch on it")
    (tmp_path / "megatron" / "training").mkdir(parents=True)
    target = tmp_path / "megatron" / "training" / "training.py"
    shutil.copy(Path(source) / "megatron" / "training" / "training.py", target)
    pristine = target.read_text()
    proc = _script("--target", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    patched = target.read_text()
    compile(patched, str(target), "exec")
    lines = patched.splitlines()
    logged = max(i for i, line in enumerate(lines) if "report_memory_flag = training_log(" in line)
    hook = next(i for i, line in enumerate(lines) if "dpsched_hooks.on_training_log(iteration)" in line)
    assert logged < hook < logged + 40  # right after the train() loop's training_log call
    assert sum(MARK in line for line in lines) == sum(
        line.startswith("+") and not line.startswith("+++") for line in PATCH.read_text().splitlines())
    assert _script("--target", str(tmp_path), "--reverse").returncode == 0
    assert target.read_text() == pristine


def test_script_reports_a_target_without_megatron(tmp_path: Path) -> None:
    proc = _script("--target", str(tmp_path))
    assert proc.returncode == 1 and "no megatron/training/training.py" in proc.stderr


# --- the hooks pass through with --dp-schedule off -------------------------------------------


def test_hooks_pass_through_with_dp_schedule_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.training import global_vars

    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", types.SimpleNamespace(dp_schedule=False))
    monkeypatch.setattr("megatron.core.num_microbatches_calculator.get_num_microbatches", lambda: 7)

    def schedule(**kwargs: object) -> object:
        return kwargs

    assert hooks.forward_backward_func(schedule) is schedule
    hooks.on_update_num_microbatches()
    assert hooks.active_step() is None and hooks.num_microbatches() == 7


def test_unscheduled_iterators_pass_through_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.training import global_vars

    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", types.SimpleNamespace(dp_schedule=True))
    run = hooks.forward_backward_func(lambda **kwargs: kwargs)
    call = {"data_iterator": iter([]), "model": [object()], "num_microbatches": 3}
    assert run(**call) == call and hooks.active_step() is None


# --- source mode vs monkey mode --------------------------------------------------------------


@pytest.mark.parametrize("scenario", SOURCE_SCENARIOS)
def test_source_mode_imports_the_patched_training_module(source_launches, patched_megatron: Path,
                                                         scenario: str) -> None:
    for result in source_launches.get(scenario):
        assert result["hook_mode"] == "source"
        assert Path(result["training_file"]).is_relative_to(patched_megatron.resolve())


@pytest.mark.parametrize("scenario", SOURCE_SCENARIOS)
def test_source_patch_trains_exactly_like_the_monkey_patch(source_launches, launches, scenario: str) -> None:
    source, monkey = source_launches.get(scenario), launches.get(scenario)
    assert [r["hook_mode"] for r in monkey] == ["monkey"] * len(monkey)
    for src, ref in zip(source, monkey, strict=True):
        for key in ("records", "plan_micro_batches", "plan_num_samples", "consumed_train_samples",
                    "scheduler_num_steps", "iteration", "eval_loss"):
            assert src[key] == ref[key], key
        for step in range(TRAIN_ITERS):
            assert src["grads"][step].keys() == ref["grads"][step].keys()
            assert all(torch.equal(src["grads"][step][n], g) for n, g in ref["grads"][step].items()), step
        assert all(torch.equal(src["weights"][n], w) for n, w in ref["weights"].items())


@pytest.mark.parametrize("scenario", REFERENCE_SCENARIOS)
def test_source_patch_matches_the_whole_batch_reference(source_launches, launches, scenario: str) -> None:
    results, (reference,) = source_launches.get(scenario), launches.get("reference")
    for step in range(TRAIN_ITERS):
        assert_close(merged(results, "grads", step), reference["grads"][step], f"step {step} grads")
    assert_close(merged(results, "weights"), reference["weights"], f"weights after {TRAIN_ITERS} steps")
    for result in results:
        assert result["consumed_train_samples"] == result["scheduler_num_steps"] == sum(result["plan_num_samples"])


@pytest.mark.parametrize("mode", ["source", "monkey"])
def test_a_short_trailing_step_advances_lr_and_consumed_samples_by_its_samples(source_launches, launches,
                                                                              mode: str) -> None:
    results = (source_launches if mode == "source" else launches).get("dp2_partial_step")
    for result in results:
        assert result["plan_num_samples"] == [GLOBAL_BATCH] * (TRAIN_ITERS - 1) + [4]
        assert result["consumed_train_samples"] == result["scheduler_num_steps"] == PARTIAL_STEP_SAMPLES
