"""Wrappers over any map-style dataset with ``lengths``: splits and weighted blends.

A dataset here is anything with ``__len__``, ``__getitem__(i) -> dict of tensors`` and a
``lengths`` sequence (token count per sample). Each wrapper exposes the ``lengths`` of the
samples it yields, so the planner sees their true lengths without reading token data.

* :class:`SubsetDataset`: a contiguous range of a dataset (one ``--split`` share).
* :class:`BlendedDataset`: ``size`` samples drawn from several datasets by weight in Megatron's
  blending order (:func:`megatron_dpsched.data.sampling.blending_indices`).
* :func:`split_and_blend`: the train/valid/test datasets of ``--data-path`` with ``--split``,
  or of one ``--train/valid/test-data-path`` flag.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from megatron_dpsched.data.sampling import SPLIT_NAMES, blending_indices, parse_blend, split_ranges


class SubsetDataset:
    """Samples ``indices`` of ``dataset`` (a ``range``), renumbered from 0."""

    def __init__(self, dataset: Any, indices: range, *, name: str) -> None:
        self.dataset = dataset
        self.indices = indices
        self.path = name
        """What the samples are, for messages (``file[begin:end]``)."""
        self.lengths = [dataset.lengths[i] for i in indices]
        trained = getattr(dataset, "trained_tokens", None)
        self.trained_tokens = None if trained is None else [trained[i] for i in indices]
        """The loss tokens of each sample (``None`` where the dataset does not know them)."""
        groups = getattr(dataset, "groups", None)
        self.groups = None if groups is None else [groups[i] for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]

    def sample_digest(self, index: int) -> int | None:
        """The dataset's ``sample_digest`` of this sample (``None`` where it has none)."""
        digest = getattr(self.dataset, "sample_digest", None)
        return None if digest is None else digest(self.indices[index])


class BlendedDataset:
    """``size`` samples of ``datasets`` mixed by ``weights`` in Megatron's blending order.

    Position ``i`` holds sample ``sample_index[i]`` of dataset ``dataset_index[i]``. Without
    ``repeat`` a dataset drawn more often than it has samples is refused with the numbers
    (one pass: ``--dataloader-type single``); with it, its samples are read again in order.
    """

    def __init__(self, datasets: Sequence[Any], *, weights: Sequence[float], size: int, repeat: bool,
                 flag: str = "--data-path") -> None:
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(f"{flag}: {len(datasets)} datasets for {len(weights)} weights")
        if any(getattr(d, "groups", None) is not None for d in datasets):
            raise ValueError(f"{flag}: datasets with groups cannot be blended (a blend mixes single samples)")
        self.datasets = list(datasets)
        self.weights = tuple(float(w) for w in weights)
        self.dataset_index, self.sample_index = blending_indices(self.weights, size)
        self._check_draws(repeat=repeat, flag=flag)
        self._warn_undrawn(flag=flag)
        sizes = [len(d) for d in self.datasets]
        self.lengths = [self.datasets[d].lengths[k % sizes[d]]
                        for d, k in zip(self.dataset_index, self.sample_index)]
        trained = [getattr(d, "trained_tokens", None) for d in self.datasets]
        self.trained_tokens = None if any(t is None for t in trained) else [
            trained[d][k % sizes[d]] for d, k in zip(self.dataset_index, self.sample_index)]
        """The loss tokens of each sample (``None`` unless every blended dataset knows them)."""
        self.path = "blend(" + ", ".join(f"{w:g} {getattr(d, 'path', d)}" for w, d in zip(weights, datasets)) + ")"
        """What the samples are, for messages."""
        self.groups = None

    def _check_draws(self, *, repeat: bool, flag: str) -> None:
        for d, dataset in enumerate(self.datasets):
            drawn = self.dataset_index.count(d)
            if not repeat and drawn > len(dataset):
                share = self.weights[d] / sum(self.weights)
                raise ValueError(
                    f"{flag}: the blend of {len(self.dataset_index)} samples draws {drawn} from "
                    f"{getattr(dataset, 'path', d)} (share {share:.3g}), which holds {len(dataset)}; give more data, "
                    f"other weights or fewer iterations, or --dataloader-type cyclic to read it again")

    def _warn_undrawn(self, *, flag: str) -> None:
        """A component the blend draws no sample from (its weight too small for ``size``): a warning naming it,
        as Megatron's blend allows it."""
        drawn = set(self.dataset_index)
        for d, dataset in enumerate(self.datasets):
            if d not in drawn:
                warnings.warn(f"{flag}: the blend of {len(self.dataset_index)} samples draws none from "
                              f"{getattr(dataset, 'path', d)} (share {self.weights[d] / sum(self.weights):.3g})",
                              UserWarning, stacklevel=3)

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, index: int) -> Any:
        dataset, sample = self.source(index)
        return self.datasets[dataset][sample]

    def sample_digest(self, index: int) -> int | None:
        """The blended dataset's ``sample_digest`` of this sample (``None`` where it has none)."""
        dataset, sample = self.source(index)
        digest = getattr(self.datasets[dataset], "sample_digest", None)
        return None if digest is None else digest(sample)

    def source(self, index: int) -> tuple[int, int]:
        """(dataset number, sample index in that dataset) of blend position ``index``."""
        d = self.dataset_index[index]
        return d, self.sample_index[index] % len(self.datasets[d])


def blend(datasets: Sequence[Any], *, weights: Sequence[float] | None, size: int | None, repeat: bool,
          flag: str) -> Any:
    """One dataset as it is; several blended: by ``weights`` (``None``: by their sizes, as Megatron does)
    into ``size`` samples (``None``: all their samples)."""
    if len(datasets) == 1:
        return datasets[0]
    sizes = [len(d) for d in datasets]
    if weights is None:
        weights = [float(n) for n in sizes]
        size = sum(sizes) if size is None else min(size, sum(sizes))
    return BlendedDataset(datasets, weights=weights, size=sum(sizes) if size is None else size,
                          repeat=repeat, flag=flag)


def split_and_blend(values: Sequence[str], *, flag: str, open_dataset: Callable[[str], Any],
                    split: Sequence[float] | None, sizes: Sequence[int | None], repeat: bool) -> list[Any]:
    """The train, valid and test datasets of one data flag (``None`` where a split is empty or not asked for).

    ``values``: the flag's ``[W1] P1 [W2 P2 ...]``. With ``split`` (``--data-path``) every dataset is
    cut into its train/valid/test ranges and each split is blended; without it (``--train-data-path``
    and the like) the whole datasets form the first split. ``sizes[i]``: the samples Megatron reads
    from split ``i`` (the blend's size; 0 builds nothing).
    """
    prefixes, weights = parse_blend(values, flag=flag)
    whole = [open_dataset(prefix) for prefix in prefixes]
    out: list[Any] = []
    for role, size in enumerate(sizes):
        parts = _parts(whole, prefixes, role=role, split=split)
        if parts is None or size == 0:
            out.append(None)
            continue
        kept = [(part, w) for part, w in zip(parts, weights or [None] * len(parts)) if len(part)]
        if not kept:
            out.append(None)
            continue
        if weights is not None and len(kept) < len(parts):
            _refuse_empty_part(parts, flag=flag, role=role)
        kept_weights = None if weights is None else [w for _, w in kept]
        out.append(blend([p for p, _ in kept], weights=kept_weights, size=size, repeat=repeat, flag=flag))
    return out


def _refuse_empty_part(parts: Sequence[Any], *, flag: str, role: int) -> None:
    """A weighted component with no sample in a split the others fill: the blend would silently leave it out."""
    empty = next(part for part in parts if not len(part))
    source = getattr(empty.dataset, "path", None) or empty.path
    raise ValueError(
        f"{flag}: {source} has no sample in the {SPLIT_NAMES[role]} split ({len(empty.dataset)} samples, "
        f"{SPLIT_NAMES[role]} range {empty.indices.start}:{empty.indices.stop}) while the blend gives it a weight: "
        f"the {SPLIT_NAMES[role]} data would be the other datasets alone; give it more samples, another --split, "
        "or blend that split with --train/valid/test-data-path")


def _parts(whole: list[Any], prefixes: Sequence[str], *, role: int, split: Sequence[float] | None) -> list | None:
    if split is None:
        return whole if role == 0 else None
    parts = []
    for dataset, prefix in zip(whole, prefixes):
        indices = split_ranges(len(dataset), split)[role]
        if indices is None:
            return None
        name = f"{prefix}[{indices.start}:{indices.stop}] ({SPLIT_NAMES[role]} split)"
        parts.append(SubsetDataset(dataset, indices, name=name))
    return parts
