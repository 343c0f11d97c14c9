"""scripts/bench_peers.py on the peers' REAL planners, each skipped unless its checkout is named:
``DPSCHED_SLIME_SRC``, ``DPSCHED_VERL_SRC``, ``DPSCHED_NEMO_RL_SRC``, ``DPSCHED_MEGATRON_LM_SRC`` (checked at
slime 624b824, verl b178a3c, NeMo-RL 7ea279a, Megatron-LM d98e8a6; Megatron-LM's gives its RL packer and
``DpBalancedScheduler``), and hybrid CP's ``BalancedCPScheduler`` from the installed megatron-core, always. The
rewrites in ``megatron_dpsched.baselines`` must make the same plans as the real code wherever the real code
plans, and the comparison must run on a tiny input with cap-breaking plans counted apart.
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


def _compared(peer: peer_sources.PeerPlanner, lengths: list[int], config: ScheduleConfig) -> list:
    rows = bench_peers.run_setting(lengths, setting="tiny", config=config, peers=[peer],
                                   model=bench_peers.workload_model(1.0), cache=bench_peers.PeerCache())
    return [r for r in rows if r.peer_seconds is not None]


def test_hybrid_cp_plans_every_sample_once_at_pp1_and_is_refused_with_pp() -> None:
    (peer,) = peer_sources.load_peers({}, hybrid_cp=True)
    config = ScheduleConfig(dp_size=4, global_batch_size=32, max_tokens_per_gpu=2048)
    lengths = [1900, 40, 700, 300, 20, 1500, 480, 90] * 4
    plan = peer.raw_plan(lengths, config=config)  # raw_plan asserts every sample once
    assert all(len(mb) == 1 for rank in plan for mb in rank), "hybrid CP runs each sub-sample on its own"
    busiest = max(sum(bench_peers.workload(lengths[mb[0]]) for mb in rank) for rank in plan)
    assert busiest < 1.3 * sum(map(bench_peers.workload, lengths)) / 4  # it balances the ranks
    assert len(_compared(peer, lengths * 2, config)) == 2 * len(bench_peers.OBJECTIVES)
    with pytest.raises(peer_sources.PeerRefused, match="pipeline parallelism"):
        peer.raw_plan(lengths, config=ScheduleConfig(dp_size=4, global_batch_size=32, max_tokens_per_gpu=2048,
                                                     pp_size=2))
    with pytest.raises(peer_sources.PeerRefused, match="several ranks"):  # over the cap: CP 2 over two ranks
        peer.raw_plan([4000, *lengths[1:]], config=config)


def test_dp_balanced_is_next_fit_in_megatrons_order_with_a_legal_count() -> None:
    peer = next(p for p in _peers("megatron_lm") if p.name == "megatron_dp_balanced")
    config = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=1000, pp_size=2, vpp_size=2)
    lengths = [900, 400, 300, 500, 300, 800, 300, 700]
    # gathered as rank 0's samples 0 2 4 6, then rank 1's 1 3 5 7; next fit under 1000 tokens makes [0] [2 4 6]
    # [1 3] [5] [7]; to reach a multiple of 4 packs (DP 2 x the VPP group 2) samples are split off the last packs
    # of several: 3, 6, then 4; pack i goes to rank i % 2
    plan = peer.raw_plan(lengths, config=config)
    assert plan == [[[0], [1], [7], [6]], [[2], [5], [3], [4]]]
    assert config.layout.is_legal(len(plan[0]))
    assert len(_compared(peer, lengths, config)) == len(bench_peers.OBJECTIVES)
    # its first pack is never split: 5 packs [0 2] [4 6 1] [3] [5] [7] cannot become 8 (a plan exists)
    with pytest.raises(peer_sources.PeerRefused, match="Not enough samples to move"):
        peer.raw_plan([600, 100, 300, 500, 200, 700, 400, 900], config=config)
    with pytest.raises(peer_sources.PeerRefused, match="Not enough samples to move"):
        peer.raw_plan([900, 900], config=ScheduleConfig(dp_size=4, global_batch_size=4, max_tokens_per_gpu=1000))
