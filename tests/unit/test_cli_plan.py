"""``megatron-dpsched plan`` as a what-if tool: the table, the JSON, the warnings (no torch)."""

from __future__ import annotations

import json
import re

import pytest

from megatron_dpsched import build_dp_schedule
from megatron_dpsched.cli import main
from megatron_dpsched.whatif.analysis import plan_ours
from megatron_dpsched.whatif.inputs import load_sample_lengths
from megatron_dpsched.whatif.model import DEFAULT_MODEL

# dp 2, global batch 4, cap 100: step 0 = four 60s (each alone: 2 micro-batches per rank for every
# strategy), step 1 = four 30s (dp-schedule and per-rank packing: one micro-batch of two per rank;
# Megatron fixed: micro_batch_size = 100 // 90 = 1, so 2), step 2 = one 90 (ragged, one rank empty).
LENGTHS = [60, 60, 60, 60, 30, 30, 30, 30, 90]
LAYOUT = ["--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "100"]
FLOPS = 4e14
OVERHEAD = 0.002  # seconds per micro-batch forward: --microbatch-overhead-ms's default, training's 2 ms


def _write(tmp_path, text: str, name: str = "lengths.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _rows(out: str) -> dict[str, list[list[str]]]:
    """Table rows by their first cell (step number or 'all'): per strategy group, the cells."""
    rows = {}
    for line in out.splitlines():
        parts = [part.split() for part in line.split("|")]
        if len(parts) > 1 and parts[0] and (parts[0][0].isdigit() or parts[0][0] == "all") and len(parts[1]) == 5:
            rows[parts[0][0]] = parts
    return rows


def _seconds(micro_batches_per_rank: list[list[list[int]]]) -> float:
    """Step time with PP 1 restated: the slowest rank's 3 x sum of forward times (overhead + a per token + b per
    token pair)."""
    a = DEFAULT_MODEL.linear_flops_per_token / FLOPS
    b = DEFAULT_MODEL.quadratic_flops_per_token_pair / FLOPS
    return max(sum(3 * (OVERHEAD + a * sum(mb or [1]) + b * sum(n * n for n in (mb or [1]))) for mb in rank)
               for rank in micro_batches_per_rank)


def test_table_puts_the_strategies_side_by_side_with_hand_derived_totals(tmp_path, capsys) -> None:
    # one line per sample and several on a line: one parser for both
    path = _write(tmp_path, "60 60\n60\n60\n\n30 30 30 30\n90\n")
    assert main(["plan", path, *LAYOUT]) == 0
    out = capsys.readouterr().out
    assert "dp-schedule" in out and "Megatron fixed" in out and "per-rank packing" in out
    assert "fixed mbs 1" in out and "per-rank" in out and "token fill" in out and "in %" in out
    rows = _rows(out)
    assert set(rows) == {"0", "1", "2", "all"}
    counts = {step: [int(rows[step][g][0]) for g in (1, 2, 3)] for step in rows}
    assert counts == {"0": [2, 2, 2], "1": [1, 2, 1], "2": [1, 1, 1], "all": [4, 5, 4]}
    assert rows["all"][0] == ["all", "9"] and rows["2"][0] == ["2", "1*"]  # * marks the ragged step
    fills = {step: [float(rows[step][g][1]) for g in (1, 2, 3)] for step in rows}
    assert fills["1"] == [60.0, 30.0, 60.0]
    assert fills["all"][0] == pytest.approx(100 * (0.6 * 2 + 0.6 + 0.45) / 4, abs=0.05)
    assert fills["all"][1] == pytest.approx(100 * (0.6 * 2 + 0.3 * 2 + 0.45) / 5, abs=0.05)
    ours = [_seconds([[[60], [60]], [[60], [60]]]), _seconds([[[30, 30]], [[30, 30]]]), _seconds([[[90]], [[]]])]
    fixed = [ours[0], _seconds([[[30], [30]], [[30], [30]]]), ours[2]]
    times = {step: [float(rows[step][g][4]) for g in (1, 2)] for step in rows}
    assert times["1"] == pytest.approx([1e3 * ours[1], 1e3 * fixed[1]], abs=0.006)
    assert times["all"] == pytest.approx([1e3 * sum(ours), 1e3 * sum(fixed)], abs=0.006)
    assert float(rows["all"][4][0].rstrip("x")) == pytest.approx(sum(fixed) / sum(ours), abs=0.006)


def test_padding_of_megatron_fixed_and_of_bshd_packing(tmp_path, capsys) -> None:
    # longest 50, cap 100: Megatron fixed runs 2 samples per micro-batch, [50, 10] padded to 2 x 50
    path = _write(tmp_path, "50 10 50 10 40 40 40 40")
    assert main(["plan", path, *LAYOUT, "--json", "--collate-format", "thd"]) == 0
    report = json.loads(capsys.readouterr().out)
    fixed = report["steps"][0]["strategies"]["megatron_fixed"]
    assert (fixed["padding"], fixed["tokens"]) == (80, 120)
    assert report["total"]["strategies"]["megatron_fixed"]["padding_share"] == pytest.approx(80 / (280 + 80))
    assert report["total"]["strategies"]["dpsched"]["padding_share"] == 0.0  # thd: nothing padded
    assert main(["plan", path, *LAYOUT, "--json", "--collate-format", "bshd"]) == 0
    padded = json.loads(capsys.readouterr().out)
    assert padded["steps"][0]["strategies"]["dpsched"]["padding"] == 80  # [50, 10] on each rank, padded


def test_json_schema(tmp_path, capsys) -> None:
    path = _write(tmp_path, "\n".join(map(str, LENGTHS)))
    assert main(["plan", path, *LAYOUT, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"input", "samples", "config", "tp_size", "megatron_fixed_micro_batch_size",
                           "megatron_fixed_micro_batch_size_from", "speedup_against", "simulation", "strategies",
                           "columns", "steps", "total", "warnings", "plots"}
    assert report["megatron_fixed_micro_batch_size"] == 1  # 100 // 90
    assert report["strategies"] == ["dpsched", "megatron_fixed", "per_rank_first_fit"]
    assert report["samples"] == 9 and report["config"]["dp_size"] == 2
    assert len(report["steps"]) == 3
    for step in report["steps"]:
        assert set(step) == {"step", "samples", "tokens", "strategies", "speedup"}
        assert set(step["speedup"]) == {"megatron_fixed", "per_rank_first_fit"}
        for row in step["strategies"].values():
            assert set(row) == {"micro_batches", "tokens", "padding", "padding_share", "token_fill", "imbalance",
                                "seconds", "slowest_rank", "rank_tokens", "rank_padding"}
            assert len(row["rank_tokens"]) == 2
    assert [s["strategies"]["megatron_fixed"]["micro_batches"] for s in report["steps"]] == [2, 2, 1]
    assert set(report["total"]) == {"samples", "strategies", "speedup"}
    assert [w["kind"] for w in report["warnings"]] == ["ragged_step"]
    assert set(report["warnings"][0]) == {"kind", "message", "step", "ids", "count"}


def test_warnings_for_a_ragged_step_a_sample_over_the_cap_and_dropped_samples(tmp_path, capsys) -> None:
    path = _write(tmp_path, "60 60 60 250 30 30 30 30 90")  # id 3 is over the cap
    assert main(["plan", path, *LAYOUT, "--json"]) == 0
    captured = capsys.readouterr()
    kinds = {w["kind"]: w for w in json.loads(captured.out)["warnings"]}
    assert set(kinds) == {"ragged_step", "over_cap"}
    assert kinds["ragged_step"]["step"] == 2 and "Megatron" in kinds["ragged_step"]["message"]
    assert kinds["over_cap"]["ids"] == [3] and "id 3" in kinds["over_cap"]["message"]
    err = captured.err.splitlines()
    assert sum(line.startswith("megatron-dpsched: warning: ") for line in err) == 2
    assert main(["plan", _write(tmp_path, " ".join(["40"] * 10)), *LAYOUT, "--drop-last", "--json"]) == 0
    captured = capsys.readouterr()
    (dropped,) = json.loads(captured.out)["warnings"]
    assert dropped["kind"] == "dropped" and dropped["ids"] == [8, 9] and dropped["count"] == 2
    assert "dropped 2 sample(s)" in captured.err and "ids 8, 9" in captured.err


def test_table_mode_warns_on_stderr_only(tmp_path, capsys) -> None:
    assert main(["plan", _write(tmp_path, " ".join(map(str, LENGTHS))), *LAYOUT]) == 0
    captured = capsys.readouterr()
    assert "warning:" not in captured.out
    assert "megatron-dpsched: warning: step 2 trains 1 samples" in captured.err


def test_model_shape_flags_change_the_costs_and_model_shape_file(tmp_path, capsys) -> None:
    path = _write(tmp_path, "4000 100 100 100 100 100 100 100")
    shape = ["--hidden-size", "256", "--num-layers", "2", "--num-attention-heads", "4"]
    assert main(["plan", path, *LAYOUT[:4], "--max-tokens-per-gpu", "8192", *shape, "-o", str(tmp_path / "a")]) == 0
    assert main(["plan", path, *LAYOUT[:4], "--max-tokens-per-gpu", "8192", "--balance", "tokens",
                 "-o", str(tmp_path / "b")]) == 0
    cost, tokens = (json.loads((tmp_path / name).read_text()) for name in "ab")
    assert cost["costs"] != tokens["costs"] and tokens["costs"] == [float(n) for n in tokens["lengths"]]
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"hidden_size": 256, "num_layers": 2, "num_attention_heads": 4}))
    assert main(["plan", path, *LAYOUT[:4], "--max-tokens-per-gpu", "8192", "--model-shape", str(model),
                 "-o", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c").read_text())["costs"] == cost["costs"]
    assert "hidden 256, 2 layers" in capsys.readouterr().out


def test_jsonl_lengths_without_torch(tmp_path) -> None:
    path = _write(tmp_path, '{"tokens": [1, 2, 3]}\n\n{"tokens": [4, 5]}\n', "corpus.jsonl")
    assert load_sample_lengths(path) == ([2, 1], "JSONL corpus")


def test_jsonl_rows_read_as_training_reads_them(tmp_path) -> None:
    path = _write(tmp_path, '{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}\n{"tokens": [4, 5]}\n', "hf.jsonl")
    assert load_sample_lengths(path) == ([2, 1], "JSONL corpus")


@pytest.mark.parametrize(("row", "message"), [
    ('{"tokens": [1, true, 3]}', "true/false are not ids"),
    ('{"tokens": [1, 2, 3], "input_ids": [1, 2]}', "both 'tokens' and 'input_ids'"),
    ('{"tokens": ' + "[" * 200_000 + "]" * 200_000 + "}", "levels deep"),
    ('{"tokens": [1, -2, 3]}', "negative token id"),
])
def test_jsonl_rows_training_refuses_are_refused_naming_the_line(tmp_path, row: str, message: str) -> None:
    path = _write(tmp_path, '{"tokens": [1, 2]}\n' + row + "\n", "bad.jsonl")
    with pytest.raises(ValueError, match=re.escape("bad.jsonl:2: ")) as info:
        load_sample_lengths(path)
    assert message in str(info.value)


def test_planning_in_chunks_equals_one_call() -> None:
    lengths = [(i * 37) % 500 + 1 for i in range(1003)]  # 251 steps of 4, the last ragged
    for drop_last in (False, True):
        kwargs = dict(dp_size=2, global_batch_size=4, max_tokens_per_gpu=600, drop_last=drop_last)
        whole = build_dp_schedule(lengths, cost_model=DEFAULT_MODEL, **kwargs)
        ticks = []
        chunked = plan_ours(lengths, config=whole.config, cost_model=DEFAULT_MODEL, tick=ticks.append)
        assert chunked == whole and sum(ticks) == whole.num_steps and len(ticks) > 1


def test_progress_bar_on_request(tmp_path, capsys) -> None:
    assert main(["plan", _write(tmp_path, " ".join(map(str, LENGTHS))), *LAYOUT, "--progress"]) == 0
    err = capsys.readouterr().err
    assert "planning [" in err and "simulating [" in err and "100%" in err


def test_with_a_pipeline_the_plan_minimises_the_simulated_step_time(capsys) -> None:
    layout = ["--dp-size", "8", "--global-batch-size", "256", "--max-tokens-per-gpu", "1024", "--pp-size", "4",
              "--microbatch-overhead-ms", "1", "--json"]
    totals = {}
    for objective in ("step-time", "micro-batches"):
        assert main(["plan", "megatron_dpsched/data/gsm8k_train.txt", *layout, "--objective", objective]) == 0
        totals[objective] = json.loads(capsys.readouterr().out)["total"]["strategies"]["dpsched"]
    assert totals["step-time"]["seconds"] < totals["micro-batches"]["seconds"]
    assert totals["step-time"]["micro_batches"] > totals["micro-batches"]["micro_batches"]


def test_the_plan_bounds_what_training_collates(tmp_path, capsys) -> None:
    """As in training (``--dp-schedule-cap-counts padded``): bshd counts rows x longest, CP rounds each sample."""
    lengths = [1000, *[10 + (7 * i) % 81 for i in range(63)]]
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join(map(str, lengths)))
    out = tmp_path / "plan.json"
    assert main(["plan", str(path), "--dp-size", "2", "--global-batch-size", "64", "--max-tokens-per-gpu", "1024",
                 "--collate-format", "bshd", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    for partition, micro_batches in zip(plan["partitions"], plan["micro_batch_indices"]):
        for micro_batch in micro_batches:
            ids = [partition[i] for i in micro_batch]
            if len(ids) > 1:
                assert len(ids) * max(lengths[i] for i in ids) <= 1024
    even = tmp_path / "even.txt"
    even.write_text("\n".join(["25"] * 40))
    assert main(["plan", str(even), "--dp-size", "2", "--global-batch-size", "40", "--max-tokens-per-gpu", "64",
                 "--cp-size", "2", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["config"]["pad_multiple"] == 4
    capsys.readouterr()
