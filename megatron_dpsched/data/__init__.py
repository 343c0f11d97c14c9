"""Shipped sample-length distributions and the corpora the entry point and demo read.

* :func:`load_lengths`: a shipped distribution (``gsm8k_train``, see ``README.md`` here).
* :class:`TokenJsonlDataset`: one JSONL row per sample: ``{"tokens"}``, ``{"tokens", "loss_mask"}`` or
  ``{"input_ids", "labels"}`` (-100 = not trained); sample ``i`` predicts ``tokens[1:]`` from
  ``tokens[:-1]`` (its length is ``len(tokens) - 1``); read by byte offset through a cached length index.
* :class:`IndexedTokenDataset`: Megatron's indexed dataset (``PREFIX.bin``/``.idx``), one
  sample per stored sequence, lengths read from the index, optional sidecar mask ``PREFIX_mask``;
  :func:`open_corpus` picks by path.
* :class:`ConversationJsonlDataset`: Megatron's SFT conversation JSONL, one conversation per sample,
  tokenized and masked by Megatron's ``SFTTokenizer``.
* :class:`PaddedSampleDataset`: the same samples right-padded to ``--seq-length`` for
  Megatron's ordinary fixed-shape micro-batches.

The row parser (:mod:`.rows`) and the length index (:mod:`.line_index`) import no torch; the names
below are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "IndexedTokenDataset": "corpus", "PaddedSampleDataset": "corpus", "TokenJsonlDataset": "corpus",
    "open_corpus": "corpus", "write_token_indexed": "corpus", "write_token_jsonl": "corpus",
    "ConversationJsonlDataset": "conversations", "ConversationFormat": "conversations",
    "sft_format_from_args": "conversations",
    "SHIPPED": "lengths", "lengths_path": "lengths", "load_lengths": "lengths", "scale_lengths": "lengths",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
