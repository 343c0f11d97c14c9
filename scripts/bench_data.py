#!/usr/bin/env python
"""Start-up time and peak memory of opening a large JSONL corpus, first run (index built) and cached run.

    python scripts/bench_data.py                 # 1,000,000 samples (and 100,000 for the scaling)
    python scripts/bench_data.py --samples 200000

Writes a corpus of ``--samples`` rows of 8 to 64 token ids (half of them with a ``loss_mask``) to a
temporary folder, then opens it with ``TokenJsonlDataset`` in a fresh process twice: once building the
length index, once reading it from the cache (``DPSCHED_CACHE_DIR`` in the same folder). Start-up is the
time to open the dataset and read one sample (measured without tracing); memory is the ``tracemalloc`` peak
of the same in another fresh process (Python and numpy allocations) and the growth of the peak resident
set over the process's size before opening (psutil, ``ru_maxrss``). A second, 10x smaller corpus shows
how the cached start-up scales: only the index arrays (16 bytes per sample) grow with the corpus. Prints
the figures and exits 0; the target is a cached start-up under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_CACHED_S = 2.0


def write_corpus(path: Path, samples: int, *, seed: int = 0) -> None:
    """``samples`` rows of 8-64 ids below 32000; every other row carries a loss mask."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 65, size=samples)
    with open(path, "w") as out:
        for i, length in enumerate(lengths.tolist()):
            ids = rng.integers(0, 32000, size=length).tolist()
            row = {"tokens": ids, "loss_mask": [0] * (length // 2) + [1] * (length - length // 2)} if i % 2 \
                else {"tokens": ids}
            out.write(json.dumps(row) + "\n")


def measure(path: str, *, traced: bool) -> dict[str, float]:
    """Open the corpus in this process: seconds and peak RSS growth, or (``traced``) the tracemalloc peak
    (tracing slows every allocation, so it runs on its own and its time is not reported)."""
    import resource
    import tracemalloc

    import psutil

    sys.path.insert(0, str(REPO))
    from megatron_dpsched.data.corpus import TokenJsonlDataset

    rss_before = psutil.Process().memory_info().rss
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    data = TokenJsonlDataset(path)
    data[len(data) - 1]
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] if traced else None
    peak_rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return {"seconds": seconds, "peak_bytes": peak, "rss_growth_bytes": max(0, peak_rss_growth),
            "samples": len(data), "rebuilt": data.index.rebuilt}


def measure_in_a_fresh_process(path: Path, cache: Path, *, traced: bool = False) -> dict[str, float]:
    env = {**os.environ, "DPSCHED_CACHE_DIR": str(cache), "PYTHONWARNINGS": "ignore"}
    flag = "--measure-traced" if traced else "--measure"
    proc = subprocess.run([sys.executable, __file__, flag, str(path)], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_and_cached(path: Path, cache: Path) -> tuple[dict, dict]:
    """Timed first and cached runs, then the tracemalloc peaks of both (the cache removed in between)."""
    first = measure_in_a_fresh_process(path, cache)
    cached = measure_in_a_fresh_process(path, cache)
    cached["peak_bytes"] = measure_in_a_fresh_process(path, cache, traced=True)["peak_bytes"]
    for stale in cache.glob("*.npz"):
        stale.unlink()
    first["peak_bytes"] = measure_in_a_fresh_process(path, cache, traced=True)["peak_bytes"]
    return first, cached


def _mib(value: float) -> str:
    return f"{value / 2**20:8.1f} MiB"


def bench(samples: int, folder: Path) -> tuple[dict, dict, int]:
    path = folder / f"corpus_{samples}.jsonl"
    started = time.perf_counter()
    write_corpus(path, samples)
    print(f"corpus: {samples:,} samples, {path.stat().st_size / 2**20:.0f} MiB "
          f"(written in {time.perf_counter() - started:.1f} s)", flush=True)
    first, cached = first_and_cached(path, folder / "cache")
    assert first["rebuilt"] and not cached["rebuilt"] and cached["samples"] == samples
    for name, run in (("first run (index built)", first), ("cached run", cached)):
        print(f"  {name:24s} start-up {run['seconds']:6.2f} s   tracemalloc peak {_mib(run['peak_bytes'])}"
              f"   peak RSS growth {_mib(run['rss_growth_bytes'])}", flush=True)
    return first, cached, path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-traced", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.measure or opts.measure_traced:
        print(json.dumps(measure(opts.measure or opts.measure_traced, traced=bool(opts.measure_traced))))
        return
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        small_first, small_cached, _ = bench(max(1, opts.samples // 10), Path(tmp))
        first, cached, size = bench(opts.samples, Path(tmp))
    grown = cached["peak_bytes"] - small_cached["peak_bytes"]
    print(f"cached start-up peak per extra sample: {grown / (opts.samples - max(1, opts.samples // 10)):.1f} bytes "
          f"(the offset/part/length index arrays are 16 bytes per sample); corpus file {size / opts.samples:.0f} "
          f"bytes per sample")
    verdict = "meets" if cached["seconds"] < TARGET_CACHED_S else "misses"
    print(f"cached start-up {cached['seconds']:.2f} s {verdict} the {TARGET_CACHED_S:.0f} s target")


if __name__ == "__main__":
    main()
