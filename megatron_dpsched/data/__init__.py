"""Shipped sample-length distributions and a JSONL token corpus for the entry point and demo.

* :func:`load_lengths`: a shipped distribution (``gsm8k_train``, see ``README.md`` here).
* :class:`TokenJsonlDataset`: ``{"tokens": [...]}`` per line; sample ``i`` predicts
  ``tokens[1:]`` from ``tokens[:-1]`` (its length is ``len(tokens) - 1``).
* :class:`IndexedTokenDataset`: Megatron's indexed dataset (``PREFIX.bin``/``.idx``), one
  sample per stored sequence, lengths read from the index; :func:`open_corpus` picks by path.
* :class:`PaddedSampleDataset`: the same samples right-padded to ``--seq-length`` for
  Megatron's ordinary fixed-shape micro-batches.
"""

from megatron_dpsched.data.corpus import (
    IndexedTokenDataset,
    PaddedSampleDataset,
    TokenJsonlDataset,
    open_corpus,
    write_token_indexed,
    write_token_jsonl,
)
from megatron_dpsched.data.lengths import SHIPPED, lengths_path, load_lengths, scale_lengths

__all__ = [
    "SHIPPED",
    "IndexedTokenDataset",
    "open_corpus",
    "write_token_indexed",
    "PaddedSampleDataset",
    "TokenJsonlDataset",
    "lengths_path",
    "load_lengths",
    "scale_lengths",
    "write_token_jsonl",
]
