"""Batched input: Arrow tables in, `EventBatch`es out, so that no Beam element exists per event.

    tables = p | beam.io.ReadFromParquetBatched("events-*.parquet")      # pyarrow Tables
    batches = tables | ArrowEvents({"unit": "user", "key": "region"}, timestamp="ts",
                                   timestamp_unit="us")
    result = batches | ContinualCount(...)        # the same stages as timestamped elements

An `EventBatch` holds one table's events column by column (the transform's element fields,
by role, and each event's time in microseconds). Every `Continual*` transform accepts a
PCollection of them in place of timestamped elements (bounded input): `AssignSteps` assigns
steps with numpy and packs each unit's events per bundle without a Beam element per event, and
truncation and release are the very same stages. The result is exactly that of the element
path (tested: `tests/test_arrow_input.py`):
- an event's time is what `TimestampedValue(element, value / units_per_second)` would carry
  (Beam's microseconds of those float seconds), computed with the same float operations;
- rows the vectorised checks cannot vouch for (nulls, empty strings, a column of another type,
  out-of-horizon times) take the element path's per-row code, so they get the same dead letter
  (same reason, same record) or the same event; rows whose time is missing or not finite
  and rows of a table without a mapped column become dead letters (never a crash).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa

from transforms.assign import AssignStepsFn
from transforms.streams.columns import UnitColumns, normalised
from transforms.messages import KEYED, dead_letter
from transforms.streams.records import Reason
from transforms.validation import fail

UNITS_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


@dataclasses.dataclass
class EventBatch:
    """One table's events, column by column: `columns` maps each role of `shape` (the
    transform's element shape, e.g. ("unit", "key") or ("op", ("a", "b"))) to a pyarrow Array;
    `micros` (int64 numpy) is each event's time as Beam's microseconds. `extra` holds events
    already in element form ((element, micros), e.g. rows a reader validated one by one) and
    `dead` dead letters to emit ((record, reason)). Every array has one entry per event."""
    shape: Tuple[Any, ...]
    columns: Dict[str, pa.Array]
    micros: np.ndarray
    extra: List[Tuple[Any, int]] = dataclasses.field(default_factory=list)
    dead: List[Tuple[Any, str]] = dataclasses.field(default_factory=list)

    def __len__(self):
        return len(self.micros)

    def take(self, rows: np.ndarray) -> "EventBatch":
        """The events at `rows` (indices), without extra events or dead letters."""
        index = pa.array(rows, type=pa.int64())
        return EventBatch(self.shape, {r: c.take(index) for r, c in self.columns.items()},
                          self.micros[rows])

    def elements(self, rows: Optional[np.ndarray] = None) -> List[Any]:
        """The events at `rows` (all by default) as the transform's element tuples."""
        part = self if rows is None else self.take(rows)
        values = {role: python_cells(column) for role, column in part.columns.items()}

        def build(shape, i):
            return tuple(build(p, i) if isinstance(p, tuple) else values[p][i] for p in shape)
        return [build(self.shape, i) for i in range(len(part))]


class Unreadable:
    """A cell Python cannot hold (a time beyond the year 9999, nanoseconds that are not whole
    microseconds): no id, op or number, so its row becomes a dead letter showing the cell."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return f"<unreadable cell {self.text}>"


def cell_text(column) -> str:
    """A one-row column's cell as text, for a cell Python cannot hold: times as their integer
    count of the column's unit, other cells as Python shows them (or the type, never raising)."""
    timed = str(column.type).startswith(("timestamp", "date"))
    for convert in ((lambda c: c.cast("int64"), lambda c: c) if timed else (lambda c: c,)):
        try:
            return str(convert(column).to_pylist()[0])
        except Exception:  # noqa: BLE001 (any pyarrow failure: try the next way, or the type)
            continue
    return f"<{column.type}>"


def python_cells(column) -> list:
    """A column as Python values (`to_pylist`); a cell Python cannot hold is `Unreadable`."""
    try:
        return column.to_pylist()
    except Exception:  # noqa: BLE001 (any pyarrow conversion failure: cell by cell)
        pass
    cells = []
    for index in range(len(column)):
        cell = column.slice(index, 1)
        try:
            cells.append(cell.to_pylist()[0])
        except Exception:  # noqa: BLE001 (this cell: unreadable, its row a dead letter)
            cells.append(Unreadable(cell_text(cell)))
    return cells


def python_rows(table) -> list:
    """A table's rows as dicts (`to_pylist`: of columns of one name, the last); a cell Python
    cannot hold is `Unreadable`."""
    try:
        return table.to_pylist()
    except Exception:  # noqa: BLE001 (any pyarrow conversion failure: column by column)
        pass
    names = table.column_names if hasattr(table, "column_names") else table.schema.names
    columns = [python_cells(table.column(index)) for index in range(len(names))]
    return [dict(zip(names, values)) for values in zip(*columns)]


def flat_roles(shape) -> Tuple[str, ...]:
    out = []
    for part in shape:
        out.extend(flat_roles(part) if isinstance(part, tuple) else (part,))
    return tuple(out)


def beam_micros(seconds: np.ndarray) -> np.ndarray:
    """Beam's `Timestamp(seconds).micros` of float64 seconds, vectorised: int(seconds * 1e6)
    (truncated toward zero), the same float operations as Beam's."""
    return np.trunc(seconds * 1e6).astype(np.int64)


def time_seconds(column, timestamp_unit: str) -> Optional[np.ndarray]:
    """The float seconds the element path would pass to TimestampedValue: float64(value) /
    units per second (Arrow timestamp columns: their own unit; NaN where null), or None for a
    column of another type."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_timestamp(kind):
        timestamp_unit = kind.unit
        column = column.cast(pa.int64())
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return None
    values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
    if column.null_count:
        values = np.where(_valid(column), values, np.nan)
    divisor = UNITS_PER_SECOND[timestamp_unit]
    return values if divisor == 1.0 else values / divisor


def named_column(table, name: str):
    """The column `name` of a table or record batch; of several columns with that name, the last
    (as `to_pylist` keeps it, and JSON objects and CSV headers their last field of a name)."""
    return table.column(table.schema.get_all_field_indices(name)[-1])


def event_batch(table, fields: Mapping[str, str], timestamp: str, timestamp_unit: str = "s",
                shape: Optional[Sequence] = None) -> EventBatch:
    """An Arrow table (or record batch) -> EventBatch: role columns by `fields` ({role:
    column}); the time column's values in `timestamp_unit` (ignored for Arrow timestamps).
    Never raises on data: a row whose time is missing, not finite or beyond Beam's range is a
    dead letter, and so is every row of a table without one of the columns."""
    shape = tuple(shape) if shape is not None else tuple(fields)
    names = table.column_names if hasattr(table, "column_names") else table.schema.names
    wanted = [fields[role] for role in flat_roles(shape)] + [timestamp]
    missing = [column for column in wanted if column not in names]
    if missing:
        rows = python_rows(table)
        return EventBatch(shape, {role: pa.array([]) for role in flat_roles(shape)},
                          np.zeros(0, np.int64),
                          dead=[(row, Reason("missing_field", f"missing field {missing[0]!r}"))
                                for row in rows])
    columns = {}
    for role in flat_roles(shape):
        column = named_column(table, fields[role])
        columns[role] = column.combine_chunks() if isinstance(column, pa.ChunkedArray) \
            else column
    seconds = time_seconds(named_column(table, timestamp), timestamp_unit)
    if seconds is None:
        bad = np.ones(table.num_rows, dtype=bool)
    else:
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(seconds) | (np.abs(seconds) * 1e6 >= 2.0 ** 63)
    if not bad.any():
        return EventBatch(shape, columns, beam_micros(seconds))
    whole = EventBatch(shape, columns, np.zeros(len(bad), dtype=np.int64))
    rows = np.flatnonzero(bad)
    raw = python_cells(named_column(table, timestamp).take(pa.array(rows, type=pa.int64())))
    dead = [(element, Reason("bad_timestamp", f"`{timestamp}` must be a finite time within "
                                              f"Beam's range; got {value!r}"))
            for element, value in zip(whole.elements(rows), raw)]
    keep = np.flatnonzero(~bad)
    out = whole.take(keep)
    out.micros = beam_micros(seconds[keep]) if len(keep) else np.zeros(0, np.int64)
    out.dead = dead
    return out


@beam.typehints.with_output_types(EventBatch)
class _ToBatchFn(beam.DoFn):
    def __init__(self, fields, timestamp, timestamp_unit, shape):
        self.fields, self.timestamp = dict(fields), timestamp
        self.timestamp_unit, self.shape = timestamp_unit, shape

    def process(self, table):
        if table.num_rows:  # dead letters ride in the batch: AssignSteps emits them
            yield event_batch(table, self.fields, self.timestamp, self.timestamp_unit,
                              self.shape)


class ArrowEvents(beam.PTransform):
    """pyarrow Tables (or RecordBatches, e.g. from `beam.io.ReadFromParquetBatched`) ->
    `EventBatch`es, the batched input of every `Continual*` transform (bounded input).

    `fields` maps the transform's element roles to columns, in element order (ContinualCount:
    {"unit": ..., "key": ...}; ContinualSum adds "value"; ContinualCountDistinct: "op", "item",
    "key"; pass `shape` for nested elements, e.g. ("op", ("a", "b")) for edges); `timestamp`
    is the event-time column: numbers in `timestamp_unit` ("s", "ms", "us" or "ns") or an
    Arrow timestamp column. The transform sees exactly the events it would see as
    `TimestampedValue(element, value / units_per_second)` elements."""

    def __init__(self, fields: Mapping[str, str], timestamp: str, timestamp_unit: str = "s",
                 shape: Optional[Sequence] = None):
        super().__init__()
        if not fields or not all(isinstance(k, str) and isinstance(v, str)
                                 for k, v in dict(fields).items()):
            fail("fields", "a non-empty {role: column} mapping", fields)
        if timestamp_unit not in UNITS_PER_SECOND:
            fail("timestamp_unit", f"one of {sorted(UNITS_PER_SECOND)}", timestamp_unit)
        self.fields, self.timestamp = dict(fields), timestamp
        self.timestamp_unit = timestamp_unit
        self.shape = tuple(shape) if shape is not None else tuple(self.fields)
        missing = set(flat_roles(self.shape)) - set(self.fields)
        if missing:
            fail("fields", f"a column for every role of {self.shape}", sorted(missing))

    def expand(self, tables):
        return tables | "ToEventBatches" >> beam.ParDo(_ToBatchFn(
            self.fields, self.timestamp, self.timestamp_unit, self.shape))


def is_batched(pcoll) -> bool:
    """Whether a PCollection holds `EventBatch`es (from `ArrowEvents` or the job reader)."""
    kind = getattr(pcoll, "element_type", None)
    return isinstance(kind, type) and issubclass(kind, EventBatch)


# ----- the batched step assignment (used by `stages.AssignSteps`) -------------------------------
def _valid(column: pa.Array) -> np.ndarray:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def id_mask(column: pa.Array) -> Optional[np.ndarray]:
    """Rows whose value `records.is_id` accepts for sure (ints; non-empty strings), or None
    when the column's type is none of these (every row then takes the per-row path)."""
    kind = column.type
    if pa.types.is_integer(kind):
        return _valid(column)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        import pyarrow.compute as pc
        lengths = pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
        return np.asarray(lengths, dtype=np.int64) > 0
    return None


def number_mask(column: pa.Array) -> Optional[np.ndarray]:
    """Rows holding a finite number (ints, floats; not booleans), or None for other types."""
    kind = column.type
    if pa.types.is_integer(kind):
        return _valid(column)
    if pa.types.is_floating(kind) and not pa.types.is_float16(kind):
        values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        return np.isfinite(values) & _valid(column)
    return None


def python_values(column: pa.Array) -> list:
    """A null-free column as Python values (what `to_pylist` gives, faster for numbers)."""
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        return column.to_numpy(zero_copy_only=False).tolist()
    return column.to_pylist()


_MASKS = {"id": id_mask, "number": number_mask}


def _flat_columns(problem, batch: EventBatch):
    """The batch's columns when the problem parses its flat elements vectorised
    (`Problem.flat_fields`) and the batch has that shape, else None (every row then takes the
    per-row path)."""
    kinds, shape = problem.flat_fields, batch.shape
    if kinds is None or len(shape) != len(kinds) or any(isinstance(p, tuple) for p in shape):
        return None
    return [batch.columns[role] for role in shape]


@beam.typehints.with_output_types(KEYED)
class AssignBatchStepsFn(AssignStepsFn):
    """`AssignStepsFn` for EventBatches: steps, horizon and window with numpy; counts and
    sums whose fields pass the vectorised checks become events without per-row parsing (with
    `columnar`, column arrays); every other row runs `_assign`, the per-element rule itself."""

    def process(self, batch):
        for record, reason in batch.dead:
            yield dead_letter(record, reason)
        if len(batch):
            yield from self._batch(batch)
        for element, micros in batch.extra:
            yield from self._emit(self._assign(element, micros))
        if self._buffered >= self.MAX_EVENTS:
            yield from self._flush()

    def _emit(self, out):
        """One `_assign` result: a dead letter, or an event (packed or not)."""
        if out is None:
            return
        if self.packed and type(out) is tuple:
            yield from self._pack(out[0], out[1])
        else:
            yield out

    def _batch(self, batch: EventBatch):
        steps, window = self.steps, self.window
        micros = batch.micros
        # = steps.step_of(float(micros) / 1e6): the same float operations, vectorised
        step = np.floor((micros.astype(np.float64) / 1e6 - steps.origin) / steps.size)
        inside = (step >= 0) & (step < steps.horizon)
        self._released += int(np.count_nonzero(inside & (step < window.first)))
        current = inside & (step >= window.first) & (step < window.stop)
        problem = self.problem
        columns = _flat_columns(problem, batch)
        ok = None
        if columns is not None:
            masks = [_MASKS[kind](column) for kind, column in zip(problem.flat_fields, columns)]
            if all(m is not None for m in masks):
                ok = np.logical_and.reduce(masks)
        if ok is None:
            fast, slow = None, ~inside | current
        else:
            fast, slow = current & ok, ~inside | (current & ~ok)
        if fast is not None and fast.any():
            yield from self._fast_rows(problem, columns, np.flatnonzero(fast), step, micros)
        if slow.any():
            rows = np.flatnonzero(slow)
            for element, m in zip(batch.elements(rows), micros[rows].tolist()):
                yield from self._emit(self._assign(element, m))

    def _fast_rows(self, problem, columns, rows, step, micros):
        """Rows whose fields passed their checks: `Problem.parse_columns`, then events."""
        index = pa.array(rows, type=pa.int64())
        if self.columnar:
            taken = [column.take(index) for column in columns]
            values = problem.column_values(
                taken[2].to_numpy(zero_copy_only=False).astype(np.float64)
                if len(taken) > 2 else None, len(rows))
            self._assigned += len(rows)
            yield from self.add_columns(UnitColumns(
                normalised(taken[0]), normalised(taken[1]), step[rows].astype(np.int64),
                values))
            return
        units, payloads = problem.parse_columns([python_values(column.take(index))
                                                 for column in columns])
        steps = step[rows].astype(np.int64).tolist()
        times = micros[rows].tolist()
        self._assigned += len(rows)
        if not self.packed:
            for unit, s, m, payload in zip(units, steps, times, payloads):
                yield unit, (s, m, payload)
            return
        packs = self._packs
        for unit, s, m, payload in zip(units, steps, times, payloads):
            found = packs.get(unit)
            if found is None:
                packs[unit] = [(s, m, payload)]
            else:
                found.append((s, m, payload))
        self._buffered += len(rows)
