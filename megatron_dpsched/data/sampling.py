"""Which sample trains at which position: blends, splits and epochs, with Megatron's semantics.

Pure Python (standard library only), deterministic, the same on every rank:

* :func:`parse_blend`: ``--data-path W1 P1 W2 P2 ...`` (or ``P1 P2 ...``), as Megatron's
  ``get_blend_from_list`` reads it.
* :func:`parse_split` and :func:`split_ranges`: ``--split 969,30,1`` as Megatron's
  ``parse_and_normalize_split`` and ``convert_split_vector_to_split_matrix`` read it; each
  dataset is cut into contiguous train/valid/test ranges ``round(begin * N) .. round(end * N)``.
* :func:`blending_indices`: Megatron's ``build_blending_indices`` (``helpers.cpp``): position
  ``i`` of a blend takes the dataset whose share so far lags its weight most
  (``weight * max(i, 1) - drawn``, the lowest index on a tie), and that dataset's next sample.
* :func:`epoch_permutation` and :class:`SampleOrder`: the training stream of
  ``--dataloader-type single`` (one pass in order) or ``cyclic`` (every epoch a fresh
  permutation seeded from ``--seed`` and the epoch, wrapping around for ever); groups of
  samples are permuted as units and stay contiguous.
"""

from __future__ import annotations

import bisect
import math
import random
import re
import threading
from collections.abc import Hashable, Sequence

SPLIT_NAMES = ("train", "valid", "test")


def parse_blend(values: Sequence[str], *, flag: str) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
    """``[W1, P1, W2, P2, ...]`` -> (prefixes, weights); ``[P1, P2, ...]`` -> (prefixes, ``None``).

    As Megatron's ``get_blend_from_list``: an even-length list whose every other entry is a
    number is weights and prefixes, anything else is prefixes alone. Raises ``ValueError``
    naming ``flag`` for an empty list, a list mixing weights and prefixes, a weight that is
    not a finite number > 0, or weights whose sum overflows (``1e308 a 1e308 b``).
    """
    items = [str(value).strip() for value in values or ()]
    if not items or not all(items):
        raise ValueError(f"{flag} needs at least one dataset prefix; got {list(values or ())}")
    if len(items) % 2:
        return tuple(items), None
    weights = [_number(items[i]) for i in range(0, len(items), 2)]
    if all(w is None for w in weights):
        return tuple(items), None
    if any(w is None for w in weights):
        raise ValueError(f"{flag} mixes weights and prefixes: give 'W1 P1 W2 P2 ...' or 'P1 P2 ...'; got {items}")
    bad = [w for w in weights if not (math.isfinite(w) and w > 0)]
    if bad:
        raise ValueError(f"{flag}: every weight must be a finite number > 0; got {bad[0]}")
    if not math.isfinite(sum(weights)):
        raise ValueError(f"{flag}: the weights must have a finite sum (they are normalized by it); got "
                         f"{', '.join(items[0::2])}")
    return tuple(items[1::2]), tuple(float(w) for w in weights)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def normalize(weights: Sequence[float]) -> tuple[float, ...]:
    """Weights divided by their sum (Megatron's ``normalize``)."""
    total = sum(weights)
    return tuple(w / total for w in weights)


def parse_split(text: str, *, flag: str = "--split") -> tuple[float, float, float]:
    """``"969,30,1"`` -> normalized train/valid/test shares (missing ones are 0), as Megatron reads it."""
    if re.search(r"[^0-9.,/\s]", str(text)):  # Megatron's reader would drop signs and exponents silently
        raise ValueError(f"{flag} takes up to three non-negative shares for train, valid and test, separated by "
                         f"commas (e.g. 969,30,1); got {text!r}")
    try:
        shares = [float(part) for part in re.findall(r"[.0-9]+", str(text))]
    except ValueError:
        shares = []
    if not shares or len(shares) > len(SPLIT_NAMES) or not sum(shares) > 0:
        raise ValueError(f"{flag} takes up to three non-negative shares for train, valid and test with a "
                         f"positive sum (e.g. 969,30,1); got {text!r}")
    shares += [0.0] * (len(SPLIT_NAMES) - len(shares))
    train, valid, test = normalize(shares)
    return train, valid, test


def split_ranges(num_samples: int, split: Sequence[float]) -> tuple[range | None, range | None, range | None]:
    """The train/valid/test index ranges of a dataset of ``num_samples`` (``None``: no share)."""
    bounds = [0.0]
    for share in split:
        bounds.append(bounds[-1] + share)
    ranges: list[range | None] = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        if end <= begin:
            ranges.append(None)
        else:
            ranges.append(range(int(round(begin * num_samples)), int(round(end * num_samples))))
    return ranges[0], ranges[1], ranges[2]


def blending_indices(weights: Sequence[float], size: int) -> tuple[list[int], list[int]]:
    """Megatron's blend of ``size`` samples: per position, the dataset and that dataset's sample number."""
    shares = normalize(weights)
    drawn = [0] * len(shares)
    dataset_index, sample_index = [0] * size, [0] * size
    for position in range(size):
        scale = max(float(position), 1.0)
        best, best_error = 0, shares[0] * scale - drawn[0]
        for d in range(1, len(shares)):
            error = shares[d] * scale - drawn[d]
            if error > best_error:
                best, best_error = d, error
        dataset_index[position], sample_index[position] = best, drawn[best]
        drawn[best] += 1
    return dataset_index, sample_index


def epoch_permutation(count: int, *, seed: int, epoch: int) -> list[int]:
    """``range(count)`` shuffled by ``random.Random(f"{seed}:{epoch}")`` (Fisher-Yates; the same everywhere)."""
    order = list(range(count))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


class SampleOrder:
    """The training stream: which dataset sample sits at each position (Megatron's ``consumed_samples``).

    ``single``: one pass over the dataset in order. ``cyclic``: epoch ``e`` (positions
    ``e * N .. (e + 1) * N - 1``) is the dataset in the order :func:`epoch_permutation` gives
    for ``(seed, e)``, for ever. With ``groups`` (a group id per sample) every group is one
    unit: units keep the order of their first sample (``single``) or are permuted
    (``cyclic``), and the samples of a unit stay together in dataset order.
    """

    def __init__(self, num_samples: int, *, cyclic: bool = False, seed: int = 0,
                 groups: Sequence[Hashable] | None = None) -> None:
        if num_samples < 1:
            raise ValueError(f"a sample order needs at least one sample; got {num_samples}")
        if groups is not None and len(groups) != num_samples:
            raise ValueError(f"groups has {len(groups)} entries for {num_samples} samples")
        self.num_samples = num_samples
        self.cyclic = cyclic
        self.seed = seed
        self.units = None if groups is None else _units(groups)
        self._epochs: dict[int, tuple[Sequence[int], list[int] | None]] = {}
        self._lock = threading.Lock()

    @property
    def total(self) -> int | None:
        """Positions in the stream: the dataset size for ``single``, ``None`` (endless) for ``cyclic``."""
        return None if self.cyclic else self.num_samples

    def epoch(self, epoch: int) -> tuple[Sequence[int], list[int] | None]:
        """Epoch ``epoch``'s samples in stream order, and its unit start offsets (``None`` without groups)."""
        with self._lock:
            if epoch not in self._epochs:
                if len(self._epochs) >= 2:  # the current epoch and the next are enough
                    del self._epochs[min(self._epochs)]
                self._epochs[epoch] = self._build_epoch(epoch)
            return self._epochs[epoch]

    def _build_epoch(self, epoch: int) -> tuple[Sequence[int], list[int] | None]:
        if self.units is None:
            if not self.cyclic:
                return range(self.num_samples), None
            return epoch_permutation(self.num_samples, seed=self.seed, epoch=epoch), None
        units = self.units
        if self.cyclic:
            units = [units[u] for u in epoch_permutation(len(units), seed=self.seed, epoch=epoch)]
        samples, starts = [], [0]
        for unit in units:
            samples.extend(unit)
            starts.append(len(samples))
        return samples, starts

    def take(self, start: int, count: int) -> tuple[list[int], list[int] | None]:
        """The samples of the next ``count`` units from position ``start`` (fewer at the end of ``single``),
        and per sample the position of its unit's first sample (a group id unique in the stream; ``None``
        without groups). ``ValueError`` if ``start`` falls inside a group."""
        if self.units is None:
            return self._take_samples(start, count), None
        ids: list[int] = []
        keys: list[int] = []
        position = start
        for _ in range(count):
            epoch, offset = divmod(position, self.num_samples)
            if not self.cyclic and epoch >= 1:
                break
            samples, starts = self.epoch(epoch)
            assert starts is not None
            unit = bisect.bisect_left(starts, offset)
            if starts[unit] != offset:
                raise ValueError(f"position {position} falls inside a group (units start at {starts[unit - 1]} "
                                 f"and {starts[unit]} of epoch {epoch}); steps hold whole groups")
            members = samples[offset : starts[unit + 1]]
            ids.extend(members)
            keys.extend([position] * len(members))
            position += len(members)
        return ids, keys

    def _take_samples(self, start: int, count: int) -> list[int]:
        ids: list[int] = []
        position = start
        while len(ids) < count:
            epoch, offset = divmod(position, self.num_samples)
            if not self.cyclic and epoch >= 1:
                break
            samples, _ = self.epoch(epoch)
            chunk = samples[offset : offset + count - len(ids)]
            ids.extend(chunk)
            position += len(chunk)
        return ids


def _units(groups: Sequence[Hashable]) -> list[list[int]]:
    """Samples by group, groups in order of their first sample."""
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    return list(members.values())
