"""The keyed noise seam: determinism, independence of keys, distributions."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms.noise import (ConstantNoiseSource, KeyedNoiseSource, make_noise_source,
                                         stream_bytes)


def test_same_node_same_noise_across_block_boundaries_and_access_patterns():
    source = KeyedNoiseSource(b"secret")
    whole = source.unit_noise("laplace", "k", 3, 0, 5000)
    pieces = np.concatenate([source.unit_noise("laplace", "k", 3, a, b - a)
                             for a, b in ((0, 1), (1, 1023), (1023, 1025), (1025, 5000))])
    assert np.array_equal(whole, pieces)
    fresh = KeyedNoiseSource(b"secret")  # a rerun in another process
    assert np.array_equal(fresh.unit_noise("laplace", "k", 3, 2000, 7), whole[2000:2007])


def test_keys_separate_secret_stream_level_and_distribution():
    source = KeyedNoiseSource(b"secret")
    base = source.unit_noise("gaussian", "k", 0, 0, 64)
    others = [KeyedNoiseSource(b"secreT").unit_noise("gaussian", "k", 0, 0, 64),
              source.unit_noise("gaussian", "k2", 0, 0, 64),
              source.unit_noise("gaussian", "k", 1, 0, 64),
              source.unit_noise("laplace", "k", 0, 0, 64)]
    for other in others:
        assert np.corrcoef(base, other)[0, 1] ** 2 < 0.2
        assert not np.any(base == other)
    assert len({stream_bytes(1), stream_bytes("1"), stream_bytes(b"1")}) == 3


@pytest.mark.parametrize("distribution,reference", [("laplace", "laplace"), ("gaussian", "norm")])
def test_unit_noise_has_the_standard_distribution(distribution, reference):
    """KS test on 200k values (false-failure rate 1e-4)."""
    values = KeyedNoiseSource(b"ks").unit_noise(distribution, "s", 0, 0, 200_000)
    assert stats.kstest(values, reference).pvalue > 1e-4
    assert np.all(np.isfinite(values))


def test_seed_is_explicit_and_default_secret_is_random():
    a = make_noise_source(seed=5).unit_noise("laplace", "", 0, 0, 8)
    assert np.array_equal(a, make_noise_source(seed=5).unit_noise("laplace", "", 0, 0, 8))
    b = make_noise_source().unit_noise("laplace", "", 0, 0, 8)
    c = make_noise_source().unit_noise("laplace", "", 0, 0, 8)
    assert not np.array_equal(b, c)


def test_secret_source_refuses_to_be_pickled():
    with pytest.raises(TypeError, match="secret"):
        pickle.dumps(KeyedNoiseSource(b"secret"))


@pytest.mark.parametrize("call,message", [
    (lambda: make_noise_source(seed=1, secret=b"x"),
     r"^`seed` must be None when `secret` is given \(pass at most one of them\); got 1\.$"),
    (lambda: make_noise_source(seed=-1), r"^`seed` must be an integer >= 0; got -1\.$"),
    (lambda: KeyedNoiseSource(b""), r"^`secret` must be non-empty bytes or str; got b''\.$"),
    (lambda: stream_bytes(1.5), r"^`stream` must be a str, bytes or int key; got 1\.5\.$"),
    (lambda: KeyedNoiseSource(b"x").unit_noise("cauchy", "", 0, 0, 1),
     r"^`distribution` must be one of 'laplace', 'gaussian'; got 'cauchy'\.$"),
])
def test_noise_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_constant_source_is_constant():
    assert ConstantNoiseSource(2.5).unit_noise("laplace", "", 4, 10, 3).tolist() == [2.5] * 3
