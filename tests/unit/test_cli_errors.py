"""Bad inputs end in one line and exit 2; ``--help`` explains every option; a closed pipe is no error."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dpsched.cli import build_parser, main

LAYOUT = ["--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "100"]
REPO = Path(__file__).resolve().parents[2]


def _one_line_error(capsys, argv: list[str], expected: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith("megatron-dpsched: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(("text", "expected"), [
    ("10\n-5\n", "lengths.txt:2: token count -5 is out of range"),
    ("10 abc", "lengths.txt:1: not an integer token count: 'abc'"),
    ("10 2.5", "not an integer token count: '2.5'"),
    ("0", "token count 0 is out of range"),
    ("", "holds no token counts"),
    ("\n  \n", "holds no token counts"),
])
def test_bad_length_files(tmp_path, capsys, text, expected) -> None:
    (tmp_path / "lengths.txt").write_text(text)
    _one_line_error(capsys, ["plan", str(tmp_path / "lengths.txt"), *LAYOUT], expected)


def test_missing_binary_and_directory_inputs(tmp_path, capsys) -> None:
    _one_line_error(capsys, ["plan", str(tmp_path / "nope.txt"), *LAYOUT], "nope.txt: no such file")
    (tmp_path / "blob").write_bytes(b"\xff\xfe\x00\x81")
    _one_line_error(capsys, ["plan", str(tmp_path / "blob"), *LAYOUT], "is not a text file")
    _one_line_error(capsys, ["plan", str(tmp_path), *LAYOUT], "is a directory")
    (tmp_path / "c.jsonl").write_text('{"tokens": [1]}\n')
    _one_line_error(capsys, ["plan", str(tmp_path / "c.jsonl"), *LAYOUT], "c.jsonl:1: 'tokens' needs at least 2")
    (tmp_path / "d.jsonl").write_text("not json\n")
    _one_line_error(capsys, ["plan", str(tmp_path / "d.jsonl"), *LAYOUT], "d.jsonl:1: not a JSON object")
    (tmp_path / "x.bin").write_bytes(b"")
    _one_line_error(capsys, ["plan", str(tmp_path / "x.bin"), *LAYOUT], "needs both PREFIX.bin and PREFIX.idx")


@pytest.mark.parametrize(("flags", "expected"), [
    (["--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "0"],
     "argument --max-tokens-per-gpu: must be between 1 and 2147483647, got '0'"),
    (["--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "x"], "expected an integer"),
    ([*LAYOUT, "--vpp-size", "2"], "error: --vpp-size: vpp_size=2 needs pp_size >= 2"),
    ([*LAYOUT, "--pp-size", "2", "--vpp-size", "2", "--microbatch-group-size-per-vp-stage", "1"],
     "error: --microbatch-group-size-per-vp-stage: microbatch_group_size_per_vp_stage=1 is below pp_size=2"),
    ([*LAYOUT, "--dp-size", "8"], "error: --dp-size: dp_size=8 is larger than the 4 samples"),
    (["--dp-size", "2", "--global-batch-size", "4"], "one of the arguments --max-tokens-per-gpu"),
    ([*LAYOUT, "--balance", "flops"], "invalid choice: 'flops'"),
    ([*LAYOUT, "--balance-growth", "11"], "argument --balance-growth: must be between 0 and 10, got '11'"),
    ([*LAYOUT, "--microbatch-overhead-ms", "-1"], "argument --microbatch-overhead-ms: must be between 0 and 1000000"),
    ([*LAYOUT, "--cap-counts", "rows"], "argument --cap-counts: invalid choice: 'rows'"),
    ([*LAYOUT, "--flops-per-gpu", "0"], "must be > 0"),
    ([*LAYOUT, "--hidden-size", "64"], "a model shape needs --num-layers, --num-attention-heads"),
    ([*LAYOUT, "--hidden-size", "64", "--num-layers", "2", "--num-attention-heads", "6", "--num-query-groups",
      "4"], "num_query_groups=4 must divide"),
    ([*LAYOUT, "--plot-step", "7"], "--plot-step 7: the plan has steps 0..1"),
    ([*LAYOUT, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_options(tmp_path, capsys, flags, expected) -> None:
    (tmp_path / "lengths.txt").write_text("10 20 30 40 50 60 70 80")
    _one_line_error(capsys, ["plan", str(tmp_path / "lengths.txt"), *flags], expected)


def test_bad_model_shape_files(tmp_path, capsys) -> None:
    (tmp_path / "lengths.txt").write_text("10 20 30 40")
    lengths = str(tmp_path / "lengths.txt")
    for text, expected in (("{", "is not JSON"), ('{"width": 3}', "got ['width']"),
                           ('{"hidden_size": 0, "num_layers": 1, "num_attention_heads": 1}', "hidden_size must be")):
        (tmp_path / "m.json").write_text(text)
        _one_line_error(capsys, ["plan", lengths, *LAYOUT, "--model-shape", str(tmp_path / "m.json")], expected)
    _one_line_error(capsys, ["plan", lengths, *LAYOUT, "--model-shape", str(tmp_path / "m.json"), "--hidden-size",
                             "8"], "not both")


def test_check_on_files_that_are_not_plans(tmp_path, capsys) -> None:
    (tmp_path / "a.txt").write_text("lengths 10 20 30\n")
    _one_line_error(capsys, ["check", str(tmp_path / "a.txt")], "is not JSON (Expecting value at line 1 column 1)")
    _one_line_error(capsys, ["check", str(tmp_path / "none.json")], "none.json: no such file")


def test_check_prints_explained_percentages(tmp_path, capsys) -> None:
    (tmp_path / "lengths.txt").write_text("10 20 30 40")
    assert main(["plan", str(tmp_path / "lengths.txt"), *LAYOUT, "-o", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "token fill: real tokens that fit the cap" in out and "token-fill%" in out and "imbalance%" in out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


@pytest.mark.parametrize("name", ["plan", "check"])
def test_help_explains_every_option(capsys, name) -> None:
    parser = _subcommands()[name]
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.dest
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in out, flag
    if name == "plan":
        assert "Token fill" in out and "--hidden-size" in out and "--cost-model" in out and "--model-shape" in out


def test_a_reader_that_stops_early_leaves_no_traceback(tmp_path) -> None:
    (tmp_path / "lengths.txt").write_text(" ".join(str(i % 90 + 1) for i in range(3000)))
    command = (f"{sys.executable} -m megatron_dpsched.cli plan {tmp_path / 'lengths.txt'} --dp-size 1 "
               f"--global-batch-size 2 --max-tokens-per-gpu 100 --hidden-size 64 --num-layers 1 "
               f"--num-attention-heads 1 2>{tmp_path / 'err'} | head -n 3")
    done = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert len(done.stdout.splitlines()) == 3
    assert (tmp_path / "err").read_text() == ""


@pytest.mark.parametrize("value", ["inf", "1e-320"])
def test_step_time_figures_that_overflow_name_the_flag(value, capsys) -> None:
    argv = ["plan", "megatron_dpsched/data/gsm8k_train.txt", "--dp-size", "8", "--global-batch-size", "256",
            "--max-tokens-per-gpu", "1024", "--pp-size", "2", "--flops-per-gpu", value]
    with pytest.raises(SystemExit) as raised:
        code = main(argv)
        raise SystemExit(code)
    assert raised.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megatron-dpsched: error:") and "--flops-per-gpu" in err[0], err


def test_abbreviated_or_renamed_flags_are_refused(tmp_path, capsys) -> None:
    """``--microbatch-overhead`` (seconds, before the option table) must not pass as a prefix of
    ``--microbatch-overhead-ms``: argparse's abbreviations are off."""
    from megatron_dpsched.cli import main

    path = tmp_path / "lengths.txt"
    path.write_text("10 20 30 40")
    argv = ["plan", str(path), "--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "64"]
    for flag in ("--microbatch-overhead", "--max-tokens", "--collate"):
        assert main([*argv, flag, "1"]) == 2
        assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
