"""What a remote runner's launch checks first (Dataflow, or a cluster's workers): its paths are
remote, the `[gcp]` extra is installed, and Google Cloud's credentials are found, each failure a
one-line error before anything starts (`io.preflight` calls it for a remote runner).
"""
from __future__ import annotations

import importlib.util
import os

from pipelines import config as job_config
from transforms.secret import GCP_EXTRA


# what a remote runner needs where the job is launched (the `[gcp]` extra): module -> package
GCP_MODULES = {"google.cloud.storage": "google-cloud-storage", "apitools": "google-apitools"}
SECRET_MODULE = ("google.cloud.secretmanager", "google-cloud-secret-manager")


def preflight(job: job_config.JobConfig, runner: str, paths=()) -> None:
    """A remote runner's workers read and write only remote paths (gs://), and launching needs
    the `[gcp]` extra: a local input, output or state path, or a missing module of the extra,
    is a one-line error before anything starts. `paths`: more (name, path) the job writes."""
    named = [("output.path", job.output.path), *paths]
    if not job.input.unbounded:
        named.insert(0, ("input.path", job.input.path))
    for name, path in named:
        if "://" not in path:
            job_config.fail(name, f"a path every {runner} worker can reach (gs://my-bucket/...; "
                                  f"a local path exists on this machine only)", path)
    needed = dict(GCP_MODULES)
    if job.secret.gcp_secret:
        needed[SECRET_MODULE[0]] = SECRET_MODULE[1]
    for module, package in needed.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            job_config.fail("--runner", f"launched where the [gcp] extra is installed "
                                        f"(pip install -e \".[gcp]\" in a clone, or "
                                        f"{GCP_EXTRA}; {package} is missing)",
                            runner)
    gcp_credentials()


def pubsub_reachable() -> None:
    """A streaming job's Pub/Sub: the local emulator (PUBSUB_EMULATOR_HOST) or Google Cloud,
    whose default credentials must then be found, else one line saying what to set (a launch
    without either retried for minutes and failed on credentials)."""
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        return
    try:
        found = has_credentials()
    except ImportError:
        return  # the [pubsub] extra's absence is reported where the reader is built
    if not found:
        job_config.fail("input.subscription", "reachable: set PUBSUB_EMULATOR_HOST for the "
                                              "local emulator (or python3 -m pipelines.replay), "
                                              "or Google Cloud credentials", "neither")


def gcp_credentials() -> None:
    """Google Cloud's Application Default Credentials, found at once (a launch without them
    would wait minutes for a Cloud Storage timeout), else one line saying how to set them."""
    if not has_credentials():  # (the [gcp] extra's google.auth: checked before)
        job_config.fail("credentials", "Google Cloud's default credentials (gcloud auth "
                                       "application-default login, or "
                                       "GOOGLE_APPLICATION_CREDENTIALS=key.json)", "none found")


def has_credentials() -> bool:
    """Whether Google Cloud's Application Default Credentials are found (ImportError without
    google.auth)."""
    import google.auth  # (an extra's module: imported only when a check needs it)
    from google.auth.exceptions import DefaultCredentialsError
    try:
        google.auth.default()
    except DefaultCredentialsError:
        return False
    return True
