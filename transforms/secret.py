"""Where the noise secret comes from, resolved on the worker (never logged, never output).

A `SecretRef` is what a pipeline carries: an environment variable name, a file path (any Beam
filesystem path, e.g. gs://...; the file holds the secret bytes), a Google Secret Manager version
(`projects/P/secrets/S/versions/V`, read on the worker; needs the `[gcp]` extra), an explicit
`seed` for tests and demos, or literal bytes (tests only: they are pickled into the pipeline
graph, so like a seed they are public: a transform takes them only with insecure=True and marks
its records private: false). Only the reference travels in the pipeline: never the secret
itself (except `literal`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
from typing import Optional

from transforms import validation as check
from transforms.mechanisms.noise import (NOISE_DOMAIN_VERSION, KeyedNoiseSource, NoiseSource,
                                         seed_secret)

# projects/<project id or number>/secrets/<secret id>/versions/<version number or latest>
GCP_SECRET = re.compile(r"projects/(?:[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,20}"
                        r"|[a-z0-9.-]{1,63}:[a-z][a-z0-9-]{4,28}[a-z0-9])"
                        r"/secrets/[A-Za-z0-9_-]{1,255}/versions/(?:latest|[1-9][0-9]{0,19})")
GCP_SECRET_SHAPE = ("a Secret Manager version name projects/<project>/secrets/<secret>/versions/"
                    "<number or latest>")
GCP_EXTRA = "pip install 'dp-continual-release[gcp]'"


def check_gcp_secret(name: str, resource) -> str:
    """A Secret Manager secret version's resource name, or one error naming `name`."""
    if not isinstance(resource, str) or not GCP_SECRET.fullmatch(resource):
        check.fail(name, GCP_SECRET_SHAPE, resource)
    return resource


@dataclasses.dataclass(frozen=True)
class SecretRef:
    env: Optional[str] = None
    path: Optional[str] = None
    seed: Optional[int] = None
    literal: Optional[bytes] = dataclasses.field(default=None, repr=False)
    gcp_secret: Optional[str] = None  # projects/P/secrets/S/versions/V (resolved on the worker)

    def __post_init__(self):
        given = [n for n in ("env", "path", "seed", "literal", "gcp_secret")
                 if getattr(self, n) is not None]
        if len(given) != 1:
            check.fail("secret", "exactly one of env, path, seed, literal or gcp_secret", given)
        if self.gcp_secret is not None:
            check_gcp_secret("secret.gcp_secret", self.gcp_secret)

    def describe(self) -> str:
        if self.env is not None:
            return f"environment variable {self.env}"
        if self.path is not None:
            return f"file {self.path}"
        if self.gcp_secret is not None:
            return f"Google Secret Manager {self.gcp_secret}"
        return "explicit seed (not private)" if self.seed is not None else \
            "literal (tests only, not private)"

    @property
    def public(self) -> bool:
        """A seed is public: whoever knows it can subtract the noise. Literal bytes are pickled
        into the job graph (staged templates, worker logs of a failed unpickling): public too."""
        return self.seed is not None or self.literal is not None

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
        if self.gcp_secret is not None:
            return self._gcp_secret_bytes()
        from apache_beam.io.filesystems import FileSystems
        with FileSystems.open(self.path) as handle:
            data = handle.read().strip()
        if not data:
            check.fail("secret", f"non-empty in {self.path}", "empty file")
        return data

    def _gcp_secret_bytes(self) -> bytes:
        """The payload of the Secret Manager version (the caller's credentials: on Dataflow the
        worker service account, which needs roles/secretmanager.secretAccessor)."""
        try:
            from google.cloud import secretmanager
        except ImportError:
            check.fail("secret.gcp_secret", f"readable with google-cloud-secret-manager installed "
                                            f"(the [gcp] extra: {GCP_EXTRA})", "not installed")
        client = secretmanager.SecretManagerServiceClient()
        try:
            data = client.access_secret_version(name=self.gcp_secret).payload.data
        except Exception as error:  # the API's errors name the resource, never the payload
            check.fail("secret.gcp_secret", "an accessible Secret Manager version",
                       f"{self.gcp_secret} ({type(error).__name__}: {error})")
        data = bytes(data or b"").strip()
        if not data:
            check.fail("secret.gcp_secret", "a non-empty Secret Manager version",
                       f"{self.gcp_secret} (empty payload)")
        return data

    def fingerprint(self) -> str:
        """HMAC-SHA256(secret, "fingerprint"): identifies the secret, reveals nothing of it."""
        return hmac.new(self.secret_bytes(), b"dp-continual-release/fingerprint",
                        hashlib.sha256).hexdigest()

    def noise_source(self, release: bytes = b"",
                     version: str = NOISE_DOMAIN_VERSION) -> NoiseSource:
        """The keyed source bound to one release (its id and descriptor digest), deriving
        noise as `version` (the release's: `noise.NOISE_VERSIONS`)."""
        return KeyedNoiseSource(self.secret_bytes(), release=release, version=version)
