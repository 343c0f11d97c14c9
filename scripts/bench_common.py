"""What the benchmark scripts share: the length files they read and the report blocks they write.

Length files: the permissively licensed ones shipped in the package (``megatron_dpsched/data``: GSM8K,
MIT; MT-Bench, Apache-2.0) always; others (e.g. ``alpaca_eval_outputs``, CC BY-NC data that is not
shipped) from ``--lengths-dir`` (default ``../shared/data/lengths`` beside the checkout) only where it exists.
Reports go to stdout; a benchmark writes its own docs page only when ``--markdown FILE`` asks, and never
the README (the figures of README.md and docs/*.md are rerun by ``scripts/update_docs.py``).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "megatron_dpsched" / "data"
DEFAULT_LENGTHS_DIR = REPO.parent / "shared" / "data" / "lengths"


def length_files(lengths_dir: Path | None = None) -> dict[str, Path]:
    """``name -> path``: the shipped files, then the other ``*.txt`` files of ``lengths_dir`` (if it exists)."""
    files = {p.stem: p for p in sorted(SHIPPED.glob("*.txt"))}
    if lengths_dir is not None and lengths_dir.is_dir():
        files.update({p.stem: p for p in sorted(lengths_dir.glob("*.txt")) if p.stem not in files})
    return files

