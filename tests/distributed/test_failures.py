"""One line per failure: the plugin's errors reach the user as one line per job, with a non-zero exit code and
no traceback from the ranks; flag checks run before Megatron's asserts and say what to do.

The pre-checks' logic runs in-process on namespaces as Megatron's ``parse_args`` returns them; the one-line
handler runs in a real subprocess (exit code, stderr); the entry point runs as real ``torchrun`` jobs (2 gloo
processes, ``--cpu-dry-run``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from entry import MODEL_BUILT, REPO, corpus_rows, errors, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron.checks import check_before_validate_args, check_training_data
from megatron_dpsched.megatron.failures import failure_line

pytestmark = pytest.mark.distributed

RANK_TRACEBACK = re.compile(r"\[rank\d+\]:|File \".*(megatron_dpsched|pretrain_gpt_dpsched\.py)")
"""A traceback frame of a rank (torchrun's own ChildFailedError traceback names neither)."""


def _flags(**given: object) -> SimpleNamespace:
    """Megatron's parsed (not yet validated) flags: its defaults, then ``given``."""
    defaults = {"world_size": 2, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                "context_parallel_size": 1, "micro_batch_size": 1, "global_batch_size": 8,
                "eval_global_batch_size": None, "eval_micro_batch_size": None, "rampup_batch_size": None,
                "decrease_batch_size_if_needed": False, "use_checkpoint_args": False, "yaml_cfg": None}
    return SimpleNamespace(**{**defaults, **given})


@pytest.mark.parametrize(("given", "message"), [
    ({"global_batch_size": 7}, "--global-batch-size 7 is not a multiple of --micro-batch-size 1 x data-parallel "
                               "size 2 = 2 (Megatron counts a step in micro-batches of that many samples over the "
                               "data-parallel ranks); use 6 or 8"),
    ({"micro_batch_size": 3}, "--global-batch-size 8 is not a multiple of --micro-batch-size 3 x data-parallel size "
                              "2 = 6 (Megatron counts a step in micro-batches of that many samples over the "
                              "data-parallel ranks); use 6 or 12"),
    ({"eval_global_batch_size": 3}, "--eval-global-batch-size 3 is not a multiple of --micro-batch-size 1 x "
                                    "data-parallel size 2 = 2"),
    ({"eval_global_batch_size": 8, "eval_micro_batch_size": 3}, "--eval-global-batch-size 8 is not a multiple of "
                                                                "--eval-micro-batch-size 3"),
    ({"global_batch_size": 7, "decrease_batch_size_if_needed": True},
     "--eval-global-batch-size (default: --global-batch-size) 7 is not a multiple of --micro-batch-size 1"),
    ({"world_size": 8, "global_batch_size": 6, "tensor_model_parallel_size": 2}, "use 4 or 8"),
    ({"global_batch_size": 1}, "--global-batch-size 1 is not a multiple of --micro-batch-size 1 x data-parallel "
                               "size 2 = 2 (Megatron counts a step in micro-batches of that many samples over the "
                               "data-parallel ranks); use 2"),
    ({"world_size": 6, "pipeline_model_parallel_size": 4},
     "the job's 6 processes (WORLD_SIZE) do not divide into model-parallel groups of --tensor-model-parallel-size "
     "1 x --pipeline-model-parallel-size 4 x --context-parallel-size 1 = 4; start a multiple of 4 processes"),
    ({"micro_batch_size": None}, "give --micro-batch-size"),
])
def test_batch_sizes_megatron_would_assert_on_are_refused_naming_the_flags(given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_before_validate_args(_flags(**given))


@pytest.mark.parametrize("given", [
    {}, {"global_batch_size": None}, {"world_size": 8, "tensor_model_parallel_size": 2, "global_batch_size": 12},
    {"micro_batch_size": 3, "global_batch_size": 12, "eval_global_batch_size": 6},
    {"global_batch_size": 7, "rampup_batch_size": ["4", "1", "100"], "eval_global_batch_size": 8},
    {"global_batch_size": 7, "use_checkpoint_args": True}, {"global_batch_size": 7, "yaml_cfg": "run.yaml"},
])
def test_batch_sizes_megatron_accepts_pass(given: dict) -> None:
    check_before_validate_args(_flags(**given))


def test_training_needs_a_training_split() -> None:
    data = {"data_path": ["corpus.jsonl"], "train_data_path": None, "train_iters": 2, "train_samples": None,
            "skip_train": False}
    with pytest.raises(ValueError, match=re.escape("--split 0,100,0 gives training no samples, but --train-iters 2 "
                                                   "trains: give the train split a share")):
        check_training_data(SimpleNamespace(**data, split="0,100,0"))
    check_training_data(SimpleNamespace(**{**data, "skip_train": True}, split="0,100,0"))
    check_training_data(SimpleNamespace(**data, split="1,100,0"))
    with pytest.raises(ValueError, match="no training data .--train-data-path., but --train-samples 64 trains"):
        check_training_data(SimpleNamespace(**{**data, "data_path": None, "train_iters": None, "train_samples": 64}))


def test_the_failure_line_names_rank_and_step_once() -> None:
    error = ValueError("dp-schedule: the train dataset holds 4 samples,\n  but training reads 8")
    assert failure_line(error, rank=1, step=3) == "dp-schedule: rank 1 step 3: the train dataset holds 4 samples, " \
                                                  "but training reads 8"
    assert failure_line(ValueError("x"), rank=None, step=None) == "dp-schedule: x"


SCRIPT = textwrap.dedent("""
    import sys
    from megatron_dpsched.data.sampling import parse_split
    from megatron_dpsched.megatron.failures import one_line_errors

    with one_line_errors():
        print("started", flush=True)
        if sys.argv[1] == "ours":
            parse_split("-1,2")
        int("not a number")  # a ValueError raised outside the plugin
""")


def _script(kind: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "DPSCHED_DEBUG"}
    environment.update(PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", RANK="0", **env)
    return subprocess.run([sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, env=environment,
                          timeout=120, cwd=REPO)


def test_one_line_errors_prints_the_plugins_error_as_one_line_and_exits_2(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    proc = _script("ours", TORCHELASTIC_ERROR_FILE=str(error_file))
    assert proc.returncode == 2 and proc.stdout == "started\n", proc
    line = ("dp-schedule: rank 0: --split takes up to three non-negative shares for train, valid and test, "
            "separated by commas (e.g. 969,30,1); got '-1,2'")
    assert proc.stderr.splitlines()[-1] == line and "Traceback" not in proc.stderr, proc.stderr  # (import warnings)
    assert json.loads(error_file.read_text())["message"]["message"] == line  # what torchrun's summary prints
    debug = _script("ours", DPSCHED_DEBUG="1")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "parse_split" in debug.stderr
    other = _script("theirs")
    assert other.returncode == 1 and "Traceback" in other.stderr and "invalid literal for int()" in other.stderr


# --- the entry point under torchrun ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows(48))


def _argv(corpus: Path, *extra: str) -> list[str]:
    return [*tiny_gpt_argv(), "--data-path", str(corpus), "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0",
            "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", *extra]


def _one_line(log: str, pattern: str) -> str:
    """The log's one line matching ``pattern`` (torchrun's summary repeats it after 'traceback : '), no rank's
    traceback, and the failed rank's exit code 2 in torchrun's summary."""
    lines = [line for line in log.splitlines() if re.search(pattern, line) and "traceback :" not in line]
    assert len(lines) == 1, (lines, errors(log))
    assert not RANK_TRACEBACK.search(log), errors(log)
    summary = re.search(r"traceback : " + pattern.lstrip("^"), log, re.MULTILINE)
    assert re.search(r"exitcode\s*: 2 ", log) and summary, errors(log)
    return lines[0]


@pytest.mark.parametrize(("extra", "expected"), [
    (("--split", "100,0,0", "--global-batch-size", "7"),
     r"^pretrain_gpt_dpsched\.py: error: --global-batch-size 7 is not a multiple of --micro-batch-size 1 x "
     r"data-parallel size 2 = 2 .*; use 6 or 8$"),
    (("--split", "0,100,0", "--global-batch-size", "8"),
     r"^pretrain_gpt_dpsched\.py: error: --split 0,100,0 gives training no samples, but --train-iters 2 trains"),
], ids=["gbs7_dp2", "split_0_100_0"])
def test_refused_flags_are_one_line_per_job_before_the_model(corpus: Path, extra: tuple, expected: str) -> None:
    proc = torchrun(_argv(corpus, *extra), nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    _one_line(log, expected)
    assert MODEL_BUILT not in log


def test_a_bad_row_found_while_training_is_one_line_naming_rank_step_and_line(tmp_path: Path) -> None:
    """A row that changed after its length index vouched for it (the index cache matches the file's stamp) is
    only found when its micro-batch is read: step 2 (samples 16-23, read in order)."""
    from megatron_dpsched.data.corpus import TokenJsonlDataset
    from megatron_dpsched.data.line_index import file_stamp, index_path

    path = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows(48))
    TokenJsonlDataset(path)  # builds and caches the index of the good file
    lines = path.read_bytes().split(b"\n")
    lines[20] = lines[20].replace(b"[", b"{", 1)  # same length, no longer JSON
    path.write_bytes(b"\n".join(lines))
    cache = index_path(path)
    with np.load(cache) as stored:
        kept = {name: stored[name] for name in stored.files if name != "meta"}
    with open(cache, "wb") as out:  # the index vouches for the changed file
        np.savez(out, meta=np.array(json.dumps(file_stamp(path, TokenJsonlDataset.INDEX_KIND))), **kept)
    proc = torchrun([*_argv(path, "--split", "100,0,0", "--global-batch-size", "8"), "--train-iters", "4"], nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    _one_line(log, rf"^dp-schedule: rank \d step 2: {re.escape(str(path))}:21: not a JSON object")
    assert "iteration        2/" in log and MODEL_BUILT in log


def test_a_checkpoint_of_a_dropout_run_without_dp_schedule_resumes_with_it(corpus: Path, tmp_path: Path) -> None:
    """Megatron compares --data-parallel-random-init with the checkpoint's (``--no-load-rng`` or not); the plugin,
    which turns it on for DP > 1 with dropout, keeps the checkpoint's off."""
    plain = [*tiny_gpt_argv(), "--data-path", str(corpus), "--split", "100,0,0", "--global-batch-size", "8",
             "--lr", "1e-3", "--eval-iters", "0", "--attention-dropout", "0.1", "--hidden-dropout", "0.1",
             "--ckpt-format", "torch_dist"]
    saved = torchrun([*plain, "--train-iters", "4", "--save", str(tmp_path / "ckpt"), "--save-interval", "2",
                      "--exit-interval", "2"], nproc=2)
    assert saved.returncode == 0, errors(saved.stdout + saved.stderr)
    resumed = torchrun([*plain, "--train-iters", "4", "--load", str(tmp_path / "ckpt"), "--dp-schedule",
                        "--dp-schedule-max-tokens-per-gpu", "48"], nproc=2)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, errors(log)
    assert f"dp-schedule: --load {tmp_path / 'ckpt'} was saved without per-rank RNG states" in log
    assert "iteration        3/       4" in log and "iteration        4/       4" in log
    assert "iteration        1/" not in log  # resumed at iteration 2
