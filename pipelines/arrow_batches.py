"""Input rows as Arrow tables -> `EventBatch`es (the batched entry of `pipelines.run` and
`pipelines.schedule`): the checks of `pipelines.io.ToElement` vectorised where a column's type
lets them vouch for a row, and `ToElement` itself for every other row, so that the events and
dead letters are those of the row path (tested). Parquet tables (`io.read_parquet_batches`)
and JSON lines parsed into tables (`io.read_jsonl_batches`) take it.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines import config as job_config
from pipelines import text_cells
from transforms import registry
from transforms.arrow_input import (UNITS_PER_SECOND, EventBatch, Unreadable, beam_micros,
                                    cell_text, flat_roles, id_mask, named_column, number_mask)
from transforms.messages import dead_letter
from transforms.streams.records import Reason

UNIT_ROLES = ("unit", "item")  # roles whose integer ids are their text (`io.canonical_unit`)


def fast_column(kind: str, column, timestamp_format: str):
    """(rows `parse_cell` accepts for sure, their values as `parse_cell` returns them) for a
    role's Arrow column, or None when the column's type is not one the vectorised checks
    cover (its rows then go through `ToElement` one by one). Timestamps: (mask, seconds)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind_of = column.type
    integer = pa.types.is_integer(kind_of) and not pa.types.is_uint64(kind_of)
    string = pa.types.is_string(kind_of) or pa.types.is_large_string(kind_of)
    if kind in ("id", "int") and integer or kind in ("id", "str") and string:
        return id_mask(column), column  # ints / non-empty strings, not null
    if string:  # numbers and times as text (CSV; JSON lines' ISO times): parse_cell's reading
        return text_cells.text_column(kind, column, timestamp_format)
    if kind == "float" and (integer or pa.types.is_floating(kind_of)):
        mask = number_mask(column)
        if mask is None:
            return None
        values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        return mask, pa.array(values, type=pa.float64())  # float(cell), as parse_cell
    if kind != "timestamp":
        return None
    low, high = job_config.TIME_RANGE
    if pa.types.is_timestamp(kind_of) and timestamp_format == "iso" and \
            kind_of.unit in ("s", "ms", "us"):
        # parse_time: datetime.timestamp() = whole microseconds / 10**6, correctly rounded:
        # the same float as value / units_per_second while the microseconds are exact floats
        whole = column.cast(pa.int64())
        raw = np.asarray(whole.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        exact = np.abs(raw) < (2 ** 53) // {"s": 10 ** 6, "ms": 10 ** 3, "us": 1}[kind_of.unit]
        seconds = raw.astype(np.float64) / UNITS_PER_SECOND[kind_of.unit]
        return exact & id_mask(whole) & (seconds >= low) & (seconds <= high), seconds
    if integer or (pa.types.is_floating(kind_of) and not pa.types.is_float16(kind_of)):
        mask = number_mask(column)  # float(cell) (every format), then the years 1 to 9999
        seconds = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        if timestamp_format == "milliseconds":  # float(cell) / 1000.0, as `parse_cell`
            seconds = seconds / 1000.0
        with np.errstate(invalid="ignore"):
            return mask & (seconds >= low) & (seconds <= high), seconds
    return None


class TableToBatch(beam.DoFn):
    """An Arrow table of input rows -> one EventBatch of the rows that pass `to_element`'s
    checks (vectorised), plus, one by one through `to_element` itself (`pipelines.io.
    ToElement`), every row the vectorised checks cannot vouch for: its dead letter (the same
    reason and record as row by row) or its element (in the batch's `extra`). `rows`: the
    table's rows as the row path parsed them (JSON lines), else converted from Arrow."""

    def __init__(self, job: job_config.JobConfig, to_element):
        self.job, self.to_element = job, to_element

    def setup(self):
        self.spec = registry.SPECS[self.job.transform]

    def process(self, table, rows=None):
        if not table.num_rows:
            return
        job = self.job
        names = set(table.column_names)
        ok = np.ones(table.num_rows, dtype=bool)
        values, seconds = {}, None
        for role, column in job.input.fields.items():
            kind = job.input.type_of(role)
            fast = None if column not in names or (role == "timestamp") != (
                kind == "timestamp") else fast_column(kind, named_column(table, column),
                                                       job.input.timestamp_format)
            if fast is None:
                ok[:] = False
                break
            ok &= fast[0]
            if role == "timestamp":
                seconds = fast[1]
            elif kind == "id" and role in UNIT_ROLES and pa.types.is_integer(fast[1].type):
                values[role] = fast[1].cast(pa.string())  # = canonical_unit, vectorised
            else:
                values[role] = fast[1]
        extra = []
        if not ok.all():
            slow = python_rows(table.filter(pa.array(~ok)), set(job.input.fields.values())) \
                if rows is None else [rows[i] for i in np.flatnonzero(~ok).tolist()]
            for row in slow:
                if isinstance(row, beam.pvalue.TaggedOutput):
                    yield row
                    continue
                for out in self.to_element.process(row):
                    if isinstance(out, beam.pvalue.TaggedOutput):
                        yield out
                    else:  # valid after all: the element and its Beam event time
                        extra.append((out.value, out.timestamp.micros))
        rows = np.flatnonzero(ok)
        roles = flat_roles(self.spec.shape)
        if len(rows):
            index = pa.array(rows, type=pa.int64())
            columns = {role: values[role].take(index) for role in roles}
            micros = beam_micros(seconds[rows])  # = TimestampedValue(element, seconds)
        else:
            columns, micros = {role: pa.array([]) for role in roles}, np.zeros(0, np.int64)
        if len(micros) or extra:
            yield EventBatch(self.spec.shape, columns, micros, extra)


def python_rows(table, mapped=None):
    """The table's rows as dicts; a row Arrow cannot convert (a timestamp outside Python's
    years 1-9999) is a dead letter holding its cells as text, never a crash, if the cell Python
    cannot hold is in a `mapped` column (default: any); else that cell is `Unreadable` (the
    vectorised checks, which see mapped columns only, keep such a row too)."""
    try:
        rows = table.to_pylist()
    except Exception:  # noqa: BLE001 (any pyarrow conversion failure: row by row below)
        rows = None
    if rows is not None:
        yield from rows
        return
    for index in range(table.num_rows):
        row = table.slice(index, 1)
        try:
            converted = row.to_pylist()[0]
        except Exception as failure:  # noqa: BLE001 (any pyarrow failure: cell by cell)
            converted, unreadable = {}, False
            for position, name in enumerate(row.column_names):
                try:
                    converted[name] = row.column(position).to_pylist()[0]
                except Exception:  # noqa: BLE001 (this cell cannot be a Python value)
                    converted[name] = Unreadable(cell_text(row.column(position)))
                    unreadable |= mapped is None or name in mapped
            if unreadable:
                cells = {name: cell_text(row.column(position))
                         for position, name in enumerate(row.column_names)}
                yield dead_letter(cells, Reason("unparseable", f"unreadable Parquet row: "
                                                             f"{str(failure)[:200]}"))
                continue
        yield converted
