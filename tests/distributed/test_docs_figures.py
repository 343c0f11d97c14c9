"""Docs that cannot go stale: rerun the commands of the deterministic figures of README.md and docs/*.md.

Each figure names its command in its first line and marks its deterministic lines (micro-batch counts,
padding shares, loss tokens, planner tables) with ``check:`` (see ``scripts/update_docs.py``). This test
reruns every checked figure that is not marked ``slow`` (the CPU demo, the GPU check's CPU dry run, the
calibration demo and its fit, the what-if table: about two minutes on two cores) in a copy of the
checkout, so the figures' side effects (``out/``, the what-if PNGs) never touch the working tree, and
fails naming each figure whose checked lines no longer match. ``update_docs.py --check`` also reruns the
``slow`` ones (the PP=2 demo, the benchmarks); ``update_docs.py`` rewrites the blocks.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("update_docs", REPO / "scripts" / "update_docs.py")
update_docs = importlib.util.module_from_spec(_spec)
sys.modules["update_docs"] = update_docs
_spec.loader.exec_module(update_docs)


def _figures() -> list:
    figures = [f for p in update_docs.doc_files(REPO) for f in update_docs.parse_figures(p)]
    return [f for f in figures if (f.checks or f.check_all) and not f.slow and not update_docs.missing_needs(f)]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkout") / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".venv", ".git", "out", ".hypothesis", "__pycache__",
                                                              "*.egg-info", ".pytest_cache", ".ruff_cache"))
    return root


def test_the_suite_reruns_figures_of_every_kind() -> None:
    commands = " ".join(f.command for f in _figures())
    for script in ("scripts/demo.py", "scripts/gpu_check.sh", "megatron-dpsched plan", "megatron-dpsched calibrate"):
        assert script in commands, f"no checked, non-slow figure runs {script}"


@pytest.mark.parametrize("figure", _figures(), ids=lambda f: f.where)
def test_figure_matches_its_command(figure: update_docs.Figure, checkout: Path) -> None:
    output = update_docs.run_command(figure.command, timeout=figure.timeout, root=checkout)
    reason = update_docs.stale_reason(figure, output)
    assert reason is None, (f"{figure.where}: stale figure ({reason}); rerun "
                            f".venv/bin/python scripts/update_docs.py --only '{figure.where}'")
