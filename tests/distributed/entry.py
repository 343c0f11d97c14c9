"""Launching the GPT entry point (``scripts/pretrain_gpt_dpsched.py --cpu-dry-run``) from tests.

Each launch is a real ``torchrun`` job on gloo (or a plain ``python`` process for the
argument checks, which fail before any process group exists).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "scripts" / "pretrain_gpt_dpsched.py"
MODEL_BUILT = "> number of parameters on (tensor, gtp_weight_remat, pipeline) model parallel rank"
"""What Megatron's ``get_model`` prints once it has built a model chunk."""
_PORTS = itertools.count(29500 + os.getpid() % 400)


def tiny_gpt_argv(*, num_layers: int = 2, seq_length: int = 48, vocab: int = 128) -> list[str]:
    """A tiny fp32 GPT on CPU/gloo with the local layer spec."""
    return [
        "--cpu-dry-run", "--num-layers", str(num_layers), "--hidden-size", "32", "--num-attention-heads", "2",
        "--ffn-hidden-size", "64", "--seq-length", str(seq_length), "--max-position-embeddings", str(seq_length),
        "--micro-batch-size", "1", "--position-embedding-type", "learned_absolute",
        "--untie-embeddings-and-output-weights", "--transformer-impl", "local", "--no-gradient-accumulation-fusion",
        "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
        "--use-cpu-initialization", "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(vocab), "--log-interval", "1",
    ]


def corpus_rows(count: int = 48) -> list[list[int]]:
    """``count`` token rows of varied lengths (3 to 40 positions), deterministic."""
    lengths = [9, 30, 4, 17, 25, 3, 12, 40]
    return [[(7 * i + j) % 100 for j in range(lengths[i % len(lengths)] + 1)] for i in range(count)]


def torchrun(argv: Sequence[str], *, nproc: int, timeout: int = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node nproc scripts/pretrain_gpt_dpsched.py argv`` (``env``: more environment)."""
    launcher = Path(sys.executable).with_name("torchrun")
    cmd = [str(launcher), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(next(_PORTS)), str(ENTRY), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(env or {})}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)


def torchrun_per_rank(argvs: Sequence[Sequence[str]], *, cwds: Sequence[Path], spec: Path,
                      timeout: int = 300) -> subprocess.CompletedProcess:
    """A ``torchrun`` job of the entry point where global rank ``r`` runs ``argvs[r]`` in folder ``cwds[r]``
    (``tests/distributed/per_rank_entry.py``; ``spec`` is where the per-rank JSON is written)."""
    import json

    spec.write_text(json.dumps([{"argv": list(argv), "cwd": str(cwd)} for argv, cwd in zip(argvs, cwds)]))
    launcher = Path(sys.executable).with_name("torchrun")
    cmd = [str(launcher), "--nproc-per-node", str(len(argvs)), "--master-addr", "127.0.0.1",
           "--master-port", str(next(_PORTS)), str(REPO / "tests" / "distributed" / "per_rank_entry.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "DPSCHED_PER_RANK": str(spec),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)


def python(argv: Sequence[str], *, timeout: int = 120) -> subprocess.CompletedProcess:
    """The entry point in one plain process (for failures before the process group starts)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    return subprocess.run([sys.executable, str(ENTRY), *argv], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=timeout)


def errors(log: str) -> str:
    """The lines of a failed run that say why (tracebacks, errors, aborts: ``terminate called ...``,
    ``what(): ...``, ``Fatal Python error``), not the argument dump."""
    words = ("error", "terminate", "what()", "fatal", "abort", "exception", "signal")
    keep = [line for line in log.splitlines() if line.startswith("  File") or any(w in line.lower() for w in words)]
    return "\n".join(keep[-60:])


RESUME_COMPARED = ("micro_batch_ids", "loss", "lr", "consumed_samples", "fingerprint", "micro_batches", "tokens")
"""The step records' fields a resumed run must repeat exactly."""


def assert_resumed_like_uninterrupted(full: dict[tuple[int, int], dict], resumed: dict[tuple[int, int], dict], *,
                                      save_at: int) -> dict[tuple[int, int], dict]:
    """The resumed run's step records ((rank, iteration) -> record) equal the uninterrupted run's from ``save_at``
    on (every rank, every field of :data:`RESUME_COMPARED`); returns those expected records."""
    expected = {key: record for key, record in full.items() if key[1] >= save_at}
    assert sorted(resumed) == sorted(expected), "the resumed run must train exactly the steps after the save"
    for key, record in expected.items():
        for field in RESUME_COMPARED:
            assert resumed[key][field] == record[field], f"rank {key[0]} iteration {key[1]}: {field}"
    assert any(record["loss"] is not None for record in expected.values())
    return expected
