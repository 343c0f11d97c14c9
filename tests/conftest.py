"""Shared by every test: the Hypothesis profiles (pick one with ``HYPOTHESIS_PROFILE``, default ``ci``).

* ``ci``: 1500 derandomized cases per property (what ``bash scripts/test.sh`` runs);
* ``dev``: 200 random cases, while iterating;
* ``soak``: 20,000 random cases, to hunt for rare failures.

A test's own ``@settings(max_examples=...)`` overrides the profile's count.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=1500, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("soak", max_examples=20000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
