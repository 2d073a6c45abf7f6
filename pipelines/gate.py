"""The input gate: a batch run whose input is mostly unusable publishes nothing, and whether it
publishes tells nothing about one person beyond the gate's share of the budget.

A wrong column name, a horizon that misses the data, public keys spelt unlike the data's or a
file in another format make a release of noise presented as the data. Whether a run publishes
is public (its files, its exit code), so the gate decides in one of two ways only:
- *structurally*, from what is not a person's data: a file that cannot be read at all (an
  unreadable Parquet file) refuses the run unless `input.max_dead_letter_fraction` is 1;
- *privately*, by a noisy count costing `privacy.gate_share` of the release's budget (bound to
  its descriptor, stated in its records and `release.json`).

The private rule (f = `input.max_dead_letter_fraction`, as p/q to 1/1000): every unit (what
one person is for the transform: a user, an item, an edge) casts one vote, by what most of
its input records are (ties go to the first of):

    used       well-formed, inside the horizon, of a public key (any key when keys are selected)
    off_key    well-formed, inside the horizon, of a key not in `public_keys`
    outside    well-formed, outside the horizon (neutral: a source may hold history)
    malformed  a dead letter of the reader from which the unit can be read

A unit scores q - p when its vote is unusable (malformed, off_key), -p when it is used, 0
when outside. A line from
which no unit can be read (invalid JSON, a CSV record of the wrong width) is assumed to carry no
person's data (no unit owns it) and scores (q - p) per record it may hide, exactly. The run is
refused when score + X > tau, X discrete Laplace (pure DP) or discrete Gaussian (zCDP) noise from
the release's one noise seam, calibrated to one unit's influence max(p, q - p), and tau the
smallest integer with P(X > tau) <= BETA: an input whose true score is <= 0 (at most f of it
unusable) is refused with probability at most BETA. Adding or removing one unit's records moves
the score by at most max(p, q - p), so the publish-or-refuse decision is gate_share-DP
(docs/privacy.md, "The input gate").

    votes:   elements + the reader's dead letters | (unit, [used, off_key, outside, malformed])
             | CombinePerKey | one vote per unit | CombineGlobally -> [4 vote counts]
    lines:   the reader's dead letters without a unit | CombineGlobally -> (records, unknown)
    codes:   every dead letter | CombineGlobally -> {code: [records, unknown, detail]}
             (operator-only: the refusal's exact reasons)
    verdict: (votes, lines, codes) | Map(`Gate.refusal`) -> None, or the refusal's text
    gated:   output | Map(passes once the verdict did, else raises GarbageInput)

A refused run writes no public file; it spent the gate's share only (its records' noise never
left the workers).
"""
from __future__ import annotations

import dataclasses
import math
import os
from fractions import Fraction
from typing import Any, Optional

import apache_beam as beam
import numpy as np

from transforms import registry
from transforms.arrow_input import EventBatch, python_cells
from transforms.mechanisms.discrete import (DISCRETE_GAUSSIAN, DISCRETE_LAPLACE,
                                            DiscreteSampler)
from transforms.release import descriptor_digest
from transforms.streams.records import INPUT_CODES
from transforms.validation import ValidationError
from transforms.registry import SPECS

EXAMPLE_CHARS = 160
USED, OFF_KEY, OUTSIDE, MALFORMED = range(4)
CATEGORIES = ("used", "off_key", "outside", "malformed")
BETA = 1e-3  # the most often an input with at most f of it unusable is refused
GATE_STREAM = b"dp-continual-release/input-gate"  # its own stream of the release's noise seam
FRACTION_DENOMINATOR = 1000

# the roles that name the unit of each transform's record (its registry row; `release`
# declares its unit: none)
UNIT_ROLES = {name: spec.unit_roles for name, spec in registry.SPECS.items() if spec.unit_roles}


class GarbageInput(ValidationError):
    """A run refused by the input gate (before anything was written)."""


def rule_of(job) -> dict:
    """The gate's public parameters a release is bound to (its descriptor's `gate`, beside the
    share and budget): the fraction, the false-refusal bound and how outside votes count."""
    return {"max_dead_letter_fraction": job.input.max_dead_letter_fraction, "beta": BETA,
            "outside_horizon": "neutral"}


def unit_of(transform: str, values: dict) -> Optional[str]:
    """The unit of a record as the gate keys it (`values`: role -> parsed value), or None when
    a role naming it is absent. An edge is unordered."""
    roles = UNIT_ROLES.get(transform)
    if not roles or any(role not in values for role in roles):
        return None
    if len(roles) == 2:
        return repr(tuple(sorted((repr(values[roles[0]]), repr(values[roles[1]])))))
    return repr(values[roles[0]])


def _element_values(shape, element) -> dict:
    values = {}
    for part, value in zip(shape, element):
        if isinstance(part, tuple):
            values.update(_element_values(part, value))
        else:
            values[part] = value
    return values


@dataclasses.dataclass(frozen=True)
class Gate:
    """The gate of one run: its rule (public: the config's) and the release it is bound to."""
    transform: str            # the job's transform (registry name)
    shape: tuple              # its element shape
    limit: float              # input.max_dead_letter_fraction
    outside_unusable: bool    # whether records outside the horizon are unusable (not: history)
    origin: float
    size: float
    horizon: int
    public_keys: Optional[frozenset]  # None: keys selected privately
    private: Optional[dict]   # the release's gate entry {"share", "budget"}; None: structural
    problem: Any              # the release's truncation `Problem`: its `parse` is the record rule

    @classmethod
    def of(cls, job, plan, outside_unusable: bool = False, private: bool = True) -> "Gate":
        """The gate of a run of `job`'s release (`plan`, a `release_plan.ReleasePlan`);
        `private` False (a release with no noise: the report's exact truth, operator-only)
        checks the structure only."""
        steps = job.steps.time_steps()
        # None: every well-formed record is of a released key (selected, or the one key)
        keys = None if SPECS[job.transform].single_key is not None else \
            plan.spec.public_keys
        entry = plan.gate if private else None
        limit = entry.get("max_dead_letter_fraction", job.input.max_dead_letter_fraction) \
            if entry else job.input.max_dead_letter_fraction  # the release's own, when bound
        return cls(job.transform, SPECS[job.transform].shape, limit,
                   outside_unusable, steps.origin, steps.size, steps.horizon,
                   None if keys is None else frozenset(keys), entry, plan.truncation.problem)

    # ----- the rule (public: from the config and the release's descriptor) -----
    @property
    def fraction(self) -> Fraction:
        """f as p/q (to 1/FRACTION_DENOMINATOR)."""
        return Fraction(self.limit).limit_denominator(FRACTION_DENOMINATOR)

    def scores(self):
        """(score of each vote category, score of one unattributed record, one unit's most)."""
        f = self.fraction
        p, q = f.numerator, f.denominator
        bad = q - p
        outside = bad if self.outside_unusable else 0
        return (-p, bad, outside, bad), bad, max(p, bad)

    def sampler(self) -> DiscreteSampler:
        """The gate's noise: one unit's influence over the gate's budget."""
        _, _, influence = self.scores()
        budget = self.private["budget"]
        if "epsilon" in budget:
            return DiscreteSampler(DISCRETE_LAPLACE, influence / budget["epsilon"])
        return DiscreteSampler(DISCRETE_GAUSSIAN, influence * influence / (2.0 * budget["rho"]))

    def threshold(self) -> int:
        """tau: the smallest integer with P(X > tau) <= BETA."""
        return noise_threshold(self.sampler(), BETA)

    # ----- what the pipeline computes -----
    def record_votes(self, element, seconds: float):
        """(unit, category) of a well-formed element at event time `seconds`."""
        values = _element_values(self.shape, element)
        unit = unit_of(self.transform, values)
        if self.problem.parse(element)[1] is not None:  # the transform dead-letters it
            return unit, MALFORMED
        step = math.floor((seconds - self.origin) / self.size)
        if not 0 <= step < self.horizon:
            return unit, OUTSIDE
        keys, roles = self.public_keys, SPECS[self.transform].key_roles
        used = keys is None or not roles or any(values.get(role) in keys for role in roles)
        return unit, USED if used else OFF_KEY

    def score(self, votes) -> int:
        unit_scores, _, _ = self.scores()
        return int(sum(s * int(n) for s, n in zip(unit_scores, votes)))

    def verdict(self, votes, lines, codes, noise_source_of=None) -> bool:
        """True, or raises GarbageInput (see the module docstring). `votes`: the units' vote
        counts by category; `lines`: (records, unknown) of dead letters with no unit;
        `codes`: the exact tallies by code (operator-only; only named in a refusal)."""
        refusal = self.refusal(votes, lines, codes, noise_source_of)
        if refusal is not None:
            raise GarbageInput(refusal)
        return True

    def refusal(self, votes, lines, codes, noise_source_of=None) -> Optional[str]:
        """`verdict`'s refusal text, or None when the run passes."""
        records, unknown = lines
        if unknown and self.limit < 1.0:
            return (
                f"{UNREADABLE}; got {unknown} file(s) that cannot be read (nothing published "
                f"or spent). input.max_dead_letter_fraction 1 accepts them.{_reasons(codes)}")
        if self.private is None:
            return None
        _, line_score, _ = self.scores()
        score = self.score(votes) + line_score * int(records)
        source = noise_source_of()
        noise = int(np.asarray(source.discrete_noise(self.sampler(), GATE_STREAM, 0, 0, 1))[0])
        tau = self.threshold()
        if score + noise <= tau:
            return None
        budget = ", ".join(f"{k} {v:g}" for k, v in self.private["budget"].items())
        return (
            f"{REFUSAL}; got a noisy excess {score + noise} over {tau} (nothing published; "
            f"the gate spent {budget}). {MOST}{_cause(votes, codes)}. The excess counts units "
            f"malformed or off public_keys beyond input.max_dead_letter_fraction "
            f"{self.limit:g}, by a noisy count. Units (operator-only, exact): "
            + ", ".join(f"{name} {int(n)}" for name, n in zip(CATEGORIES, votes)) + "."
            f"{_reasons(codes)}")


def plan_of(job, plan):
    """The job's input gate (`pipelines.gate`) in its release `plan`: its share and budget,
    the threshold of its noisy score and the noise's standard deviation, or None when the job
    has none."""
    entry = plan.gate
    if entry is None:
        return None
    rule = Gate.of(job, plan)
    sampler = rule.sampler()
    return {"share": entry["share"], "budget": entry["budget"],
            "threshold": rule.threshold(), "stddev": math.sqrt(sampler.variance),
            "false_refusal": BETA, "max_dead_letter_fraction": rule.limit}


def plan_text(gate) -> str:
    if gate is None:
        return ("input gate: none (input.max_dead_letter_fraction 1, streaming input or a "
                "declared release): the whole budget is the release's")
    budget = ", ".join(f"{k} {v:g}" for k, v in gate["budget"].items())
    return (f"input gate: privacy.gate_share {gate['share']:g} ({budget}) of the budget; a run "
            f"is refused when its noisy score (units mostly malformed or off public_keys, "
            f"beyond input.max_dead_letter_fraction {gate['max_dead_letter_fraction']:g}) "
            f"passes {gate['threshold']} (noise sd {gate['stddev']:.1f}; an input within the "
            f"fraction is refused with probability <= {gate['false_refusal']:g})")


def noise_threshold(sampler: DiscreteSampler, beta: float) -> int:
    """The smallest integer tau with P(X > tau) <= beta for the sampler's law.

    >>> noise_threshold(DiscreteSampler(DISCRETE_LAPLACE, 1.0), 0.5) >= 0
    True
    """
    if sampler.kind == DISCRETE_LAPLACE:
        # P(X >= k) = r^k / (1 + r) for k >= 1, r = exp(-1/t)
        r = math.exp(-1.0 / sampler.parameter)
        if r <= 0.0:
            return 0
        k = math.ceil(math.log(beta * (1.0 + r)) / math.log(r))
        return max(0, k - 1)
    pmf = sampler.pmf(beta * 1e-6)
    centre = (pmf.shape[0] - 1) // 2
    upper = np.cumsum(pmf[::-1])[::-1]  # upper[i] = P(X >= i - centre)
    above = np.flatnonzero(upper <= beta)
    return max(0, int(above[0]) - centre - 1) if len(above) else int(pmf.shape[0] - centre)


TALLIES = " Dead letters (operator-only, exact): "
MOST = "Most: "
# a dead letter's detail that says what to set -> its short form (the config's options only)
HINTS = {"milliseconds? set input.timestamp_format": "milliseconds? see input.timestamp_format"}


def _cause(votes, codes) -> str:
    """What most of a refused input is, for its headline (operator-only: from the exact
    tallies): units whose keys are not public keys, or the most common dead-letter code (with
    its hint, when its detail has one)."""
    off, malformed = int(votes[OFF_KEY]), int(votes[MALFORMED])
    bad = {code: entry for code, entry in (codes or {}).items() if code in INPUT_CODES}
    if off > malformed or not bad:
        return "units off public_keys (check public_keys, input.fields.key)"
    code, (_, _, detail) = min(bad.items(), key=lambda item: (-item[1][0] - item[1][1],
                                                              item[0]))
    hint = next((short for hint, short in HINTS.items() if hint in (detail or "")), None)
    return code + (f" ({hint})" if hint else "")


def _reasons(codes) -> str:
    """The refusal's exact dead-letter tallies (operator-only: the console of the run)."""
    bad = {code: entry for code, entry in (codes or {}).items() if code in INPUT_CODES}
    if not bad:
        return ""
    top = sorted(bad.items(), key=lambda item: (-item[1][0] - item[1][1], item[0]))[:3]
    return TALLIES + "; ".join(
        f"{code}: {count}" + (f" and {unknown} unreadable file(s)" if unknown else "")
        + (f", e.g. {detail.rstrip('.')}" if code in CONFIG_DETAILS else "")
        for code, (count, unknown, detail) in top) + "."


REFUSAL = "`input` must be mostly usable records"
UNREADABLE = "`input` must be files that can be read"
# the one detail a refusal prints: built from the config (the column), never from a record
CONFIG_DETAILS = ("missing_field",)


def weight_of(letter: dict):
    """Input records a dead letter stands for: its "weight" (1 unless it says more), None when
    unknown (a file that cannot be read)."""
    return letter.get("weight", 1)


class UnitVotesFn(beam.DoFn):
    """A well-formed element (or an EventBatch) -> (unit, [used, off_key, outside,
    malformed]) partial counts; a reader's dead letter with a unit -> (unit, malformed)."""

    def __init__(self, gate: Gate):
        self.gate = gate

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        counts = {}

        def add(unit, category):
            if unit is None:
                return
            entry = counts.get(unit)
            if entry is None:
                entry = counts[unit] = [0, 0, 0, 0]
            entry[category] += 1

        if type(element) is EventBatch:
            gate = self.gate
            values = {role: python_cells(column) for role, column in element.columns.items()}
            roles = list(values)
            for i, micros in enumerate(element.micros.tolist()):
                add(*gate.record_votes(_rebuild(gate.shape, {r: values[r][i] for r in roles}),
                                       micros / 1e6))
            for item, micros in element.extra:
                add(*gate.record_votes(item, micros / 1e6))
        elif isinstance(element, dict):  # a reader's dead letter
            add(element.get("unit"), MALFORMED)
        else:
            add(*self.gate.record_votes(element, timestamp.micros / 1e6))
        yield from counts.items()


def _rebuild(shape, values):
    return tuple(_rebuild(p, values) if isinstance(p, tuple) else values[p] for p in shape)


def _add_counts(counts):
    total = [0, 0, 0, 0]
    for entry in counts:
        for i, n in enumerate(entry):
            total[i] += n
    return total


def vote(counts) -> int:
    """A unit's vote: the category most of its records are (ties: used, off_key, outside,
    malformed, in that order)."""
    return max(range(4), key=lambda c: (counts[c], -c))


def _counted_vote(unit_counts) -> int:
    """A unit's vote, counted for the operator (`gate_units`: exact, NOT private)."""
    beam.metrics.Metrics.counter("continual_release", "gate_units").inc()
    return vote(unit_counts[1])


class VotesFn(beam.CombineFn):
    """Vote counts by category."""

    def create_accumulator(self):
        return [0, 0, 0, 0]

    def add_input(self, total, category):
        total[category] += 1
        return total

    def merge_accumulators(self, totals):
        return _add_counts(totals)

    def extract_output(self, total):
        return total


class LinesFn(beam.CombineFn):
    """(records, unknown) of the reader's dead letters with no unit: the records they stand
    for, and how many stand for an unknown number (a file that cannot be read)."""

    def create_accumulator(self):
        return (0, 0)

    def add_input(self, total, letter):
        if letter.get("unit") is not None:
            return total
        weight = weight_of(letter)
        return (total[0] + (weight or 0), total[1] + (weight is None))

    def merge_accumulators(self, totals):
        totals = list(totals)
        return (sum(t[0] for t in totals), sum(t[1] for t in totals))

    def extract_output(self, total):
        return total


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


def decide(pipeline, gate: Gate, transform, elements, read_dead: list, all_dead: list,
           label: str = "Gate", after=None):
    """The run's verdict: a singleton None when the gate passed, else its refusal (`gated`
    fails the job with it before any output waiting on it). With `after` (the job's claim
    guard), the noisy decision is made only once the execution won its claim: a second
    execution of the same job graph (same release, same gate noise) on changed data never
    decides."""
    def one(pcolls, name):
        if not pcolls:
            return pipeline | f"{label}No{name}" >> beam.Create([])
        if len(pcolls) == 1:
            return pcolls[0]
        return list(pcolls) | f"{label}{name}" >> beam.Flatten()

    read = one(read_dead, "ReadDead")
    codes = one(all_dead, "AllDead") | f"{label}Codes" >> beam.CombineGlobally(CodesFn())
    lines = read | f"{label}Lines" >> beam.CombineGlobally(LinesFn())
    if gate.private is not None:
        votes = votes_of(gate, elements, read, label)
    else:
        votes = pipeline | f"{label}NoVotes" >> beam.Create([[0, 0, 0, 0]])
    source_of = gate_noise(transform) if gate.private is not None else None

    def check(_, votes, lines, codes):  # raised where the outputs wait for it (`gated`)
        return gate.refusal(votes, lines, codes, source_of)

    start = pipeline | f"{label}Start" >> beam.Create([None])
    if after is not None:
        start = start | f"{label}AfterClaim" >> beam.Map(lambda element, _: element,
                                                        beam.pvalue.AsSingleton(after))
    return (start
            | f"{label}Verdict" >> beam.Map(check, beam.pvalue.AsSingleton(votes),
                                            beam.pvalue.AsSingleton(lines),
                                            beam.pvalue.AsSingleton(codes)))


def votes_of(gate: Gate, elements, read, label: str = "Gate"):
    """The units' vote counts by category (a singleton), from the transform's elements and the
    reader's dead letters."""
    return ((elements, read) | f"{label}Records" >> beam.Flatten()
            | f"{label}UnitCounts" >> beam.ParDo(UnitVotesFn(gate))
            | f"{label}PerUnit" >> beam.CombinePerKey(_add_counts)
            | f"{label}Vote" >> beam.Map(_counted_vote)
            | f"{label}Votes" >> beam.CombineGlobally(VotesFn()))


class gate_noise:
    """The gate's noise source, resolved on the worker: the release's secret bound to its id
    and descriptor digest (the one seam; the gate's own stream)."""

    def __init__(self, transform):
        self.secret = transform.secret
        self.release = bytes.fromhex(transform.release_id) + bytes.fromhex(
            descriptor_digest(transform.descriptor))
        self.version = transform.noise_version

    def __call__(self):
        return self.secret.noise_source(release=self.release, version=self.version)


def gated(pcoll, verdict, label: str):
    """`pcoll`, each element passed only once the run's verdict passed (else the job fails
    with GarbageInput before any element reaches a sink)."""
    def check(element, refusal):
        if refusal is not None:
            raise GarbageInput(refusal)
        return element

    return pcoll | label >> beam.Map(check, beam.pvalue.AsSingleton(verdict))


def headline(text: str, details: str) -> str:
    """A refusal on screen: its first sentence (the condition, the noisy result, what was spent),
    the most common dead-letter code (operator-only, as the run summary's line), and where the
    rest is (`details`: a file holding the whole text, with the exact tallies). A local path
    below the current folder is shown relative to it."""
    end = text.find("). ")
    line = text if end < 0 else text[:end + 2]
    if text[end + 3:].startswith(MOST):  # the cause, its own sentence (if the line keeps
        cause = text[end + 3:]              # under 200 characters: it is in the file too)
        cause = cause[:cause.find(". ") + 1 if ". " in cause else len(cause)]
        if len("error: ") + len(line) + 1 + len(cause) < 200:
            line += " " + cause
    if "://" not in details:
        shown = os.path.relpath(details)
        details = details if shown.startswith("..") else shown
    return f"{line} Why: {details}"


def one_line(error: Exception) -> str:
    """An error raised inside the job as its one line: without Beam's "[while running ...]";
    a refusal of the gate wrapped by another runner (a RuntimeError holding its traceback)
    is cut out of the text."""
    text = str(error)
    for marker in (REFUSAL, UNREADABLE):
        start = text.find(marker)
        if start > 0:
            text = text[start:]
            text = text.splitlines()[0]
            break
    cut = text.find(" [while running")
    return text if cut < 0 else text[:cut]


def refused(error: Exception) -> bool:
    """Whether `error` (as any runner raises it) is the gate's refusal."""
    return REFUSAL in str(error) or UNREADABLE in str(error)
