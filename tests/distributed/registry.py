"""One registry of the multi-process scenarios: each is declared once, with its world size and launch.

A scenario is a function run in every process of a gloo launch; it returns a picklable result per rank.
Declare it with :func:`scenario` in a ``tests/distributed/scenarios*.py`` module (the launcher and the
tests import every such module)::

    @scenario(world_size=2, tags={"whole_batch"})
    def dp2() -> dict[str, Any]:                       # one scenario, named like the function
        return run_training(FeedCase())

    @scenario(world_size=2, launch="layouts2", cases={"tp2": Layout(tp=2), "cp2_bshd": Layout(cp=2)})
    def train_layout(layout: Layout) -> dict[str, Any]:  # one scenario per case, run as train_layout(case)
        return run_training(FeedCase(layout=layout))

A *launch* is one set of ``world_size`` processes that runs its scenarios one after another in the order
they were declared (process start-up dominates, so scenarios share launches; ``launch`` defaults to
``world<N>``). A test reads the per-rank results with the session fixture ``launches.get(name)`` (only the
launches it asks for start) and parametrizes from the registry: ``names(tag)`` for the scenarios with a
tag, ``case(name)`` for the value a scenario was declared with.
"""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODULE_PATTERN = "scenarios*.py"
"""The modules that declare scenarios (imported by :func:`load_scenario_modules`)."""
LAUNCH_TIMEOUT_S = 600

Run = TypeVar("Run", bound=Callable[..., Any])


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A declared scenario."""

    name: str
    """What tests ask ``launches.get`` for; the results are ``<name>.rank<r>.pt``."""
    world_size: int
    """Processes of its launch."""
    launch: str
    """The launch that runs it (with the other scenarios of that launch)."""
    run: Callable[[], Any]
    """Called in every process; returns that rank's result."""
    case: Any = None
    """The value of ``cases`` it was declared with (``None`` for a plain function)."""
    tags: frozenset[str] = frozenset()
    """Labels tests select scenarios by (:meth:`Registry.names`)."""


class Registry:
    """Scenarios by name, in declaration order; ``load`` (if given) runs before every query."""

    def __init__(self, *, load: Callable[[], None] | None = None) -> None:
        self._scenarios: dict[str, Scenario] = {}
        self._load = load

    def scenario(self, *, world_size: int, launch: str | None = None, cases: Mapping[str, Any] | None = None,
                 tags: Iterable[str] = ()) -> Callable[[Run], Run]:
        """Decorator: declares ``run`` as one scenario (``cases`` None) or one per entry of ``cases``."""
        if world_size < 1:
            raise ValueError(f"scenario world_size={world_size}; expected at least 1")
        launch = f"world{world_size}" if launch is None else launch
        tag_set = frozenset(tags)

        def declare(run: Run) -> Run:
            entries = {run.__name__: (run, None)} if cases is None else {
                name: (functools.partial(run, value), value) for name, value in cases.items()}
            for name, (call, value) in entries.items():
                self._add(Scenario(name=name, world_size=world_size, launch=launch, run=call, case=value,
                                   tags=tag_set))
            return run

        return declare

    def _add(self, scenario: Scenario) -> None:
        if scenario.name in self._scenarios:
            raise ValueError(f"scenario '{scenario.name}' is declared twice")
        sizes = {s.world_size for s in self._scenarios.values() if s.launch == scenario.launch}
        if sizes and sizes != {scenario.world_size}:
            raise ValueError(f"scenario '{scenario.name}': launch '{scenario.launch}' runs {sizes.pop()} processes, "
                             f"not world_size={scenario.world_size}")
        self._scenarios[scenario.name] = scenario

    def _loaded(self) -> dict[str, Scenario]:
        if self._load is not None:
            self._load()
        return self._scenarios

    def get(self, name: str) -> Scenario:
        """The scenario called ``name``."""
        scenarios = self._loaded()
        if name not in scenarios:
            raise ValueError(f"no scenario '{name}' is declared (with @scenario in {MODULE_PATTERN})")
        return scenarios[name]

    def case(self, name: str) -> Any:
        """The value ``name`` was declared with in ``cases``."""
        return self.get(name).case

    def names(self, tag: str) -> list[str]:
        """The scenarios tagged ``tag``, in declaration order (for ``pytest.mark.parametrize``)."""
        found = [s.name for s in self._loaded().values() if tag in s.tags]
        if not found:
            raise ValueError(f"no scenario is tagged '{tag}'")
        return found

    def launch(self, launch: str) -> list[Scenario]:
        """The scenarios of ``launch``, in the order its processes run them."""
        return [s for s in self._loaded().values() if s.launch == launch]


@functools.cache
def load_scenario_modules() -> None:
    """Imports every ``scenarios*.py`` next to this file (each declares its scenarios once, on import)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    for path in sorted(HERE.glob(MODULE_PATTERN)):
        importlib.import_module(path.stem)


REGISTRY = Registry(load=load_scenario_modules)
scenario = REGISTRY.scenario
names = REGISTRY.names
case = REGISTRY.case


class LaunchResults:
    """Starts each launch on first use and loads ``<scenario>.rank<r>.pt``.

    ``env``: more environment for the launched processes; ``only``: run just these scenarios of each
    launch (e.g. a re-run of a few in another mode).
    """

    def __init__(self, root: Path, *, env: Mapping[str, str] | None = None, only: Collection[str] | None = None,
                 registry: Registry = REGISTRY) -> None:
        self.root = root
        self.env = None if env is None else {**os.environ, **env}
        self.only = None if only is None else frozenset(only)
        self.registry = registry
        self._logs: dict[str, str] = {}

    def _launch(self, launch: str, world_size: int) -> Path:
        out = self.root / launch
        if launch in self._logs:
            return out
        out.mkdir(parents=True, exist_ok=True)
        members = [s.name for s in self.registry.launch(launch) if self.only is None or s.name in self.only]
        cmd = [sys.executable, str(HERE / "launcher.py"), "--world-size", str(world_size), "--out", str(out), *members]
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                                  env=self.env)
            self._logs[launch] = (proc.stdout + proc.stderr)[-4000:]
        except subprocess.TimeoutExpired as error:
            self._logs[launch] = f"launch timed out after {LAUNCH_TIMEOUT_S}s: {error}"
        return out

    def get(self, name: str) -> list[Any]:
        """Per-rank results of scenario ``name``; fails the test with the rank's traceback otherwise."""
        import pytest
        import torch

        if self.only is not None and name not in self.only:
            raise ValueError(f"scenario '{name}' is not among the ones these launches run: {sorted(self.only)}")
        declared = self.registry.get(name)
        out = self._launch(declared.launch, declared.world_size)
        results, errors = [], []
        for rank in range(declared.world_size):
            path = out / f"{name}.rank{rank}.pt"
            if not path.exists():
                errors.append(f"rank {rank}: no result (an earlier scenario of '{declared.launch}' failed?)")
                continue
            saved = torch.load(path, weights_only=False)
            if not saved["ok"]:
                errors.append(f"rank {rank} raised:\n{saved['error']}")
            results.append(saved.get("result"))
        if errors:
            pytest.fail(f"scenario '{name}' failed:\n" + "\n".join(errors)
                        + f"\n--- launch log tail ---\n{self._logs[declared.launch]}", pytrace=False)
        return results
