"""The count and sum truncation rule over many units at once, with numpy (the bounded batched
path: no Python object per event).

`count.truncate_step`, run over each unit's steps by `CountProblem.run`, is the rule; this module
computes its result for every unit of a bucket in a few array passes, and is property-tested
against it (tests/streams/test_columns.py): the same contributions, unit states and dropped
counts. It exists because the per-event Python objects of the packed path (an Event tuple per
event, encoded into and out of the shuffle) cost several times the floor's whole work per event.

It holds for problems whose amounts are integers (`CountProblem.columnar`: counts, and sums on a
value grid, in grid units) and whose masses in a bucket add up below 2^52, where float64 adds
integers exactly and in any order; anything else takes the rule itself. The rule, per unit:
- keys: the first `max_keys_per_unit` keys by (first step with an event, canonical key);
- a step's room is R = min(per_step, total - used); its events in (canonical key, value) order
  take min(R, C_j) - min(R, C_{j-1}) of their mass (C: the running mass of admitted events),
  so that used after the step is min(total, used + min(per_step, S)) (S: the step's admitted
  mass), hence used = min(total, the running sum of min(per_step, S)) over the unit's steps.

Units go to buckets by `bucket_of`, a fixed function of the unit id (no process's hash seed),
vectorised for Arrow integer and string columns by `unit_buckets`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from .count import HORIZON_CAP, KEY_CAP, STEP_CAP
from .records import canonical, plain_id

BUCKETS = 256  # shuffle groups of units: parallelism of the truncation, a bucket's memory
_SAFE = float(2 ** 52)  # masses below it add exactly in float64, in any order
_MASK = (1 << 64) - 1


def _mix(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of uint64 numbers (numpy's uint64 products wrap mod 2^64)."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _weights(size: int) -> np.ndarray:
    """The position weights of the text hash: mixed position numbers (a fixed function)."""
    return _mix(np.arange(1, size + 1, dtype=np.uint64))


def _finish_array(h: np.ndarray) -> np.ndarray:
    return (_mix(h) % np.uint64(BUCKETS)).astype(np.int64)


def _finish(h: int) -> int:
    return int(_finish_array(np.array([h & _MASK], dtype=np.uint64))[0])


def _text_hash(data: bytes) -> int:
    weights = _weights(len(data)).tolist()
    return (len(data) + sum(b * w for b, w in zip(data, weights))) & _MASK


def bucket_of(unit) -> int:
    """The bucket of a unit id: SplitMix64's finaliser of an int's low 64 bits, or of a str's
    sum of its UTF-8 bytes times mixed position weights (mod 2^64); any other id (tuples)
    that of its canonical text.

    >>> bucket_of(300), bucket_of("user-1")
    (150, 54)
    """
    unit = plain_id(unit)  # a str or int subclass hashes as the str or int it equals
    if type(unit) is int:
        return _finish(unit)
    data = (unit if type(unit) is str else repr(canonical(unit))).encode("utf-8")
    return _finish(_text_hash(data))


def unit_buckets(column: pa.Array) -> Optional[np.ndarray]:
    """`bucket_of` of every cell of a null-free int64 or string Arrow array, vectorised; None
    for other types."""
    kind = column.type
    if pa.types.is_int64(kind):
        return _finish_array(column.to_numpy(zero_copy_only=False).view(np.uint64))
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    count = len(column)
    if count == 0:
        return np.zeros(0, np.int64)
    _, offsets, data = column.buffers()
    width = np.int64 if pa.types.is_large_string(kind) else np.int32
    ends = np.frombuffer(offsets, width)[column.offset:column.offset + count + 1]
    ends = ends.astype(np.int64)
    lengths = np.diff(ends)
    raw = np.zeros(0, np.uint64) if data is None else \
        np.frombuffer(data, np.uint8)[ends[0]:ends[-1]].astype(np.uint64)
    position = np.arange(len(raw), dtype=np.int64) - np.repeat(ends[:-1] - ends[0], lengths)
    weighted = raw * _weights(int(lengths.max()))[position]
    sums = np.zeros(count, np.uint64)
    filled = lengths > 0
    if len(raw):
        sums[filled] = np.add.reduceat(weighted, (ends[:-1] - ends[0])[filled])
    return _finish_array(sums + lengths.astype(np.uint64))


@dataclasses.dataclass
class Truncated:
    """A bucket's truncation: the contributions summed per (key, step) over its units (cells
    where some event took mass, even if the signed sum is 0, as the rule's `taken`), each
    unit's `used` mass and admitted key codes (in admission order), and dropped events by
    the bound that cut them."""
    cell_keys: np.ndarray
    cell_steps: np.ndarray
    cell_values: np.ndarray  # int64
    used: np.ndarray  # float64 per unit code
    admitted: List[np.ndarray]  # key codes per unit code
    dropped: Dict[str, int]


def run_starts(*columns: np.ndarray) -> np.ndarray:
    """Where a run of equal rows starts in sorted columns."""
    size = len(columns[0])
    change = np.zeros(size, dtype=bool)
    if size:
        change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(change)


def _within(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums restarting at each start (exact: integers below 2^52 in all)."""
    running = np.cumsum(values)
    before = np.concatenate(([0.0], running[:-1]))[starts]
    return running - np.repeat(before, np.diff(np.append(starts, len(values))))


def exact_enough(limits: tuple, values: np.ndarray) -> bool:
    """Whether the bucket's masses add up exactly in float64 in any order (`_SAFE`)."""
    most = limits[2]
    mass = np.abs(values) if most is not None else np.ones(len(values))
    return float(mass.sum()) < _SAFE and len(values) < _SAFE


def truncate_columns(limits: tuple, units: np.ndarray, unit_count: int, keys: np.ndarray,
                     key_ranks: np.ndarray, steps: np.ndarray, values: np.ndarray
                     ) -> Truncated:
    """`count.truncate_step` over the steps of every unit in the arrays, from fresh states.

    Args:
      limits: `ContributionBounds.limits` (grid units for sums).
      units, keys: int codes per event (units in [0, unit_count)); `key_ranks[code]` is the
        key's place in canonical order.
      steps: each event's step; values: each event's amount (1.0 for counts).

    Returns:
      Truncated. Callers check `exact_enough` first.
    """
    per_step, total, most, max_keys, least = limits
    amount = values if most is None else np.minimum(np.maximum(values, least), most)
    mass = np.abs(amount)
    ranks = key_ranks[keys]
    dropped: Dict[str, int] = {}
    # keys: admitted by (unit, first step, canonical key)
    order = np.lexsort((ranks, steps, units))
    pairs = units.astype(np.int64) * len(key_ranks) + keys
    _, first = np.unique(pairs[order], return_index=True)
    first.sort()
    pair_units = units[order[first]]
    unit_starts = run_starts(pair_units)
    place = np.arange(len(first)) - np.repeat(unit_starts, np.diff(np.append(unit_starts,
                                                                              len(first))))
    kept_pairs = pairs[order[first[place < max_keys]]]
    admitted = np.isin(pairs, kept_pairs)
    by_unit: List[np.ndarray] = [np.zeros(0, np.int64)] * unit_count
    kept_first = first[place < max_keys]
    kept_units, kept_keys = units[order[kept_first]], keys[order[kept_first]]
    bounds = run_starts(kept_units)
    for begin, end in zip(bounds, np.append(bounds[1:], len(kept_units))):
        by_unit[int(kept_units[begin])] = kept_keys[begin:end]
    # events in (unit, step, canonical key, value) order, grouped by (unit, step)
    order = np.lexsort((amount, ranks, steps, units))
    u, s, k = units[order], steps[order], keys[order]
    a, m, sign = admitted[order], mass[order] * admitted[order], amount[order]
    groups = run_starts(u, s)
    sizes = np.diff(np.append(groups, len(u)))
    step_mass = np.add.reduceat(m, groups) if len(u) else np.zeros(0)
    spent = np.minimum(per_step, step_mass)
    group_units = u[groups]
    first_groups = run_starts(group_units)
    used_after = np.minimum(total, _within(spent, first_groups))
    used_before = np.concatenate(([0.0], used_after[:-1]))
    used_before[first_groups] = 0.0
    room = np.minimum(per_step, total - used_before)
    room_e = np.repeat(room, sizes)
    upto = _within(m, groups)
    take = np.minimum(room_e, upto) - np.minimum(room_e, upto - m)
    took = take > 0
    # dropped events, by the bound that cut them (the rule's reasons)
    dropped_key = int(np.count_nonzero(~a))
    exhausted = np.repeat(total - used_before <= 0, sizes)
    horizon_first = np.repeat(total - used_before <= per_step, sizes)
    cut = a & ~took & (exhausted | (m > 0))
    horizon = int(np.count_nonzero(cut & (exhausted | horizon_first)))
    step_cut = int(np.count_nonzero(cut)) - horizon
    for reason, count in ((KEY_CAP, dropped_key), (HORIZON_CAP, horizon), (STEP_CAP, step_cut)):
        if count:
            dropped[reason] = count
    used = np.zeros(unit_count)
    last_groups = np.append(first_groups[1:], len(groups)) - 1
    used[group_units[first_groups]] = used_after[last_groups]
    # contributions per (key, step): signed takes of the events that took mass
    signed = np.where(sign > 0, take, -take)[took].astype(np.int64)
    cell_keys, cell_steps, cell_values = sum_cells(k[took], s[took], signed)
    return Truncated(cell_keys, cell_steps, cell_values, used, by_unit, dropped)


def sum_cells(keys: np.ndarray, steps: np.ndarray, values: np.ndarray):
    """(key, step, int64 value) triples -> one per distinct (key, step), values summed, in
    (key, step) order."""
    order = np.lexsort((steps, keys))
    keys, steps, values = keys[order], steps[order], values[order]
    cells = run_starts(keys, steps)
    summed = np.add.reduceat(values, cells) if len(cells) else np.zeros(0, np.int64)
    return keys[cells], steps[cells], summed


class Codes:
    """Ids -> dense int codes, for the ids of several parts (Arrow arrays: dictionary-encoded
    in C; Python lists: one dict lookup each); `ids[code]` is the id."""

    def __init__(self):
        self.index: Dict[Any, int] = {}
        self.ids: List[Any] = []

    def _code(self, value) -> int:
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.ids)
            self.ids.append(value)
        return code

    def of(self, column) -> np.ndarray:
        if isinstance(column, (pa.Array, pa.ChunkedArray)):
            encoded = column.dictionary_encode()
            if isinstance(encoded, pa.ChunkedArray):
                encoded = encoded.combine_chunks()
            mapping = np.array([self._code(v) for v in encoded.dictionary.to_pylist()],
                               dtype=np.int64)
            indices = encoded.indices.to_numpy(zero_copy_only=False)
            return mapping[indices] if len(mapping) else np.zeros(0, np.int64)
        return np.array([self._code(v) for v in column], dtype=np.int64)

    def canonical_ranks(self) -> np.ndarray:
        """Each code's place in canonical order of the ids."""
        ranks = np.zeros(len(self.ids), np.int64)
        order = sorted(range(len(self.ids)), key=lambda code: canonical(self.ids[code]))
        ranks[np.array(order, dtype=np.int64)] = np.arange(len(order))
        return ranks


@dataclasses.dataclass
class UnitColumns:
    """Events of units, column by column: units and keys as Arrow arrays or Python lists,
    steps (int64) and payload values (float64: 1.0 for counts, grid units for sums) as numpy."""
    units: Any
    keys: Any
    steps: np.ndarray
    values: np.ndarray

    def __len__(self):
        return len(self.steps)

    def take(self, rows: np.ndarray) -> "UnitColumns":
        def pick(column):
            if isinstance(column, pa.Array):
                return column.take(pa.array(rows, type=pa.int64()))
            return [column[i] for i in rows.tolist()]
        return UnitColumns(pick(self.units), pick(self.keys), self.steps[rows],
                           self.values[rows])

    def buckets(self) -> np.ndarray:
        found = unit_buckets(self.units) if isinstance(self.units, pa.Array) else None
        if found is None:
            units = self.units.to_pylist() if isinstance(self.units, pa.Array) else self.units
            found = np.array([bucket_of(unit) for unit in units], dtype=np.int64)
        return found

    def split(self) -> List[Tuple[int, "UnitColumns"]]:
        """(bucket, the events of its units) for every bucket present."""
        buckets = self.buckets()
        order = np.argsort(buckets, kind="stable")
        starts = run_starts(buckets[order])
        ends = np.append(starts[1:], len(order))
        return [(int(buckets[order[begin]]), self.take(order[begin:end]))
                for begin, end in zip(starts, ends)]


def as_column(ids: list) -> Any:
    """Python ids as an int64 or string Arrow array when they are all ints within int64 or all
    strs (buckets and codes then vectorise), else the list itself."""
    kinds = set(map(type, ids))
    if kinds == {int} or kinds == {str}:
        try:
            column = pa.array(ids, pa.int64() if kinds == {int} else pa.large_string())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return ids
        if isinstance(column, pa.Array):  # (not chunked)
            return column
    return ids


def normalised(column) -> Any:
    """An Arrow id column as int64 or large_string (one type per kind, so parts concatenate
    past 2 GiB of text), else its Python values."""
    kind = column.type
    try:
        if pa.types.is_integer(kind) and not pa.types.is_int64(kind):
            return column.cast(pa.int64())
        if pa.types.is_string(kind):
            return column.cast(pa.large_string())
    except (pa.ArrowInvalid, OverflowError):  # uint64 beyond int64: Python ints
        return column.to_pylist()
    return column


def concat(parts: Sequence[UnitColumns]) -> UnitColumns:
    """One UnitColumns of parts; id columns of mixed kinds become Python lists."""
    if len(parts) == 1:
        return parts[0]

    def joined(columns):
        kinds = {column.type if isinstance(column, pa.Array) else None for column in columns}
        if len(kinds) == 1 and None not in kinds:
            return pa.concat_arrays(columns)
        out: list = []
        for column in columns:
            out.extend(column.to_pylist() if isinstance(column, pa.Array) else column)
        return out
    return UnitColumns(joined([p.units for p in parts]), joined([p.keys for p in parts]),
                       np.concatenate([p.steps for p in parts]),
                       np.concatenate([p.values for p in parts]))
