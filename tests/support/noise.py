"""Test doubles for the release's secret, injected with `noise_source=` (like Beam's `clock`)."""
from __future__ import annotations

from transforms.mechanisms.noise import ConstantNoiseSource


class ZeroNoise:
    """Every node's noise is 0, so released values are the exact running totals. Public (it
    protects nothing): transforms need insecure=True and mark records private: false."""
    public = True

    def noise_source(self, release: bytes = b""):
        return ConstantNoiseSource(0.0)

    def fingerprint(self) -> str:
        return "0" * 64

    def secret_bytes(self) -> bytes:
        return b"zero-noise-test-double"

    def describe(self) -> str:
        return "zero noise (test double)"


ZERO = dict(noise_source=ZeroNoise(), insecure=True)
