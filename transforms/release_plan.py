"""A release as a value. `ReleaseSpec` is everything a user chooses (the statistic and its
bounds, the steps, the keys, the budget, the mechanism), validated when it is made;
`plan_release(spec)` resolves what the release is: its truncation, mechanism (auto's choice),
calibration, descriptor and its digest, the budget it spends, its key selection rule and, for a
composed release (a mean), its parts. No Beam and no secret: `pipelines.plan`, `report`,
`caps` and the run summaries read a plan; the Beam transforms (`transforms.continual`) bind one
to a secret and a release id (`ReleasePlan.release_config`) and run it.

>>> from transforms.steps import TimeSteps
>>> spec = ReleaseSpec.of("count", steps=TimeSteps(0.0, 3600.0, 24), public_keys=["a", "b"],
...                       epsilon=1.0, max_contributions=4)
>>> plan = plan_release(spec)
>>> plan.mechanism, plan.descriptor["bounds"]["max_contributions"], plan.budget_spent
('input_perturbation', 4, {'epsilon': 1.0})
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Dict, Mapping, Optional, Tuple

from transforms import registry
from transforms import validation as check
from transforms.accountant import (gate_budget, part_kwargs, refuse_noise, selection_budget,
                                   share_budget)
from transforms.calibration import (SPLIT, Calibration, calibrate, choose_calibrated,
                                    choose_horizon_free, full_privacy, split_privacy)
from transforms.mechanisms import MECHANISMS, NAMES, ConstantNoiseSource, make
from transforms.mechanisms import selection as key_selection
from transforms.mechanisms.base import NOISE_KINDS
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY,
                                           MIN_STATE_BYTES_PER_KEY, RELEASE_TAG_BYTES,
                                           STATE_BUDGET, check_state_budget,
                                           over_budget_condition)
from transforms.mechanisms.discrete import NoiseTooLarge
from transforms.mechanisms.noise import NOISE_DOMAIN_VERSION, NOISE_VERSIONS
from transforms.mechanisms.privacy import PrivacyBudget, check_small_delta
from transforms.mechanisms.ratio import best_split
from transforms.release import (KEY_TYPES, ReleaseConfig, check_lateness, check_release_id,
                                checked_public_keys, descriptor_digest, new_release_id,
                                public_key_digest)
from transforms.steps import TimeSteps
from transforms.streams.mean import COUNT, PARTS, SUM
from transforms.truncations import Truncation

POSTPROCESS = (None, "nonnegative")  # what a release may apply to its released running totals


def _selecting_classes() -> str:
    names = [registry.SPECS[name].class_name for name in registry.able(registry.SELECT_KEYS)]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


@dataclasses.dataclass(frozen=True)
class ReleaseSpec:
    """What a user chooses for one release (validated on construction; the statistic's bounds
    by its truncation, in `plan_release`). `public_keys` None: keys selected privately."""
    statistic: str                      # its registry row (`transforms.registry.SPECS`)
    steps: TimeSteps
    bounds: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    public_keys: Optional[Tuple] = None
    key_type: Optional[str] = None      # selecting: the one key type released
    epsilon: Optional[float] = None
    rho: Optional[float] = None
    delta: Optional[float] = None
    selection_delta: Optional[float] = None
    allow_large_delta: bool = False
    mechanism: Any = "auto"             # a name; a mean: also {"sum": ..., "count": ...}
    mechanism_params: Any = None
    confidence: float = 0.95
    noise: str = "discrete"
    noise_version: str = NOISE_DOMAIN_VERSION
    # operational: which mechanism a new release may use (auto skips candidates over it)
    max_state_bytes_per_key: int = DEFAULT_MAX_STATE_BYTES_PER_KEY
    release_delay_steps: int = 1
    allowed_lateness_seconds: float = 0.0
    postprocess: Optional[str] = None
    gate_share: Optional[float] = None
    gate_rule: Optional[Mapping] = None
    release_id: Optional[str] = None    # given: a started release continues (mechanism fixed)
    diagnostics: bool = False
    name: Optional[str] = None          # the descriptor's "transform" (default: the row's class)

    @classmethod
    def of(cls, statistic: str, **choices) -> "ReleaseSpec":
        """A spec from keyword arguments: the spec's fields, the rest the statistic's bounds."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"statistic", "bounds"}
        bounds = {k: v for k, v in choices.items() if k not in fields}
        return cls(statistic, bounds=bounds, **{k: v for k, v in choices.items()
                                                 if k in fields})

    def __post_init__(self):
        row = self.row
        if self.postprocess not in POSTPROCESS:
            check.fail("postprocess", "None or 'nonnegative' (running totals and their "
                                      "intervals clamped at 0)", self.postprocess)
        if not isinstance(self.steps, TimeSteps):
            check.fail("steps", "a TimeSteps(origin, size, horizon)", self.steps)
        keys = self.public_keys
        if row.single_key is not None:  # its one key
            keys = [row.single_key] if keys is None else keys
            if list(keys) != [row.single_key]:
                check.fail("public_keys", f"[{row.single_key!r}] (the one key of "
                                          f"{row.class_name})", keys)
        if keys is None and not registry.can(self.statistic, registry.SELECT_KEYS):
            check.fail("public_keys", f"a non-empty list of ids for {row.class_name} (keys are "
                                      f"selected privately only by {_selecting_classes()})",
                       keys)
        object.__setattr__(self, "public_keys",
                           None if keys is None else tuple(checked_public_keys(keys)))
        if self.selects:
            object.__setattr__(self, "key_type", "str" if self.key_type is None
                               else self.key_type)
            check.one_of("key_type", self.key_type, tuple(KEY_TYPES))
        elif self.key_type is not None:
            check.fail("key_type", "None when public_keys are given (their types are listed)",
                       self.key_type)
        check.boolean("allow_large_delta", self.allow_large_delta)
        check_small_delta("delta", self.delta, self.allow_large_delta)
        check_small_delta("selection_delta", self.selection_delta, self.allow_large_delta)
        if isinstance(self.mechanism, str):
            check.one_of("mechanism", self.mechanism, ("auto",) + NAMES)
        check_state_budget(self.max_state_bytes_per_key)
        check.open_unit_interval("confidence", self.confidence)
        check.one_of("noise", self.noise, NOISE_KINDS)
        check.one_of("noise_version", self.noise_version, NOISE_VERSIONS)
        check.boolean("diagnostics", self.diagnostics)
        if self.release_id is not None:
            check_release_id(self.release_id)
        check.integer_at_least("release_delay_steps", self.release_delay_steps, 0)
        check_lateness(self.allowed_lateness_seconds, self.release_delay_steps,
                       self.steps.size)

    @property
    def row(self) -> registry.TransformSpec:
        if self.statistic not in registry.SPECS:
            check.fail("statistic", f"one of {', '.join(registry.NAMES)}", self.statistic)
        return registry.SPECS[self.statistic]

    @property
    def selects(self) -> bool:
        """Keys selected privately (`transforms.mechanisms.selection`): no public keys."""
        return self.public_keys is None


@dataclasses.dataclass(frozen=True)
class ReleasePlan:
    """What a release is (`plan_release`): public, data-independent, no secret."""
    spec: ReleaseSpec
    transform: str                       # the descriptor's name of it (the class name)
    truncation: Truncation
    whole_budget: PrivacyBudget          # what the release spends (before selection's delta)
    budget: PrivacyBudget                # the counting budget (the whole minus the gate's)
    gate: Optional[dict]                 # the input gate's descriptor entry
    selection_delta: Optional[float]
    mechanism: Any                       # its name; a composed release: {part: name}
    params: Any                          # its parameters; composed: {part: params}
    descriptor: dict
    digest: str
    state_bytes_per_key: int
    calibration: Optional[Calibration] = None
    selection: Optional[dict] = None     # selecting: the rule (never the keys it selects)
    integer_values: bool = True
    parts: Dict[str, "ReleasePlan"] = dataclasses.field(default_factory=dict)
    zero_noise: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def selects(self) -> bool:
        return self.spec.selects

    @property
    def resolved_mechanism(self) -> Tuple[Any, Any]:
        """(mechanism, params) as resolved (auto's choice): what a continuation is built with
        (the scheduler's ledger stores it)."""
        return self.mechanism, (dict(sorted(self.params.items())) if not self.parts else
                                {part: dict(sorted(p.items()))
                                 for part, p in self.params.items()})

    @property
    def budget_spent(self) -> dict:
        """The whole budget (epsilon / rho / delta as resolved; a release that selects its keys
        adds its selection delta)."""
        spent = {k: v for k, v in self.whole_budget.as_dict().items() if k != "noise"}
        if self.selects:  # (epsilon, delta) as given: split, not added
            spent["delta"] = self.selection_delta if self.whole_budget.delta is None \
                else self.spec.delta
        return spent

    def summary(self) -> dict:
        """What the release is, for run summaries (public, data-independent); a mean adds its
        parts' MaxSE (sum in value units) and its error at the worst-case mean for a key whose
        count is C: `se_times_count` / C (delta method: sqrt(Vs + M^2 Vc) / C)."""
        if not self.parts:
            return {"mechanism": self.mechanism,
                    "mechanism_params": self.resolved_mechanism[1],
                    "noise": self.descriptor["noise"], "budget_spent": self.budget_spent,
                    "key_budget": self.descriptor["key_budget"], "gate": self.gate}
        composed = self.truncation.composed
        sum_se = self.parts[SUM].zero_noise.max_se() * self.parts[SUM].truncation.value_scale
        count_se = self.parts[COUNT].zero_noise.max_se()
        return {"mechanism": self.mean_mechanism,
                "mechanism_params": {**self.resolved_mechanism[1],
                                     "sum_share": self.descriptor["sum_share"]},
                "noise": self.descriptor["noise"], "budget_spent": self.budget_spent,
                "gate": self.gate, "key_budget": {part: p.descriptor["key_budget"]
                                                  for part, p in self.parts.items()},
                "part_max_se": {SUM: sum_se, COUNT: count_se},
                "se_times_count": math.sqrt(sum_se ** 2 + (composed.magnitude * count_se) ** 2)}

    @property
    def mean_mechanism(self) -> str:
        return f"mean = sum ({self.mechanism[SUM]}) / count ({self.mechanism[COUNT]})"

    def plan_declarations(self) -> list:
        """(label, descriptor) of each released stream, for `pipelines.plan` commands (a mean's
        descriptor plans both parts)."""
        return [("", self.descriptor)]

    def release_id(self, secret, private: bool) -> str:
        """The release's id (`release.new_release_id`): the given one, derived from a fixed
        seed, or fresh."""
        return new_release_id(self.spec.release_id, private, secret, self.digest)

    def release_config(self, secret, private: bool, release_id: str,
                       secret_fingerprint: Optional[str] = None) -> ReleaseConfig:
        """What a worker needs to release it (a composed release: its count part's, which the
        census and the claims use)."""
        if self.parts:
            return self.parts[COUNT].release_config(secret, private, release_id,
                                                     secret_fingerprint)
        spec, declaration = self.spec, self.truncation.problem.declaration
        total = {k: v for k, v in self.budget.as_dict().items() if k != "noise"}
        if self.selects or self.gate is not None:
            total = self.budget_spent  # records state the whole guarantee
        return ReleaseConfig(
            steps=spec.steps, mechanism=self.mechanism,
            params=tuple(sorted(self.params.items())),
            key_privacy=tuple(sorted(self.calibration.key_privacy.items())),
            total_privacy=tuple(sorted(total.items())),
            max_contributions=declaration.max_contributions,
            interval_bound=declaration.interval_bound,
            keys_per_unit=declaration.keys_per_unit, confidence=spec.confidence,
            secret=secret, release_delay_steps=spec.release_delay_steps,
            release_id=release_id, descriptor_digest=self.digest, noise_kind=spec.noise,
            private=private, value_scale=self.truncation.value_scale,
            diagnostics=spec.diagnostics, integer_values=self.integer_values,
            secret_fingerprint=secret_fingerprint, noise_version=spec.noise_version,
            allowed_lateness_seconds=spec.allowed_lateness_seconds,
            nonnegative=spec.postprocess == "nonnegative",
            selection_threshold=self.selection["threshold"] if self.selects else None,
            key_type=spec.key_type)


def plan_release(spec: ReleaseSpec) -> ReleasePlan:
    """What `spec` releases: its statistic's truncation (its registry row's), then the
    mechanism and calibration of one stream, or of each part of a composed one."""
    truncation = spec.row.truncate(dict(spec.bounds), spec.noise)
    if truncation.composed is not None:
        return _plan_composed(spec, truncation)
    name = spec.name or spec.row.class_name
    if spec.postprocess is not None and not truncation.nonnegative_truth:
        check.fail("postprocess", f"None for {name} (its running totals may be negative: a "
                                  f"clamped interval would miss them)", spec.postprocess)
    if not isinstance(spec.mechanism, str):  # one stream: one mechanism
        check.one_of("mechanism", spec.mechanism, ("auto",) + NAMES)
    return _plan_stream(spec, name, truncation)


def _budgets(spec: ReleaseSpec):
    """(whole budget, counting budget, gate entry, selection delta)."""
    selection_delta, delta = selection_budget(spec.selects, spec.epsilon, spec.rho, spec.delta,
                                              spec.selection_delta)
    whole = PrivacyBudget.resolve(epsilon=spec.epsilon, rho=spec.rho, delta=delta)
    if spec.gate_share is None:
        return whole, whole, None, selection_delta
    gate, budget = gate_budget(whole, spec.gate_share)
    gate.update(spec.gate_rule or {})  # the rule's public parameters (the config's)
    return whole, budget, gate, selection_delta


def _plan_stream(spec: ReleaseSpec, transform: str, truncation: Truncation,
                 part: bool = False) -> ReleasePlan:
    """One stream per key (one mechanism): the old `ContinualBase` constructor's resolution."""
    whole, budget, gate, selection_delta = _budgets(spec)
    declaration = truncation.problem.declaration
    name, params = spec.mechanism, dict(spec.mechanism_params or {})
    try:  # discrete noise too large to sample: refused now, in the user's budget
        if spec.steps.unbounded:  # only a horizon-free mechanism is calibrated past any T
            if spec.selects:
                check.fail("public_keys", "given for steps with no horizon (keys selected "
                                          "privately are planned for a horizon)", None)
            name = _horizon_free(spec, budget, declaration, name)
        elif name == "auto":  # the lowest MaxSE (then MeanSE) of the candidates that fit
            best, _ = choose_calibrated(spec.steps.horizon, budget, declaration,
                                        noise=spec.noise,
                                        max_state_bytes=spec.max_state_bytes_per_key)
            name, params = best.mechanism, dict(best.params)
        calibration, resolved = _calibrated(spec, declaration, budget, name, params)
        resolved.check_noise()
    except NoiseTooLarge as error:
        if part:
            raise  # the composed release restates it in its own budget
        refuse_noise(whole, error, grid=truncation.grid)  # (the gate takes a fixed share)
    size = _state_bytes(spec, name, resolved)
    params = resolved.params()
    descriptor = {
        "format": 2, "transform": transform, "mechanism": name, "params": params,
        "noise": resolved.noise_name,
        "noise_derivation": resolved.derivation_name(spec.noise_version),
        "budget": {k: v for k, v in budget.as_dict().items() if k != "noise"},
        "key_budget": calibration.key_privacy, "calibration": calibration.kind,
        "horizon": spec.steps.shown_horizon, "origin": spec.steps.origin,
        "step_seconds": spec.steps.size, "bounds": truncation.bounds,
        "declaration": {"interval_bound": declaration.interval_bound,
                        "max_contributions": declaration.max_contributions,
                        "keys_per_unit": declaration.keys_per_unit,
                        "joint_mass": declaration.joint_mass},
        "value_scale": truncation.value_scale,
        "public_keys": None if spec.selects else public_key_digest(spec.public_keys)}
    selection = None
    if spec.selects:  # the rule, never the keys it selects (they depend on the data)
        m, bound = declaration.keys_per_unit, declaration.interval_bound
        tau = key_selection.selection_threshold(resolved, m, bound, selection_delta)
        selection = descriptor["selection"] = {
            "threshold": tau, "delta": selection_delta, "max_keys_per_unit": m,
            "contribution_bound": bound, "key_type": spec.key_type,
            "delta_spent": key_selection.selection_delta(resolved, tau, m, bound)}
    if gate is not None:  # (absent otherwise: the digests of releases before)
        descriptor["gate"] = gate
    if spec.postprocess is not None:  # (absent otherwise: the digests of releases before)
        descriptor["postprocess"] = spec.postprocess
    return ReleasePlan(spec, transform, truncation, whole, budget, gate, selection_delta, name,
                       params, descriptor, descriptor_digest(descriptor), size, calibration,
                       selection, resolved.integer_release, zero_noise=resolved)


def _horizon_free(spec: ReleaseSpec, budget: PrivacyBudget, declaration, name: str) -> str:
    """The mechanism of a release with no horizon: `name` if its outputs, calibration and
    state at step t are the same for every horizon (`horizon_free`), the auto choice
    (`choose_horizon_free`), else refused."""
    if name == "auto":
        return choose_horizon_free(budget, declaration, spec.noise)
    if not MECHANISMS[name].horizon_free:
        free = ", ".join(repr(n) for n in NAMES if MECHANISMS[n].horizon_free)
        check.fail("mechanism", f"one of {free} or 'auto' for steps with no horizon ({name} is "
                                f"calibrated for a horizon T)", name)
    return name


def _build(spec: ReleaseSpec, declaration, name: str, privacy: dict, params: dict):
    return make(name, spec.steps.horizon, **privacy,  # validates parameters now
                max_contributions=declaration.max_contributions,
                interval_bound=declaration.interval_bound,
                noise_source=ConstantNoiseSource(0.0), noise=spec.noise, **params)


def _calibrated(spec: ReleaseSpec, declaration, budget: PrivacyBudget, name: str,
                params: dict) -> Tuple[Calibration, Any]:
    """(calibration, mechanism built with the key budget and zero noise)."""
    if declaration.joint_mass is None or declaration.keys_per_unit == 1:
        split = split_privacy(declaration, budget)
        return Calibration(SPLIT, split, None), _build(spec, declaration, name, split, params)
    # S, c_p and the grid do not depend on the budget: probe at the full budget (which fits
    # wherever a smaller one does) and keep it when the key gets the full budget
    probe = _build(spec, declaration, name, full_privacy(budget), params)
    calibration = calibrate(probe, declaration, budget)
    if calibration.key_privacy == full_privacy(budget):
        return calibration, probe
    return calibration, _build(spec, declaration, name, calibration.key_privacy, params)


def _state_bytes(spec: ReleaseSpec, name: str, mechanism) -> int:
    """A key's state in bytes; refused over the budget, unless the release continues (its
    mechanism is fixed and its states exist: refusing would only strand it; a warning). With
    no horizon: its state at the first step, uncapped (a horizon-free mechanism's state grows
    with the steps released, as `state_size(steps=t)` says; summaries give it at each run)."""
    if spec.steps.unbounded:
        return RELEASE_TAG_BYTES + mechanism.state_bytes(steps=1)
    size = RELEASE_TAG_BYTES + mechanism.state_bytes()
    budget = spec.max_state_bytes_per_key
    if size <= budget:
        return size
    condition = over_budget_condition(name, spec.steps.horizon, spec.noise, size, budget)
    if spec.release_id is None:
        check.fail("mechanism", condition, name)
    logging.getLogger(__name__).warning(
        "release %s continues with %s, whose state of %d B per key exceeds %s (%d B): the "
        "mechanism of a started release cannot change", spec.release_id, name, size,
        STATE_BUDGET, budget)
    return size


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


def _plan_composed(spec: ReleaseSpec, truncation: Truncation) -> ReleasePlan:
    """A mean: its budget shared by its parts (`accountant.share_budget`, sequential
    composition; the sum part's share w defaults to the split minimising the mean's
    delta-method variance at the worst-case mean, `ratio.best_split`: exactly 1/2), each part
    one stream with its own mechanism and descriptor, under one descriptor and release id. A
    key holds one state per part: each part gets half the state budget."""
    composed, transform = truncation.composed, spec.name or spec.row.class_name
    if spec.steps.unbounded:
        check.fail("steps", "a horizon T for a mean (its parts' split and intervals are "
                            "planned for one)", "no horizon")
    if spec.postprocess is not None:
        check.fail("postprocess", "absent for a mean (its values are clamped to [min_value, "
                                  "max_value] already)", spec.postprocess)
    mechanisms = _per_part("mechanism", spec.mechanism, "auto")
    for part, name in mechanisms.items():
        check.one_of(f"mechanism.{part}", name, ("auto",) + NAMES)
    part_params = _per_part("mechanism_params", spec.mechanism_params, None)
    if spec.max_state_bytes_per_key // 2 < MIN_STATE_BYTES_PER_KEY:
        check.fail(STATE_BUDGET, f"an integer >= {2 * MIN_STATE_BYTES_PER_KEY} for a mean "
                                 f"(a key holds one state per part)",
                   spec.max_state_bytes_per_key)
    whole, budget, gate, _ = _budgets(spec)
    split = best_split(composed.min_value, composed.max_value, budget.noise)
    share = split.sum_share if composed.sum_share is None else composed.sum_share
    budgets = share_budget(budget, {SUM: share, COUNT: 1.0 - share})
    parts = {}
    for part in PARTS:
        part_spec = dataclasses.replace(
            spec, mechanism=mechanisms[part], mechanism_params=part_params[part],
            **{"epsilon": None, "rho": None, **part_kwargs(budgets[part])}, delta=None,
            selection_delta=None, gate_share=None, gate_rule=None, postprocess=None,
            max_state_bytes_per_key=spec.max_state_bytes_per_key // 2,
            diagnostics=spec.diagnostics and part == SUM)  # operator counts once
        try:
            parts[part] = _plan_stream(part_spec, "_MeanPart", composed.parts[part], part=True)
        except NoiseTooLarge as error:  # in the mean's budget (a part's is a share)
            refuse_noise(whole, error, f"the {part} part's ", grid=truncation.grid)
    spent = {k: v for k, v in whole.as_dict().items() if k != "noise"}
    descriptor = {
        "format": 2, "transform": transform, "budget": spent, "sum_share": share,
        "split": "configured" if composed.sum_share is not None else
        f"{split.formula} at m = {split.reference_mean:g} (the worst case)",
        "noise": parts[SUM].descriptor["noise"],
        "noise_derivation": parts[SUM].descriptor["noise_derivation"],
        "horizon": spec.steps.shown_horizon, "origin": spec.steps.origin,
        "step_seconds": spec.steps.size, "bounds": truncation.bounds,
        "interval": "fieller test inversion (transforms.mechanisms.ratio)",
        "public_keys": public_key_digest(spec.public_keys),
        "parts": {part: parts[part].descriptor for part in PARTS}}
    if gate is not None:  # (absent otherwise: the digests of releases before)
        descriptor["gate"] = gate
    return ReleasePlan(spec, transform, truncation, whole, budget, gate, None,
                       {part: p.mechanism for part, p in parts.items()},
                       {part: p.params for part, p in parts.items()}, descriptor,
                       descriptor_digest(descriptor),
                       sum(p.state_bytes_per_key for p in parts.values()),
                       integer_values=parts[COUNT].integer_values, parts=parts)
