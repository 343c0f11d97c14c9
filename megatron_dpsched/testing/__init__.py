"""Test-only stand-ins: the CPU device shim and the CPU packed/context-parallel attention.

Nothing under ``megatron_dpsched`` outside this package imports it (``tests/unit/test_layout.py``
checks); tests, the CPU demo's dry run and the RL example's CPU trainer turn it on.
"""
