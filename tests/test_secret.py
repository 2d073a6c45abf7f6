"""SecretRef from Google Secret Manager (`gcp_secret`): resolved on the worker through the
client library (a fake module injected here), never in describe/repr/pickles; and its config."""
from __future__ import annotations

import pickle
import sys
import types

import pytest
import yaml

from pipelines.config import ConfigError, load, validate
from transforms.secret import SecretRef
from transforms.validation import ValidationError

NAME = "projects/my-project/secrets/dp-secret/versions/latest"
VALUE = b"s3cr3t-0123456789abcdef-payload"


class FakeClient:
    """SecretManagerServiceClient's access_secret_version(name=...).payload.data."""
    payloads = {}
    calls = []

    def access_secret_version(self, name):
        FakeClient.calls.append(name)
        if name not in self.payloads:
            raise PermissionError(f"403 Permission denied on resource {name}")
        return types.SimpleNamespace(payload=types.SimpleNamespace(data=self.payloads[name]))


@pytest.fixture
def secret_manager(monkeypatch):
    """A fake `google.cloud.secretmanager` module; its payloads by version name. The real
    `google` namespace (protobuf, and google.cloud where installed) stays in place."""
    import google
    try:
        import google.cloud as cloud
    except ImportError:
        cloud = types.ModuleType("google.cloud")
        cloud.__path__ = []
        monkeypatch.setitem(sys.modules, "google.cloud", cloud)
        monkeypatch.setattr(google, "cloud", cloud, raising=False)
    module = types.ModuleType("google.cloud.secretmanager")
    module.SecretManagerServiceClient = FakeClient
    monkeypatch.setitem(sys.modules, "google.cloud.secretmanager", module)
    monkeypatch.setattr(cloud, "secretmanager", module, raising=False)
    monkeypatch.setattr(FakeClient, "payloads", {NAME: VALUE})
    monkeypatch.setattr(FakeClient, "calls", [])
    return FakeClient


def test_bytes_come_from_the_secret_version(secret_manager):
    ref = SecretRef(gcp_secret=NAME)
    assert ref.secret_bytes() == VALUE
    assert secret_manager.calls == [NAME]
    assert ref.fingerprint() == SecretRef(literal=VALUE).fingerprint()
    assert not ref.public


def test_surrounding_whitespace_is_stripped_like_a_secret_file(secret_manager, tmp_path):
    secret_manager.payloads[NAME] = VALUE + b"\n"   # gcloud secrets versions add --data-file
    path = tmp_path / "secret"
    path.write_bytes(VALUE + b"\n")
    assert SecretRef(gcp_secret=NAME).fingerprint() == SecretRef(path=str(path)).fingerprint()


@pytest.mark.parametrize("payload", [b"", b" \n", None])
def test_an_empty_payload_is_refused(secret_manager, payload):
    secret_manager.payloads[NAME] = payload
    with pytest.raises(ValidationError, match=r"^`secret.gcp_secret` must be a non-empty "
                                              r"Secret Manager version; got '.*empty payload"):
        SecretRef(gcp_secret=NAME).secret_bytes()


def test_an_inaccessible_version_is_one_error_naming_it(secret_manager):
    other = "projects/my-project/secrets/other/versions/2"
    with pytest.raises(ValidationError, match=r"^`secret.gcp_secret` must be an accessible "
                                              r"Secret Manager version; got '" + other):
        SecretRef(gcp_secret=other).fingerprint()


def test_a_missing_client_library_names_the_gcp_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.cloud.secretmanager", None)  # import fails
    with pytest.raises(ValidationError, match=r"^`secret.gcp_secret` must be readable with "
                                              r"google-cloud-secret-manager installed \(the "
                                              r"\[gcp\] extra: .*dp-continual-release\[gcp\]"):
        SecretRef(gcp_secret=NAME).secret_bytes()


def test_the_secret_never_appears_in_describe_repr_or_pickle(secret_manager):
    ref = SecretRef(gcp_secret=NAME)
    ref.secret_bytes()                               # resolving keeps nothing on the object
    texts = [ref.describe().encode(), repr(ref).encode(), pickle.dumps(ref),
             pickle.dumps(ref.fingerprint())]
    assert NAME in ref.describe()
    for text in texts:
        assert VALUE not in text
    assert pickle.loads(pickle.dumps(ref)) == ref
    # and the control: a literal does travel in its pickle (why it is for tests only)
    assert VALUE in pickle.dumps(SecretRef(literal=VALUE))


@pytest.mark.parametrize("name", [
    "projects/P/secrets/S/versions/latest",              # project ids are 6-30 characters
    "projects/my-project/secrets/dp-secret",             # a secret, not a version
    "projects/my-project/secrets/dp-secret/versions/0",
    "projects/my-project/secrets/dp secret/versions/1",
    "projects/my-project/locations/eu/secrets/s/versions/1",
    "dp-secret", "", 7])
def test_a_malformed_name_is_refused(name):
    with pytest.raises(ValidationError, match=r"^`secret.gcp_secret` must be a Secret Manager "
                                              r"version name projects/<project>/secrets/"
                                              r"<secret>/versions/<number or latest>; got "):
        SecretRef(gcp_secret=name)


@pytest.mark.parametrize("name", [NAME, "projects/123456789012/secrets/s_1/versions/42",
                                  "projects/example.com:my-project/secrets/s/versions/1"])
def test_well_formed_names(name):
    assert SecretRef(gcp_secret=name).gcp_secret == name


def test_exactly_one_source():
    with pytest.raises(ValidationError, match=r"^`secret` must be exactly one of env, path, "
                                              r"seed, literal or gcp_secret"):
        SecretRef(env="X", gcp_secret=NAME)


BASE = {
    "job": "t", "transform": "count",
    "input": {"path": "demo:active_users.jsonl", "fields": {"timestamp": "ts", "unit": "user",
                                                            "key": "region"}},
    "steps": {"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600, "horizon": 4},
    "privacy": {"epsilon": 1.0}, "public_keys": ["a", "b"],
    "secret": {"gcp_secret": NAME}, "output": {"path": "out"},
}


def test_config_with_gcp_secret(tmp_path, secret_manager):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(BASE))
    job = load(str(path))
    assert job.secret.gcp_secret == NAME and job.secret.configured
    assert not job.secret.stored and not job.secret.insecure
    assert job.secret.ref() == SecretRef(gcp_secret=NAME)
    assert job.secret.ref().fingerprint() == SecretRef(literal=VALUE).fingerprint()


@pytest.mark.parametrize("secret, pattern", [
    ({"gcp_secret": "projects/my-project/secrets/s"},
     r"^`secret.gcp_secret` must be a Secret Manager version name projects/<project>/secrets/"
     r"<secret>/versions/<number or latest>; got 'projects/my-project/secrets/s'\.$"),
    ({"gcp_secret": 12}, r"^`secret.gcp_secret` must be a Secret Manager version name .*; "
                         r"got 12\.$"),
    ({"gcp_secret": NAME, "env": "X"}, r"^`secret` must be at most one of env, path, seed or "
                                       r"stored or gcp_secret"),
])
def test_config_refuses_a_bad_gcp_secret(secret, pattern):
    with pytest.raises(ConfigError, match=pattern) as raised:
        validate({**BASE, "secret": secret})
    assert "\n" not in str(raised.value)


def test_remote_run_accepts_a_gcp_secret_without_resolving_it(tmp_path):
    """A remote runner needs a configured secret; the driver of `pipelines.run` does not read
    it (the workers do), so no client library is needed here."""
    from pipelines import run
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**BASE, "output": {"path": str(tmp_path / "out")}}))
    job = load(str(path))
    assert job.secret.configured
    transform = run.build_transform(job)
    assert transform.private


# ----- short secrets: refused where resolved, and on the launcher, unless insecure -------------
def test_a_secret_shorter_than_16_bytes_is_refused_without_printing_it(monkeypatch, tmp_path,
                                                                        secret_manager):
    monkeypatch.setenv("DP_SHORT_SECRET", "abc")
    short = tmp_path / "short"
    short.write_text("abcdefghijklmno\n")  # 15 bytes once stripped
    secret_manager.payloads[NAME] = b"tiny"
    for ref, length in ((SecretRef(env="DP_SHORT_SECRET"), 3), (SecretRef(path=str(short)), 15),
                        (SecretRef(literal=b"abc"), 3), (SecretRef(gcp_secret=NAME), 4)):
        with pytest.raises(ValidationError) as caught:
            ref.secret_bytes()
        message = str(caught.value)
        assert message.startswith("`secret` must be at least 16 bytes (")
        assert message.endswith(f"; got {length} bytes.") and len(message) < 200
        assert "abc" not in message and "tiny" not in message  # never the secret
        insecure = SecretRef(**{k: v for k, v in vars(ref).items() if k != "insecure"},
                             insecure=True)
        assert len(insecure.secret_bytes()) == length  # tests and demos may
    monkeypatch.setenv("DP_SHORT_SECRET", "a" * 16)
    assert SecretRef(env="DP_SHORT_SECRET").secret_bytes() == b"a" * 16


def test_a_short_secret_is_refused_when_the_transform_is_built(monkeypatch):
    from transforms import ContinualCount, TimeSteps
    steps = TimeSteps(1_700_000_000.0, 60.0, 4)
    monkeypatch.setenv("DP_SHORT_SECRET", "abc")
    with pytest.raises(ValidationError, match=r"^`secret` must be at least 16 bytes \("
                                              r"environment variable DP_SHORT_SECRET.*got 3 "
                                              r"bytes\.$"):
        ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0,
                       secret=SecretRef(env="DP_SHORT_SECRET"))
    ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0,
                   secret=SecretRef(env="DP_SHORT_SECRET"), insecure=True)
    monkeypatch.setenv("DP_SHORT_SECRET", "a-long-enough-secret")
    ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0,
                   secret=SecretRef(env="DP_SHORT_SECRET"))
