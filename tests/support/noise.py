"""Test doubles for the release's secret, injected with `noise_source=` (like Beam's `clock`)."""
from __future__ import annotations

from transforms.release import NoNoise

# Every node's noise is 0: released values are the exact running totals (not private).
ZERO = dict(noise_source=NoNoise(), insecure=True)
