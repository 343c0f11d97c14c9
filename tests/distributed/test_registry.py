"""The scenario registry (``registry.py``): what ``@scenario`` declares, and what it refuses (no processes start)."""

from __future__ import annotations

from pathlib import Path

import pytest
from registry import HERE, MODULE_PATTERN, REGISTRY, LaunchResults, Registry


def test_a_plain_function_is_one_scenario_named_like_it_in_the_launch_of_its_world_size() -> None:
    registry = Registry()

    @registry.scenario(world_size=2, tags={"fast"})
    def dp2() -> str:
        return "ran"

    declared = registry.get("dp2")
    assert (declared.world_size, declared.launch, declared.case, declared.tags) == (2, "world2", None, {"fast"})
    assert declared.run() == "ran" and dp2() == "ran"  # the decorator hands the function back unchanged
    assert registry.names("fast") == ["dp2"] and registry.launch("world2") == [declared]


def test_cases_declare_one_scenario_each_run_with_its_value_in_declaration_order() -> None:
    registry = Registry()

    @registry.scenario(world_size=4, launch="big", cases={"c": 3}, tags={"t"})
    @registry.scenario(world_size=1, launch="small", cases={"b": 2, "a": 1}, tags={"t"})
    def double(value: int) -> int:
        return 2 * value

    assert registry.names("t") == ["b", "a", "c"]
    assert [(s.name, s.case, s.run()) for s in registry.launch("small")] == [("b", 2, 4), ("a", 1, 2)]
    assert registry.case("c") == 3 and registry.get("c").world_size == 4


def test_mistakes_are_refused_naming_the_scenario() -> None:
    registry = Registry()
    registry.scenario(world_size=2, launch="shared")(lambda: None)
    with pytest.raises(ValueError, match="'<lambda>' is declared twice"):
        registry.scenario(world_size=2)(lambda: None)
    with pytest.raises(ValueError, match="'other': launch 'shared' runs 2 processes, not world_size=4"):
        registry.scenario(world_size=4, launch="shared", cases={"other": 0})(lambda value: value)
    with pytest.raises(ValueError, match="world_size=0"):
        registry.scenario(world_size=0)
    with pytest.raises(ValueError, match="no scenario 'missing'"):
        registry.get("missing")
    with pytest.raises(ValueError, match="no scenario is tagged 'nothing'"):
        registry.names("nothing")


def test_every_scenario_module_declares_scenarios_and_each_launch_has_one_world_size() -> None:
    modules = {path.stem for path in HERE.glob(MODULE_PATTERN)}
    REGISTRY.get("reference")  # imports every scenario module
    declared = list(REGISTRY._scenarios.values())
    assert {s.run.func.__module__ if hasattr(s.run, "func") else s.run.__module__ for s in declared} == modules
    for launch in {s.launch for s in declared}:
        assert len({s.world_size for s in REGISTRY.launch(launch)}) == 1, launch


def test_launches_restricted_to_some_scenarios_refuse_others_before_starting_anything(tmp_path: Path) -> None:
    results = LaunchResults(tmp_path, only=("dp2",))
    with pytest.raises(ValueError, match="'pp2' is not among"):
        results.get("pp2")
    assert list(tmp_path.iterdir()) == []
