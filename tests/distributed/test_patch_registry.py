"""The patch registry (:mod:`megatron_dpsched.megatron.patch`) on the installed megatron-core.

* ``enable()`` twice is ``enable()`` once; ``disable()`` puts back every original object;
* every job gets the job checks and the step recorder, ``--dp-schedule`` the rest;
* the version check names, in one message, every name a release lacks or no longer uses, and ``enable()``
  replaces nothing in a release that fails it;
* a second training loop is one more key: registered, checked, patched and restored on its own;
* ``docs/patch.md``'s table is the registry's, and ``patches/README.md`` names the hooks of every row.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from registry import REPO

from megatron_dpsched.megatron import patch

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROWS = patch.rows_of()
EVERY_JOB = ("setup_model_and_optimizer", "save_checkpoint", "train_step")


@pytest.fixture
def training() -> Iterator[tuple[Any, dict[str, Any]]]:
    """Megatron's training module with nothing replaced, and its objects for every row's name."""
    import megatron.training.training as module

    patch.disable()
    yield module, {row.name: getattr(module, row.name) for row in ROWS}
    patch.disable()


def test_enable_twice_is_enable_once_and_disable_restores_every_original(training) -> None:
    module, originals = training
    patch.enable()
    replaced = {name: getattr(module, name) for name in originals}
    assert all(replaced[name] is not original for name, original in originals.items())
    patch.enable()
    assert all(getattr(module, name) is replaced[name] for name in originals)
    assert patch.installed() == tuple(originals) and patch.is_enabled()
    patch.disable()
    patch.disable()
    assert all(getattr(module, name) is original for name, original in originals.items())
    assert patch.installed() == () and not patch.is_enabled()


def test_every_job_gets_the_job_checks_and_the_recorder_and_dp_schedule_the_rest(training) -> None:
    module, originals = training
    patch.enable(dp_schedule=False)
    assert patch.installed() == EVERY_JOB == tuple(row.name for row in ROWS if row.when == "always")
    assert not patch.is_enabled()
    recorded_step = module.train_step
    patch.enable()  # checks get_num_microbatches in Megatron's train_step, not in the recorder's wrapper
    assert patch.installed() == tuple(originals) and module.train_step is recorded_step


def test_the_version_check_names_every_name_a_release_lacks_or_no_longer_uses(training) -> None:
    module, _ = training
    release = types.ModuleType("a_megatron_release")
    release.__dict__.update({name: value for name, value in vars(module).items()
                             if name not in ("get_moe_metrics_tracker", "save_checkpoint")})

    def train_step(forward_step_func: Any, data_iterator: Any) -> None:
        return None

    release.train_step = train_step
    with pytest.raises(RuntimeError) as raised:
        patch.check_megatron(release)
    assert str(raised.value) == (
        "dp-schedule: unsupported Megatron version: megatron.training.training does not fit the plugin's patch: "
        "it lacks get_moe_metrics_tracker, save_checkpoint; train_step no longer uses get_num_microbatches; "
        "train_step no longer takes (forward_step_func, data_iterator, model, optimizer, opt_param_scheduler, "
        "config, forward_backward_func, ...) first")
    patch.check_megatron(module)


def test_enable_replaces_nothing_in_a_release_that_fails_the_check(training, monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = training
    monkeypatch.delattr(module, "DSAIndexerLossLoggingHelper")
    with pytest.raises(RuntimeError, match="it lacks DSAIndexerLossLoggingHelper$"):
        patch.enable()
    assert patch.installed() == ()
    patch.enable(dp_schedule=False)  # a job without --dp-schedule does not use it
    assert patch.installed() == EVERY_JOB


LOOP = "dpsched_test_training_loop"
LOOP_SOURCE = """
def step(x):
    return x + 1


def train(x):
    return 10 * step(x)
"""


def _doubled(original: Callable[[int], int]) -> Callable[[int], int]:
    """The original, doubled."""
    return lambda x: 2 * original(x)


def test_a_second_training_loop_is_registered_checked_and_patched_on_its_own(training) -> None:
    megatron_module, megatron_originals = training
    module = types.ModuleType(LOOP)
    exec(LOOP_SOURCE, module.__dict__)
    row = patch.Replacement(name="step", make=_doubled, calls=(), used_by=("train",), when="dp_schedule",
                            parameters=("x",))
    sys.modules[LOOP] = module
    patch.register(LOOP, [row])
    try:
        with pytest.raises(ValueError, match="registered already"):
            patch.register(LOOP, [row])
        original = module.step
        patch.enable(dp_schedule=False, loop=LOOP)
        assert module.step is original and module.train(1) == 20
        patch.enable(loop=LOOP)
        assert module.train(1) == 40 and patch.installed(LOOP) == ("step",) and patch.installed() == ()
        patch.enable()
        patch.disable(LOOP)
        assert module.step is original and patch.installed() == tuple(megatron_originals)
        older = types.ModuleType(LOOP)
        exec("def train(x):\n    return x\n", older.__dict__)
        with pytest.raises(RuntimeError, match=f"{LOOP} does not fit the plugin's patch: it lacks step; "
                                               f"train no longer uses step$"):
            patch.check_megatron(older, loop=LOOP)
    finally:
        patch.disable(LOOP)
        del patch.LOOPS[LOOP]
        sys.modules.pop(LOOP)


def test_docs_patch_md_holds_the_registry_table(capsys: pytest.CaptureFixture) -> None:
    committed = (REPO / "docs" / "patch.md").read_text(encoding="utf-8")
    table = patch.markdown()
    assert table in committed, f"regenerate the table: {patch.MARKDOWN_COMMAND} (into docs/patch.md)"
    assert all(f"| `{row.name}` |" in table for row in ROWS)
    patch.main(["--markdown"])
    assert capsys.readouterr().out == table


def test_the_patches_readme_names_the_hooks_of_every_row() -> None:
    readme = (REPO / "patches" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(\w+)\(", readme, re.M))
    assert listed == {name for row in ROWS for name in row.calls}


def test_a_training_py_patched_by_an_older_source_patch_is_refused(training, monkeypatch: pytest.MonkeyPatch) -> None:
    module, originals = training
    monkeypatch.setattr(module, "dpsched_hooks", patch.hooks, raising=False)  # patched, but not its every-job names
    assert patch.is_source_patched(module)
    stale = "setup_model_and_optimizer, save_checkpoint, train_step are not wrapped by the plugin's hooks"
    with pytest.raises(RuntimeError, match=f"carries an older megatron-dpsched source patch: {stale}"):
        patch.enable()
    assert patch.installed() == ()
    for row in ROWS:  # what the current source patch does to the every-job names
        if row.when == "always":
            monkeypatch.setattr(module, row.name, row.make(originals[row.name]))
    patch.enable()
    assert patch.installed() == ()  # the source carries every row: nothing is replaced at run time
