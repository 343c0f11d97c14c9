#!/usr/bin/env python
"""Start-up time and peak memory of opening a large JSONL corpus, first run (index built) and cached run; and
the cost of validating a 1 GiB corpus when it is indexed.

    python scripts/bench_data.py                 # 1,000,000 samples (and 100,000 for the scaling)
    python scripts/bench_data.py --samples 200000
    python scripts/bench_data.py --validation    # a 1 GiB JSONL and a 1 GiB indexed corpus (--gib to change)

Writes a corpus of ``--samples`` rows of 8 to 64 token ids (half of them with a ``loss_mask``) to a
temporary folder, then opens it with ``TokenJsonlDataset`` in a fresh process twice: once building the
length index, once reading it from the cache (``DPSCHED_CACHE_DIR`` in the same folder). Start-up is the
time to open the dataset and read one sample (measured without tracing); memory is the ``tracemalloc`` peak
of the same in another fresh process (Python and numpy allocations) and the growth of the peak resident
set over the process's size before opening (psutil, ``ru_maxrss``). A second, 10x smaller corpus shows
how the cached start-up scales: only the index arrays (36 bytes per sample) grow with the corpus. Prints
the figures and exits 0; the target is a cached start-up under 2 s.

``--validation`` writes a JSONL corpus and a Megatron indexed corpus (``.bin``/``.idx``, int32 ids) of
``--gib`` GiB each (rows of 256 to 2048 ids below 32000; temporary, never kept) and opens each with the
padded vocabulary (``open_corpus(path, vocab_size=32000)``) in fresh processes, as the entry point does: the
first open reads every byte once (every id checked against the vocabulary, masks 0/1, a digest per row and the
whole file's checksum, the ``.bin`` size against the ``.idx``) and caches what it found; the second reads the
cache. Next to it: one plain read of the file (the whole-file blake2b the job identity takes from the index),
the floor of any validation that reads every byte.
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


VOCAB = 32000
"""Token ids are below it (the padded vocabulary the validation bounds them by)."""


def write_jsonl_gib(path: Path, gib: float, *, seed: int = 0) -> None:
    """A JSONL corpus of about ``gib`` GiB: 4096 distinct rows of 256-2048 ids, written over and over."""
    import numpy as np

    rng = np.random.default_rng(seed)
    block = "".join(json.dumps({"tokens": rng.integers(0, VOCAB, size=int(n)).tolist()}) + "\n"
                    for n in rng.integers(256, 2049, size=4096)).encode()
    with open(path, "wb") as out:
        for _ in range(max(1, round(gib * 2**30 / len(block)))):
            out.write(block)


def write_indexed_gib(prefix: Path, gib: float, *, seed: int = 0) -> None:
    """A Megatron indexed corpus (int32) of about ``gib`` GiB of ids, sequences of 256-2048 ids, written in the
    ``.bin``/``.idx`` layout megatron-core reads (header, lengths, pointers, document indices)."""
    import struct

    import numpy as np

    rng = np.random.default_rng(seed)
    total = int(gib * 2**30) // 4
    lengths = rng.integers(256, 2049, size=total // 256 + 1).astype(np.int32)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), total)) + 1]
    with open(f"{prefix}.bin", "wb") as out:
        for start in range(0, int(lengths.sum()), 1 << 24):
            rng.integers(0, VOCAB, size=min(1 << 24, int(lengths.sum()) - start), dtype=np.int32).tofile(out)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * 4)[:-1]])
    with open(f"{prefix}.idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, lengths.size, lengths.size + 1))
        for array in (lengths, pointers, np.arange(lengths.size + 1, dtype=np.int64)):
            array.tofile(out)


def measure_open(path: str) -> dict[str, float]:
    """Open a corpus with the padded vocabulary in this process: seconds, peak RSS growth, whether it read the
    data (``rebuilt``)."""
    import resource

    import psutil

    sys.path.insert(0, str(REPO))
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: F401  (imported before timing)

    from megatron_dpsched.data.corpus import open_corpus

    rss_before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    data = open_corpus(path, vocab_size=VOCAB)
    seconds = time.perf_counter() - start
    rebuilt = data.index.rebuilt if hasattr(data, "index") else data._scan.rebuilt
    peak_rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return {"seconds": seconds, "rss_growth_bytes": max(0, peak_rss_growth), "samples": len(data),
            "rebuilt": rebuilt}


def read_once_seconds(path: Path) -> float:
    """One plain pass over the file: its whole-file checksum computed here (no index consulted)."""
    sys.path.insert(0, str(REPO))
    from megatron_dpsched.data.line_index import file_digest

    start = time.perf_counter()
    digest = file_digest(path.stat().st_size)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return time.perf_counter() - start


def validation(gib: float, folder: Path) -> None:
    """Write both corpora, then time a first (validating) and a cached open of each in fresh processes."""
    jsonl, prefix = folder / "corpus.jsonl", folder / "indexed"
    for name, write, data_file, opened in (("JSONL", write_jsonl_gib, jsonl, jsonl),
                                           ("indexed", write_indexed_gib, Path(f"{prefix}.bin"), prefix)):
        started = time.perf_counter()
        write(opened, gib)
        print(f"{name} corpus: {data_file.stat().st_size / 2**30:.2f} GiB (written in "
              f"{time.perf_counter() - started:.1f} s)", flush=True)
        plain = read_once_seconds(data_file)
        runs = [measure_in_a_fresh_process(opened, folder / "cache", flag="--measure-open") for _ in range(2)]
        assert runs[0]["rebuilt"] and not runs[1]["rebuilt"]
        print(f"  one plain read of the file (blake2b)   {plain:6.2f} s", flush=True)
        for label, run in zip(("first open (validated)", "cached open"), runs):
            print(f"  {label:38s} {run['seconds']:6.2f} s   {run['samples']:,} samples   peak RSS growth "
                  f"{_mib(run['rss_growth_bytes'])}", flush=True)
        print(f"  validation throughput {data_file.stat().st_size / 2**20 / runs[0]['seconds']:.0f} MiB/s "
              f"({runs[0]['seconds'] / plain:.1f}x one plain read)", flush=True)
        data_file.unlink()


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


def measure_in_a_fresh_process(path: Path, cache: Path, *, traced: bool = False, flag: str | None = None
                                ) -> dict[str, float]:
    env = {**os.environ, "DPSCHED_CACHE_DIR": str(cache), "PYTHONWARNINGS": "ignore"}
    flag = flag or ("--measure-traced" if traced else "--measure")
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
    parser.add_argument("--measure-open", help=argparse.SUPPRESS)
    parser.add_argument("--validation", action="store_true",
                        help="measure the validation of a --gib GiB JSONL and indexed corpus when indexed")
    parser.add_argument("--gib", type=float, default=1.0, help="corpus size of --validation (default 1)")
    opts = parser.parse_args()
    if opts.measure or opts.measure_traced:
        print(json.dumps(measure(opts.measure or opts.measure_traced, traced=bool(opts.measure_traced))))
        return
    if opts.measure_open:
        print(json.dumps(measure_open(opts.measure_open)))
        return
    if opts.validation:
        with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
            validation(opts.gib, Path(tmp))
        return
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        small_first, small_cached, _ = bench(max(1, opts.samples // 10), Path(tmp))
        first, cached, size = bench(opts.samples, Path(tmp))
    grown = cached["peak_bytes"] - small_cached["peak_bytes"]
    print(f"cached start-up peak per extra sample: {grown / (opts.samples - max(1, opts.samples // 10)):.1f} bytes "
          f"(the index arrays are 36 bytes per sample); corpus file {size / opts.samples:.0f} "
          f"bytes per sample")
    verdict = "meets" if cached["seconds"] < TARGET_CACHED_S else "misses"
    print(f"cached start-up {cached['seconds']:.2f} s {verdict} the {TARGET_CACHED_S:.0f} s target")


if __name__ == "__main__":
    main()
