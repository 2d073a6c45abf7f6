"""The remote runner's launch checks (pipelines/remote.py)."""
from __future__ import annotations

import pytest


def test_a_launch_without_google_credentials_is_one_line_at_once(monkeypatch):
    """No Application Default Credentials: refused before anything waits on Cloud Storage."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from pipelines import remote

    def none_found(*args, **kwargs):
        raise DefaultCredentialsError("no credentials")
    monkeypatch.setattr(google.auth, "default", none_found)
    with pytest.raises(ValueError, match=r"^`credentials` must be Google Cloud's default "
                                         r"credentials \(gcloud auth application-default "
                                         r"login, or GOOGLE_APPLICATION_CREDENTIALS=key.json\); "
                                         r"got 'none found'\.$"):
        remote.gcp_credentials()
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (object(), "project"))
    remote.gcp_credentials()


def test_a_streaming_job_without_the_emulator_or_credentials_is_one_line(monkeypatch):
    """Neither PUBSUB_EMULATOR_HOST nor Google Cloud credentials: refused at once, saying
    what to set (the reader would retry for minutes, then fail on credentials)."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from pipelines import remote

    def none_found(*args, **kwargs):
        raise DefaultCredentialsError("no credentials")
    monkeypatch.setattr(google.auth, "default", none_found)
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    with pytest.raises(ValueError, match=r"^`input.subscription` must be reachable: set "
                                         r"PUBSUB_EMULATOR_HOST for the local emulator"):
        remote.pubsub_reachable()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")
    remote.pubsub_reachable()
