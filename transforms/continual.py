"""What every continual-release transform shares (`ContinualBase`; the statistics are in
`transforms.statistics`): it plans the release from its arguments (`release_plan`: Beam-free),
binds the plan to its secret and release id, claims it, and runs one of the two pipelines (`transforms.bounded` for bounded input,
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
import secrets
import time
from typing import Any, NamedTuple, Optional

import apache_beam as beam

from transforms import validation as check
from transforms.budget_ledger import BudgetSpec, Ledger, ledger_spend
from transforms.census import CheckCensus, WriteCensus, census_of
from transforms.claims import (ClaimOnce, Claimed, NothingLater, WindowClaims, claim_of,
                               guard, guarded)
from transforms.mechanisms.choose import STATE_BUDGET
from transforms.release import NoNoise, check_secret
from transforms.release_plan import ReleasePlan, ReleaseSpec, plan_release
from transforms.secret import SecretRef
from transforms.bounded import release_bounded
from transforms.messages import Released, StepWindow
from transforms.streaming import release_streaming


class ContinualResult(NamedTuple):
    """A NamedTuple, so that Beam registers the PCollections as the transform's outputs."""
    records: Any
    dead_letters: Any
    unit_states: Any = None  # bounded input: (unit, state) after this run
    key_states: Any = None   # bounded input: (key, (sealed mechanism state, halt step))


class ContinualBase(beam.PTransform):
    """A release's Beam shell: its plan (`release_plan.plan_release` of the spec its keyword
    arguments make), bound to a secret and a release id, and the pipeline that runs it."""

    statistic = ""  # its registry row (`transforms.registry.SPECS`)

    def __init__(self, *, secret: Optional[SecretRef] = None, seed: Optional[int] = None,
                 noise_source=None, insecure: bool = False,
                 secret_fingerprint: Optional[str] = None, claims: Optional[str] = None,
                 checkpoint: Optional[str] = None, label: Optional[str] = None,
                 spec: Optional[ReleaseSpec] = None, ledger: Optional[BudgetSpec] = None,
                 **choices):
        """`choices`: a `ReleaseSpec`'s fields and the statistic's bounds (what is released),
        or `spec`, the spec itself; the rest says how it runs: the secret (`secret`, or for
        insecure demos and tests `seed` / `noise_source`), where a private release claims its
        steps (`claims`), on unbounded input where it checkpoints (`checkpoint`), and the
        source's budget ledger it is charged to when applied (`ledger`, with `claims`:
        `transforms.budget_ledger`; refused there when it would exceed the limit)."""
        super().__init__(label)
        if spec is None:  # (a subclass is its own release: its name is in the descriptor)
            spec = ReleaseSpec.of(self.statistic, name=type(self).__name__, **choices)
        elif choices or spec.statistic != self.statistic:
            check.fail("spec", f"the only release argument, of statistic {self.statistic!r}",
                       spec.statistic if not choices else sorted(choices))
        self._bind(plan_release(spec), secret, seed, noise_source, insecure,
                   secret_fingerprint, claims, checkpoint)
        if ledger is not None and (claims is None or not isinstance(ledger, BudgetSpec)):
            check.fail("ledger", "a BudgetSpec, with `claims` (a private release's folder)",
                       ledger)
        self.ledger, self.ledger_state = ledger, None

    def _bind(self, plan: ReleasePlan, secret, seed, noise_source, insecure,
              secret_fingerprint, claims, checkpoint, release_id: Optional[str] = None):
        """The plan bound to its secret and release id (`release_id`: a part's, its
        composite's)."""
        self.plan = plan
        spec = plan.spec
        self.secret_arguments = (secret, seed, noise_source)  # as given (a mean's parts too)
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
        check_secret(self.secret)
        self.private = not public
        self._expanded = False
        self._window: Optional[StepWindow] = None
        self._resume_units = self._resume_keys = None
        # where a private release claims its steps once (`transforms.claims`)
        self._claims = None if claims is None else WindowClaims(claims)
        # unbounded input: the folder of the release's checkpoints (`stream_checkpoint`), and
        # this job graph's execution id there (its unit log folder, named in its step claims)
        self.checkpoint = checkpoint
        if checkpoint is not None and spec.selects:
            check.fail("checkpoint", "None for a release that selects its keys (a checkpointed "
                                     "streaming release publishes each step once every public "
                                     "key's record is in: it needs public_keys)", checkpoint)
        self.execution = secrets.token_hex(8) if checkpoint is not None else None
        self.release_id = release_id or plan.release_id(self.secret, self.private)
        self.config = plan.release_config(self.secret, self.private, self.release_id,
                                          secret_fingerprint)

    # ----- the plan, as the drivers and tests read it -----
    steps = property(lambda self: self.plan.spec.steps)
    selects = property(lambda self: self.plan.selects)
    public_keys = property(lambda self: None if self.plan.selects
                           else list(self.plan.spec.public_keys))
    key_type = property(lambda self: self.plan.spec.key_type)
    diagnostics = property(lambda self: self.plan.spec.diagnostics)
    noise_kind = property(lambda self: self.plan.spec.noise)
    noise_version = property(lambda self: self.plan.spec.noise_version)
    confidence = property(lambda self: self.plan.spec.confidence)
    release_delay_steps = property(lambda self: self.plan.spec.release_delay_steps)
    max_state_bytes_per_key = property(lambda self: self.plan.spec.max_state_bytes_per_key)
    problem = property(lambda self: self.plan.truncation.problem)
    value_scale = property(lambda self: self.plan.truncation.value_scale)
    descriptor = property(lambda self: self.plan.descriptor)
    calibration = property(lambda self: self.plan.calibration)
    budget = property(lambda self: self.plan.budget)
    gate = property(lambda self: self.plan.gate)
    selection = property(lambda self: self.plan.selection)
    selection_delta = property(lambda self: self.plan.selection_delta)
    state_bytes_per_key = property(lambda self: self.plan.state_bytes_per_key)
    descriptor_digest = property(lambda self: self.plan.digest)
    resolved_mechanism = property(lambda self: self.plan.resolved_mechanism)
    budget_spent = property(lambda self: self.plan.budget_spent)

    @property
    def noisy(self) -> bool:
        """False for the operator's exact totals (`release.NoNoise`: no noise at all)."""
        return not isinstance(self.secret, NoNoise)

    def summary(self) -> dict:
        """What the release is, for run summaries (public, data-independent)."""
        return self.plan.summary()

    def plan_declarations(self) -> list:
        """(label, descriptor) of each released stream, for `pipelines.plan` commands."""
        return self.plan.plan_declarations()

    def display_data(self):
        spec, config = self.plan.spec, self.config
        data = {"mechanism": config.mechanism,
                "mechanism_params": json.dumps(dict(config.params), sort_keys=True),
                "horizon": spec.steps.shown_horizon, "step_seconds": spec.steps.size,
                "origin": spec.steps.iso(spec.steps.origin),
                "public_keys": "selected" if self.selects else len(spec.public_keys),
                "max_contributions": config.max_contributions,
                "interval_bound": config.interval_bound,
                "keys_per_unit": config.keys_per_unit, "confidence": spec.confidence,
                "secret": self.secret.describe(), "calibration": self.calibration.kind,
                "noise": self.descriptor["noise"],
                "noise_derivation": self.descriptor["noise_derivation"],
                "release_id": self.release_id,
                "private": self.private, "state_bytes_per_key": self.state_bytes_per_key,
                STATE_BUDGET: spec.max_state_bytes_per_key}
        data.update({k: v for k, v in dict(config.total_privacy).items()})
        return data

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
            if self.plan.spec.release_id is None and self.private:
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
            if self.plan.spec.release_id is not None:
                check.fail("release_id", "given only to continue a private release through "
                                         "`.resume(window, unit_states, key_states, "
                                         "claims=folder)` (which claims its steps once: the "
                                         "same id on other data would publish the same noise "
                                         "twice), or with insecure=True",
                           self.plan.spec.release_id)
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
        if self.plan.spec.release_id is not None and window.first == 0:
            check.fail("window", "a continuation after step 0 for a given private "
                                 "`release_id` (steps from 0 are released once, by the run "
                                 "that drew the id: a new release needs no id)", window)

    def expand(self, events):
        self._claim()
        if self._window is None and self.steps.unbounded and \
                events.is_bounded is not False:
            check.fail("window", "given with `resume` for steps with no horizon on bounded "
                                 "input (the whole reach would be released now, every step "
                                 "after the data's as noise)", None)
        window = self._window or StepWindow.whole(self.steps)
        self._check_continuation(window, events.pipeline)
        if getattr(self, "ledger", None) is not None:  # before anything is claimed (a mean's
            now = time.time()                           # parts are charged as the mean)
            self.ledger_state = Ledger(self.ledger, self.secret, now).charge(
                self.release_id, type(self).__name__, self.statistic,
                ledger_spend(self.plan.budget_spent, self.plan.selects), now)
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


PORTABLE_RUNNERS = ("FlinkRunner", "SparkRunner", "PortableRunner", "PrismRunner")
LOOPBACK = ("LOOPBACK", "beam:env:loopback:v1")  # Beam's name and URN of the environment


def workers_here(runner: str, environment_type=None) -> bool:
    """Whether `runner`'s SDK workers are this machine's processes, reading and writing its
    paths: Beam's in-process runners, and a portable runner (Prism too) whose environment is
    LOOPBACK (the launching process is its SDK harness, wherever the engine runs; Prism's
    default)."""
    if runner in PORTABLE_RUNNERS:
        return environment_type in LOOPBACK or (runner == "PrismRunner"
                                                and not environment_type)
    return runner in LOCAL_RUNNERS + ("NoneType",)


def remote_runner(pipeline) -> bool:
    """Whether `pipeline` runs its workers elsewhere (Dataflow, a portable runner's workers):
    its local paths are not the driver's."""
    if pipeline is None:
        return False
    from apache_beam.options.pipeline_options import PortableOptions
    runner = type(getattr(pipeline, "runner", None)).__name__
    options = getattr(pipeline, "_options", None)
    environment = options.view_as(PortableOptions).environment_type if options else None
    return not workers_here(runner, environment)
