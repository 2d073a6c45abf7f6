"""Columnar packs: a bundle's events leave step assignment as column arrays per bucket of units
(`streams.columns.bucket_of`), one shuffled element per bucket and bundle, and are truncated
with numpy (`bounded.TruncateBucketsFn`). Bounded input takes this path for problems whose
rule `streams.columns.truncate_columns` computes (`Problem.columnar`: counts, grid sums).

    events     -> AssignStepsFn       -> (bucket, UnitColumns) per bucket and bundle
               -> GroupByKey          -> (bucket, [UnitColumns])
               -> TruncateBucketsFn   -> (key, KeySums wire tuple) per key and bundle
                                         + (unit, state) per unit
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
from apache_beam.utils.windowed_value import WindowedValue

from transforms.messages import END_OF_GLOBAL, GLOBAL_WINDOWS
from transforms.streams.columns import UnitColumns, as_column, bucket_of, concat


class ColumnPacks:
    """A DoFn's per-bundle columnar packs (mixed into `AssignBatchStepsFn`): column parts of
    events (`add_columns`) and events one by one (`add_event`, rows the per-row rule took),
    flushed as (bucket, UnitColumns) once per bucket and bundle (or per `MAX_COLUMN_EVENTS`)."""

    MAX_COLUMN_EVENTS = 2_000_000  # ~50 MB of buffered columns at most

    def start_columns(self):
        self._parts: List[UnitColumns] = []
        self._rows: Tuple[list, list, list, list] = ([], [], [], [])
        self._buffered = 0

    def add_columns(self, part: UnitColumns):
        self._parts.append(part)
        self._buffered += len(part)
        if self._buffered >= self.MAX_COLUMN_EVENTS:
            yield from self.flush_columns()

    def add_event(self, unit, event):
        """One (unit, (step, micros, (key, value))) event of the per-row rule."""
        units, keys, steps, values = self._rows
        step, _, (key, value) = event
        units.append(unit)
        keys.append(key)
        steps.append(step)
        values.append(value)
        self._buffered += 1
        if self._buffered >= self.MAX_COLUMN_EVENTS:
            yield from self.flush_columns()

    def flush_columns(self):
        parts, rows = self._parts, self._rows
        self.start_columns()
        if rows[0]:
            parts.append(UnitColumns(as_column(rows[0]), as_column(rows[1]),
                                     np.array(rows[2], dtype=np.int64),
                                     np.array(rows[3], dtype=np.float64)))
        by_kind: Dict[Any, List[UnitColumns]] = {}
        for part in parts:  # parts of one id type concatenate as Arrow arrays
            by_kind.setdefault((_kind(part.units), _kind(part.keys)), []).append(part)
        for group in by_kind.values():
            for bucket, part in concat(group).split():
                yield WindowedValue((bucket, part), END_OF_GLOBAL, GLOBAL_WINDOWS)


def _kind(column) -> str:
    return str(column.type) if hasattr(column, "type") else "python"


def by_bucket(pair):
    """(unit, state) -> (its bucket, (unit, state)): saved states meet their units' events."""
    return bucket_of(pair[0]), pair
