"""Where the noise secret comes from, resolved on the worker (never logged, never output).

A `SecretRef` is what a pipeline carries: an environment variable name, a file path (any Beam
filesystem path, e.g. gs://...; the file holds the secret bytes), an explicit `seed` for tests and
demos, or literal bytes (only for tests: they are pickled into the pipeline graph).
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
from typing import Optional

from transforms import validation as check
from transforms.mechanisms.noise import KeyedNoiseSource, NoiseSource, seed_secret


@dataclasses.dataclass(frozen=True)
class SecretRef:
    env: Optional[str] = None
    path: Optional[str] = None
    seed: Optional[int] = None
    literal: Optional[bytes] = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        given = [n for n in ("env", "path", "seed", "literal") if getattr(self, n) is not None]
        if len(given) != 1:
            check.fail("secret", "exactly one of env, path, seed or literal", given)

    def describe(self) -> str:
        if self.env is not None:
            return f"environment variable {self.env}"
        if self.path is not None:
            return f"file {self.path}"
        return "explicit seed (not private)" if self.seed is not None else "literal (tests only)"

    @property
    def public(self) -> bool:
        """A seed is public: whoever knows it can subtract the noise."""
        return self.seed is not None

    def secret_bytes(self) -> bytes:
        """Resolve the secret (on the worker, or in a driver that must fingerprint it)."""
        if self.seed is not None:
            return seed_secret(self.seed)
        if self.literal is not None:
            return self.literal
        if self.env is not None:
            value = os.environ.get(self.env)
            if not value:
                check.fail("secret", f"set in the environment variable {self.env}", "unset")
            return value.encode("utf-8")
        from apache_beam.io.filesystems import FileSystems
        with FileSystems.open(self.path) as handle:
            data = handle.read().strip()
        if not data:
            check.fail("secret", f"non-empty in {self.path}", "empty file")
        return data

    def fingerprint(self) -> str:
        """HMAC-SHA256(secret, "fingerprint"): identifies the secret, reveals nothing of it."""
        return hmac.new(self.secret_bytes(), b"dp-continual-release/fingerprint",
                        hashlib.sha256).hexdigest()

    def noise_source(self, release: bytes = b"") -> NoiseSource:
        """The keyed source bound to one release (its id and descriptor digest)."""
        return KeyedNoiseSource(self.secret_bytes(), release=release)
