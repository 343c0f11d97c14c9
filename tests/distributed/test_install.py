"""Installing into an environment that already has torch and megatron-core installs neither."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("target", [".", ".[megatron,demo,test]"])
def test_pip_install_into_a_megatron_environment_adds_only_this_package(tmp_path: Path, target: str) -> None:
    import megatron.core  # noqa: F401 - the environment under test has both
    import torch  # noqa: F401

    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--report", str(report), target], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    would_install = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert would_install == ["megatron-dpsched"], would_install
