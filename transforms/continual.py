"""What every continual-release transform shares (`ContinualBase`; the statistics are in
`transforms.statistics`): it validates its arguments, resolves the mechanism and the release
identity, and runs one of the two pipelines (`transforms.bounded` for bounded input,
`transforms.streaming` for unbounded input):

    counts = events | ContinualCount(steps=TimeSteps(origin, 3600, 24 * 30), public_keys=regions,
                                     rho=0.5, max_contributions=10, secret=SecretRef(env="DP"))
    counts.records | WriteRecordsToParquet("out/counts")
    counts.dead_letters | ...

Without `public_keys`, ContinualCount, ContinualSum and ContinualCountDistinct select their
keys privately (`selection_delta=`; docs/selection.md): a key's records start at the first step
its noisy running total reaches a threshold.

Every transform returns a `ContinualResult` with `.records` (one dict per public key and step)
and `.dead_letters` (bad, late or out-of-horizon elements with a reason); on bounded input also
the new unit and key states (the scheduler checkpoints them, see `resume`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import secrets
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam

from transforms import validation as check
from transforms.census import CheckCensus, WriteCensus, census_of
from transforms.claims import (ClaimOnce, Claimed, NothingLater, WindowClaims, claim_of,
                               guard, guarded)
from transforms.mechanisms import NAMES, ConstantNoiseSource, make
from transforms.mechanisms.base import NOISE_KINDS
from transforms.mechanisms.noise import NOISE_DOMAIN_VERSION, NOISE_VERSIONS
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY, RELEASE_TAG_BYTES,
                                           STATE_BUDGET, check_state_budget,
                                           over_budget_condition)
from transforms.accountant import gate_budget, refuse_noise, selection_budget
from transforms.mechanisms.discrete import NoiseTooLarge
from transforms.mechanisms.privacy import PrivacyBudget, check_small_delta
from transforms.mechanisms import selection as key_selection
from transforms.calibration import (SPLIT, Calibration, calibrate, choose_calibrated,
                                    full_privacy, split_privacy)
from transforms.release import (KEY_TYPES, ReleaseConfig, check_release_id, checked_public_keys,
                                descriptor_digest, new_release_id, public_key_digest)
from transforms.secret import SecretRef
from transforms.bounded import release_bounded
from transforms.messages import Released, StepWindow
from transforms.streaming import release_streaming
from transforms.steps import TimeSteps
from transforms.streams.units import Problem


UNJOINED = "0" * 32  # the release id of a part until its composite gives it its own


POSTPROCESS = (None, "nonnegative")  # what a release may apply to its released running totals


class ContinualResult(NamedTuple):
    """A NamedTuple, so that Beam registers the PCollections as the transform's outputs."""
    records: Any
    dead_letters: Any
    unit_states: Any = None  # bounded input: (unit, state) after this run
    key_states: Any = None   # bounded input: (key, (sealed mechanism state, halt step))


class ContinualBase(beam.PTransform):
    """Shared construction, validation, display data and the release half of the pipeline."""

    nonnegative_truth = True  # every true running total is >= 0 (`postprocess` may clamp)
    selects_keys = False  # may run without public keys (private key selection)

    def __init__(self, *, steps: TimeSteps, public_keys: Optional[Sequence] = None,
                 epsilon=None, rho=None, delta=None, selection_delta=None,
                 allow_large_delta: bool = False, key_type: Optional[str] = None,
                 mechanism: str = "auto", mechanism_params: Optional[dict] = None,
                 confidence: float = 0.95, secret: Optional[SecretRef] = None,
                 seed: Optional[int] = None, insecure: bool = False, noise: str = "discrete",
                 release_id: Optional[str] = None, diagnostics: bool = False,
                 secret_fingerprint: Optional[str] = None, noise_source=None,
                 release_delay_steps: int = 1, allowed_lateness_seconds: float = 0.0,
                 max_state_bytes_per_key: int = DEFAULT_MAX_STATE_BYTES_PER_KEY,
                 noise_version: str = NOISE_DOMAIN_VERSION, claims: Optional[str] = None,
                 label: Optional[str] = None, part_of: Optional[str] = None,
                 checkpoint: Optional[str] = None, postprocess: Optional[str] = None,
                 gate_share: Optional[float] = None, gate_rule: Optional[dict] = None):
        super().__init__(label)
        # opt-in post-processing of the running totals (bound to the release: descriptor)
        if postprocess not in POSTPROCESS:
            check.fail("postprocess", "None or 'nonnegative' (running totals and their "
                                      "intervals clamped at 0)", postprocess)
        if postprocess is not None and not self.nonnegative_truth:
            check.fail("postprocess", f"None for {type(self).__name__} (its running totals may "
                                      f"be negative: a clamped interval would miss them)",
                       postprocess)
        self.postprocess = postprocess
        # a part of a composed release (`transforms.mean`): its composite claims, checks and
        # guards the release and gives it its release id (`join`)
        self.part_of = part_of
        if not isinstance(steps, TimeSteps):
            check.fail("steps", "a TimeSteps(origin, size, horizon)", steps)
        self.steps = steps
        # keys selected privately when none are listed (`transforms.mechanisms.selection`)
        self.selects = public_keys is None
        if self.selects and not self.selects_keys:
            check.fail("public_keys", f"a non-empty list of ids for {type(self).__name__} "
                                      f"(keys are selected privately only by ContinualCount, "
                                      f"ContinualSum and ContinualCountDistinct)", public_keys)
        self.public_keys = None if self.selects else checked_public_keys(public_keys)
        # selecting: the one type of key released ("str" or "int"; keys of another type are
        # dropped with a dead letter: 5 and "5" would be two keys published under one name)
        if self.selects:
            self.key_type = "str" if key_type is None else key_type
            check.one_of("key_type", self.key_type, tuple(KEY_TYPES))
        elif key_type is not None:
            check.fail("key_type", "None when public_keys are given (their types are listed)",
                       key_type)
        else:
            self.key_type = None
        # delta above 1e-3 only on request: it is the probability the guarantee fails outright
        self.allow_large_delta = check.boolean("allow_large_delta", allow_large_delta)
        check_small_delta("delta", delta, self.allow_large_delta)
        check_small_delta("selection_delta", selection_delta, self.allow_large_delta)
        self._given_delta = delta
        self.selection_delta, delta = selection_budget(self.selects, epsilon, rho, delta,
                                                        selection_delta)
        self.budget = PrivacyBudget.resolve(epsilon=epsilon, rho=rho, delta=delta)
        # the whole budget the release states; a share of it may go to the input gate
        # (`pipelines.gate`, bound to the descriptor), the rest is the counting budget
        self._whole_budget = self.budget
        self.gate = None
        if gate_share is not None:
            self.gate, self.budget = gate_budget(self.budget, gate_share)
            self.gate.update(gate_rule or {})  # the rule's public parameters (the config's)
        check.one_of("mechanism", mechanism, ("auto",) + NAMES)
        self.mechanism_name = mechanism
        self.mechanism_params = dict(mechanism_params or {})
        # operational, not part of the release: it limits which mechanism a new release may use
        # (auto skips candidates over it, a configured one is refused); the chosen mechanism is
        # in the descriptor
        self.max_state_bytes_per_key = check_state_budget(max_state_bytes_per_key)
        self.confidence = check.open_unit_interval("confidence", confidence)
        if sum(x is not None for x in (secret, seed, noise_source)) != 1:
            check.fail("secret", "given once, as SecretRef(env=\"DP_SECRET\") (or path= or "
                                 "gcp_secret=; for insecure demos and tests only: `seed` or "
                                 "`noise_source` instead, with insecure=True)", secret)
        if secret is not None and not isinstance(secret, SecretRef):
            check.fail("secret", "a SecretRef (env, path, seed or literal)", secret)
        # the release's secret: a SecretRef, or an injected source (tests, the operator's exact
        # totals), resolved on workers; an injected source is never private
        self.insecure = check.boolean("insecure", insecure)
        if self.insecure and isinstance(secret, SecretRef) and not secret.insecure:
            secret = dataclasses.replace(secret, insecure=True)  # a short secret is taken
        self.secret = secret or noise_source or SecretRef(seed=seed)
        public = noise_source is not None or self.secret.public
        if public and not self.insecure:
            given = "noise_source" if noise_source is not None else (
                "literal" if getattr(self.secret, "literal", None) is not None else "seed")
            check.fail("secret", "a secret from `env`, `path` or `gcp_secret` (a fixed "
                                 "`seed` is public: anyone who knows it can subtract the noise; "
                                 "`literal` bytes are pickled into the job graph; an injected "
                                 "`noise_source` is not private: pass insecure=True for demos "
                                 "and tests)", given)
        if isinstance(self.secret, SecretRef):
            self.secret.check_early()  # a short env / local file secret: refused now
        check.one_of("noise", noise, NOISE_KINDS)
        self.noise_kind = noise
        # how node noise is derived: new releases take the newest; a release continues with
        # the one it started with (the scheduler reads it from the ledger's descriptor)
        check.one_of("noise_version", noise_version, NOISE_VERSIONS)
        self.noise_version = noise_version
        self.private = not public
        self.diagnostics = check.boolean("diagnostics", diagnostics)
        if release_id is not None:
            check_release_id(release_id)
        self._given_release_id = release_id
        self._secret_fingerprint = secret_fingerprint
        self._expanded = False
        self._window: Optional[StepWindow] = None
        self._resume_units = self._resume_keys = None
        # where a private release claims its steps once (`transforms.claims`)
        self._claims = None if claims is None else WindowClaims(claims)
        self.release_delay_steps = check.integer_at_least("release_delay_steps",
                                                          release_delay_steps, 0)
        self.allowed_lateness_seconds = allowed_lateness_seconds
        # unbounded input: the folder of the release's checkpoints (`stream_checkpoint`), and
        # this job graph's execution id there (its unit log folder, named in its step claims)
        self.checkpoint = checkpoint
        if checkpoint is not None and self.selects:
            check.fail("checkpoint", "None for a release that selects its keys (a checkpointed "
                                     "streaming release publishes each step once every public "
                                     "key's record is in: it needs public_keys)", checkpoint)
        self.execution = secrets.token_hex(8) if checkpoint is not None else None
        self.problem = self.make_problem()
        self.config = self._release_config()

    def make_problem(self) -> Problem:
        raise NotImplementedError

    def bounds(self) -> dict:
        """The transform's contribution bounds (part of the release descriptor)."""
        raise NotImplementedError

    @property
    def value_scale(self) -> float:
        return 1.0

    def _key_privacy(self) -> dict:
        return split_privacy(self.problem.declaration, self.budget)

    def _full_privacy(self) -> dict:
        return full_privacy(self.budget)

    def _build(self, name: str, privacy: dict, params: dict):
        declaration = self.problem.declaration
        return make(name, self.steps.horizon, **privacy,  # validates parameters now
                    max_contributions=declaration.max_contributions,
                    interval_bound=declaration.interval_bound,
                    noise_source=ConstantNoiseSource(0.0), noise=self.noise_kind, **params)

    def _calibrated(self, name: str, params: dict) -> Tuple[Calibration, Any]:
        """(calibration, mechanism built with the key budget) for a given mechanism."""
        declaration = self.problem.declaration
        if declaration.joint_mass is None or declaration.keys_per_unit == 1:
            split = self._key_privacy()
            return Calibration(SPLIT, split, None), self._build(name, split, params)
        # S, c_p and the grid do not depend on the budget: probe at the full budget (which
        # fits wherever a smaller one does) and keep it when the key gets the full budget
        probe = self._build(name, self._full_privacy(), params)
        calibration = calibrate(probe, declaration, self.budget)
        if calibration.key_privacy == self._full_privacy():
            return calibration, probe
        return calibration, self._build(name, calibration.key_privacy, params)

    def _auto(self) -> Tuple[str, dict]:
        """`mechanism="auto"`: the lowest MaxSE (then MeanSE) over every candidate whose
        per-key state fits `max_state_bytes_per_key`, each under the calibration it would
        actually be released with."""
        best, _ = choose_calibrated(self.steps.horizon, self.budget, self.problem.declaration,
                                    noise=self.noise_kind,
                                    max_state_bytes=self.max_state_bytes_per_key)
        return best.mechanism, dict(best.params)

    def _check_state_budget(self, name: str, mechanism) -> None:
        """Refuse a mechanism whose per-key state exceeds the budget, unless it continues an
        existing release (`release_id` given: its mechanism is fixed and its states exist, so
        refusing would only strand the release; a warning says so)."""
        size = self.state_bytes_per_key = RELEASE_TAG_BYTES + mechanism.state_bytes()
        budget = self.max_state_bytes_per_key
        if size <= budget:
            return
        condition = over_budget_condition(name, self.steps.horizon, self.noise_kind, size,
                                          budget)
        if self._given_release_id is None:
            check.fail("mechanism", condition, name)
        logging.getLogger(__name__).warning(
            "release %s continues with %s, whose state of %d B per key exceeds %s (%d B): the "
            "mechanism of a started release cannot change", self._given_release_id, name, size,
            STATE_BUDGET, budget)

    def _release_config(self) -> ReleaseConfig:
        declaration = self.problem.declaration
        name, params = self.mechanism_name, dict(self.mechanism_params)
        try:  # discrete noise too large to sample: refused now, in the user's budget
            if name == "auto":
                name, params = self._auto()
            calibration, resolved = self._calibrated(name, params)
            resolved.check_noise()
        except NoiseTooLarge as error:
            if self.part_of is not None:
                raise  # the composed release restates it in its own budget
            refuse_noise(self._whole_budget, error,  # (the gate takes a fixed share)
                         grid=getattr(self, "value_resolution", None) is not None)
        self._check_state_budget(name, resolved)
        key_privacy = calibration.key_privacy
        self.calibration = calibration
        total = {k: v for k, v in self.budget.as_dict().items() if k != "noise"}
        params = resolved.params()
        self.descriptor = {
            "format": 2, "transform": type(self).__name__, "mechanism": name, "params": params,
            "noise": resolved.noise_name,
            "noise_derivation": resolved.derivation_name(self.noise_version),
            "budget": total, "key_budget": key_privacy,
            "calibration": calibration.kind,
            "horizon": self.steps.horizon, "origin": self.steps.origin,
            "step_seconds": self.steps.size, "bounds": self.bounds(),
            "declaration": {"interval_bound": declaration.interval_bound,
                            "max_contributions": declaration.max_contributions,
                            "keys_per_unit": declaration.keys_per_unit,
                            "joint_mass": declaration.joint_mass},
            "value_scale": self.value_scale,
            "public_keys": None if self.selects else public_key_digest(self.public_keys)}
        if self.selects:  # the rule, never the keys it selects (they depend on the data)
            self.selection = self._selection(resolved)
            self.descriptor["selection"] = self.selection
        if self.gate is not None:  # (absent otherwise: the digests of releases before)
            self.descriptor["gate"] = self.gate
        if self.selects or self.gate is not None:
            total = self.budget_spent  # records state the whole guarantee; the descriptor's
            # budget stays the counting budget (plan commands calibrate with it)
        if self.postprocess is not None:  # (absent otherwise: the digests of releases before)
            self.descriptor["postprocess"] = self.postprocess
        digest = descriptor_digest(self.descriptor)
        if self.part_of is not None:
            self.release_id = self._given_release_id or UNJOINED  # until `join`
        else:
            self.release_id = new_release_id(self._given_release_id, self.private, self.secret,
                                             digest)
        return ReleaseConfig(
            steps=self.steps, mechanism=name, params=tuple(sorted(params.items())),
            key_privacy=tuple(sorted(key_privacy.items())),
            total_privacy=tuple(sorted(total.items())),
            max_contributions=declaration.max_contributions,
            interval_bound=declaration.interval_bound,
            keys_per_unit=declaration.keys_per_unit, confidence=self.confidence,
            secret=self.secret, release_delay_steps=self.release_delay_steps,
            release_id=self.release_id, descriptor_digest=digest, noise_kind=self.noise_kind,
            private=self.private, value_scale=self.value_scale, diagnostics=self.diagnostics,
            integer_values=resolved.integer_release,
            secret_fingerprint=self._secret_fingerprint, noise_version=self.noise_version,
            allowed_lateness_seconds=self.allowed_lateness_seconds,
            nonnegative=self.postprocess == "nonnegative",
            selection_threshold=self.selection["threshold"] if self.selects else None,
            key_type=self.key_type)

    def _selection(self, mechanism) -> dict:
        """The selection rule of a release without public keys (`mechanism`: the key
        mechanism as calibrated): tau from m, K and the selection delta alone."""
        declaration = self.problem.declaration
        m, bound = declaration.keys_per_unit, declaration.interval_bound
        tau = key_selection.selection_threshold(mechanism, m, bound, self.selection_delta)
        return {"threshold": tau, "delta": self.selection_delta, "max_keys_per_unit": m,
                "contribution_bound": bound, "key_type": self.key_type,
                "delta_spent": key_selection.selection_delta(mechanism, tau, m, bound)}

    def display_data(self):
        data = {"mechanism": self.config.mechanism,
                "mechanism_params": json.dumps(dict(self.config.params), sort_keys=True),
                "horizon": self.steps.horizon, "step_seconds": self.steps.size,
                "origin": self.steps.iso(self.steps.origin),
                "public_keys": "selected" if self.selects else len(self.public_keys),
                "max_contributions": self.config.max_contributions,
                "interval_bound": self.config.interval_bound,
                "keys_per_unit": self.config.keys_per_unit, "confidence": self.confidence,
                "secret": self.secret.describe(), "calibration": self.calibration.kind,
                "noise": self.descriptor["noise"],
                "noise_derivation": self.descriptor["noise_derivation"],
                "release_id": self.release_id,
                "private": self.private, "state_bytes_per_key": self.state_bytes_per_key,
                STATE_BUDGET: self.max_state_bytes_per_key}
        data.update({k: v for k, v in dict(self.config.total_privacy).items()})
        return data

    # ----- the release's interface (what the drivers read: run, schedule, report) -----
    @property
    def descriptor_digest(self) -> str:
        """The digest of `descriptor` (claims and the scheduler's ledger carry it)."""
        return self.config.descriptor_digest

    @property
    def resolved_mechanism(self) -> Tuple[Any, Any]:
        """(mechanism, params) as resolved (auto's choice): what a continuation is built with
        (`mechanism=`, `mechanism_params=`; the scheduler's ledger stores it)."""
        return self.config.mechanism, dict(self.config.params)

    @property
    def budget_spent(self) -> dict:
        """The release's whole budget (epsilon / rho / delta as resolved; a release that
        selects its keys adds its selection delta)."""
        spent = {k: v for k, v in self._whole_budget.as_dict().items() if k != "noise"}
        if self.selects:  # (epsilon, delta) as given: split, not added
            spent["delta"] = self.selection_delta if self._whole_budget.delta is None \
                else self._given_delta
        return spent

    def summary(self) -> dict:
        """What the release is, for run summaries (public, data-independent)."""
        name, params = self.resolved_mechanism
        return {"mechanism": name, "mechanism_params": params,
                "noise": self.descriptor["noise"], "budget_spent": self.budget_spent,
                "key_budget": self.descriptor["key_budget"], "gate": self.gate}

    def plan_declarations(self) -> list:
        """(label, descriptor) of each released stream, for `pipelines.plan` commands."""
        return [("", self.descriptor)]

    def join(self, release_id: str) -> None:
        """A part takes its composite's release id (`part_of`; its noise is bound to the id
        and to its own descriptor, so two parts never share noise)."""
        if self.part_of is None:
            check.fail("join", "called on a part of a composed release", type(self).__name__)
        self.release_id = check_release_id(release_id)
        self.config = dataclasses.replace(self.config, release_id=release_id)

    def _claim(self):
        """One transform object is one release: applying it twice would release two inputs with
        the same noise (their difference would be exact)."""
        if self._expanded:
            check.fail("transform", "applied once (construct a new transform for each release; "
                                    f"release {self.release_id} was already applied)",
                       "a second application")
        self._expanded = True

    def resume(self, window: StepWindow, unit_states=None, key_states=None, claims=None):
        """Release only the steps of `window`, continuing from the previous run's unit and key
        states (PCollections the scheduler reads from its checkpoint; unbounded input: from a
        streaming checkpoint, `transforms.stream_checkpoint`, with `checkpoint=`).

        A continuation is proven, not asserted: the key states must be this release's own,
        sealed at step `window.first` (`RecordMaker.restore`), the unit states must match the
        census the run before sealed (`transforms.census`), and the job claims the window once,
        at its start and before any output, in `claims` (a folder, local or gs://; the one the
        release was constructed with when not given): `<claims>/<release id>/from-<first>.json`
        (`transforms.claims`). A window that was claimed before, or that anything after it
        was recorded for, is refused, whoever replays it."""
        if not isinstance(window, StepWindow) or not (
                0 <= window.first < window.stop <= self.steps.horizon):
            check.fail("window", f"a StepWindow inside [0, {self.steps.horizon})", window)
        if window.first > 0 and (unit_states is None or key_states is None):
            check.fail("key_states", "given when the window starts after step 0 (the keys' "
                                     "mechanism states continue the release)", None)
        self._window, self._resume_units, self._resume_keys = window, unit_states, key_states
        if claims is not None:
            given = WindowClaims(claims)
            if self._given_release_id is None and self.private:
                check.fail("claims", "given when the release is constructed (a new release "
                                     "claims its steps where it was built to: a copy of the "
                                     "transform resumed with other claims would publish the "
                                     "same noise twice)", claims)
            if isinstance(self._claims, WindowClaims) and self._claims.folder != given.folder:
                check.fail("claims", f"the folder the release was constructed with "
                                     f"({self._claims.folder})", claims)
            self._claims = given
        return self

    def claimed_by(self, passed):
        """For the drivers that claim and commit a release themselves (`pipelines.run`: the
        release; `pipelines.schedule`: its checkpoint folder, ordered by its commit markers):
        every output of the transform waits for `passed`, the singleton of their claim's
        `guard` (`transforms.claims.guard` of a claim; any other PCollection is refused),
        instead of a claims folder."""
        if claim_of(passed) is None:
            check.fail("claimed_by", "the singleton of a claim's guard (transforms.claims.guard "
                                     "of a ClaimOnce: only the drivers that claim and commit "
                                     "themselves use it)", passed)
        self._claims = Claimed(passed)
        return self

    def _claim_window(self, pipeline, window: StepWindow):
        """The singleton that exists once the window is claimed (`transforms.claims`); a
        resumed window is claimed only after the given unit states matched the sealed census of
        the run before (`transforms.census`)."""
        claims = self._claims
        claim = ClaimOnce(claims.path(self.release_id, window.first),
                          {"release_id": self.release_id, "steps": [window.first, window.stop],
                           "descriptor_digest": self.descriptor_digest},
                          f"steps {window.first} -> {window.stop} of release {self.release_id}",
                          precondition=NothingLater(claims, self.release_id, window.first))
        if window.first == 0:
            return guard(pipeline, claim, "ClaimWindow")
        checked = census_of(self._census_states(self._resume_units, self._resume_keys, "Given"),
                            self.config, window.first, "GivenUnitCensus") \
            | "CheckUnitCensus" >> beam.Map(CheckCensus(
                self.config, claims.folder, window.first,
                "unit and key state" if self.selects else "unit state"))
        passed = checked | "ClaimWindow" >> beam.Map(lambda _: claim())
        passed.dp_claim = claim  # exists only once claimed, after the census check (`guard`)
        return passed

    def _census_states(self, unit_states, key_states, label: str):
        """What the census seals: the unit states; selecting keys, the key states too (a
        public key's missing state fails its release, but a selected key missing from the
        given states would restart as new: its published total and selection lost)."""
        if not self.selects:
            return unit_states
        return ((unit_states | f"{label}Units" >> beam.Map(lambda pair: ("unit", pair)),
                 key_states | f"{label}Keys" >> beam.Map(lambda pair: ("key", pair)))
                | f"{label}States" >> beam.Flatten())

    def _check_continuation(self, window: StepWindow, pipeline=None) -> None:
        """A private release is claimed once in durable storage (`claims=`, or a driver's own
        claim: `claimed_by`): without it, a job graph executed twice (a pipeline run again, a
        copied transform, a classic template launched twice) would publish the same noise on
        two inputs. A given private `release_id=` only continues a release, after step 0
        (steps from 0 are released once, by the job that drew the id)."""
        if not self.private:
            return
        if self._claims is None:
            if self._given_release_id is not None:
                check.fail("release_id", "given only to continue a private release through "
                                         "`.resume(window, unit_states, key_states, "
                                         "claims=folder)` (which claims its steps once: the "
                                         "same id on other data would publish the same noise "
                                         "twice), or with insecure=True",
                           self._given_release_id)
            check.fail("claims", "a folder (local or gs://) where a private release claims its "
                                 "steps once, e.g. ContinualCount(..., claims=\"gs://bucket/"
                                 "claims\") (a job graph executed twice would otherwise publish "
                                 "the same noise on two inputs); or insecure=True for demos",
                       None)
        if isinstance(self._claims, WindowClaims) and "://" not in self._claims.folder and \
                remote_runner(pipeline):
            check.fail("claims", "a gs:// folder with a remote runner (a local folder is one "
                                 "machine's: every worker would claim on its own disk)",
                       self._claims.folder)
        if self._given_release_id is not None and window.first == 0:
            check.fail("window", "a continuation after step 0 for a given private "
                                 "`release_id` (steps from 0 are released once, by the run "
                                 "that drew the id: a new release needs no id)", window)

    def expand(self, events):
        self._claim()
        window = self._window or StepWindow.whole(self.steps)
        if self.part_of is not None and self.release_id == UNJOINED:
            check.fail("transform", "a part applied by its composite (a part takes its release "
                                    "id from it)", type(self).__name__)
        self._check_continuation(window, events.pipeline)
        passed = None  # the singleton of the window's claim: nothing leaves before it
        if isinstance(self._claims, Claimed):  # claimed by the caller, for all its writes
            passed = self._claims.passed
        elif self._claims is not None:
            passed = self._claim_window(events.pipeline, window)
        # timestamped elements, or EventBatches (`transforms.arrow_input`, bounded input)
        released = self.release(events, window, passed)
        # records: one per public key and step; bounded: the new unit states (unit, state)
        # and key states (key, (sealed bytes, halt step))
        dead = [d for d in released.dead_letters if d is not None]
        records, unit_states, key_states = (released.records, released.unit_states,
                                            released.key_states)
        if passed is not None:
            records = guarded(records, passed, "ClaimedRecords")
            if unit_states is not None:
                unit_states = guarded(unit_states, passed, "ClaimedUnitStates")
            if key_states is not None:
                key_states = guarded(key_states, passed, "ClaimedKeyStates")
        if isinstance(self._claims, WindowClaims) and unit_states is not None and \
                events.is_bounded:
            _ = census_of(self._census_states(unit_states, key_states, "Sealed"), self.config,
                          window.stop, "UnitCensus") \
                | "SealUnitCensus" >> beam.Map(WriteCensus(self.config, self._claims.folder,
                                                            window.stop))
        return ContinualResult(records, dead | "DeadLetters" >> beam.Flatten(),
                               unit_states, key_states)

    def release(self, events, window: StepWindow, passed=None) -> Released:
        """The release of `window` (unguarded: `expand` guards it with `passed`, the claim's
        singleton, or None when nothing claims): one of the two pipelines, by the input's
        boundedness."""
        if events.is_bounded:
            if self.checkpoint is not None:
                check.fail("checkpoint", "None for bounded input (a batch release's states "
                                         "are its outputs: unit_states, key_states)",
                           self.checkpoint)
            return release_bounded(events, self.problem, self.config, self.public_keys, window,
                                   self._resume_units, self._resume_keys, self.diagnostics)
        if self.release_delay_steps < 1:
            check.fail("release_delay_steps", "an integer >= 1 on unbounded input (a step's "
                                              "totals reach the release at the step's end, "
                                              "when a delay of 0 releases it: every total "
                                              "would be late)", self.release_delay_steps)
        if self.checkpoint is not None and passed is None:
            check.fail("checkpoint", "used with a claimed release (claims= or claimed_by: "
                                     "its unit log is written only by the execution that "
                                     "claimed it)", self.checkpoint)
        return release_streaming(events, self.problem, self.config, self.public_keys, window,
                                 self._resume_units, self._resume_keys, self.diagnostics,
                                 self.checkpoint and (self.checkpoint, self.execution, passed))


LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner",
                 "SwitchingDirectRunner", "PrismRunner", "TestDirectRunner")


def remote_runner(pipeline) -> bool:
    """Whether `pipeline` runs its workers elsewhere (Dataflow, a portable runner): its local
    paths are not the driver's."""
    if pipeline is None:
        return False
    runner = type(getattr(pipeline, "runner", None)).__name__
    return runner not in LOCAL_RUNNERS + ("NoneType",)
