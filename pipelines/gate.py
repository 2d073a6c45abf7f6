"""The input gate: a batch run whose input is mostly malformed publishes nothing (fail closed).

A wrong column name, a horizon that misses the data or a file in another format turns most
records into dead letters; a release of what is left would be noise presented as the data.
So every output a run writes passes the gate first (a side input holding the run's tallies):

    rows:    elements | CombineGlobally(rows read)            (an EventBatch counts its rows)
    read:    the reader's dead letters | CombineGlobally(the records they stand for)
    codes:   every dead letter | CombineGlobally(records, unknowns and one detail per code)
    gated:   output | Map(`verdict`: refuse if the malformed records are more than
             `input.max_dead_letter_fraction` of rows + read, if no record is well-formed and
             inside the horizon, or if a file could not be read and the fraction is below 1)

A dead letter may stand for more than one record (`weight`: a CSV record whose open quote
swallowed the lines after it, a JSON array on one line) or for an unknown number (a Parquet
file that cannot be read), so a few bad bytes cannot hide most of the input from the count.

The gate raises `GarbageInput` before any record, key state or unit state reaches a sink, so a
refused run writes no public file and spends nothing: its noise never leaves the workers.
The decision is the operator's (the config's fraction) and depends only on whether records are
well-formed for the job (`transforms.streams.records.INPUT_CODES`), never on their values;
it is documented in docs/privacy.md ("The input gate").
"""
from __future__ import annotations

import apache_beam as beam

from transforms.arrow_input import EventBatch
from transforms.streams.records import CODES, INPUT_CODES
from transforms.validation import ValidationError

EXAMPLE_CHARS = 160


class GarbageInput(ValidationError):
    """A run refused by the input gate (before anything was written)."""


def rows_of(element) -> int:
    """Input records an element stands for: an EventBatch's rows, else 1."""
    if type(element) is EventBatch:
        return len(element) + len(element.extra) + len(element.dead)
    return 1


class RowsFn(beam.CombineFn):
    """The number of input records (lifted: a partial count per bundle, no Map per element)."""

    def create_accumulator(self):
        return 0

    def add_input(self, count, element):
        return count + rows_of(element)

    def merge_accumulators(self, counts):
        return sum(counts)

    def extract_output(self, count):
        return count


def weight_of(letter: dict):
    """Input records a dead letter stands for: its "weight" (1 unless it says more), None when
    unknown (a file that cannot be read)."""
    return letter.get("weight", 1)


class CodesFn(beam.CombineFn):
    """{code: [records, unknown, first detail]} of dead letters (the dicts
    `dead_letter_record` makes): the records they stand for (weights), how many stand for an
    unknown number, and one detail."""

    def create_accumulator(self):
        return {}

    def add_input(self, tally, letter):
        code = letter.get("code", "invalid_record")
        weight = weight_of(letter)
        entry = tally.get(code)
        if entry is None:
            entry = tally[code] = [0, 0, str(letter.get("reason", ""))[:EXAMPLE_CHARS]]
        if weight is None:
            entry[1] += 1
        else:
            entry[0] += weight
        return tally

    def merge_accumulators(self, tallies):
        merged = {}
        for tally in tallies:
            for code, (count, unknown, detail) in tally.items():
                entry = merged.setdefault(code, [0, 0, detail])
                entry[0] += count
                entry[1] += unknown
        return merged

    def extract_output(self, tally):
        return tally


class ReadFn(beam.CombineFn):
    """The input records the reader's dead letters stand for (unknown weights count 0: the
    verdict refuses them by their code's tally)."""

    def create_accumulator(self):
        return 0

    def add_input(self, count, letter):
        return count + (weight_of(letter) or 0)

    def merge_accumulators(self, counts):
        return sum(counts)

    def extract_output(self, count):
        return count


# the one detail a refusal prints: built from the config (the column), never from a record
CONFIG_DETAILS = ("missing_field",)


def verdict(rows: int, read: int, codes: dict, limit: float) -> None:
    """Raises GarbageInput when the input's malformed records (`INPUT_CODES` but
    `outside_horizon`) are more than `limit` of its records (rows + read), when no record is
    both well-formed and inside the horizon, or when a file could not be read at all (an
    unknown number of records) and `limit` is below 1. Records outside the horizon are not
    malformed (a source may hold history before the origin, or events after the end) but do
    not count as good, except with `limit` 1 (the operator's override: refused only when no
    record is well-formed). An empty input passes: no record is not a bad record.

    >>> verdict(10, 0, {"outside_horizon": [9, 0, "event time ..."]}, 0.5)
    >>> verdict(0, 3, {"unparseable": [3, 0, "invalid JSON line: ..."]}, 1.0)
    Traceback (most recent call last):
    ...
    pipelines.gate.GarbageInput: `input` must be mostly well-formed records (...
    """
    bad = {code: entry for code, entry in codes.items() if code in INPUT_CODES}
    malformed = sum(entry[0] for code, entry in bad.items() if code != "outside_horizon")
    outside = bad.get("outside_horizon", [0, 0, ""])[0]
    unknown = sum(entry[1] for entry in bad.values())
    total = rows + read
    anything = limit >= 1.0  # the operator's override: refuse only if nothing is well-formed
    good = total - malformed - (0 if anything else outside)
    if not bad or (malformed <= limit * total and good > 0 and (unknown == 0 or anything)):
        return
    top = sorted(bad.items(), key=lambda item: (-item[1][0] - item[1][1], item[0]))[:3]
    reasons = "; ".join(
        f"{code} ({CODES[code]}): {count}" + (f" and {unknown} unreadable file(s)"
                                              if unknown else "")
        + (f", e.g. {detail.rstrip('.')}" if code in CONFIG_DETAILS else "")
        for code, (count, unknown, detail) in top)
    raise GarbageInput(
        f"{REFUSAL} (malformed dead letters at most input.max_dead_letter_fraction = "
        f"{limit:g} of them, no unreadable file unless it is 1, and at least one good record in "
        f"the horizon); got {malformed} malformed and {outside} outside the horizon of {total} "
        f"records" + (f", and {unknown} unreadable file(s)" if unknown else "")
        + f". Top reasons: {reasons}. Nothing was published and no privacy budget was spent; "
          f"the dead letters show the records (operator-only); fix the input or the config's "
          f"fields, types, steps and run again.")


REFUSAL = "`input` must be mostly well-formed records"


def input_tallies(pipeline, elements, read_dead: list, all_dead: list, label: str = "Input"):
    """(rows, read, codes) singletons of a run (see the module docstring)."""
    def one(pcolls, name):
        if len(pcolls) == 1:
            return pcolls[0]
        return list(pcolls) | f"{label}{name}" >> beam.Flatten()

    rows = elements | f"{label}Rows" >> beam.CombineGlobally(RowsFn())
    read = (one(read_dead, "ReadDead") if read_dead else
            pipeline | f"{label}NoReadDead" >> beam.Create([])) \
        | f"{label}ReadCount" >> beam.CombineGlobally(ReadFn())
    codes = one(all_dead, "AllDead") | f"{label}Codes" >> beam.CombineGlobally(CodesFn())
    return rows, read, codes


def gated(pcoll, tallies, limit: float, label: str):
    """`pcoll`, each element passed only once the run's tallies pass the verdict."""
    rows, read, codes = tallies

    def check(element, rows, read, codes):
        verdict(rows, read, codes, limit)
        return element

    return pcoll | label >> beam.Map(check, beam.pvalue.AsSingleton(rows),
                                     beam.pvalue.AsSingleton(read),
                                     beam.pvalue.AsSingleton(codes))


def one_line(error: Exception) -> str:
    """An error raised inside the job as its one line: without Beam's "[while running ...]";
    a refusal of the gate wrapped by another runner (a RuntimeError holding its traceback)
    is cut out of the text."""
    text = str(error)
    start = text.find(REFUSAL)
    if start > 0:
        text = text[start:]
        end = text.find("run again.")
        text = text[:end + len("run again.")] if end >= 0 else text.splitlines()[0]
    cut = text.find(" [while running")
    return text if cut < 0 else text[:cut]


def refused(error: Exception) -> bool:
    """Whether `error` (as any runner raises it) is the gate's refusal."""
    return REFUSAL in str(error)
