"""`ContinualMean`: a running mean per key, released as a composition of two releases.

    means = events | ContinualMean(steps=steps, public_keys=pages, epsilon=1.0,
                                   max_value=600.0, max_contributions=10, secret=...)

Elements (unit, key, value). One truncation rule (`streams.mean`) keeps at most
`max_contributions` events per unit (values clamped to [0, max_value]); two parts release the
running SUM of the kept values and their running COUNT, each a continual release with its own
mechanism, descriptor, noise stream (the noise seam binds the release id AND the part's
descriptor) and key states, under one release id, one claim and one ledger entry. The budget is
shared by `accountant.share_budget` (sequential composition): the sum part's share w defaults to
the split minimising the mean's delta-method variance at the worst-case mean
(`ratio.best_split`: exactly 1/2), or is configured (`sum_share`).

Each record is the mean at one key and step: value = clamp(S^ / C^, 0, max_value) (the
midpoint when C^ <= 0), stddev = the delta-method standard error, and [ci_low, ci_high] the
Fieller / test-inversion interval of `mechanisms.ratio` from the two parts' exact noise laws at
that step (exact for Laplace and Gaussian noise, conservative for discrete Laplace, approximate
for discrete Gaussian; the record's `mechanism_params` says which). Where C = 0 the mean is
undefined and the record says nothing about it beyond its interval (the whole range).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, Optional, Tuple

import apache_beam as beam
from apache_beam.coders import PickleCoder
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from transforms import validation as check
from transforms.accountant import part_kwargs, share_budget
from transforms.accountant import refuse_noise
from transforms.continual import ContinualBase
from transforms.mechanisms.discrete import NoiseTooLarge
from transforms.mechanisms import NAMES, ConstantNoiseSource
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY,
                                           MIN_STATE_BYTES_PER_KEY, STATE_BUDGET,
                                           check_state_budget)
from transforms.mechanisms.ratio import QuantileCurve, best_split, ratio_interval, step_noise
from transforms.messages import Released
from transforms.release import descriptor_digest, new_release_id, public_key_digest
from transforms.streams import ContributionBounds
from transforms.streams.count import value_resolution as grid_of
from transforms.streams.mean import COUNT, PARTS, SUM, MeanProblem

_FORWARDED = ("steps", "public_keys", "confidence", "secret", "seed", "insecure", "noise",
              "secret_fingerprint", "noise_source", "release_delay_steps",
              "allowed_lateness_seconds",
              "max_state_bytes_per_key", "noise_version")
_CACHED_CURVES = 1 << 10


class _MeanPart(ContinualBase):
    """One part (SUM or COUNT) of a `ContinualMean`; built only by it (`part_of`)."""

    def __init__(self, *, part: str, mean: "ContinualMean", **kwargs):
        self.part, self.mean = part, mean
        super().__init__(**kwargs)

    def make_problem(self):
        mean = self.mean
        return MeanProblem(mean.contribution_bounds, with_value=True,
                           value_grid=mean.value_resolution, max_value=mean.max_value,
                           part=self.part)

    def bounds(self):
        return {**self.mean.bounds(), "part": self.part}

    @property
    def value_scale(self):
        return (self.mean.value_resolution or 1.0) if self.part == SUM else 1.0


def _per_part(name: str, given, default) -> Dict[str, Any]:
    """A value for both parts, or a mapping {"sum": ..., "count": ...}."""
    if isinstance(given, dict) and set(given) == set(PARTS):
        return dict(given)
    if isinstance(given, dict) and name == "mechanism_params" and not set(given) & set(PARTS):
        return {part: dict(given) for part in PARTS}
    if isinstance(given, dict):
        check.fail(name, "one value for both parts or a mapping with exactly the keys "
                         "'sum' and 'count'", given)
    return {part: default if given is None else given for part in PARTS}


class ContinualMean(ContinualBase):
    """Running mean per public key: noisy running sum / noisy running count of the values of
    the events each unit keeps (at most `max_contributions` events over the horizon, at most
    `max_contributions_per_step` per step, on at most `max_keys_per_unit` keys; values clamped
    to [0, `max_value`]; with discrete noise rounded to `value_resolution`, default
    max_value / 100). `sum_share`: the sum part's share of the budget (default: the worst-case
    optimum, 1/2). `mechanism` / `mechanism_params`: one for both parts, or a mapping
    {"sum": ..., "count": ...}. `max_state_bytes_per_key` bounds a key's two states together
    (each part gets half)."""

    def __init__(self, *, max_value: float, max_contributions: int = 1,
                 max_contributions_per_step=None, max_keys_per_unit: int = 1,
                 value_resolution: Optional[float] = None, sum_share: Optional[float] = None,
                 mechanism="auto", mechanism_params=None, **kwargs):
        if kwargs.get("postprocess") is not None:
            check.fail("postprocess", "absent for a mean (its values are clamped to [0, "
                                      "max_value] already)", kwargs["postprocess"])
        self.contribution_bounds = ContributionBounds(max_contributions,
                                                      max_contributions_per_step,
                                                      max_keys_per_unit)
        self.max_value = check.positive_finite("max_value", max_value)
        self.value_resolution = grid_of(max_value, value_resolution,
                                        kwargs.get("noise", "discrete"))
        self.sum_share = None if sum_share is None else check.open_unit_interval(
            "sum_share", sum_share)
        self.part_mechanisms = _per_part("mechanism", mechanism, "auto")
        for part, name in self.part_mechanisms.items():
            check.one_of(f"mechanism.{part}", name, ("auto",) + NAMES)
        self.part_params = _per_part("mechanism_params", mechanism_params, None)
        self._forwarded = {k: v for k, v in kwargs.items() if k in _FORWARDED}
        # a key of the mean holds one state per part: each part gets half the state budget
        budget = check_state_budget(kwargs.get("max_state_bytes_per_key",
                                               DEFAULT_MAX_STATE_BYTES_PER_KEY))
        if budget // 2 < MIN_STATE_BYTES_PER_KEY:
            check.fail(STATE_BUDGET, f"an integer >= {2 * MIN_STATE_BYTES_PER_KEY} for a mean "
                                     f"(a key holds one state per part)", budget)
        self._forwarded[STATE_BUDGET] = budget // 2
        super().__init__(**kwargs)

    def make_problem(self):
        """The count part's problem: its unit states are the mean's (both parts run one rule
        on the same events, so their unit states are equal)."""
        return MeanProblem(self.contribution_bounds, with_value=True,
                           value_grid=self.value_resolution, max_value=self.max_value,
                           part=COUNT)

    def bounds(self):
        return {**dataclasses.asdict(self.contribution_bounds), "max_value": self.max_value,
                "value_resolution": self.value_resolution}

    def _release_config(self):
        split = best_split(0.0, self.max_value, self.budget.noise)
        share = split.sum_share if self.sum_share is None else self.sum_share
        budgets = share_budget(self.budget, {SUM: share, COUNT: 1.0 - share})
        self.parts = {}
        for part in PARTS:
            try:
                self.parts[part] = _MeanPart(
                    part=part, mean=self, part_of=type(self).__name__, diagnostics=(
                        self.diagnostics and part == SUM),  # operator counts once
                    mechanism=self.part_mechanisms[part],
                    mechanism_params=self.part_params[part],
                    release_id=self._given_release_id, **part_kwargs(budgets[part]),
                    **self._forwarded)
            except NoiseTooLarge as error:  # in the mean's budget (a part's is a share)
                refuse_noise(self._whole_budget, error, f"the {part} part's ",
                             grid=self.value_resolution is not None)
        sum_part = self.parts[SUM]
        self.descriptor = {
            "format": 2, "transform": type(self).__name__, "budget": self.budget_spent,
            "sum_share": share, "split": "configured" if self.sum_share is not None else
            f"{split.formula} at m = {split.reference_mean:g} (the worst case)",
            "noise": sum_part.descriptor["noise"],
            "noise_derivation": sum_part.descriptor["noise_derivation"],
            "horizon": self.steps.horizon, "origin": self.steps.origin,
            "step_seconds": self.steps.size, "bounds": self.bounds(),
            "interval": "fieller test inversion (transforms.mechanisms.ratio)",
            "public_keys": public_key_digest(self.public_keys),
            "parts": {part: self.parts[part].descriptor for part in PARTS}}
        if self.gate is not None:  # (absent otherwise: the digests of releases before)
            self.descriptor["gate"] = self.gate
        self._digest = descriptor_digest(self.descriptor)
        self.release_id = new_release_id(self._given_release_id, self.private, self.secret,
                                         self._digest)
        for part in self.parts.values():
            part.join(self.release_id)
        self.state_bytes_per_key = sum(p.state_bytes_per_key for p in self.parts.values())
        return self.parts[COUNT].config  # the census and claims use its secret and binding

    # ----- the release's interface -----
    @property
    def descriptor_digest(self) -> str:
        return self._digest

    @property
    def resolved_mechanism(self) -> Tuple[Any, Any]:
        return ({part: p.resolved_mechanism[0] for part, p in self.parts.items()},
                {part: p.resolved_mechanism[1] for part, p in self.parts.items()})

    def summary(self) -> dict:
        """Besides every release's fields, the parts' MaxSE (sum in value units) and the mean's
        error at the worst-case mean for a key whose count is C: `se_times_count` / C (delta
        method: sqrt(Vs + M^2 Vc) / C; what `plan --mean-max-value` prints)."""
        names, params = self.resolved_mechanism
        laws = self.mean_records()
        sum_se = laws.law(SUM).max_se() * (self.value_resolution or 1.0)
        count_se = laws.law(COUNT).max_se()
        return {"mechanism": f"mean = sum ({names[SUM]}) / count ({names[COUNT]})",
                "mechanism_params": {**params, "sum_share": self.descriptor["sum_share"]},
                "noise": self.descriptor["noise"], "budget_spent": self.budget_spent,
                "gate": self.gate, "key_budget": {part: p.descriptor["key_budget"]
                               for part, p in self.parts.items()},
                "part_max_se": {SUM: sum_se, COUNT: count_se},
                "se_times_count": math.sqrt(sum_se ** 2 + (self.max_value * count_se) ** 2)}

    def plan_declarations(self) -> list:
        return [("", self.descriptor)]  # `pipelines.plan --mean-max-value` plans both parts

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
        names, params = self.resolved_mechanism
        return MeanRecords({part: p.config for part, p in self.parts.items()},
                           self.max_value, self.confidence,
                           f"mean = sum ({names[SUM]}) / count ({names[COUNT]})",
                           {**params, "sum_share": self.descriptor["sum_share"]},
                           self.budget_spent)


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
                 params: dict, budget: dict):
        self.configs, self.max_value, self.confidence = configs, max_value, confidence
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
            found = self._curves[step] = QuantileCurve(sum_noise, count_noise, 0.0,
                                                       self.max_value, self.confidence)
        return found

    def record(self, sum_record: dict, count_record: dict) -> dict:
        step = sum_record["step"]
        curve = self.curve(step)
        found = ratio_interval(sum_record["value"], count_record["value"], curve.sum_noise,
                               curve.count_noise, 0.0, self.max_value, self.confidence, curve)
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
    PENDING = ReadModifyWriteStateSpec("pending", PickleCoder())

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
