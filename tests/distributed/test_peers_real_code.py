"""scripts/bench_peers.py on the peers' REAL planners, each skipped unless its checkout is named:
``DPSCHED_SLIME_SRC``, ``DPSCHED_VERL_SRC``, ``DPSCHED_NEMO_RL_SRC``, ``DPSCHED_MEGATRON_LM_SRC`` (checked at
slime 624b824, verl b178a3c, NeMo-RL 7ea279a, Megatron-LM d98e8a6). The rewrites in
``megatron_dpsched.baselines`` must make the same plans as the real code wherever the real code plans, and the
comparison must run on a tiny input with cap-breaking plans counted apart.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import bench_peers  # noqa: E402
import peer_sources  # noqa: E402

from megatron_dpsched.core.config import ScheduleConfig  # noqa: E402


def _peers(key: str) -> list[peer_sources.PeerPlanner]:
    variable = bench_peers.SOURCES[key]
    if not os.environ.get(variable):
        pytest.skip(f"set {variable} to a checkout of the peer to run its real planner")
    return peer_sources.load_peers({key: os.environ[variable]})


@pytest.mark.parametrize("key", list(bench_peers.SOURCES))
def test_rewrites_make_the_real_codes_plans(key: str) -> None:
    for peer in _peers(key):
        if peer.name not in peer_sources.REWRITES:
            continue
        check = bench_peers.check_rewrite(peer, cases=60, seed=1)
        assert check.counts["different"] == 0 and check.counts["rank order"] == 0, check.first
        assert check.counts["identical"] >= 40, check  # most random steps are within what the peer accepts


@pytest.mark.parametrize("key", list(bench_peers.SOURCES))
def test_comparison_runs_on_the_real_planner(key: str) -> None:
    peers = _peers(key)
    config = ScheduleConfig(dp_size=4, global_batch_size=32, max_tokens_per_gpu=2048, pp_size=4, vpp_size=2)
    lengths = [1900, 40, 700, 300, 20, 1500, 480, 90] * 8
    rows = bench_peers.run_setting(lengths, setting="tiny", config=config, peers=peers,
                                   model=bench_peers.workload_model(1.0), cache=bench_peers.PeerCache())
    assert {r.peer for r in rows} == {p.name for p in peers}
    for row in rows:
        assert row.project > 0 and (row.peer_seconds is None or row.peer_seconds > 0)
        if row.peer_seconds is not None and not next(p for p in peers if p.name == row.peer).cap_breaking:
            assert not row.cap_breaking, f"{row.peer} is not cap-breaking but its plan went over the cap"
    for peer in peers:
        plan = peer.plan(lengths[:32], config=config)
        assert len({len(rank) for rank in plan}) == 1 and config.layout.is_legal(len(plan[0]))
