"""Job configs (YAML): one validated, immutable description of a continual-release job.

Every error names the field and the allowed values, in the project's one shape:
"`input.format` must be one of 'jsonl', 'csv', 'parquet'; got 'xml'." Unknown fields are errors.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import yaml

from pipelines.config_steps import (MAX_HORIZON, TIME_RANGE, StepsSpec,  # noqa: F401
                                    parse_time, steps_spec)  # (re-exported)
from transforms.budget_ledger import BudgetSpec, spec_of as budget_spec_of
from transforms import registry
from transforms.accountant import MAX_GATE_SHARE
from transforms.secret import SecretRef, check_gcp_secret
from transforms.release import KEY_TYPES
from transforms.mechanisms import NAMES
from transforms.mechanisms.choose import DEFAULT_MAX_STATE_BYTES_PER_KEY, MIN_STATE_BYTES_PER_KEY
from transforms.mechanisms.privacy import check_small_delta
from transforms.validation import ValidationError as ConfigError  # noqa: F401 (re-export)
from transforms import validation as check
from transforms.validation import fail

FORMATS = ("jsonl", "csv", "parquet")
OUTPUT_FORMATS = ("parquet", "jsonl", "csv")
REQUIRED = registry.REQUIRED
ID_TYPES = ("id", "str", "int")   # id: a non-empty str or an int, as the input holds it
MAX_BOUND = 1 << 31
DEFAULT_GATE_SHARE = 0.02  # the input gate's share of a release's budget (`pipelines.gate`)
TOP = ("job", "transform", "input", "steps", "privacy", "bounds", "public_keys",
       "public_keys_file", "mechanism", "confidence", "secret", "output", "postprocess",
       "budget")
DEMO_PREFIX = "demo:"
DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_data")
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def _section(raw, name, allowed, required=()):
    if not isinstance(raw, dict):
        fail(name, "a mapping", raw)
    for key in raw:
        if key not in allowed:
            fail(f"{name}.{key}" if name else key,
                 "a known field (one of " + ", ".join(allowed) + ")", "unknown field")
    for key in required:
        if raw.get(key) is None:
            fail(f"{name}.{key}" if name else key, "given", None)
    return raw


def _fraction(source: dict) -> float:
    value = source.get("max_dead_letter_fraction", 0.5)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0.0 <= value <= 1.0):
        fail("input.max_dead_letter_fraction", "a number in [0, 1]", value)
    return float(value)


def resolve_path(path: str) -> str:
    if path.startswith(DEMO_PREFIX):
        return os.path.join(DEMO_DIR, path[len(DEMO_PREFIX):])
    return path


UNBOUNDED_KINDS = ("pubsub", "kafka")
# iso: ISO-8601 text (or epoch seconds as numbers); seconds / milliseconds: epoch numbers
TIMESTAMP_FORMATS = ("iso", "seconds", "milliseconds")
PUBSUB_SETTINGS = ("subscription", "timestamp_attribute", "id_attribute")
KAFKA_SETTINGS = ("bootstrap_servers", "topic")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Where the events come from and how a record is read. `kind: files` (bounded: `path`,
    one batch release), `pubsub` (unbounded: `subscription`, one JSON record per message;
    `timestamp_attribute`, optional, must agree with the record's time; `id_attribute`
    deduplicates on Dataflow) or `kafka` (unbounded, on Flink: `bootstrap_servers` and `topic`,
    one JSON record per Kafka record value; the record's Kafka timestamp plays Pub/Sub's
    publish time). `max_dead_letter_fraction` (files: `pipelines.gate`): a run
    whose input records are more than this fraction dead letters publishes nothing."""
    path: str
    format: str
    fields: Dict[str, str]            # role -> column
    timestamp_format: str = "iso"
    types: Dict[str, str] = dataclasses.field(default_factory=dict)  # role -> declared type
    kind: str = "files"
    subscription: Optional[str] = None
    timestamp_attribute: Optional[str] = None
    id_attribute: Optional[str] = None
    max_dead_letter_fraction: float = 0.5
    bootstrap_servers: Optional[str] = None
    topic: Optional[str] = None
    # the folder the config was read from: a relative `path` is read from the current folder,
    # and an error says when the config's folder has it instead (messages only)
    config_folder: Optional[str] = dataclasses.field(default=None, compare=False)

    @property
    def unbounded(self) -> bool:
        return self.kind in UNBOUNDED_KINDS

    @property
    def source_name(self) -> str:
        """Where an unbounded input's events come from, for messages."""
        return self.subscription if self.kind == "pubsub" else \
            f"kafka://{self.bootstrap_servers}/{self.topic}"

    def type_of(self, role: str) -> str:
        """The declared type, else: timestamp, float for numeric roles, str for `op`, else id."""
        if role in self.types:
            return self.types[role]
        return {"timestamp": "timestamp", "value": "float", "op": "str"}.get(role, "id")


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
    """The release's total budget (exactly what the transform takes) and its noise kind."""
    epsilon: Optional[float] = None
    rho: Optional[float] = None
    delta: Optional[float] = None
    noise: str = "discrete"
    selection_delta: Optional[float] = None  # no public keys: the delta selection spends
    gate_share: float = DEFAULT_GATE_SHARE  # the input gate's share (`pipelines.gate`)
    allow_large_delta: bool = False  # delta or selection_delta above 1e-3 (MAX_DELTA) taken

    @property
    def budget(self) -> Dict[str, Any]:
        """epsilon / rho / delta (/ selection_delta) as given, as the transform's arguments
        (the transform resolves them to a PrivacyBudget and, without public keys, the
        selection's delta; allow_large_delta=True when the config opts in)."""
        given = {k: v for k, v in (("epsilon", self.epsilon), ("rho", self.rho),
                                   ("delta", self.delta),
                                   ("selection_delta", self.selection_delta)) if v is not None}
        if self.allow_large_delta:
            given["allow_large_delta"] = True
        return given


@dataclasses.dataclass(frozen=True)
class MechanismSpec:
    name: str = "auto"
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    # the per-key state budget (bytes): auto skips mechanisms over it, a configured one over it
    # is refused. Operational, not part of the release (not in the ledger's fingerprint).
    max_state_bytes_per_key: int = DEFAULT_MAX_STATE_BYTES_PER_KEY


@dataclasses.dataclass(frozen=True)
class SecretSpec:
    """Where the noise secret comes from: env, path, a Google Secret Manager version
    (gcp_secret), a seed (with insecure), the scheduler's stored secret, or nothing (a fresh
    secret per local run)."""
    env: Optional[str] = None
    path: Optional[str] = None
    seed: Optional[int] = None
    stored: bool = False
    insecure: bool = False            # a public seed: records are marked private: false
    gcp_secret: Optional[str] = None  # projects/P/secrets/S/versions/V, read on the worker

    @property
    def configured(self) -> bool:
        return (self.env is not None or self.path is not None or self.seed is not None
                or self.gcp_secret is not None)

    def ref(self) -> SecretRef:
        """The configured secret (env, path, gcp_secret or seed)."""
        return SecretRef(env=self.env, path=self.path, seed=self.seed,
                         gcp_secret=self.gcp_secret, insecure=self.insecure)


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    path: str
    formats: Tuple[str, ...] = ("parquet", "jsonl")


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """A validated job: nested, immutable, built once by `validate`."""
    job: str
    transform: str
    input: InputSpec
    steps: StepsSpec
    privacy: PrivacySpec
    bounds: Dict[str, Any]            # the transform's registry bounds, defaults filled in
    public_keys: Optional[List[Any]]  # None: keys selected privately (docs/selection.md)
    mechanism: MechanismSpec
    confidence: float
    secret: SecretSpec
    output: OutputSpec
    postprocess: Optional[str] = None  # "nonnegative": running totals clamped at 0
    budget: Optional[BudgetSpec] = None  # the source's ledger and limit (`pipelines.budget`)

    @property
    def gate_share(self) -> Optional[float]:
        """The budget share of the private input gate (`pipelines.gate`), or None when the
        job has none: streaming input (no gate), a declared release (its records name no
        unit), or input.max_dead_letter_fraction 1 (the operator turned it off)."""
        if self.input.unbounded or not registry.SPECS[self.transform].unit_roles or \
                self.input.max_dead_letter_fraction >= 1.0:
            return None
        return self.privacy.gate_share

    @property
    def operator_path(self) -> str:
        """Operator-only folder: dead letters and exact counts (not private)."""
        return os.path.join(self.output.path, f"{self.job}-operator")

    @property
    def public_path(self) -> str:
        return os.path.join(self.output.path, self.job)

    def replace(self, **changes) -> "JobConfig":
        """A copy with some sections replaced (e.g. output=OutputSpec(...))."""
        return dataclasses.replace(self, **changes)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML without silently overwritten keys (a duplicate key is an error)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                fail("config", "free of duplicate keys", key)
            seen.add(key)
        return super().construct_mapping(node, deep)


def config_path(name: str) -> str:
    """`demo:<job>` names a bundled config (installed with the package); anything else is a
    local path or a Beam filesystem path (gs://...)."""
    if name.startswith(DEMO_PREFIX):
        job = name[len(DEMO_PREFIX):]
        path = os.path.join(CONFIG_DIR, job + ".yaml")
        if not job or os.path.basename(job) != job or not os.path.isfile(path):
            fail("config", "a path or demo:<name> with a bundled name (one of "
                           + ", ".join(bundled_configs()) + ")", name)
        return path
    return name


def bundled_configs() -> List[str]:
    return sorted(n[:-5] for n in os.listdir(CONFIG_DIR) if n.endswith(".yaml"))


def _read_text(path: str) -> str:
    if "://" in path:   # gs:// and other Beam filesystems (e.g. a Flex Template parameter)
        from apache_beam.io.filesystems import FileSystems
        try:
            with FileSystems.open(path) as handle:
                return handle.read().decode("utf-8")
        except (OSError, IOError) as error:
            fail("config", "an existing YAML file", f"{path} ({type(error).__name__})")
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def load(name: str) -> JobConfig:
    """Load and validate a config: a path, a gs:// path or `demo:<job>` (bundled)."""
    path = config_path(name)
    try:
        raw = yaml.load(_read_text(path), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        fail("config", "an existing YAML file", name)
    except UnicodeDecodeError:
        fail("config", "a UTF-8 text file", name)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f"{name}, line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        fail("config", "valid YAML", f"{where}{problem}")
    base_dir = path.rsplit("/", 1)[0] if "://" in path else os.path.dirname(os.path.abspath(path))
    return validate(raw, base_dir=base_dir)


def validate(raw, base_dir: str = ".") -> JobConfig:
    raw = _section(raw, "", TOP, ("job", "transform", "input", "steps", "privacy", "output"))
    job = raw["job"]
    if not isinstance(job, str) or not job.replace("-", "").replace("_", "").isalnum():
        fail("job", "a name of letters, digits, '-' and '_'", job)
    if job.endswith(("-operator", "-scheduled")):
        fail("job", "a name not ending in '-operator' or '-scheduled' (reserved for the "
                    "operator-only and scheduled folders)", job)
    transform = raw["transform"]
    if transform not in registry.SPECS:
        fail("transform", "one of " + ", ".join(repr(t) for t in registry.SPECS), transform)

    source = _section(raw["input"], "input", ("kind", "path", "format", "fields", "types",
                                              "timestamp_format", "subscription",
                                              "timestamp_attribute", "id_attribute",
                                              "max_dead_letter_fraction", *KAFKA_SETTINGS),
                      ("fields",))
    source_kind = source.get("kind", "files")
    if source_kind not in ("files", *UNBOUNDED_KINDS):
        fail("input.kind", "one of 'files', 'pubsub', 'kafka'", source_kind)
    unbounded = source_kind in UNBOUNDED_KINDS
    for kind, names, what in (("pubsub", PUBSUB_SETTINGS, "a Pub/Sub setting"),
                              ("kafka", KAFKA_SETTINGS, "a Kafka setting")):
        for name in names:
            if name in source and source_kind != kind:
                fail(f"input.{name}", f"absent for input.kind {source_kind!r} ({what})",
                     source[name])
    stream = _pubsub_input(source) if source_kind == "pubsub" else \
        _kafka_input(source) if source_kind == "kafka" else {}
    if source_kind == "files":
        if not isinstance(source.get("path"), str) or not source["path"]:
            fail("input.path", "a non-empty path (or demo:<file>)", source.get("path"))
        stream["max_dead_letter_fraction"] = _fraction(source)
    elif "max_dead_letter_fraction" in source:
        fail("input.max_dead_letter_fraction", f"absent for input.kind {source_kind!r} (a "
                                               f"streaming job publishes step by step)",
             source["max_dead_letter_fraction"])
    default_format = "jsonl" if unbounded else \
        os.path.splitext(source["path"])[1].lstrip(".")
    fmt = source.get("format", default_format)
    if fmt not in FORMATS:
        fail("input.format", "one of " + ", ".join(repr(f) for f in FORMATS), fmt)
    if unbounded and fmt != "jsonl":
        fail("input.format", f"'jsonl' for input.kind {source_kind!r} (one JSON object per "
                             f"message)", fmt)
    fields = _section(source["fields"], "input.fields", registry.SPECS[transform].roles,
                      registry.SPECS[transform].roles)
    for role, column in fields.items():
        if not isinstance(column, str) or not column:
            fail(f"input.fields.{role}", "a column name", column)
    timestamp_format = source.get("timestamp_format", "iso")
    if timestamp_format not in TIMESTAMP_FORMATS:
        fail("input.timestamp_format", "one of 'iso', 'seconds', 'milliseconds'",
             timestamp_format)
    types = dict(_section(source.get("types") or {}, "input.types",
                          registry.SPECS[transform].roles))
    for role, kind in types.items():
        allowed = ("timestamp",) if role == "timestamp" else (
            ("float", "int") if role in registry.SPECS[transform].numeric else ID_TYPES)
        if kind not in allowed:
            fail(f"input.types.{role}", "one of " + ", ".join(repr(a) for a in allowed), kind)

    steps = _section(raw["steps"], "steps", ("origin", "size_seconds", "horizon",
                                             "release_delay_steps", "allowed_lateness_seconds"),
                     ("origin", "size_seconds", "horizon"))
    steps = steps_spec(steps, unbounded)

    privacy = dict(_section(raw["privacy"], "privacy", ("epsilon", "rho", "delta", "noise",
                                                         "selection_delta", "gate_share",
                                                         "allow_large_delta")))
    noise = privacy.pop("noise", "discrete")
    allow_large_delta = privacy.pop("allow_large_delta", False)
    if allow_large_delta not in (True, False):
        fail("privacy.allow_large_delta", "true or false", allow_large_delta)
    gate_share = privacy.pop("gate_share", DEFAULT_GATE_SHARE)
    if isinstance(gate_share, bool) or not isinstance(gate_share, (int, float)) or not (
            0 < gate_share <= MAX_GATE_SHARE):
        fail("privacy.gate_share", f"a number in (0, {MAX_GATE_SHARE:g}] (the input gate's "
                                   f"share of the budget; input.max_dead_letter_fraction 1 "
                                   f"turns the gate off)", gate_share)
    if noise not in ("discrete", "float"):
        fail("privacy.noise", "one of 'discrete' (exact integer noise, the default), 'float' "
                              "(continuous float64 noise, not safe against floating-point "
                              "attacks)", noise)
    if ("epsilon" in privacy) == ("rho" in privacy):
        fail("privacy", "exactly one of epsilon or rho (with an optional delta for epsilon)",
             privacy)
    for name, value in privacy.items():
        check.positive_finite(f"privacy.{name}", value)
    # absent, not null: `public_keys:` left empty is an error, not a release selecting keys
    selects = registry.SPECS[transform].single_key is None and \
        "public_keys" not in raw and "public_keys_file" not in raw
    if "delta" in privacy and (("rho" in privacy and not selects) or not privacy["delta"] < 1):
        fail("privacy.delta", "a number in (0, 1) given with epsilon (with rho: only when "
                              "public_keys are not given, as the selection's delta)",
             privacy["delta"])
    if selects and registry.can(transform, registry.SELECT_KEYS) and \
            "selection_delta" not in privacy and (
            "delta" not in privacy or "rho" in privacy) and not ("rho" in privacy and
                                                                 "delta" in privacy):
        fail("public_keys", "given, either as a list or as public_keys_file, or, to select "
                            "keys privately, privacy.selection_delta (with epsilon or rho; with "
                            "epsilon and delta, half of delta by default)", None)
    if "selection_delta" in privacy and not (selects and privacy["selection_delta"] < 1):
        fail("privacy.selection_delta", "a number in (0, 1), given only when public_keys are "
                                        "not (the delta private key selection spends)",
             privacy["selection_delta"])
    for name in ("delta", "selection_delta"):
        check_small_delta(f"privacy.{name}", privacy.get(name), bool(allow_large_delta),
                          "privacy.allow_large_delta is true")

    allowed_bounds = registry.SPECS[transform].bounds
    bounds_raw = _section(raw.get("bounds") or {}, "bounds", tuple(allowed_bounds),
                          tuple(k for k, v in allowed_bounds.items() if v == REQUIRED))
    bounds = {**{k: v for k, v in allowed_bounds.items() if v not in (None, REQUIRED)},
              **bounds_raw}
    for name, value in bounds.items():
        if name == "semantics":
            if value not in ("count", "set"):
                fail("bounds.semantics", "one of 'count', 'set'", value)
        elif name in ("max_value", "value_resolution"):
            if value is not None:
                check.positive_finite(f"bounds.{name}", value)
        elif name == "min_value":  # (0 or null is the default: dropped below, one release)
            if value is not None:
                check.finite_number("bounds.min_value", value)
                if not value < check.positive_finite("bounds.max_value", bounds["max_value"]):
                    fail("bounds.min_value", f"below max_value ({bounds['max_value']})", value)
                if value < -1e15:
                    fail("bounds.min_value", ">= -1e15 (sums stay exact in float64)", value)
        elif name == "sum_share":
            if value is not None and not 0 < check.positive_finite("bounds.sum_share", value) < 1:
                fail("bounds.sum_share", "a number in (0, 1) (the sum part's share of the "
                                         "budget)", value)
        elif value is not None:
            check.integer_at_least(f"bounds.{name}", value, 1)
            if value > MAX_BOUND:  # sensitivities are computed exactly in integers
                fail(f"bounds.{name}", f"<= {MAX_BOUND} (2^31)", value)
        if name == "max_value" and value is not None and value > 1e15:
            fail("bounds.max_value", "<= 1e15 (sums stay exact in float64)", value)

    if "min_value" in bounds and not bounds["min_value"]:
        del bounds["min_value"]  # 0, -0.0 and null are the default: the same release as absent
    single_key = registry.SPECS[transform].single_key
    if single_key is not None:
        if raw.get("public_keys") or raw.get("public_keys_file"):
            fail("public_keys", f"absent for {transform} (its one key is {single_key!r})",
                 raw.get("public_keys") or raw.get("public_keys_file"))
        keys = [single_key]
    elif selects:  # keys selected privately (docs/selection.md)
        if not registry.can(transform, registry.SELECT_KEYS):
            fail("public_keys", f"given for {transform} (keys are selected privately only by "
                                f"{', '.join(registry.able(registry.SELECT_KEYS))})", None)
        if unbounded:
            fail("public_keys", f"given for input.kind {source_kind!r} (a streaming job "
                                "publishes each step once every public key's record is in; selecting "
                                "keys privately runs in batch and scheduled jobs, and in "
                                "ContinualCount(...) on unbounded input without a checkpoint)",
                 None)
        if types.get("key", "id") not in KEY_TYPES:
            fail("input.types.key", "'str' or 'int' when public_keys are not given (a selected "
                                    "key is published under its text: with 'id', 5 and '5' "
                                    "would be two keys with one name)", types.get("key", "id"))
        keys = None
    else:
        keys = _public_keys(raw, base_dir)
        key_type = types.get("key", "id")
        wrong = [k for k in keys if key_type == "str" and not isinstance(k, str)
                 or key_type == "int" and not isinstance(k, int)]
        if wrong:
            fail("public_keys", f"of the declared key type {key_type!r}", wrong[:3])
        if fmt == "csv" and key_type == "id" and any(not isinstance(k, str) for k in keys):
            fail("public_keys", "strings for CSV input (its cells are text; declare "
                                "`input.types.key: int` for integer keys)",
                 [k for k in keys if not isinstance(k, str)][:3])

    mechanism = _section(raw.get("mechanism") or {}, "mechanism",
                         ("name", "params", "max_state_bytes_per_key"))
    name = mechanism.get("name", "auto")
    if name not in ("auto",) + NAMES:
        fail("mechanism.name", "one of " + ", ".join(repr(n) for n in ("auto",) + NAMES), name)
    params = mechanism.get("params") or {}
    if not isinstance(params, dict):
        fail("mechanism.params", "a mapping", params)
    if name == "auto" and params:
        fail("mechanism.params", "empty when mechanism.name is 'auto'", params)
    state_budget = mechanism.get("max_state_bytes_per_key", DEFAULT_MAX_STATE_BYTES_PER_KEY)
    if isinstance(state_budget, bool) or not isinstance(state_budget, int) or (
            state_budget < MIN_STATE_BYTES_PER_KEY):
        fail("mechanism.max_state_bytes_per_key",
             f"an integer >= {MIN_STATE_BYTES_PER_KEY} (bytes of state per key; every tree "
             f"mechanism keeps {MIN_STATE_BYTES_PER_KEY})", state_budget)

    postprocess = raw.get("postprocess")
    if postprocess not in (None, "nonnegative"):  # which transforms take it: the transform's
        fail("postprocess", "absent, or 'nonnegative'", postprocess)  # rule (nonnegative_truth)
    confidence = raw.get("confidence", 0.95)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not (
            0 < confidence < 1):
        fail("confidence", "a number in (0, 1)", confidence)

    secret = dict(_section(raw.get("secret") or {}, "secret",
                           ("env", "path", "seed", "stored", "insecure", "gcp_secret")))
    insecure = secret.pop("insecure", False)
    if insecure not in (True, False):
        fail("secret.insecure", "true or false", insecure)
    if len(secret) > 1:
        fail("secret", "at most one of env, path, seed or stored or gcp_secret (none: a fresh "
                       "secret for this run)", secret)
    if "gcp_secret" in secret:
        check_gcp_secret("secret.gcp_secret", secret["gcp_secret"])
    if "seed" in secret and not insecure:
        fail("secret", "a secret from env, path or stored (a fixed `seed` is public: anyone "
                       "who knows it can subtract the noise; add `insecure: true` for demos "
                       "and tests)", {"seed": secret["seed"]})
    if "stored" in secret and secret["stored"] is not True:
        fail("secret.stored", "true (a secret kept in the state directory, mode 0600)",
             secret["stored"])
    if "seed" in secret and (isinstance(secret["seed"], bool)
                             or not isinstance(secret["seed"], int) or secret["seed"] < 0):
        fail("secret.seed", "an integer >= 0", secret["seed"])

    output = _section(raw["output"], "output", ("path", "formats"), ("path",))
    formats = output.get("formats", ["parquet", "jsonl"])
    if not isinstance(formats, list) or not formats or any(f not in OUTPUT_FORMATS
                                                           for f in formats):
        fail("output.formats", "a non-empty list of " + ", ".join(
            repr(f) for f in OUTPUT_FORMATS), formats)

    return JobConfig(job, transform,
                     InputSpec(resolve_path(source["path"]) if source_kind == "files" else "",
                               fmt, dict(fields), timestamp_format, types, source_kind,
                               **stream, config_folder=base_dir),
                     steps,
                     PrivacySpec(**privacy, noise=noise, gate_share=gate_share,
                                 allow_large_delta=bool(allow_large_delta)),
                     bounds, keys, MechanismSpec(name, dict(params), state_budget),
                     float(confidence),
                     SecretSpec(**secret, insecure=bool(insecure)),
                     OutputSpec(output["path"], tuple(formats)), postprocess,
                     _budget(raw.get("budget"), secret))


def _budget(raw, secret: dict) -> Optional[BudgetSpec]:
    spec = budget_spec_of(raw)
    if spec is not None and not any(secret.get(k) is not None for k in (
            "env", "path", "gcp_secret", "seed", "literal")):
        fail("secret", "configured (env, path, gcp_secret or seed) with a budget (the "
                       "ledger's entries are MAC'd with it)", "none")
    return spec


def _pubsub_input(source) -> dict:
    """The Pub/Sub settings of an unbounded input, checked."""
    if "path" in source:
        fail("input.path", "absent for input.kind 'pubsub' (its events come from "
                           "`subscription`)", source["path"])
    subscription = source.get("subscription")
    try:  # Beam's own rule (a project id of 6 to 30 letters, digits and '-', ...)
        from apache_beam.io.gcp.pubsub import parse_subscription
        parse_subscription(subscription if isinstance(subscription, str) else "")
    except ValueError:
        fail("input.subscription", "projects/<project id>/subscriptions/<name> (a project id "
                                   "is 6 to 30 lowercase letters, digits and '-')",
             subscription)
    settings = {"subscription": subscription}
    for name in ("timestamp_attribute", "id_attribute"):
        attribute = source.get(name)
        if attribute is not None and (not isinstance(attribute, str) or not attribute):
            fail(f"input.{name}", "a message attribute name", attribute)
        settings[name] = attribute
    return settings


def _kafka_input(source) -> dict:
    """The Kafka settings of an unbounded input, checked (the broker is reached when the job
    starts)."""
    if "path" in source:
        fail("input.path", "absent for input.kind 'kafka' (its events come from `topic`)",
             source["path"])
    servers, topic = source.get("bootstrap_servers"), source.get("topic")
    if not isinstance(servers, str) or not all(
            re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}", s) for s in servers.split(",")):
        fail("input.bootstrap_servers", "host:port[,host:port...]", servers)
    if not isinstance(topic, str) or not re.fullmatch(r"[A-Za-z0-9._\-]{1,249}", topic):
        fail("input.topic", "a Kafka topic name (1 to 249 letters, digits, '.', '_', '-')",
             topic)
    return {"bootstrap_servers": servers, "topic": topic}


def _public_keys(raw, base_dir):
    keys, path = raw.get("public_keys"), raw.get("public_keys_file")
    if (keys is None) == (path is None):
        fail("public_keys", "given, either as a list or as public_keys_file (not both)",
             keys if keys is not None else path)
    if path is not None:
        full = resolve_path(path) if path.startswith(DEMO_PREFIX) or "://" in path else (
            os.path.join(base_dir, path) if "://" not in base_dir else f"{base_dir}/{path}")
        try:
            keys = [line.strip() for line in _read_text(full).splitlines() if line.strip()]
        except (OSError, ValueError, UnicodeDecodeError):
            fail("public_keys_file", "an existing UTF-8 file with one key per line", path)
    if not isinstance(keys, list) or not keys or any(
            isinstance(k, bool) or not isinstance(k, (str, int)) for k in keys):
        fail("public_keys", "a non-empty list of strings or integers", keys)
    if len(set(keys)) != len(keys):
        fail("public_keys", "free of duplicates", keys)
    return keys
