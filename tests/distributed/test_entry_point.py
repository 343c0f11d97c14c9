"""The GPT entry point under a virtual pipeline: Megatron's per-stage provider calls share one feed.

``pretrain()`` builds data iterators once per VPP stage through the datasets provider
(asserting it takes ``vp_stage``); the ``--cpu-dry-run`` path does the same. This runs
PP=2 x VPP=2 on 2 CPU processes for two steps, with a validation pass, and checks the
run completes with the planned micro-batch counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]


def _errors(log: str) -> str:
    """The lines of a failed run that say why (tracebacks and errors), not the argument dump."""
    keep = [line for line in log.splitlines() if "Error" in line or "error" in line or line.startswith("  File")]
    return "\n".join(keep[-60:])


def test_pipeline_with_virtual_stages_trains_and_evaluates(tmp_path: Path) -> None:
    rows = [[(7 * i + j) % 100 for j in range(n + 1)] for i, n in enumerate([9, 30, 4, 17, 25, 3, 12, 40] * 6)]
    data = write_token_jsonl(tmp_path / "corpus.jsonl", rows)
    valid = write_token_jsonl(tmp_path / "valid.jsonl", rows[::-1])
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", "29477",
           str(REPO / "scripts" / "pretrain_gpt_dpsched.py"), "--cpu-dry-run", "--train-data-path", str(data),
           "--valid-data-path", str(valid), "--eval-global-batch-size", "4",
           "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "2", "--ffn-hidden-size", "64",
           "--seq-length", "48", "--max-position-embeddings", "48", "--pipeline-model-parallel-size", "2",
           "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "1", "--global-batch-size", "8",
           "--train-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--lr", "1e-3",
           "--position-embedding-type", "learned_absolute", "--untie-embeddings-and-output-weights",
           "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
           "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
           "--use-cpu-initialization", "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer",
           "--vocab-size", "128", "--log-interval", "1", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48",
           "--dp-schedule-verify", "strict", "--step-stats-dir", str(tmp_path / "stats")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, _errors(proc.stdout + proc.stderr)
    assert "validation loss at iteration 2" in proc.stdout + proc.stderr
    records = [json.loads(line) for f in sorted((tmp_path / "stats").glob("rank*.jsonl"))
               for line in f.read_text().splitlines()]
    counts = {r["step"]: r["micro_batches"] for r in records if "micro_batches" in r}
    assert sorted(counts) == [0, 1], counts
    assert all(count >= 2 for count in counts.values())  # interleaved schedule: at least the group of PP=2
