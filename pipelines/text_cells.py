"""Text cells parsed column by column: what `pipelines.io.parse_cell` returns for each cell of
an Arrow string column declared `int`, `float` or `timestamp`, with numpy and Arrow compute.

CSV cells are always text, and JSON lines often carry ISO-8601 times as text; without this
every such row takes the row path one Python call at a time. The rule is `parse_cell`'s: this
module only vouches for the cells whose parse it can reproduce exactly (a strict subset of the
text `parse_cell` accepts) and leaves every other cell to the row path, which then accepts or
refuses it with its own reason. Property-tested cell by cell against `parse_cell`
(`tests/pipelines/test_text_cells.py`).

    >>> import pyarrow as pa
    >>> mask, seconds = text_column("timestamp", pa.array(["2026-01-05T00:00:01.5Z", "x"]),
    ...                             "iso")
    >>> mask.tolist(), float(seconds[0])
    ([True, False], 1767571201.5)
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines import config as job_config

# ASCII digits only (`\d` would be Unicode in Python): the row path's own regular expressions
# (`io._INT`, `io._FLOAT`) read alike in RE2, anchored at both ends as `fullmatch` is.
INT_TEXT = r"^[+-]?[0-9]{1,18}$"  # at most 18 digits: below 2^63 for sure, as int() gives
FLOAT_TEXT = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"
# ISO-8601 with a timezone, in the forms `datetime.fromisoformat` reads (after "Z" -> "+00:00")
ISO_TEXT = (r"^(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[T ]"
            r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
            r"(?:\.(?P<fraction>[0-9]{1,6}))?(?P<zone>Z|[+-][0-9]{2}:[0-9]{2})$")
EXACT_MICROS = 2 ** 53  # microseconds from the epoch held exactly by a float64 (years ~1685-2255)


def text_column(kind: str, column: pa.Array, timestamp_format: str
                ) -> Optional[Tuple[np.ndarray, object]]:
    """(rows `parse_cell` accepts for sure, their values as it returns them) for a string
    column declared `kind` ("int", "float" or "timestamp"), or None for another kind. Values
    are an Arrow int64 / float64 array ("int" / "float") or float64 seconds ("timestamp");
    rows outside the mask hold a placeholder."""
    if kind == "int":
        mask = _matches(column, INT_TEXT)
        text = pc.replace_substring_regex(_or_zero(column, mask), r"^\+", "")
        return mask, pc.cast(text, pa.int64())
    if kind == "float":
        mask, values = _floats(column)
        return mask, pa.array(values, type=pa.float64())
    if kind != "timestamp":
        return None
    if timestamp_format == "iso":
        mask, seconds = _iso_seconds(column)
    else:
        mask, seconds = _floats(column)
        if timestamp_format == "milliseconds":  # float(cell) / 1000.0, as `parse_cell`
            seconds = seconds / 1000.0
    low, high = job_config.TIME_RANGE
    with np.errstate(invalid="ignore"):
        return mask & (seconds >= low) & (seconds <= high), seconds


def _matches(column, pattern: str) -> np.ndarray:
    found = pc.match_substring_regex(column, pattern).fill_null(False)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)


def _or_zero(column, mask: np.ndarray):
    """The column with "0" wherever the mask is off (so that a cast cannot fail there)."""
    return pc.if_else(pa.array(mask), column.cast(pa.string()), "0")


def _floats(column) -> Tuple[np.ndarray, np.ndarray]:
    """Cells `float()` reads under `io._FLOAT`, as finite float64 (Arrow's string to double is
    correctly rounded, as Python's `float` is: tested cell by cell)."""
    mask = _matches(column, FLOAT_TEXT)
    values = np.asarray(pc.cast(_or_zero(column, mask), pa.float64()).to_numpy(
        zero_copy_only=False), dtype=np.float64)
    return mask & np.isfinite(values), values


_DAYS_BEFORE_MONTH = np.array([0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334], np.int64)
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int64)
_DAYS_TO_EPOCH = 719162  # days from 0001-01-01 to 1970-01-01 (proleptic Gregorian)


def _iso_seconds(column) -> Tuple[np.ndarray, np.ndarray]:
    """Cells of ISO_TEXT naming a real instant -> seconds as `datetime.timestamp()` gives them:
    whole microseconds from the epoch / 10**6, correctly rounded (exact while they are below
    2^53, the only ones vouched for)."""
    parts = pc.extract_regex(column, ISO_TEXT)
    mask = np.asarray(parts.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if not mask.any():
        return mask, np.zeros(len(column), np.float64)

    def number(name, text=None):
        cells = pc.struct_field(parts, name) if text is None else text
        cells = pc.if_else(pa.array(mask), cells.fill_null("0"), "0")
        cells = pc.if_else(pc.equal(cells, ""), "0", cells)
        return np.asarray(pc.cast(cells, pa.int64()).to_numpy(zero_copy_only=False), np.int64)

    year, month, day = number("year"), number("month"), number("day")
    hour, minute, second = number("hour"), number("minute"), number("second")
    fraction = pc.struct_field(parts, "fraction").fill_null("")
    micro = number("fraction", pc.if_else(pc.equal(fraction, ""), "0",
                                          pc.utf8_rpad(fraction, width=6, padding="0")))
    zone = pc.struct_field(parts, "zone").fill_null("Z")
    zone = pc.if_else(pc.equal(zone, "Z"), "+00:00", zone)  # every zone as +hh:mm / -hh:mm
    offset_hour = number("zone", pc.utf8_slice_codeunits(zone, 1, 3))
    offset_minute = number("zone", pc.utf8_slice_codeunits(zone, 4, 6))
    negative = np.asarray(pc.starts_with(zone, "-").to_numpy(zero_copy_only=False), bool)
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    safe_month = np.clip(month, 1, 12) - 1
    month_days = _MONTH_DAYS[safe_month] + (leap & (safe_month == 1))
    mask &= (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
    mask &= (hour <= 23) & (minute <= 59) & (second <= 59)
    mask &= (offset_hour <= 23) & (offset_minute <= 59)
    before = year - 1
    days = (before * 365 + before // 4 - before // 100 + before // 400
            + _DAYS_BEFORE_MONTH[safe_month] + (leap & (safe_month >= 2)) + day - 1
            - _DAYS_TO_EPOCH)
    offset = np.where(negative, -1, 1) * (offset_hour * 3600 + offset_minute * 60)
    micros = (days * 86400 + hour * 3600 + minute * 60 + second - offset) * 10 ** 6 + micro
    mask &= np.abs(micros) < EXACT_MICROS
    return mask, np.where(mask, micros, 0).astype(np.float64) / 1e6
