"""Samples with no loss token: counted when a corpus is read, named in a warning (numpy only, no torch).

A sample whose targets are all ignored (a JSONL row whose ``labels`` are all ``-100`` or whose ``loss_mask`` is
all 0 after its first token, a conversation with no assistant turn) trains nothing on its own; a step made
only of such samples trains nothing at all (Megatron steps the optimizer with zero gradients: see
``docs/data.md``, "Samples and steps with no loss token"). The readers count such samples from their length
index (:attr:`.line_index.LineIndex.trained`, computed once with the lengths) and :func:`no_loss_notice` words
the warning the entry point prints on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

SHOWN = 5
"""How many of the samples with no loss token a notice names."""
DOCS = "docs/data.md, 'Samples and steps with no loss token'"
"""Where the consequence is explained."""


def no_loss_samples(trained: Sequence[int] | np.ndarray) -> np.ndarray:
    """The indices (ascending, int64) of the samples whose trained-position count is 0."""
    return np.flatnonzero(np.asarray(trained) == 0).astype(np.int64)


def no_loss_notice(trained: Sequence[int] | np.ndarray, *, source: str,
                   name: Callable[[Sequence[int]], list[str]]) -> str | None:
    """The warning for the samples of ``source`` with no loss token (``None`` if there is none): their count and
    the first :data:`SHOWN`, each as ``name`` calls it (``name(ids)``: e.g. ``file:line``)."""
    found = no_loss_samples(trained)
    if not found.size:
        return None
    first = name(found[:SHOWN].tolist())
    more = f" and {found.size - SHOWN} more" if found.size > SHOWN else ""
    return (f"dp-schedule: WARNING: {source}: {found.size} of {len(trained)} samples have no loss token (every "
            f"target ignored: labels -100, loss_mask 0, or a conversation with no assistant turn): "
            f"{', '.join(first)}{more}. They train nothing; a step made only of them steps the optimizer with zero "
            f"gradients and logs no lm loss ({DOCS})")
