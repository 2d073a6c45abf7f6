"""The noise of a node is a promise: a release continued by newer code (a scheduled run after
an upgrade) must derive every node's noise exactly as before, or two different noises of one
node get published and averaging them removes noise. Each mechanism's `noise_derivation` names
how its noise is derived; this golden table pins what each name produces. Changing noise
without a new name fails here: bump `NOISE_DOMAIN_VERSION` (transforms/mechanisms/noise.py) or
the mechanism's `node_indexing`, and releases started before refuse to continue."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from transforms.mechanisms import MECHANISMS, NAMES, make
from transforms.mechanisms.noise import (NOISE_DOMAIN_VERSION, NOISE_VERSIONS, KeyedNoiseSource,
                                         seed_secret)

GOLDEN = {
    ('v3/binary_tree/1', 'epsilon'): '27bfbcd5cf02ee7b',
    ('v3/binary_tree/1', 'rho'): 'e3a5c3a392899862',
    ('v3/kary_tree/1', 'epsilon'): '27bfbcd5cf02ee7b',
    ('v3/kary_tree/1', 'rho'): 'e3a5c3a392899862',
    ('v3/kary_subtraction/1', 'epsilon'): '0b4cd1ed847d676b',
    ('v3/kary_subtraction/1', 'rho'): 'f19ae2a5f81ed6b2',
    ('v3/smooth_binary/1', 'epsilon'): 'c2149c5055e7c0b8',
    ('v3/smooth_binary/1', 'rho'): '26e0cbf5b57aaa9e',
    # 2: compact node indexing (a node's noise index is its rank among the level's usable nodes)
    ('v3/smooth_binary/2', 'epsilon'): 'c83b8cc3dc0147a9',
    ('v3/smooth_binary/2', 'rho'): '174eb853f9ed19dc',
    ('v3/sqrt_toeplitz/1', 'rho'): 'c22c59cc819ecfe2',
    ('v3/naive_composition/1', 'epsilon'): '333842f373bcf54b',
    ('v3/naive_composition/1', 'rho'): '0dac7bfed83e4500',
    ('v3/input_perturbation/1', 'epsilon'): '02f39076750bafb3',
    ('v3/input_perturbation/1', 'rho'): '796f99aef908ab74',
    # v4: a discrete block's sign bits per chunk of 64 nodes (pinned when introduced)
    ('v4/binary_tree/1', 'epsilon'): '4342b664208dd238',
    ('v4/binary_tree/1', 'rho'): '7ed736ee73105ad5',
    ('v4/kary_tree/1', 'epsilon'): '4342b664208dd238',
    ('v4/kary_tree/1', 'rho'): '7ed736ee73105ad5',
    ('v4/kary_subtraction/1', 'epsilon'): '3235967dff5e2d0b',
    ('v4/kary_subtraction/1', 'rho'): 'b886ba3edf326d91',
    ('v4/smooth_binary/2', 'epsilon'): 'c8701829ed14a151',
    ('v4/smooth_binary/2', 'rho'): '7c6aec96aae7f466',
    ('v4/sqrt_toeplitz/1', 'rho'): '25186448f7fb9c6d',
    ('v4/naive_composition/1', 'epsilon'): 'c926b6dc1fce18a2',
    ('v4/naive_composition/1', 'rho'): 'fc94cc59eec26375',
    ('v4/input_perturbation/1', 'epsilon'): '0340458668394486',
    ('v4/input_perturbation/1', 'rho'): 'b88fb2a9f6b1dc15',
    # the horizon-free factorization (pinned when introduced)
    ('v3/log_sqrt_toeplitz/1', 'rho'): 'a8702a48bf734d03',
    ('v4/log_sqrt_toeplitz/1', 'rho'): 'd4babe882937d94d',
}
# parameters as they were when the digest was pinned (defaults change the factor, not the noise
# derivation this pins)
PINNED_PARAMS = {"log_sqrt_toeplitz": {"c": 4.0, "s": 64.0, "g": 0.9}}
CASES = [(name, kind) for name in NAMES if name not in ("blt", "hybrid")  # float noise only
         for kind in ("epsilon", "rho") if not (kind == "epsilon" and (
             name == "sqrt_toeplitz" or not MECHANISMS[name].pure_dp))]


def noise_digest(name: str, kind: str, version: str = NOISE_DOMAIN_VERSION):
    """The discrete (exact, platform-independent) release of zeros, seed 7, T = 40."""
    mechanism = make(name, 40, noise="discrete", **{kind: 1.0 if kind == "epsilon" else 0.5},
                     noise_source=KeyedNoiseSource(seed_secret(7), version=version),
                     **PINNED_PARAMS.get(name, {}))
    values = np.round(np.asarray(mechanism.release(np.zeros(40))), 6)
    return mechanism.noise_derivation, hashlib.sha256(values.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("version", NOISE_VERSIONS)
@pytest.mark.parametrize("name,kind", CASES)
def test_each_noise_derivation_still_derives_the_same_noise(name, kind, version):
    derivation, digest = noise_digest(name, kind, version)
    assert (derivation, kind) in GOLDEN, (
        f"new noise derivation {derivation!r}: add it to GOLDEN (and keep the old entries)")
    assert GOLDEN[(derivation, kind)] == digest, (
        f"{name}'s noise changed under the same derivation {derivation!r}: bump "
        f"NOISE_DOMAIN_VERSION or {name}.node_indexing")


def test_the_guard_sees_a_changed_noise(monkeypatch):
    from transforms.mechanisms import noise
    original = noise.KeyedNoiseSource.__init__

    def other_domain(self, secret, cache_blocks=512, *, release=b"",
                     version=NOISE_DOMAIN_VERSION):
        original(self, secret + b"!", cache_blocks, release=release, version=version)
    monkeypatch.setattr(noise.KeyedNoiseSource, "__init__", other_domain)
    derivation, digest = noise_digest("binary_tree", "rho")
    assert GOLDEN[(derivation, "rho")] != digest
