"""Every help text renders as written: ``megatron-dpsched`` (``plan``, ``calibrate``, ``check``) and training's
``--dp-schedule*`` group. A stray ``%`` in a help text (``over 5% above``) is a format directive to argparse:
``% a`` prints argparse's internal dict of the option, ``%(`` a key error or another field."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dpsched.cli import build_parser
from megatron_dpsched.megatron.arguments import add_dp_schedule_args

REPO = Path(__file__).resolve().parents[2]
LEAKS = ("'option_strings'", "'dest':", "%(", "{'", "Namespace(")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    top = build_parser()
    training = argparse.ArgumentParser(prog="pretrain_gpt_dpsched.py")
    add_dp_schedule_args(training)
    return {"megatron-dpsched": top, **_subparsers(top), "training": training}


def test_every_command_is_covered() -> None:
    assert set(_parsers()) == {"megatron-dpsched", "plan", "calibrate", "check", "training"}


@pytest.mark.parametrize("name", sorted(_parsers()))
def test_every_option_help_renders_as_written(name: str) -> None:
    parser = _parsers()[name]
    formatter = parser._get_formatter()
    checked = 0
    for action in parser._actions:
        if not action.help or action.help == argparse.SUPPRESS:
            continue
        rendered = formatter._expand_help(action)
        assert not any(leak in rendered for leak in LEAKS), (action.option_strings, rendered)
        if "%(" not in action.help:  # no placeholder meant: the text itself, each %% one %
            assert rendered == action.help.replace("%%", "%"), action.option_strings
        checked += 1
    assert checked >= 1
    text = parser.format_help()
    assert not any(leak in text for leak in LEAKS)


def test_the_balance_growth_help_keeps_its_percent() -> None:
    parsers = _parsers()
    for name, flag in (("plan", "--balance-growth"), ("training", "--dp-schedule-balance-growth")):
        text = " ".join(parsers[name].format_help().split())
        assert f"{flag} F" in text
        assert "unless the busiest rank stays over 5% above max(mean rank, dearest sample)" in text, name


def test_a_stray_percent_would_be_caught() -> None:
    """The check above fails on the bug it guards against (the help printed argparse's dict)."""
    parser = argparse.ArgumentParser()
    action = parser.add_argument("--x", help="stays over 5% above the mean")
    rendered = parser._get_formatter()._expand_help(action)
    assert any(leak in rendered for leak in LEAKS)


@pytest.mark.slow
def test_the_entry_points_help_through_megatrons_parser() -> None:
    """``scripts/pretrain_gpt_dpsched.py --help``: Megatron's flags and ours, through Megatron's own parser."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "pretrain_gpt_dpsched.py"), "--help"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any(leak in proc.stdout for leak in LEAKS)
    text = " ".join(proc.stdout.split())
    assert "--dp-schedule-balance-growth F" in text and "stays over 5% above max(mean rank" in text
