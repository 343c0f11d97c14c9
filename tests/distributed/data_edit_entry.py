"""``torchrun`` target: the GPT entry point, with one data file edited in place once every rank has indexed it.

``$DPSCHED_EDIT`` holds ``{"file": PATH, "offset": N, "hex": BYTES, "sync": DIR}``: after each rank opens the
corpus holding ``PATH`` (its length index or scan built), it leaves ``DIR/opened.<rank>``; global rank 0 waits
for every rank's, writes ``BYTES`` at byte ``N`` of ``PATH`` (same size: an in-place edit under a running job)
and leaves ``DIR/edited``, which the other ranks wait for. Then training goes on as usual.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

from megatron_dpsched.data import corpus

ENTRY = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_gpt_dpsched.py"
WAIT_S = 120


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _edit_once_opened(edit: dict) -> None:
    sync, rank, world = Path(edit["sync"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    (sync / f"opened.{rank}").touch()
    if rank == 0:
        for other in range(world):
            _wait_for(sync / f"opened.{other}")
        with open(edit["file"], "r+b") as out:
            out.seek(int(edit["offset"]))
            out.write(bytes.fromhex(edit["hex"]))
        (sync / "edited").touch()
    _wait_for(sync / "edited")


def _wrap(cls: type, edit: dict) -> None:
    opened = cls.__init__

    def __init__(self, *args, **kwargs) -> None:
        opened(self, *args, **kwargs)
        if not (Path(edit["sync"]) / f"opened.{os.environ['RANK']}").exists():
            _edit_once_opened(edit)

    cls.__init__ = __init__


if __name__ == "__main__":
    settings = json.loads(os.environ["DPSCHED_EDIT"])
    for dataset_class in (corpus.TokenJsonlDataset, corpus.IndexedTokenDataset):
        _wrap(dataset_class, settings)
    sys.argv = [str(ENTRY), *sys.argv[1:]]
    runpy.run_path(str(ENTRY), run_name="__main__")
