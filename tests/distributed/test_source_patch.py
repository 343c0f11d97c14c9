"""The source patch (``patches/megatron_training_dpsched.patch``) against the installed megatron-core.

* the patch applies to the pristine installed ``megatron/training/training.py``,
  ``scripts/apply_megatron_patch.sh`` refuses to apply it twice and reverts it exactly;
* every changed line calls a hook of :mod:`megatron_dpsched.megatron.hooks` and is marked, and the
  hooks it calls are those of every row of the patch registry (:mod:`megatron_dpsched.megatron.patch`);
* the hooks pass through with ``--dp-schedule`` off;
* Megatron's real ``train()`` with the patched ``training.py`` first on ``PYTHONPATH`` and
  monkey-patching off (``DPSCHED_HOOK_MODE=source``) gives the same micro-batches,
  gradients, weights, LR steps and consumed samples as the monkey-patch, and matches the
  whole-batch reference;
* a job of the GPT entry point (save a checkpoint, resume it with other data allowed) logs the same
  job-check lines, writes the same checkpoint state file and records the same steps with the patched
  ``training.py`` (where ``enable()`` installs nothing) as with the monkey-patch.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from entry import corpus_rows, errors, tiny_gpt_argv, torchrun
from harness import GLOBAL_BATCH, HOOK_MODE_ENV, PATCHED_MEGATRON_ENV, TRAIN_ITERS
from registry import REPO, LaunchResults
from scenarios import PARTIAL_STEP_SAMPLES
from train_checks import assert_close, assert_same_training, merged

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron import hooks
from megatron_dpsched.megatron.accounting import active_step
from megatron_dpsched.megatron.patch import LOOPS, MEGATRON_LM
from megatron_dpsched.megatron.step_recorder import load_step_records
from megatron_dpsched.runtime.job_identity import FIELDS

pytestmark = pytest.mark.distributed

PATCH = REPO / "patches" / "megatron_training_dpsched.patch"
PATCHES = [PATCH, *sorted((REPO / "patches").glob("megatron_training_dpsched_*.patch"))]
"""The patch of 0.19 and main, and the older releases' own (``test_releases.py`` applies them)."""
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


@pytest.mark.parametrize("patch_file", PATCHES, ids=lambda path: path.name)
def test_every_changed_line_is_a_marked_hook_call(patch_file: Path) -> None:
    lines = patch_file.read_text().splitlines()
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    assert added and all(line.rstrip().endswith(MARK) and "dpsched_hooks" in line for line in added)
    assert all("get_num_microbatches()" in line for line in removed)
    called = set(re.findall(r"dpsched_hooks\.(\w+)\(", patch_file.read_text()))
    assert called == {name for row in LOOPS[MEGATRON_LM] for name in row.calls}, "the patch must carry every row"
    assert all(callable(getattr(hooks, name)) for name in called)


@pytest.mark.parametrize("patch_file", PATCHES, ids=lambda path: path.name)
def test_the_source_wraps_each_name_the_registry_wraps_with_the_same_hook(patch_file: Path) -> None:
    """A row whose replacement is a hook itself (the job checks, the step recorder) is rebound in the source."""
    rebound = dict(re.findall(r"^\+(\w+) = dpsched_hooks\.(\w+)\(\1\)  " + MARK, patch_file.read_text(), re.M))
    wrapped = {row.name: row.make.__name__ for row in LOOPS[MEGATRON_LM] if getattr(hooks, row.make.__name__, None)
               is row.make}
    assert rebound == wrapped == {"save_checkpoint": "with_state_file", "setup_model_and_optimizer": "with_job_checks",
                                  "train_step": "with_step_stats"}


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
    assert active_step() is None and hooks.num_microbatches() == 7


def test_unscheduled_iterators_pass_through_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.training import global_vars

    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", types.SimpleNamespace(dp_schedule=True))
    run = hooks.forward_backward_func(lambda **kwargs: kwargs)
    call = {"data_iterator": iter([]), "model": [object()], "num_microbatches": 3}
    assert run(**call) == call and active_step() is None


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
        assert_same_training(src, ref)


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


# --- a job of the entry point, each way in ----------------------------------------------------


JOB_CHECK_LINES = ("every rank agrees on the job", "resuming iteration", "the checkpoint (",
                   "a checkpoint saved without --dp-schedule")
"""What the job checks log (:mod:`megatron_dpsched.megatron.job_checks`)."""
STEP_FIGURES = ("iteration", "consumed_samples", "micro_batch_ids", "fingerprint", "loss", "lr", "tokens")


def _job_check_lines(log: str, checkpoint: Path) -> list[str]:
    """The job checks' lines of ``log``, the timing and the checkpoint's folder masked."""
    lines = [line[line.index("dp-schedule:"):] for line in log.splitlines()
             if "dp-schedule:" in line and any(words in line for words in JOB_CHECK_LINES)]
    return [re.sub(r"in \d+\.\d ms", "in <t> ms", line).replace(str(checkpoint), "<checkpoint>") for line in lines]


def _job(folder: Path, corpora: tuple[Path, Path], env: dict[str, str]) -> dict[str, object]:
    """Save at iteration 2 of 4 on the first corpus, then resume on the second (allowed): the job checks' lines,
    the checkpoint's state file and the step records of both runs."""
    checkpoint, stats = folder / "checkpoint", folder / "stats"
    argv = [*tiny_gpt_argv(), "--split", "100,0,0", "--global-batch-size", "8", "--train-iters", "4", "--lr", "1e-3",
            "--eval-iters", "0", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48"]
    runs = [["--data-path", str(corpora[0]), "--save", str(checkpoint), "--save-interval", "2", "--exit-interval",
             "2", "--step-stats-dir", str(stats / "saved")],
            ["--data-path", str(corpora[1]), "--load", str(checkpoint), "--dp-schedule-changed-resume", "allow",
             "--step-stats-dir", str(stats / "resumed")]]
    lines = []
    with pytest.MonkeyPatch.context() as patcher:
        for name, value in env.items():
            patcher.setenv(name, value)
        for extra in runs:
            proc = torchrun([*argv, *extra], nproc=2)
            assert proc.returncode == 0, errors(proc.stdout + proc.stderr)
            lines.append(_job_check_lines(proc.stdout + proc.stderr, checkpoint))
    records = [[{key: record[key] for key in STEP_FIGURES} for record in load_step_records(stats / run)]
               for run in ("saved", "resumed")]
    state = checkpoint / "iter_0000002" / "dp_schedule_state.json"
    return {"lines": lines, "state": state.read_text() if state.exists() else None, "records": records}


def _imported_training(env: dict[str, str]) -> str:
    """Which ``training.py`` a process with ``env`` imports, and whether it carries the source patch."""
    code = ("import megatron.training.training as t; from megatron_dpsched.megatron import patch; "
            "patch.enable(); print(t.__file__, patch.is_source_patched(t), patch.installed())")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_job_checks_the_same_with_the_source_patch_as_with_the_monkey_patch(
        patched_megatron: Path, tmp_path: Path) -> None:
    corpora = (write_token_jsonl(tmp_path / "first.jsonl", corpus_rows(48)),
               write_token_jsonl(tmp_path / "second.jsonl", corpus_rows(48)[::-1]))
    python_path = os.pathsep.join(p for p in (str(patched_megatron), os.environ.get("PYTHONPATH", "")) if p)
    source_env = {HOOK_MODE_ENV: "source", "PYTHONPATH": python_path}
    patched_file = patched_megatron / "megatron" / "training" / "training.py"
    assert _imported_training(source_env) == f"{patched_file} True ()", "the source way in installs nothing"
    assert _imported_training({}).split()[1] == "False"
    source = _job(tmp_path / "source", corpora, source_env)
    monkey = _job(tmp_path / "monkey", corpora, {HOOK_MODE_ENV: "monkey"})
    saved, resumed = monkey["lines"]
    assert saved == [f"dp-schedule: every rank agrees on the job ({', '.join(FIELDS)}) in <t> ms"], saved
    assert resumed[0] == saved[0] and resumed[1].startswith(
        "dp-schedule: WARNING: resuming iteration 2 of <checkpoint> with changes"), resumed
    assert source["lines"] == monkey["lines"]
    assert source["state"] == monkey["state"] and monkey["state"] is not None
    assert source["records"] == monkey["records"] and all(monkey["records"]), "the step recorder records either way"
