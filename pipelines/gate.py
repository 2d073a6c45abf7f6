"""The input gate: a batch run whose input is mostly dead letters publishes nothing (fail closed).

A wrong column name, a horizon that misses the data or a file in another format turns most
records into dead letters; a release of what is left would be noise presented as the data.
So every output a run writes passes the gate first (a side input holding the run's tallies):

    rows:    elements | CombineGlobally(rows read)            (an EventBatch counts its rows)
    read:    the reader's dead letters | CombineGlobally(count)
    codes:   every dead letter | CombineGlobally(count and first detail per code)
    gated:   output | Map(refuse if the input codes of `codes` are more than
             `input.max_dead_letter_fraction` of rows + read, or are every record)

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


class CodesFn(beam.CombineFn):
    """{code: [count, first detail]} of dead letters (the dicts `dead_letter_record` makes)."""

    def create_accumulator(self):
        return {}

    def add_input(self, tally, letter):
        code = letter.get("code", "invalid_record")
        entry = tally.get(code)
        if entry is None:
            tally[code] = [1, str(letter.get("reason", ""))[:EXAMPLE_CHARS]]
        else:
            entry[0] += 1
        return tally

    def merge_accumulators(self, tallies):
        merged = {}
        for tally in tallies:
            for code, (count, detail) in tally.items():
                entry = merged.setdefault(code, [0, detail])
                entry[0] += count
        return merged

    def extract_output(self, tally):
        return tally


def verdict(rows: int, read: int, codes: dict, limit: float) -> None:
    """Raises GarbageInput when input-code dead letters are more than `limit` of the input
    records (rows + read), or are all of them (no record good, whatever the limit). An empty
    input passes: no record is not a bad record.

    >>> verdict(10, 0, {"outside_horizon": [4, "event time ..."]}, 0.5)
    >>> verdict(0, 3, {"unparseable": [3, "invalid JSON line: ..."]}, 1.0)
    Traceback (most recent call last):
    ...
    pipelines.gate.GarbageInput: `input` must be mostly well-formed records (...
    """
    bad = {code: entry for code, entry in codes.items() if code in INPUT_CODES}
    garbage = sum(count for count, _ in bad.values())
    total = rows + read
    if garbage == 0 or (garbage <= limit * total and garbage < total):
        return
    top = sorted(bad.items(), key=lambda item: (-item[1][0], item[0]))[:3]
    reasons = "; ".join(f"{code} ({CODES[code]}): {count}, e.g. {detail.rstrip('.')}"
                        for code, (count, detail) in top)
    raise GarbageInput(
        f"`input` must be mostly well-formed records (dead letters at most "
        f"input.max_dead_letter_fraction = {limit:g} of them, and at least one good record); "
        f"got {garbage} dead letters of {total} records. Top reasons: {reasons}. Nothing was "
        f"published and no privacy budget was spent; fix the input or the config's fields, "
        f"types, steps and run again.")


def input_tallies(pipeline, elements, read_dead: list, all_dead: list, label: str = "Input"):
    """(rows, read, codes) singletons of a run (see the module docstring)."""
    def one(pcolls, name):
        if len(pcolls) == 1:
            return pcolls[0]
        return list(pcolls) | f"{label}{name}" >> beam.Flatten()

    rows = elements | f"{label}Rows" >> beam.CombineGlobally(RowsFn())
    read = (one(read_dead, "ReadDead") if read_dead else
            pipeline | f"{label}NoReadDead" >> beam.Create([])) \
        | f"{label}ReadCount" >> beam.combiners.Count.Globally()
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
    """An error raised inside the job as its one line (without Beam's "[while running ...]")."""
    text = str(error)
    cut = text.find(" [while running")
    return text if cut < 0 else text[:cut]
