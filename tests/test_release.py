"""ReleaseConfig: every field checked when it is built (fail closed: a worker rebuilds the
release from these fields alone), with the project's one error shape, and nothing resolved."""
from __future__ import annotations

import dataclasses
import pickle
import re

import numpy as np
import pytest

from transforms.statistics import ContinualCount
from transforms.release import NoNoise, RecordMaker, ReleaseConfig, noise_stream
from transforms.secret import SecretRef
from transforms.steps import TimeSteps
from transforms.validation import ValidationError


@pytest.fixture(scope="module")
def config() -> ReleaseConfig:
    """A valid configuration, built as the transforms build theirs."""
    return ContinualCount(steps=TimeSteps(0, 3600, 8), public_keys=["a"], epsilon=1.0, seed=1,
                          insecure=True).config


class _NoDescribe:
    """A secret double missing one of the NoiseSecret methods."""

    def noise_source(self, release=b"", version="v4"):
        raise AssertionError("resolved")

    def fingerprint(self):
        raise AssertionError("resolved")

    def secret_bytes(self):
        raise AssertionError("resolved")


HEX64 = "0123456789abcdef" * 4

# field -> wrong values, each refused with a message naming the field
REFUSED = {
    "steps": [None, (0, 3600, 8)],
    "mechanism": ["no_such_mechanism", None, 3, "auto"],
    "params": [None, {}, [("k", 2)], (("k",),), ((1, 2),), (("b", 1), ("a", 2)),
               (("a", 1), ("a", 2))],
    "key_privacy": [(), (("delta", 1e-6),), (("epsilon", 1.0), ("rho", 0.5)),
                    (("epsilon", 0.0),), (("epsilon", -1.0),), (("rho", float("inf")),),
                    (("epsilon", float("nan")),), (("epsilon", True),), (("epsilon", "1"),),
                    {"epsilon": 1.0}, (("rho", 0.5), ("epsilon", 1.0))],
    "total_privacy": [None, {"epsilon": 1.0}, (("rho", 0.5), ("epsilon", 1.0)),
                      ((None, 1.0),)],
    "max_contributions": [0, -1, 1.0, True, "1", None],
    "interval_bound": [0, 2.5, True, None],
    "keys_per_unit": [0, 1.0, False, None],
    "confidence": [0, 1, 0.0, 1.0, 1.5, -0.5, float("nan"), True, "0.95", None],
    "secret": [None, b"secret", 7, _NoDescribe()],
    "release_delay_steps": [-1, 1.0, True, None],
    "release_id": [None, "0" * 31, "0" * 33, "A" * 32, "g" * 32, 7],
    "descriptor_digest": [None, "0" * 63, "0" * 65, HEX64.upper(), "z" * 64, b"0" * 64],
    "noise_kind": ["gaussian", None, 1, "Discrete"],
    "private": [1, 0, "True", None],
    "value_scale": [0, -1.0, float("inf"), float("nan"), True, "1", None],
    "diagnostics": [0, 1, "False", None],
    "integer_values": [1, "True", None],
    "secret_fingerprint": ["", "0" * 63, HEX64.upper(), "g" * 64, b"0" * 64, 0],
    "noise_version": ["v5", "", 4, b"v4"],
    # the fixture's steps are of 3600 s, released one step late
    "allowed_lateness_seconds": [-1.0, 1800.1, 3600.0, 1e9, float("nan"), float("inf"), True,
                                 "1", None],
    "nonnegative": [1, "True", None],
    "selection_threshold": [True, "3", float("nan"), float("inf")],
    "key_type": ["str", "float", 1],
}


def test_a_valid_configuration_is_accepted_unchanged_and_pickles(config):
    assert dataclasses.replace(config) == config
    assert pickle.loads(pickle.dumps(config)) == config
    # optional fields: a secret's fingerprint (a SecretRef's, or NoNoise's zeros) or None, and
    # None for the noise version (refused by `build`, with its reason)
    for fingerprint in (SecretRef(seed=1).fingerprint(), NoNoise().fingerprint(), None):
        assert dataclasses.replace(config, secret_fingerprint=fingerprint).secret_fingerprint \
            == fingerprint
    for name, value in [("noise_kind", "float"), ("private", True), ("diagnostics", True),
                        ("integer_values", False), ("value_scale", 0.25),
                        ("release_delay_steps", 0), ("confidence", 0.5),
                        ("key_privacy", (("rho", 0.5),)), ("params", (("a", 1), ("b", [2]))),
                        ("noise_version", "v3"), ("secret", NoNoise())]:
        assert getattr(dataclasses.replace(config, **{name: value}), name) == value


def test_the_fingerprint_shape_is_the_secrets(config):
    """`secret_fingerprint` accepts exactly what `fingerprint()` returns: a SHA-256 hexdigest."""
    for fingerprint in (SecretRef(seed=1).fingerprint(), NoNoise().fingerprint()):
        assert re.fullmatch(r"[0-9a-f]{64}", fingerprint)


def test_a_configuration_without_a_noise_version_is_built_but_not_released(config):
    unversioned = dataclasses.replace(config, noise_version=None)
    with pytest.raises(ValidationError, match=r"^`noise_version` must be one of 'v3', 'v4' "):
        unversioned.build()


def test_the_secret_is_not_resolved(config, monkeypatch):
    """Its methods are looked up, never called: a secret from an unset variable (resolved only
    on the worker) is accepted."""
    monkeypatch.delenv("DP_RELEASE_TEST_UNSET", raising=False)
    secret = SecretRef(env="DP_RELEASE_TEST_UNSET")
    assert dataclasses.replace(config, secret=secret).secret is secret


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_a_wrong_field_is_refused(config, field):
    for value in REFUSED[field]:
        with pytest.raises(ValidationError) as raised:
            dataclasses.replace(config, **{field: value})
        assert re.fullmatch(rf"`{field}` must be .+; got .+\.", str(raised.value), re.DOTALL), \
            (value, str(raised.value))


def test_every_field_is_checked():
    assert set(REFUSED) == {f.name for f in dataclasses.fields(ReleaseConfig)}


def test_a_wrong_secret_is_named_by_its_type_only(config):
    """The message never holds the refused value itself (it may hold secret bytes)."""
    with pytest.raises(ValidationError, match=r"^`secret` must be a NoiseSecret .*; got 'a "
                                              r"bytes without noise_source, fingerprint, "
                                              r"secret_bytes, describe'\.$"):
        dataclasses.replace(config, secret=b"s3cr3t")


def test_with_no_horizon_only_a_horizon_free_mechanism_is_a_configuration():
    free = ContinualCount(steps=TimeSteps(0, 60, "unbounded"), public_keys=["a"], rho=0.5,
                          seed=1, insecure=True).config
    with pytest.raises(ValidationError, match=r"^`mechanism` must be a horizon-free mechanism "
                                              r"for steps with no horizon; got 'binary_tree'"):
        dataclasses.replace(free, mechanism="binary_tree")


@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_with_no_horizon_the_maker_grows_and_releases_what_one_built_further_releases(noise):
    """A worker's mechanism is built for the steps reached so far (1,024 at first, doubled);
    its outputs, stddevs and intervals are those of a mechanism built for more steps, bit for
    bit, across the doubling (steps one at a time, as a streaming release steps)."""
    config = ContinualCount(steps=TimeSteps(0, 60, "unbounded"), public_keys=["a", "b"],
                            rho=0.5, noise=noise, seed=1, insecure=True).config
    maker, at_once = RecordMaker(config), RecordMaker(config)
    assert maker.horizon == 1024 and maker.mechanism.horizon == 1024
    further = config.build(horizon=4096)
    count = 1500
    for key, seed in (("a", 1), ("b", 2)):
        x = np.random.default_rng(seed).integers(0, 3, count).astype(float)
        sealed, outputs, records = maker.seal(key, maker.mechanism.init_state()), [], []
        for step in range(count):  # each step's record made as it is released
            out, sealed = maker.step_sealed(key, sealed, [x[step]], step)
            records.append(maker.record(key, step, out, outputs[-1] if outputs else 0.0))
            outputs.append(out)
        expected, state = further.for_stream(noise_stream(key)).advance(further.init_state(), x)
        assert outputs == expected.tolist()
        assert maker.restore(key, sealed) == state
        at_once.reach(count)  # a batch release of all the steps
        assert records == [at_once.record(key, step, outputs[step],
                                          outputs[step - 1] if step else 0.0)
                           for step in range(count)]
        stddevs = [maker.record(key, s, 0.0, 0.0)["stddev"] for s in (0, 1023, 1024, 1499)]
        assert stddevs == further.noise_std()[[0, 1023, 1024, 1499]].tolist()
    assert maker.horizon == at_once.horizon == 2048
