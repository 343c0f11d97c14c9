"""scripts/bench_peers.py's comparison logic, without the peers: cap-breaking plans are reported and never
counted as wins, refused steps apart, plans compared rank by rank; and the script without peer paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import bench_peers  # noqa: E402
from peer_sources import PeerPlanner, PeerRefused  # noqa: E402

from megatron_dpsched.core.config import ScheduleConfig  # noqa: E402


def _step(project: float, peer: float | None, *, breaking: bool = False) -> bench_peers.PeerStep:
    return bench_peers.PeerStep(layout="PP1", setting="s", step=0, objective="default", peer="p", project=project,
                                peer_seconds=peer, cap_breaking=breaking)


def test_cap_breaking_and_refused_steps_are_never_wins() -> None:
    rows = [_step(1.00, 1.00), _step(1.02, 1.00), _step(1.004, 1.00), _step(0.90, 1.00),
            _step(2.0, 1.0, breaking=True), _step(1.0, 1.0, breaking=True), _step(1.0, None)]
    t = bench_peers.tally(rows)
    assert t.steps == 7 and t.refused == 1
    assert t.compared == [1.0, 1.02, 1.004, 0.9]
    assert t.behind == 1  # 1.02 only: 1.004 is within 0.5%, the cap-breaking 2.0 is not a win
    assert (t.cap_breaking, t.cap_breaking_faster) == (2, 1)
    assert t.worst == 1.02 and abs(t.median - 1.002) < 1e-12
    assert [r.project for r in bench_peers.losses(rows)] == [1.02]
    assert bench_peers.tally([_step(1.0, None)]).worst is None


def test_cap_breaking_counts_micro_batches_of_several_samples_only() -> None:
    lengths = [5000, 3000, 2000]
    assert not bench_peers.cap_breaking([[[0], [1, 2]]], lengths, 5000)  # one sample over the cap: unsplittable
    assert bench_peers.cap_breaking([[[0], [1, 2]]], lengths, 4999)
    assert not bench_peers.cap_breaking([[[0]], [[1], [2], []]], lengths, 3000)


def test_plan_match_tells_identical_from_rank_order_from_different() -> None:
    real = [[[0, 1], [2]], [[3], [4, 5]]]
    assert bench_peers.plan_match(real, [[[1, 0], [2]], [[3], [5, 4]]]) == "identical"
    assert bench_peers.plan_match(real, [[[3], [4, 5]], [[0, 1], [2]]]) == "rank order"
    assert bench_peers.plan_match(real, [[[2], [0, 1]], [[3], [4, 5]]]) == "different"  # order within a rank
    assert bench_peers.plan_match(real, [[[0], [1, 2]], [[3], [4, 5]]]) == "different"


def _one_micro_batch_per_rank(lengths: list[int], config: ScheduleConfig) -> list:
    """A stand-in peer for the test: rank r takes samples r, r + dp, ... in one micro-batch (over the cap)."""
    dp = config.dp_size
    return [[list(range(r, len(lengths), dp))] for r in range(dp)]


def _refusing(lengths: list[int], config: ScheduleConfig) -> list:
    raise AssertionError("max_token_len must be greater than the sequence length")


def test_run_setting_reports_cap_breaking_and_refused_peers_apart() -> None:
    config = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=1000, pp_size=2, vpp_size=1)
    lengths = [900, 50, 700, 300, 20, 640, 480, 90] * 2
    peers = [PeerPlanner(name="lump", plan_step=_one_micro_batch_per_rank, cap_breaking=True),
             PeerPlanner(name="refuses", plan_step=_refusing)]
    rows = bench_peers.run_setting(lengths, setting="tiny", config=config, peers=peers,
                                   model=bench_peers.workload_model(1.0), cache=bench_peers.PeerCache())
    assert len(rows) == 2 * 2 * len(bench_peers.OBJECTIVES)  # steps x peers x objectives
    lump = [r for r in rows if r.peer == "lump"]
    assert all(r.cap_breaking and r.peer_seconds > 0 for r in lump)
    assert bench_peers.tally(lump).compared == [] and bench_peers.tally(lump).cap_breaking == len(lump)
    assert all(r.peer_seconds is None for r in rows if r.peer == "refuses")
    table = "\n".join(bench_peers.comparison_table(rows))
    assert "| PP2 | default | lump | 2 | - | - | 0 | 2 (" in table
    assert "| PP2 | step-time | refuses | 2 | - | - | 0 | 0 (0) | 2 |" in table


def test_peer_plan_refusal_and_padding_to_a_legal_count() -> None:
    config = ScheduleConfig(dp_size=2, global_batch_size=4, max_tokens_per_gpu=100, pp_size=4, vpp_size=2)
    peer = PeerPlanner(name="p", plan_step=lambda lengths, cfg: [[[0], [1]], [[2, 3]]])
    plan = peer.plan([10, 10, 10, 10], config=config)
    assert [len(rank) for rank in plan] == [4, 4] and plan[1][1:] == [[], [], []]
    try:
        PeerPlanner(name="r", plan_step=_refusing).plan([1, 2], config=config)
    except PeerRefused as exc:
        assert "max_token_len" in str(exc)
    else:
        raise AssertionError("a peer's AssertionError must come back as PeerRefused")


def test_without_peer_sources_the_script_says_so_and_imports_no_torch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in bench_peers.SOURCES.values()}
    env["PYTHONPATH"] = str(REPO)
    code = ("import runpy, sys; sys.argv = ['bench_peers.py']; "
            f"sys.path.insert(0, {str(REPO / 'scripts')!r});\n"
            "try:\n    runpy.run_path(sys.path[0] + '/bench_peers.py', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no peer source given" in proc.stdout


def test_megatron_order_is_by_dp_rank_then_local_index() -> None:
    from peer_sources import megatron_order

    assert megatron_order(8, 2) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert megatron_order(6, 3) == [0, 3, 1, 4, 2, 5]
    assert megatron_order(4, 1) == [0, 1, 2, 3]


def test_classes_from_file_compiles_only_the_named_classes(tmp_path: Path) -> None:
    from peer_sources import classes_from_file

    source = tmp_path / "schedule.py"
    source.write_text("import not_installed_here\n\nclass Base:\n    size = 2\n\n\nclass Packer(Base):\n"
                      "    def double(self):\n        return self.size * 2\n", encoding="utf-8")
    classes = classes_from_file(source, ("Base", "Packer"), {})
    assert classes["Packer"]().double() == 4  # the module's import never ran
    try:
        classes_from_file(source, ("Base", "DpBalancedScheduler"), {})
    except ValueError as exc:
        assert "DpBalancedScheduler" in str(exc)
    else:
        raise AssertionError("a class missing from the checkout must be a ValueError")


def test_a_peer_megatron_refuses_with_pipelines_is_refused_there_even_after_its_pp1_run() -> None:
    peer = PeerPlanner(name="pp1_only", plan_step=_one_micro_batch_per_rank, pipeline_refusal="AssertionError: no PP")
    lengths, cache = [100, 50, 70, 30, 20, 60, 40, 90], bench_peers.PeerCache()
    runs = {}
    for pp in (1, 2):
        config = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=1000, pp_size=pp)
        runs[pp] = bench_peers.run_setting(lengths, setting="tiny", config=config, peers=[peer],
                                           model=bench_peers.workload_model(1.0), cache=cache)
    assert all(r.peer_seconds is not None for r in runs[1]) and all(r.peer_seconds is None for r in runs[2])
