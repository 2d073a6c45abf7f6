"""`pipelines.text_cells` against the one rule, `pipelines.io.parse_cell`, cell by cell: every
cell it vouches for is one `parse_cell` accepts with the very same value (float bits compared),
and the usual forms of each type are vouched for (else the fast path would be no faster)."""
from __future__ import annotations

import datetime
import math
import random
import struct

import pyarrow as pa
import pytest

from pipelines import io
from pipelines import text_cells


def _bits(value):
    return struct.pack("<d", value) if isinstance(value, float) else value


def _row_path(kind, cell, timestamp_format):
    try:
        return io.parse_cell("c", kind, cell, timestamp_format)
    except (ValueError, TypeError, ArithmeticError):
        return None


def check(kind, cells, timestamp_format="iso"):
    """-> how many cells the column path vouched for; fails on any cell it vouches for that
    the row path refuses or reads as another value."""
    mask, values = text_cells.text_column(kind, pa.array(cells, pa.string()), timestamp_format)
    values = values.to_pylist() if isinstance(values, pa.Array) else values.tolist()
    for cell, ok, value in zip(cells, mask.tolist(), values):
        if ok:
            expected = _row_path(kind, cell, timestamp_format)
            assert expected is not None, (kind, cell)
            assert type(expected) is type(value) and _bits(expected) == _bits(value), \
                (kind, cell, expected, value)
    return int(mask.sum())


def _digits(rng, low, high):
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(low, high)))


def _junk(rng, cell):
    """The cell with one edit: a character dropped, doubled or replaced, or wrapped."""
    if not cell or rng.random() < 0.2:
        return rng.choice(["", " ", "nan", "inf", "-inf", "1_000", " 1", "1 ", "+", "-", ".",
                           "e5", "١٢", "0x10", "true", "1e", "--1", "\n1", "1\n", "²"])
    at = rng.randrange(len(cell))
    edit = rng.choice(["drop", "double", "replace", "wrap"])
    if edit == "drop":
        return cell[:at] + cell[at + 1:]
    if edit == "double":
        return cell[:at] + cell[at] + cell[at:]
    if edit == "replace":
        return cell[:at] + rng.choice("0123456789+-.eEZT: ,x\u0660") + cell[at + 1:]
    return rng.choice([" ", "\t", "'"]) + cell


def _ints(rng, n):
    cells = []
    for _ in range(n):
        cell = rng.choice(["", "+", "-"]) + rng.choice(
            [_digits(rng, 1, 5), _digits(rng, 17, 20), "0" * rng.randint(1, 25) + "7",
             str(rng.choice([2 ** 63 - 1, 2 ** 63, 10 ** 18, 10 ** 18 - 1]))])
        cells.append(cell if rng.random() < 0.8 else _junk(rng, cell))
    return cells


def _floats(rng, n):
    cells = []
    for _ in range(n):
        shape = rng.random()
        if shape < 0.3:
            cell = repr(rng.uniform(-1e6, 1e6))
        elif shape < 0.5:
            cell = repr(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])
        elif shape < 0.7:  # long mantissas: the rounding of many digits
            cell = _digits(rng, 1, 30) + "." + _digits(rng, 0, 30)
        else:
            cell = (rng.choice(["", "+", "-"]) + rng.choice([_digits(rng, 1, 4), ""])
                    + rng.choice(["", "."]) + _digits(rng, 0, 4)
                    + rng.choice(["", "e", "E"]) + rng.choice(["", "+", "-"])
                    + str(rng.choice([0, 5, 300, 308, 309, 323, 324, 400, 99999])))
        cells.append(cell if rng.random() < 0.8 else _junk(rng, cell))
    return cells


def _times(rng, n):
    cells = []
    for _ in range(n):
        year = rng.choice([1, 2, 99, 1600, 1684, 1685, 1970, 2000, 2024, 2100, 2255, 2256,
                           9999, rng.randint(1, 9999)]) if rng.random() < 0.3 else \
            rng.randint(1970, 2100)
        month, day = rng.randint(0, 13), rng.randint(0, 32)
        if rng.random() < 0.7:
            month, day = rng.randint(1, 12), rng.randint(1, 28 if rng.random() < 0.8 else 31)
        clock = [rng.randint(0, 25), rng.randint(0, 61), rng.randint(0, 61)]
        if rng.random() < 0.8:
            clock = [rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)]
        fraction = rng.choice(["", "." + _digits(rng, 1, 6), "." + _digits(rng, 7, 9),
                               ",5", "."])
        zone = rng.choice(["Z", "Z", "+00:00", "-00:00", "+05:30", "-11:45", "+23:59",
                           "+24:00", "-03:61", "", "+0530", "+05", "z"])
        cell = (f"{year:04d}-{month:02d}-{day:02d}{rng.choice('TT ')}"
                f"{clock[0]:02d}:{clock[1]:02d}:{clock[2]:02d}{fraction}{zone}")
        cells.append(cell if rng.random() < 0.85 else _junk(rng, cell))
    return cells


@pytest.mark.parametrize("seed", range(4))
def test_int_cells_are_parse_cells(seed):
    rng = random.Random(seed)
    assert check("int", _ints(rng, 3000)) > 1000


@pytest.mark.parametrize("seed", range(4))
def test_float_cells_are_parse_cells(seed):
    rng = random.Random(100 + seed)
    cells = _floats(rng, 3000)
    assert check("float", cells) > 1000
    for fmt in ("seconds", "milliseconds"):
        assert check("timestamp", cells, fmt) > 100


@pytest.mark.parametrize("seed", range(4))
def test_iso_time_cells_are_parse_cells(seed):
    rng = random.Random(200 + seed)
    assert check("timestamp", _times(rng, 4000)) > 400  # (the usual forms: all, below)


def test_the_usual_forms_are_all_vouched_for():
    """What writers emit (Python's isoformat, JavaScript's toISOString, repr of floats and
    ints): every cell, so that such files never take the row path."""
    rng = random.Random(7)
    moments = [datetime.datetime(2026, 1, 5, tzinfo=datetime.timezone.utc)
               + datetime.timedelta(seconds=rng.uniform(-1e9, 1e9)) for _ in range(500)]
    times = ([m.isoformat() for m in moments]
             + [m.isoformat(timespec="milliseconds").replace("+00:00", "Z") for m in moments]
             + [m.astimezone(datetime.timezone(datetime.timedelta(hours=-5))).isoformat(
                 timespec="seconds") for m in moments])
    assert check("timestamp", times) == len(times)
    numbers = [repr(rng.uniform(-1e9, 1e9)) for _ in range(500)] + [str(i) for i in
                                                                     range(-200, 300)]
    assert check("float", numbers) == len(numbers)
    assert check("int", [str(i) for i in range(-200, 300)] + ["+7", "007"]) == 502
    epoch = [repr(m.timestamp()) for m in moments]
    assert check("timestamp", epoch, "seconds") == len(epoch)


def test_a_time_beyond_the_exact_floats_and_other_kinds_take_the_row_path():
    mask, _ = text_cells.text_column("timestamp", pa.array(["2300-01-01T00:00:00Z",
                                                            "1600-01-01T00:00:00Z"]), "iso")
    assert mask.tolist() == [False, False]  # the row path reads them (its own float rounding)
    assert _row_path("timestamp", "2300-01-01T00:00:00Z", "iso") is not None
    assert text_cells.text_column("str", pa.array(["a"]), "iso") is None
    assert math.isclose(text_cells.text_column("float", pa.array(["1e3"]), "iso")[1][0].as_py(),
                        1000.0)
