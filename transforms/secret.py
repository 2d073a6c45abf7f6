"""Where the noise secret comes from, resolved on the worker (never logged, never output).

A `SecretRef` is what a pipeline carries: an environment variable name, a file path (any Beam
filesystem path, e.g. gs://...; the file holds the secret bytes), a Google Secret Manager version
(`projects/P/secrets/S/versions/V`, read on the worker; needs the `[gcp]` extra), an explicit
`seed` for tests and demos, or literal bytes (tests only: they are pickled into the pipeline
graph, so like a seed they are public: a transform takes them only with insecure=True and marks
its records private: false). Only the reference travels in the pipeline: never the secret
itself (except `literal`).

A secret (env, path, gcp_secret, literal) must be at least MIN_SECRET_BYTES = 16 bytes (the
keyed noise's 128-bit security: a short one can be guessed, and with it every node's noise);
a shorter one is refused where it is resolved, unless `insecure` (tests and demos). The error
gives its length, never the secret. A seed is public anyway and is not checked.
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


MIN_SECRET_BYTES = 16


def check_secret_length(data: bytes, source: str, insecure: bool = False) -> bytes:
    """`data` when it is at least MIN_SECRET_BYTES long or `insecure`; else one error naming
    the source and the length (never the secret)."""
    if len(data) < MIN_SECRET_BYTES and not insecure:
        raise check.ValidationError(
            f"`secret` must be at least {MIN_SECRET_BYTES} bytes ({_short(source)}; shorter "
            f"ones can be guessed: insecure=True for tests); got {len(data)} bytes.")
    return data


def _short(source: str, limit: int = 60) -> str:
    """A secret's source as an error shows it: a long path keeps its end."""
    return source if len(source) <= limit else "..." + source[-(limit - 3):]


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
    # tests and demos: a secret shorter than MIN_SECRET_BYTES is taken (a transform built with
    # insecure=True sets it; a config's `secret.insecure: true`)
    insecure: bool = False

    def __post_init__(self):
        given = [n for n in ("env", "path", "seed", "literal", "gcp_secret")
                 if getattr(self, n) is not None]
        if len(given) != 1:
            check.fail("secret", "exactly one of env, path, seed, literal or gcp_secret", given)
        check.boolean("secret.insecure", self.insecure)
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
            return check_secret_length(self.literal, "literal", self.insecure)
        if self.env is not None:
            value = os.environ.get(self.env)
            if not value:
                check.fail("secret", f"set in the environment variable {self.env}", "unset")
            return check_secret_length(value.encode("utf-8"),
                                       f"environment variable {self.env}", self.insecure)
        if self.gcp_secret is not None:
            return check_secret_length(self._gcp_secret_bytes(), "secret.gcp_secret",
                                       self.insecure)
        from apache_beam.io.filesystems import FileSystems
        with FileSystems.open(self.path) as handle:
            data = handle.read().strip()
        if not data:
            check.fail("secret", f"non-empty in {self.path}", "empty file")
        return check_secret_length(data, f"file {self.path}", self.insecure)

    def check_early(self) -> None:
        """On the launcher: an env secret set here, or a local file, is resolved and checked
        now (`check_secret_length`), so a short one is one line before the job starts. An
        unset variable, a remote path or a Secret Manager version is left to the workers."""
        if self.env is not None and os.environ.get(self.env):
            self.secret_bytes()
        elif self.path is not None and "://" not in self.path and os.path.isfile(self.path):
            self.secret_bytes()
        elif self.literal is not None:
            self.secret_bytes()

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
