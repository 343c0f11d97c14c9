"""What the benchmark scripts share: the length files they read and the report blocks they write.

Length files: the permissively licensed ones shipped in the package (``megatron_dpsched/data``: GSM8K,
MIT; MT-Bench, Apache-2.0) always; others (e.g. ``alpaca_eval_outputs``, CC BY-NC data that is not
shipped) from ``--lengths-dir`` (default ``../shared/data/lengths`` beside the checkout) only where it exists.
Reports go to stdout; README/docs blocks are rewritten only when ``--readme`` / ``--markdown`` ask.
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


def update_marked_block(path: Path, name: str, text: str) -> None:
    """Replace the text between ``<!-- NAME:start ... -->`` and ``<!-- NAME:end -->`` in ``path``."""
    start, end = f"<!-- {name}:start (written by scripts/{name}.py --readme) -->", f"<!-- {name}:end -->"
    content = path.read_text(encoding="utf-8")
    if start not in content or end not in content:
        raise ValueError(f"--readme: {path} has no {name} markers")
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{text}\n{end}{tail}", encoding="utf-8")
