"""Rerun the commands behind the figures of README.md and docs/*.md; rewrite their blocks, or check them.

A figure is a fenced ``text`` block right after a marker comment. The block's first line names the
command (``$ COMMAND``, continued on the next lines while a line ends in ``\\``); the rest is what the
command printed on stdout::

    <!-- figure
    check: ^  padding share
    check: micro-batches per rank, total\\s*: (\\d+)
    slow
    -->
    ```text
    $ .venv/bin/python scripts/demo.py --out out/demo | sed -n '/^comparison/,$p'
    comparison (dp-schedule vs baseline, ...)
    ...
    ```

Marker lines (all optional):

- ``check: REGEX`` (repeatable): the figure's deterministic lines. Every output line that REGEX finds
  (``re.search``) must come back the same, in the same order, when the command is rerun; where REGEX
  has groups only the groups are compared (a line mixing counts and timings). ``check: all`` compares
  the whole output. A figure without ``check`` lines shows timings: it is rewritten, never compared.
- ``slow``: too slow for the test suite (``tests/distributed/test_docs_figures.py`` leaves it out);
  ``--check`` still reruns it.
- ``timeout: SECONDS`` (default 900).
- ``needs: VAR [VAR...]``: the command reads these environment variables (e.g. the checkouts of the peers that
  ``scripts/bench_peers.py`` runs); where one is unset the figure is left as it is, with a note on stderr, by
  this script and by the test.

Every ``text`` block in these files must be a figure (``unmarked_blocks``; a unit test enforces it),
so no output can be pasted in without its command. Sample data goes in ``jsonl``/``json``/``bash``
blocks. Commands run with bash (``pipefail``) from the repository root, with this checkout first on
``PYTHONPATH``; a leading ``.venv/bin/`` means the folder of the interpreter running this script (so
``DPSCHED_PYTHON`` environments work). A command that exits non-zero is an error, never a figure::

    .venv/bin/python scripts/update_docs.py                 # rerun every figure, rewrite the blocks
    .venv/bin/python scripts/update_docs.py --check         # compare the checked lines; exit 1 listing stale ones
    .venv/bin/python scripts/update_docs.py --list          # the figures, where, and their flags
    .venv/bin/python scripts/update_docs.py --only calibrate docs/calibration.md   # a subset

Exit status: 0 done / up to date, 1 stale figures (``--check``) or a command that failed, 2 a bad marker.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- figure\b(?P<body>.*?)-->\n```text\n(?P<block>.*?)^```$", re.S | re.M)
TEXT_FENCE = re.compile(r"^```text$", re.M)
VENV_BIN = re.compile(r"(?<![\w./-])\.venv/bin/")
DEFAULT_TIMEOUT = 900.0


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One marked block of a markdown file."""

    path: Path
    """The markdown file."""
    line: int
    """1-based line of the marker comment."""
    command: str
    """The shell command, continuation lines joined as written."""
    output: str
    """The block's output lines (after the command), without the trailing newline."""
    checks: tuple[re.Pattern[str], ...]
    """The deterministic lines (``check: all`` is ``(re.compile(""),)`` with ``check_all``)."""
    check_all: bool
    """Compare the whole output."""
    slow: bool
    """Left out of the test suite."""
    needs: tuple[str, ...]
    """Environment variables the command needs; the figure is skipped where one is unset."""
    timeout: float
    """Seconds the command may run."""
    span: tuple[int, int]
    """Character offsets of the block's content (command and output) in the file."""

    @property
    def where(self) -> str:
        try:
            return f"{self.path.relative_to(REPO)}:{self.line}"
        except ValueError:
            return f"{self.path}:{self.line}"


class MarkerError(ValueError):
    """A figure marker or block that cannot be read."""


def _parse_marker(body: str, where: str) -> dict:
    fields: dict = {"checks": [], "check_all": False, "slow": False, "timeout": DEFAULT_TIMEOUT, "needs": ()}
    for raw in body.strip().splitlines():
        line = raw.strip()
        if not line:
            continue
        key, _, value = line.partition(":")
        if key == "check" and value.strip() == "all":
            fields["check_all"] = True
        elif key == "check":
            try:
                fields["checks"].append(re.compile(value.strip()))
            except re.error as exc:
                raise MarkerError(f"{where}: bad check regex {value.strip()!r}: {exc}") from exc
        elif key == "slow" and not value:
            fields["slow"] = True
        elif key == "timeout":
            fields["timeout"] = float(value)
        elif key == "needs" and value.split():
            fields["needs"] = tuple(value.split())
        else:
            raise MarkerError(f"{where}: unknown figure marker line {line!r} (check:, slow, timeout:, needs:)")
    return fields


def _split_block(block: str, where: str) -> tuple[str, str]:
    lines = block.rstrip("\n").split("\n")
    if not lines or not lines[0].startswith("$ "):
        raise MarkerError(f"{where}: a figure block starts with '$ COMMAND'")
    command = [lines[0][2:]]
    i = 1
    while command[-1].endswith("\\") and i < len(lines):
        command.append(lines[i])
        i += 1
    return "\n".join(command), "\n".join(lines[i:])


def parse_figures(path: Path) -> list[Figure]:
    """The figures of one markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    figures = []
    for match in MARKER.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        where = f"{path}:{line}"
        fields = _parse_marker(match.group("body"), where)
        command, output = _split_block(match.group("block"), where)
        figures.append(Figure(path=path, line=line, command=command, output=output, checks=tuple(fields["checks"]),
                              check_all=fields["check_all"], slow=fields["slow"], timeout=fields["timeout"],
                              needs=fields["needs"], span=match.span("block")))
    return figures


def unmarked_blocks(path: Path) -> list[int]:
    """Lines of ``text`` blocks that no figure marker precedes (each should name its command)."""
    text = path.read_text(encoding="utf-8")
    marked = {m.start("block") - len("```text\n") for m in MARKER.finditer(text)}
    return [text.count("\n", 0, m.start()) + 1 for m in TEXT_FENCE.finditer(text) if m.start() not in marked]


def doc_files(root: Path = REPO) -> list[Path]:
    """README.md and the pages under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def run_command(command: str, *, timeout: float = DEFAULT_TIMEOUT, root: Path = REPO) -> str:
    """Run a figure's command from ``root`` (a checkout, first on ``PYTHONPATH``); its stdout, trailing
    spaces and blank lines cut."""
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    shell = VENV_BIN.sub(f"{bindir}/", command.replace("\\\n", " "))
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode} from: {command}\n{proc.stderr[-3000:]}")
    return "\n".join(line.rstrip() for line in proc.stdout.rstrip().split("\n"))


def checked_values(figure: Figure, output: str) -> list:
    """What ``check`` compares: the whole output, or per check regex the lines (or groups) it finds."""
    if figure.check_all:
        return output.split("\n")
    values = []
    for pattern in figure.checks:
        found = [m.groups() or m.string for m in map(pattern.search, output.split("\n")) if m]
        values.append((pattern.pattern, found))
    return values


def stale_reason(figure: Figure, new_output: str) -> str | None:
    """Why the figure no longer matches its command's output (None: it matches)."""
    old, new = checked_values(figure, figure.output), checked_values(figure, new_output)
    for pattern, found in [] if figure.check_all else old:
        if not found:
            return f"check {pattern!r} finds no line in the figure"
    if old == new:
        return None
    if figure.check_all:
        diff = [f"  - {a}\n  + {b}" for a, b in zip(old, new) if a != b] or [f"  {len(old)} vs {len(new)} lines"]
        return "output differs:\n" + "\n".join(diff[:5])
    lines = [f"  {p!r}: {a} -> {b}" for (p, a), (_, b) in zip(old, new) if a != b]
    return "checked lines differ:\n" + "\n".join(lines)


def rewrite(path: Path, outputs: dict[int, str]) -> None:
    """Replace the output of the figures of ``path`` (by marker line) with new outputs."""
    text = path.read_text(encoding="utf-8")
    for figure in reversed(parse_figures(path)):
        if figure.line in outputs:
            start, end = figure.span
            body = f"$ {figure.command}\n{outputs[figure.line]}\n"
            text = text[:start] + body + text[end:]
    path.write_text(text, encoding="utf-8")


def missing_needs(figure: Figure) -> list[str]:
    """The environment variables of ``needs:`` that are unset (the figure cannot be rerun here)."""
    return [name for name in figure.needs if not os.environ.get(name)]


def select(figures: list[Figure], args: argparse.Namespace) -> list[Figure]:
    chosen = [f for f in figures if not args.only or args.only in f.command or args.only in f.where]
    if args.list:
        return chosen
    for figure in [f for f in chosen if missing_needs(f)]:
        print(f"{figure.where}: left as it is: set {', '.join(missing_needs(figure))} to rerun it", file=sys.stderr)
    chosen = [f for f in chosen if not missing_needs(f)]
    if args.skip_slow:
        chosen = [f for f in chosen if not f.slow]
    if args.check:
        chosen = [f for f in chosen if f.checks or f.check_all]
    return chosen


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md and docs/*.md)")
    parser.add_argument("--check", action="store_true",
                        help="rerun the figures with check lines and compare; exit 1 listing the stale ones")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    parser.add_argument("--only", help="only figures whose command or FILE:LINE contains this text")
    parser.add_argument("--skip-slow", action="store_true", help="leave out figures marked slow")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = [p.resolve() for p in args.files] or doc_files()
    try:
        figures = select([f for p in files for f in parse_figures(p)], args)
    except MarkerError as exc:
        print(f"update_docs: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for f in figures:
            flags = ("check all" if f.check_all else f"{len(f.checks)} checks") + (", slow" if f.slow else "") + (
                f", needs {' '.join(f.needs)}" if f.needs else "")
            print(f"{f.where}  [{flags}]  $ {f.command.splitlines()[0]}")
        return 0
    return _run(figures, check=args.check)


def _run(figures: list[Figure], *, check: bool) -> int:
    cache: dict[str, str] = {}
    problems: list[str] = []
    new: dict[Path, dict[int, str]] = {}
    for figure in figures:
        print(f"{figure.where}: $ {figure.command.splitlines()[0]}", file=sys.stderr, flush=True)
        try:
            output = cache[figure.command] = cache.get(figure.command) or run_command(
                figure.command, timeout=figure.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{figure.where}: {exc}")
            continue
        reason = stale_reason(figure, output) if (figure.checks or figure.check_all) else None
        if check and reason:
            problems.append(f"{figure.where}: stale figure ({reason})")
        elif not check:
            if reason:
                print(f"{figure.where}: figures changed ({reason})", file=sys.stderr)
            new.setdefault(figure.path, {})[figure.line] = output
    for path, outputs in new.items():
        rewrite(path, outputs)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
