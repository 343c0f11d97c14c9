"""``torchrun`` target that runs ``scripts/pretrain_gpt_dpsched.py`` with this rank's own arguments.

``$DPSCHED_PER_RANK`` names a JSON file holding, per global rank, ``{"argv": [...], "cwd": DIR}``: the
rank changes to ``cwd`` (so a relative ``--data-path`` can name another file on each rank) and runs the
entry point with ``argv``, as if torchrun had started it with them.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

ENTRY = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_gpt_dpsched.py"

if __name__ == "__main__":
    mine = json.loads(Path(os.environ["DPSCHED_PER_RANK"]).read_text())[int(os.environ["RANK"])]
    os.chdir(mine["cwd"])
    sys.argv = [str(ENTRY), *mine["argv"]]
    runpy.run_path(str(ENTRY), run_name="__main__")
