"""`ContinualMean`: a running mean per key, released as a composition of two releases.

    means = events | ContinualMean(steps=steps, public_keys=pages, epsilon=1.0,
                                   max_value=600.0, max_contributions=10, secret=...)

Elements (unit, key, value). One truncation rule (`streams.mean`) keeps at most
`max_contributions` events per unit (values clamped to [min_value, max_value], min_value 0 by
default); two parts release the
running SUM of the kept values and their running COUNT, each a continual release with its own
mechanism, descriptor, noise stream (the noise seam binds the release id AND the part's
descriptor) and key states, under one release id, one claim and one ledger entry. The budget is
shared by `accountant.share_budget` (sequential composition): the sum part's share w defaults to
the split minimising the mean's delta-method variance at the worst-case mean
(`ratio.best_split`: exactly 1/2), or is configured (`sum_share`); `release_plan` plans it.

Each record is the mean at one key and step: value = clamp(S^ / C^, min_value, max_value) (the
midpoint when C^ <= 0), stddev = the delta-method standard error, and [ci_low, ci_high] the
Fieller / test-inversion interval of `mechanisms.ratio` from the two parts' exact noise laws at
that step (exact for Laplace and Gaussian noise, conservative for discrete Laplace, approximate
for discrete Gaussian; the record's `mechanism_params` says which). Where C = 0 the mean is
undefined and the record says nothing about it beyond its interval (the whole range).
"""
from __future__ import annotations

import json
from typing import Dict

import apache_beam as beam
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from transforms.continual import ContinualBase
from transforms.mechanisms import ConstantNoiseSource
from transforms.mechanisms.ratio import QuantileCurve, ratio_interval, step_noise
from transforms.messages import FastStateCoder, Released
from transforms.release_plan import ReleasePlan
from transforms.streams.mean import COUNT, PARTS, SUM

_CACHED_CURVES = 1 << 10


class _MeanPart(ContinualBase):
    """One part (SUM or COUNT) of a `ContinualMean`: its part's plan bound to the mean's
    secret and release id (its noise is bound to the id and to its own descriptor, so the two
    parts never share noise); applied only by the mean, under the mean's claim."""

    def __init__(self, plan: ReleasePlan, mean: "ContinualMean"):
        beam.PTransform.__init__(self)
        self._bind(plan, *mean.secret_arguments, mean.insecure,
                   mean.config.secret_fingerprint, None, None, release_id=mean.release_id)


class ContinualMean(ContinualBase):
    """Running mean per public key: noisy running sum / noisy running count of the values of
    the events each unit keeps (at most `max_contributions` events over the horizon, at most
    `max_contributions_per_step` per step, on at most `max_keys_per_unit` keys; values clamped
    to [0, `max_value`]; with discrete noise rounded to `value_resolution`, default
    max_value / 100). `sum_share`: the sum part's share of the budget (default: the worst-case
    optimum, 1/2). `mechanism` / `mechanism_params`: one for both parts, or a mapping
    {"sum": ..., "count": ...}. `max_state_bytes_per_key` bounds a key's two states together
    (each part gets half). Planned by `release_plan.plan_release` (its composed parts); its
    census and claims use the count part's configuration."""

    statistic = "mean"

    @property
    def parts(self) -> Dict[str, _MeanPart]:
        """The parts' transforms (built once, on first use)."""
        if getattr(self, "_parts", None) is None:
            self._parts = {part: _MeanPart(self.plan.parts[part], self) for part in PARTS}
        return self._parts

    def display_data(self):
        data = {f"{part}_{k}": v for part, p in self.parts.items()
                for k, v in p.display_data().items()
                if k in ("mechanism", "mechanism_params", "calibration", "noise")}
        data.update({"release_id": self.release_id, "private": self.private,
                     "secret": self.secret.describe(), "horizon": self.steps.horizon,
                     "sum_share": self.descriptor["sum_share"],
                     "public_keys": len(self.public_keys)})
        return data

    def release(self, events, window, passed=None) -> Released:
        """Both parts over the same events, then their records joined into means. A private
        mean's parts are claimed by the mean's claim (`passed`): a part is never applied
        unclaimed (`ContinualBase._check_continuation`)."""
        results = {}
        for part, transform in self.parts.items():
            keys = self._resume_keys
            if keys is not None:
                keys = keys | f"{part.title()}KeyStates" >> beam.FlatMap(_untag, part)
            if self._window is not None:
                transform.resume(window, self._resume_units, keys)
            if passed is not None:
                transform.claimed_by(passed)
            results[part] = events | f"{part.title()}Part" >> transform
        # each: records per public key and step, dead letters, unit and key states
        tagged = [results[part].records | f"Tag{part.title()}Records" >> beam.Map(
            lambda record, p=part: (record["key"], (p, record))) for part in PARTS]
        records = (tagged | "BothParts" >> beam.Flatten()
                   | "JoinParts" >> beam.ParDo(JoinMeansFn(self.mean_records())))
        # one mean record per public key and step
        count_dead = results[COUNT].dead_letters | "CountPartOwn" >> beam.FlatMap(_count_own)
        key_states = None
        if results[SUM].key_states is not None:
            key_states = [results[part].key_states | f"Tag{part.title()}KeyStates" >> beam.Map(
                lambda kv, p=part: ((p, kv[0]), kv[1])) for part in PARTS] \
                | "KeyStates" >> beam.Flatten()
        return Released(records, [results[SUM].dead_letters, count_dead],
                        results[COUNT].unit_states, key_states)

    def mean_records(self) -> "MeanRecords":
        plan = self.plan
        return MeanRecords({part: p.config for part, p in self.parts.items()},
                           plan.truncation.composed.max_value, self.confidence,
                           plan.mean_mechanism,
                           {**plan.resolved_mechanism[1],
                            "sum_share": self.descriptor["sum_share"]},
                           self.budget_spent, min_value=plan.truncation.composed.min_value)


def _count_own(dead: dict):
    """The count part's dead letters that the sum part may not have: its own halts and, on
    unbounded input, its own lateness decisions (each part's stages decide them on their own
    timing), marked as the count part's. Its input dead letters (parsing, the horizon) are
    the sum part's too: same parse, same steps."""
    if dead.get("code") in ("exact_totals", "late"):
        yield dict(dead, reason=f"count part: {dead.get('reason', '')}")


def _untag(kv, part):
    """A part's key state from the mean's ((part, key), state) pairs."""
    (owner, key), state = kv
    if owner == part:
        yield key, state


class MeanRecords:
    """The mean's record at one key and step from its parts' records (picklable; the noise
    laws are built on first use from the parts' configurations, without their secret)."""

    def __init__(self, configs: dict, max_value: float, confidence: float, mechanism: str,
                 params: dict, budget: dict, min_value: float = 0.0):
        self.configs, self.max_value, self.confidence = configs, max_value, confidence
        self.min_value = min_value
        self.mechanism, self.base_params, self.budget = mechanism, params, budget
        self._laws = self._curves = None

    def law(self, part: str):
        """The part's mechanism with zero noise (its laws and errors; no secret)."""
        return self.configs[part].build(noise_source=ConstantNoiseSource(0.0))

    def noises(self, step: int):
        """The two parts' noise laws at `step` (0-based), in value units."""
        if self._laws is None:
            self._laws = {part: self.law(part) for part in PARTS}
        return (step_noise(self._laws[SUM], step + 1).scaled(self.configs[SUM].value_scale),
                step_noise(self._laws[COUNT], step + 1))

    def curve(self, step: int) -> QuantileCurve:
        if self._curves is None or len(self._curves) >= _CACHED_CURVES:
            self._curves = {}
        found = self._curves.get(step)
        if found is None:
            sum_noise, count_noise = self.noises(step)
            found = self._curves[step] = QuantileCurve(sum_noise, count_noise, self.min_value,
                                                       self.max_value, self.confidence)
        return found

    def record(self, sum_record: dict, count_record: dict) -> dict:
        step = sum_record["step"]
        curve = self.curve(step)
        found = ratio_interval(sum_record["value"], count_record["value"], curve.sum_noise,
                               curve.count_noise, self.min_value, self.max_value,
                               self.confidence, curve)
        params = {**self.base_params, "interval": f"fieller ({found.quality})"}
        record = dict(count_record)
        record.update(value=found.estimate, stddev=found.std_error, ci_low=found.low,
                      ci_high=found.high, step_value=None, step_stddev=None,
                      step_ci_low=None, step_ci_high=None, mechanism=self.mechanism,
                      mechanism_params=json.dumps(params, sort_keys=True),
                      epsilon=self.budget.get("epsilon"), delta=self.budget.get("delta"),
                      rho=self.budget.get("rho"))
        return record


class JoinMeansFn(beam.DoFn):
    """Per key: holds a part's record until the other part's record of the same step is in,
    then emits the mean's record (works alike on bounded and unbounded input; the held records
    are those of steps one part released before the other)."""
    PENDING = ReadModifyWriteStateSpec("pending", FastStateCoder())  # (never unpickles)

    def __init__(self, means: MeanRecords):
        self.means = means

    def process(self, element, pending=beam.DoFn.StateParam(PENDING)):
        _, (part, record) = element
        held = pending.read() or {}
        other = held.pop(record["step"], None)
        if other is None:
            held[record["step"]] = (part, record)
            pending.write(held)
            return
        if held:
            pending.write(held)
        else:
            pending.clear()
        parts = {part: record, other[0]: other[1]}
        yield self.means.record(parts[SUM], parts[COUNT])
