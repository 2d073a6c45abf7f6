"""Config validation: every invalid config gives one clear error naming the field."""
from __future__ import annotations

import copy
import os

import pytest
import yaml

from pipelines.config import ConfigError, load, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BASE = {
    "job": "t", "transform": "count",
    "input": {"path": "demo:active_users.jsonl", "fields": {"timestamp": "ts", "unit": "user",
                                                            "key": "region"}},
    "steps": {"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600, "horizon": 4},
    "privacy": {"epsilon": 1.0}, "public_keys": ["a", "b"], "secret": {"seed": 1, "insecure": True},
    "output": {"path": "out"},
}


def edited(path, value):
    config = copy.deepcopy(BASE)
    node = config
    for part in path[:-1]:
        node = node[part]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return config


DELETE = object()

CASES = [
    (("colour",), "red", r"^`colour` must be a known field \(one of job, transform"),
    (("transform",), "median", r"^`transform` must be one of 'count', 'sum'.*got 'median'\.$"),
    (("job",), DELETE, r"^`job` must be given; got None\.$"),
    (("job",), "a b", r"^`job` must be a name of letters, digits"),
    (("job",), "x-operator", r"^`job` must be a name not ending in '-operator'"),
    (("input", "format"), "xml", r"^`input.format` must be one of 'jsonl', 'csv', 'parquet'; "
                                 r"got 'xml'\.$"),
    (("input", "fields"), {"timestamp": "ts", "unit": "user"},
     r"^`input.fields.key` must be given; got None\.$"),
    (("input", "fields", "colour"), "x", r"^`input.fields.colour` must be a known field"),
    (("input", "timestamp_format"), "unix", r"^`input.timestamp_format` must be one of 'iso'"),
    (("input", "extra"), 1, r"^`input.extra` must be a known field"),
    (("steps", "origin"), "yesterday", r"^`steps.origin` must be an ISO-8601 time"),
    (("steps", "origin"), "2026-01-05T00:00:00", r"^`steps.origin` must be an ISO-8601 time "
                                                 r"with a timezone"),
    (("steps", "size_seconds"), 0, r"^`steps.size_seconds` must be a positive finite number; "
                                   r"got 0\.$"),
    (("steps", "horizon"), 2.5, r"^`steps.horizon` must be an integer >= 1, or 'unbounded' "
                                r"\(no horizon\); got 2\.5\.$"),
    (("steps", "horizon"), "forever", r"^`steps.horizon` must be an integer >= 1, or "),
    (("privacy",), {"epsilon": 1.0, "rho": 1.0}, r"^`privacy` must be exactly one of epsilon"),
    (("privacy",), {"rho": 1.0, "delta": 1e-6}, r"^`privacy.delta` must be a number in \(0, 1\) "
                                                r"given with epsilon"),
    (("privacy", "epsilon"), -1, r"^`privacy.epsilon` must be a positive finite number"),
    (("bounds",), {"max_flips": 2}, r"^`bounds.max_flips` must be a known field \(one of "
                                    r"max_contributions"),
    (("bounds",), {"max_contributions": 0}, r"^`bounds.max_contributions` must be an integer "
                                            r">= 1; got 0\.$"),
    (("public_keys",), [], r"^`public_keys` must be a non-empty list"),
    (("public_keys",), ["a", "a"], r"^`public_keys` must be free of duplicates"),
    (("public_keys",), DELETE, r"^`public_keys` must be given, either as a list or as "
                               r"public_keys_file, or, to select keys privately, "
                               r"privacy.selection_delta"),
    (("privacy",), {"epsilon": 1.0, "selection_delta": 1e-6},
     r"^`privacy.selection_delta` must be a number in \(0, 1\), given only when public_keys "
     r"are not"),
    (("privacy",), {"rho": 0.5, "delta": 1e-6},
     r"^`privacy.delta` must be a number in \(0, 1\) given with epsilon \(with rho: only"),
    (("mechanism",), {"name": "magic"}, r"^`mechanism.name` must be one of 'auto'"),
    (("mechanism",), {"name": "auto", "params": {"k": 3}},
     r"^`mechanism.params` must be empty when mechanism.name is 'auto'"),
    (("mechanism",), {"max_state_bytes_per_key": 10},
     r"^`mechanism.max_state_bytes_per_key` must be an integer >= 33 \(bytes of state per key"),
    (("confidence",), 1.5, r"^`confidence` must be a number in \(0, 1\); got 1\.5\.$"),
    (("privacy",), {"epsilon": 1.0, "delta": 0.5},
     r"^`privacy.delta` must be <= 0\.001 unless privacy.allow_large_delta is true \(delta is "
     r"the probability the guarantee fails outright\); got 0\.5\.$"),
    (("privacy",), {"epsilon": 1.0, "delta": 1e-6, "allow_large_delta": "yes"},
     r"^`privacy.allow_large_delta` must be true or false; got 'yes'\.$"),
    (("secret",), {"seed": 1, "env": "X"},
     r"^`secret` must be at most one of env, path, seed or stored"),
    (("secret",), {"seed": 1}, r"^`secret` must be a secret from env, path or stored \(a fixed "
                              r"`seed` is public"),
    (("secret",), {"seed": 1, "insecure": "yes"}, r"^`secret.insecure` must be true or false"),
    (("privacy",), {"epsilon": 1.0, "noise": "exact"}, r"^`privacy.noise` must be one of"),
    (("secret",), {"password": "x"}, r"^`secret.password` must be a known field"),
    (("output", "formats"), ["xlsx"], r"^`output.formats` must be a non-empty list of "
                                      r"'parquet', 'jsonl', 'csv'"),
    (("output",), {}, r"^`output.path` must be given; got None\.$"),
    (("postprocess",), "clip", r"^`postprocess` must be absent, or 'nonnegative'"),
    (("input", "max_dead_letter_fraction"), 1.5,
     r"^`input.max_dead_letter_fraction` must be a number in \[0, 1\]; got 1\.5\.$"),
    (("input", "max_dead_letter_fraction"), True,
     r"^`input.max_dead_letter_fraction` must be a number in \[0, 1\]"),
]


@pytest.mark.parametrize("path,value,message", CASES)
def test_invalid_configs_name_the_field(path, value, message):
    with pytest.raises(ConfigError, match=message):
        validate(edited(path, value))


def test_transform_specific_required_bounds():
    config = edited(("transform",), "count_distinct")
    config["input"]["fields"] = {"timestamp": "ts", "op": "op", "item": "item", "key": "store"}
    with pytest.raises(ConfigError, match=r"^`bounds.max_flips` must be given; got None\.$"):
        validate(config)
    config["bounds"] = {"max_flips": 3}
    assert validate(config).bounds == {"max_flips": 3, "max_keys_per_unit": 1,
                                       "semantics": "count"}


def test_a_sums_min_value_is_a_finite_number_below_max_value_and_0_is_the_default():
    config = edited(("transform",), "sum")
    config["input"]["fields"]["value"] = "seconds"
    for given, message in ((-1e300, r"^`bounds.min_value` must be >= -1e15"),
                           (5.0, r"^`bounds.min_value` must be below max_value \(5\); got 5.0\.$"),
                           ("-3", r"^`bounds.min_value` must be a finite number; got '-3'\.$"),
                           (float("nan"), r"^`bounds.min_value` must be a finite number")):
        config["bounds"] = {"max_value": 5, "min_value": given}
        with pytest.raises(ConfigError, match=message):
            validate(config)
    config["bounds"] = {"max_value": 5, "min_value": -2.5}
    assert validate(config).bounds["min_value"] == -2.5
    absent = dict(config, bounds={"max_value": 5})
    for default in (0, 0.0, -0.0, None):  # the same release as absent (one ledger, one binding)
        config["bounds"] = {"max_value": 5, "min_value": default}
        assert validate(config).bounds == validate(absent).bounds
    config = edited(("bounds",), {"min_value": -1})  # a count takes no values
    with pytest.raises(ConfigError, match=r"^`bounds.min_value` must be a known field"):
        validate(config)


def test_valid_config_and_files(tmp_path):
    job = validate(BASE)
    assert job.steps.origin == 1767571200.0 and job.steps.horizon == 4
    assert job.output.formats == ("parquet", "jsonl")
    assert job.privacy.budget == {"epsilon": 1.0} and job.privacy.noise == "discrete"
    assert job.secret.seed == 1 and job.secret.insecure and not job.secret.stored
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert load(str(path)) == job
    path.write_text("job: [unclosed")
    with pytest.raises(ConfigError, match=r"^`config` must be valid YAML"):
        load(str(path))
    path.write_text("job: x\ninput: [a, b\nsteps: 1\n")
    with pytest.raises(ConfigError, match=r"^`config` must be valid YAML; got \".*job\.yaml, "
                                          r"line 3, column 6: expected ',' or '\]'"):
        load(str(path))
    with pytest.raises(ConfigError, match=r"^`config` must be an existing YAML file"):
        load(str(tmp_path / "missing.yaml"))


def test_every_bundled_config_is_valid():
    import glob
    configs = glob.glob("configs/*.yaml")
    assert len(configs) >= 6
    transforms = {load(path).transform for path in configs}
    assert transforms == {"count", "sum", "mean", "count_distinct", "degree_count",
                          "triangle_count", "release"}


def test_bundled_configs_load_by_name_and_equal_their_files():
    from pipelines.config import bundled_configs
    names = bundled_configs()
    assert len(names) >= 6
    for name in names:
        assert load(f"demo:{name}") == load(f"configs/{name}.yaml")


@pytest.mark.parametrize("name", ["demo:", "demo:nope", "demo:../setup", "demo:configs/signups"])
def test_unknown_bundled_config_names_are_one_error(name):
    with pytest.raises(ConfigError, match=r"^`config` must be a path or demo:<name> with a "
                                          r"bundled name \(one of active_users, "):
        load(name)


STREAM = {"kind": "pubsub", "subscription": "projects/dp-demo/subscriptions/events",
          "timestamp_attribute": "ts", "fields": BASE["input"]["fields"]}


def streamed(**changes):
    config = copy.deepcopy(BASE)
    config["input"] = {k: v for k, v in dict(STREAM, **changes).items() if v is not DELETE}
    return config


KAFKA = {"kind": "kafka", "bootstrap_servers": "localhost:9092,broker-2:9093",
         "topic": "events.v1", "fields": BASE["input"]["fields"]}


def kafka(**changes):
    config = copy.deepcopy(BASE)
    config["input"] = {k: v for k, v in dict(KAFKA, **changes).items() if v is not DELETE}
    return config


def test_a_kafka_input_is_read_as_configured():
    job = validate(dict(kafka(), steps=dict(BASE["steps"], allowed_lateness_seconds=60)))
    assert job.input.unbounded and job.input.path == "" and job.input.format == "jsonl"
    assert (job.input.bootstrap_servers, job.input.topic, job.input.subscription) == (
        "localhost:9092,broker-2:9093", "events.v1", None)
    assert job.input.source_name == "kafka://localhost:9092,broker-2:9093/events.v1"
    assert job.steps.allowed_lateness_seconds == 60.0


def test_a_pubsub_input_is_read_as_configured():
    job = validate(dict(streamed(id_attribute="event_id"), steps=dict(
        BASE["steps"], release_delay_steps=2, allowed_lateness_seconds=900)))
    assert job.input.unbounded and job.input.path == "" and job.input.format == "jsonl"
    assert (job.input.subscription, job.input.timestamp_attribute, job.input.id_attribute) == (
        "projects/dp-demo/subscriptions/events", "ts", "event_id")
    assert (job.steps.release_delay_steps, job.steps.allowed_lateness_seconds) == (2, 900.0)
    files = validate(BASE)
    assert not files.input.unbounded and files.input.kind == "files"
    assert (files.steps.release_delay_steps, files.steps.allowed_lateness_seconds) == (1, 0.0)


@pytest.mark.parametrize("config,message", [
    (streamed(kind="kinesis"),
     r"^`input.kind` must be one of 'files', 'pubsub', 'kafka'; got 'kinesis'\.$"),
    (streamed(kind="kafka"), r"^`input.subscription` must be absent for input.kind 'kafka' "
                             r"\(a Pub/Sub setting\)"),
    (kafka(bootstrap_servers="localhost"),
     r"^`input.bootstrap_servers` must be host:port\[,host:port...\]; got 'localhost'\.$"),
    (kafka(bootstrap_servers=DELETE), r"^`input.bootstrap_servers` must be host:port"),
    (kafka(topic="a topic"), r"^`input.topic` must be a Kafka topic name .*got 'a topic'\.$"),
    (kafka(path="x.jsonl"), r"^`input.path` must be absent for input.kind 'kafka'"),
    (kafka(format="csv"), r"^`input.format` must be 'jsonl' for input.kind 'kafka'"),
    (edited(("input", "topic"), "events"),
     r"^`input.topic` must be absent for input.kind 'files' \(a Kafka setting\)"),
    (streamed(path="x.jsonl"), r"^`input.path` must be absent for input.kind 'pubsub'"),
    (streamed(subscription="projects/p/subscriptions/s"),
     r"^`input.subscription` must be projects/<project id>/subscriptions/<name> .*got "
     r"'projects/p/subscriptions/s'\.$"),
    (streamed(subscription=DELETE), r"^`input.subscription` must be projects/.*got None\.$"),
    (streamed(id_attribute=""), r"^`input.id_attribute` must be a message attribute name"),
    (streamed(format="csv"), r"^`input.format` must be 'jsonl' for input.kind 'pubsub'"),
    (edited(("input", "subscription"), "projects/dp-demo/subscriptions/e"),
     r"^`input.subscription` must be absent for input.kind 'files'"),
    (edited(("steps", "allowed_lateness_seconds"), 1),
     r"^`steps.allowed_lateness_seconds` must be absent for input.kind 'files'"),
    (edited(("steps", "release_delay_steps"), 2),
     r"^`steps.release_delay_steps` must be absent for input.kind 'files'"),
    (dict(streamed(), steps=dict(BASE["steps"], release_delay_steps=0)),
     r"^`steps.release_delay_steps` must be an integer >= 1; got 0\.$"),
    (dict(streamed(), steps=dict(BASE["steps"], allowed_lateness_seconds=3600)),
     r"^`steps.allowed_lateness_seconds` must be a number of seconds in \[0, "
     r"release_delay_steps x size_seconds / 2\] .*got 3600\.$"),
    (dict(streamed(), steps=dict(BASE["steps"], allowed_lateness_seconds=1801)),
     r"^`steps.allowed_lateness_seconds` must be .*got 1801\.$"),
    (dict(streamed(), steps=dict(BASE["steps"], allowed_lateness_seconds=-1)),
     r"^`steps.allowed_lateness_seconds` must be a number of seconds .*got -1\.$"),
])
def test_invalid_streaming_inputs_name_the_field(config, message):
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_batch_drivers_refuse_a_subscription():
    from pipelines import io
    with pytest.raises(ConfigError, match=r"^`input.kind` must be 'files' for a batch or "
                                          r"scheduled job"):
        io.check_bounded_options((), validate(streamed()))


def selecting(**privacy):
    config = edited(("public_keys",), DELETE)
    config["privacy"] = privacy
    config["input"]["types"] = {"key": "str"}
    return config


def test_a_config_without_public_keys_selects_them():
    """count, sum and count_distinct: without public_keys the keys are selected privately,
    with privacy.selection_delta (epsilon or rho: required; with epsilon and delta: a part of
    delta, half by default); the transform's rule has that delta."""
    from pipelines import run as job_run
    for privacy, expected in (({"epsilon": 1.0, "selection_delta": 1e-6}, 1e-6),
                              ({"rho": 0.5, "delta": 1e-6}, 1e-6),
                              ({"epsilon": 1.0, "delta": 1e-5}, 5e-6)):
        job = validate(selecting(**privacy))
        assert job.public_keys is None
        transform = job_run.build_transform(job)
        assert transform.selects and transform.selection["delta"] == expected


@pytest.mark.parametrize("changes,message", [
    ({"transform": "mean", "bounds": {"max_value": 10},
      "input": {"path": "demo:active_users.jsonl", "fields": {
          "timestamp": "ts", "unit": "user", "key": "region", "value": "seconds"}}},
     r"^`public_keys` must be given for mean \(keys are selected privately only by count, "
     r"sum, count_distinct\)"),
    ({"input": {"kind": "pubsub", "subscription": "projects/dp-demo/subscriptions/s",
                "fields": {"timestamp": "ts", "unit": "user", "key": "region"}}},
     r"^`public_keys` must be given for input.kind 'pubsub'"),
    ({"privacy": {"epsilon": 1.0, "selection_delta": 1.5}},
     r"^`privacy.selection_delta` must be a number in \(0, 1\)"),
    ({"input": {"path": "demo:active_users.jsonl", "fields": {
        "timestamp": "ts", "unit": "user", "key": "region"}}},
     r"^`input.types.key` must be 'str' or 'int' when public_keys are not given"),
    ({"public_keys": None, "privacy": {"epsilon": 1.0}},
     r"^`public_keys` must be given, either as a list or as public_keys_file"),
])
def test_configs_that_cannot_select_keys_are_refused(changes, message):
    config = selecting(epsilon=1.0, selection_delta=1e-6)
    config.update(changes)
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_a_large_delta_needs_allow_large_delta():
    """delta (and selection_delta) above 1e-3 only when the config says so; the transform
    gets allow_large_delta=True then (it refuses it too otherwise)."""
    job = validate(edited(("privacy",), {"epsilon": 1.0, "delta": 0.01,
                                         "allow_large_delta": True}))
    assert job.privacy.budget == {"epsilon": 1.0, "delta": 0.01, "allow_large_delta": True}
    assert validate(edited(("privacy",), {"epsilon": 1.0, "delta": 1e-3})).privacy.budget == {
        "epsilon": 1.0, "delta": 1e-3}
    raw = selecting(epsilon=1.0, selection_delta=0.01)
    with pytest.raises(ConfigError, match=r"^`privacy.selection_delta` must be <= 0\.001 unless "
                                          r"privacy.allow_large_delta is true"):
        validate(raw)
    raw["privacy"]["allow_large_delta"] = True
    assert validate(raw).privacy.selection_delta == 0.01


def test_the_bundled_kafka_stream_is_the_pubsub_one_read_from_kafka():
    kafka_job = load(os.path.join(ROOT, "configs", "streaming", "active_users_kafka.yaml"))
    pubsub_job = load(os.path.join(ROOT, "configs", "streaming", "active_users.yaml"))
    assert (kafka_job.input.kind, kafka_job.input.topic) == ("kafka", "active-users")
    for part in ("steps", "privacy", "bounds", "public_keys", "mechanism"):
        assert getattr(kafka_job, part) == getattr(pubsub_job, part), part


@pytest.mark.parametrize("fmt,cell,found", [
    ("milliseconds", 1767571200123, 1767571200.123),
    ("milliseconds", "1767571200123", 1767571200.123),
    ("seconds", 1767571200.5, 1767571200.5),
])
def test_timestamps_in_seconds_or_milliseconds(fmt, cell, found):
    from pipelines.io import parse_cell
    assert validate(edited(("input", "timestamp_format"), fmt)).input.timestamp_format == fmt
    assert parse_cell("ts", "timestamp", cell, fmt) == found


@pytest.mark.parametrize("fmt", ["iso", "seconds"])
def test_a_time_in_milliseconds_read_as_seconds_says_what_to_set(fmt):
    from pipelines.io import parse_cell
    with pytest.raises(ConfigError, match=r"^`ts` must be a time in the years 1 to 9999 "
                                          r"\(milliseconds\? set input.timestamp_format: "
                                          r"milliseconds\); got 1767571200123\.$"):
        parse_cell("ts", "timestamp", 1767571200123, fmt)
    with pytest.raises(ConfigError, match=r"years 1 to 9999; got 1e\+300\.$"):  # no hint
        parse_cell("ts", "timestamp", 1e300, fmt)


def test_no_horizon_is_the_steps_a_release_can_reach():
    job = validate(edited(("steps", "horizon"), "unbounded"))
    assert job.steps.unbounded and job.steps.horizon == 1 << 20
    assert job.steps.shown_horizon == "unbounded" and job.steps.time_steps().unbounded
    known = validate(edited(("steps", "horizon"), 1 << 20))
    assert not known.steps.unbounded and known.steps != job.steps  # the ledger tells them apart
