"""Each fact has one statement; the docs that repeat it are generated from it or checked against it.

* The plan's invariants: the spec (the docstring of ``core/schedule.py``). ``docs/guarantees.md`` holds its
  list, generated from the spec's text; after editing the spec, ``python tests/unit/test_stated_once.py
  --write`` rewrites the list.
* The tail threshold :data:`~megatron_dpsched.core.objective.TAIL_IMBALANCE`: the prose that gives it as a
  percentage (README, the planner and benchmark pages, the help of ``--dp-schedule-balance-growth`` in
  ``docs/options.md``) gives the constant's value.
* The nominal GPU speed :data:`~megatron_dpsched.options.NOMINAL_FLOPS_PER_GPU` is not written out as a
  number in the what-if analysis.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from megatron_dpsched.core import schedule
from megatron_dpsched.core.objective import TAIL_IMBALANCE

REPO = Path(__file__).resolve().parents[2]
GUARANTEES = REPO / "docs" / "guarantees.md"
WRITE = "python tests/unit/test_stated_once.py --write"
BEGIN = f"<!-- The invariants of the spec (megatron_dpsched/core/schedule.py), written by `{WRITE}`. -->\n"
END = "<!-- End of the spec's invariants. -->\n"
TAIL_PROSE = re.compile(r"(?:more than|over)\s+(\d+(?:\.\d+)?)%\s+(?:\(`TAIL_IMBALANCE`\)\s+)?above")


def spec_invariants() -> str:
    """The spec's numbered invariants as Markdown (``code`` and Sphinx roles as `code`)."""
    text = schedule.__doc__.split("Invariants (", 1)[1].split("\n\n", 1)[1]
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text).rstrip() + "\n"


def _guarantees_block(page: str) -> str:
    assert page.count(BEGIN) == 1 and page.count(END) == 1, f"{GUARANTEES.name}: the spec's markers are missing"
    return page.split(BEGIN, 1)[1].split(END, 1)[0]


def write_guarantees() -> None:
    page = GUARANTEES.read_text(encoding="utf-8")
    old = _guarantees_block(page)
    GUARANTEES.write_text(page.replace(BEGIN + old + END, BEGIN + spec_invariants() + END), encoding="utf-8")


def test_the_guarantees_page_lists_the_specs_invariants() -> None:
    listed = _guarantees_block(GUARANTEES.read_text(encoding="utf-8"))
    assert [line[:3] for line in listed.splitlines() if line[:1].isdigit()] == [f"{n}. " for n in range(1, 7)]
    assert listed == spec_invariants(), f"the spec's invariants changed: {WRITE}"


@pytest.mark.parametrize("doc", ["README.md", "docs/planner.md", "docs/benchmarks.md", "docs/options.md"])
def test_the_tail_threshold_in_prose_is_the_constants(doc: str) -> None:
    text = (REPO / doc).read_text(encoding="utf-8")
    if doc == "docs/options.md":  # the help of --dp-schedule-balance-growth
        text = next(line for line in text.splitlines() if line.startswith("| `--dp-schedule-balance-growth`"))
    stated = TAIL_PROSE.findall(text)
    assert stated and set(stated) == {f"{TAIL_IMBALANCE:.0%}"[:-1]}, (doc, stated, TAIL_IMBALANCE)


def test_the_tail_prose_pattern_reads_the_percentage() -> None:
    assert TAIL_PROSE.findall("costs more than 5%\n  (`TAIL_IMBALANCE`) above max; stays over 12.5% above") == [
        "5", "12.5"]


def test_the_what_if_analysis_names_the_nominal_gpu_speed() -> None:
    source = (REPO / "megatron_dpsched" / "whatif" / "analysis.py").read_text(encoding="utf-8")
    assert "NOMINAL_FLOPS_PER_GPU" in source and not re.search(r"\b4(?:\.0)?e14\b", source)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {WRITE}")
    write_guarantees()
