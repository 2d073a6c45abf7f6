"""Live streaming from Pub/Sub on the local emulator: events published in real time over 5
steps of 2 s, read by `ReadFromPubSub(timestamp_attribute=...)` on Beam's local streaming
runner, released by ContinualCount and published per step by WriteStepFiles. The emulator is
started (in its own process group: gcloud leaves a Java child behind) and stopped here; without
gcloud's emulator or google-cloud-pubsub the test is skipped and says why."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.beam import run

SIZE, HORIZON, DELAY = 2.0, 5, 1
KEYS = ["eu", "us"]

JOB = """
import json, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from transforms import ContinualCount, SecretRef, TimeSteps
from transforms.step_files import WriteStepFiles
subscription, origin, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
steps = TimeSteps(origin, {size}, {horizon})
with beam.Pipeline(options=PipelineOptions(["--streaming"])) as p:
    events = (p | beam.io.ReadFromPubSub(subscription=subscription, timestamp_attribute="ts")
              | beam.Map(json.loads) | beam.Filter(lambda r: "user" in r)
              | beam.Map(lambda r: beam.window.TimestampedValue((r["user"], r["key"]), r["t"])))
    result = events | ContinualCount(steps=steps, public_keys={keys!r}, epsilon=1.0,
                                     secret=SecretRef(literal=b"live"), insecure=True)
    result.records | WriteStepFiles(out, {keys!r})
""".format(size=SIZE, horizon=HORIZON, keys=KEYS)


def _free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def _stop(process):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def emulator(monkeypatch):
    if shutil.which("gcloud") is None:
        pytest.skip("the Pub/Sub emulator (gcloud beta emulators pubsub) is not installed")
    pubsub = pytest.importorskip("google.cloud.pubsub_v1",
                                 reason="google-cloud-pubsub is not installed")
    host = f"127.0.0.1:{_free_port()}"
    process = subprocess.Popen(["gcloud", "beta", "emulators", "pubsub", "start",
                                f"--host-port={host}", "--project=dp-live"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
    try:
        publisher, subscriber = pubsub.PublisherClient(), pubsub.SubscriberClient()
        topic = publisher.topic_path("dp-live", "events")
        subscription = subscriber.subscription_path("dp-live", "events-job")
        for _ in range(150):  # the emulator starts in about 2 s
            try:
                publisher.create_topic(name=topic)
                break
            except Exception:  # noqa: BLE001 (not listening yet)
                time.sleep(0.2)
        else:
            pytest.skip("the Pub/Sub emulator did not start within 30 s")
        subscriber.create_subscription(name=subscription, topic=topic)
        yield publisher, topic, subscription
    finally:
        _stop(process)


def test_a_live_stream_publishes_every_step_once_within_the_release_delay(emulator, tmp_path):
    publisher, topic, subscription = emulator
    out = str(tmp_path / "steps")
    origin = float(int(time.time()) + 6)  # the job starts reading before the first step
    job = subprocess.Popen([sys.executable, "-c", JOB, subscription, repr(origin), out],
                           env=dict(os.environ, PYTHONPATH=os.getcwd()),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    sent, published, i = [], {}, 0
    try:
        while time.time() < origin + SIZE * (HORIZON + DELAY + 1.5):
            now = time.time()
            # events in most steps, none for "eu" in the third; heartbeats keep the watermark
            # moving (the idle emulator holds a pull up to 30 s)
            step = int((now - origin) // SIZE)
            event = 0 <= step < HORIZON and i % 3 != 2 and not (step == 2 and i % 2)
            data = {"user": f"u{i % 7}", "key": KEYS[i % 2], "t": now} if event else \
                {"heartbeat": True}
            publisher.publish(topic, json.dumps(data).encode(),
                              ts=str(int(now * 1000))).result()
            if event:
                sent.append(((data["user"], data["key"]), now))
            i += 1
            time.sleep(0.2)
            if os.path.isdir(out):
                for name in os.listdir(out):
                    if name.endswith(".json") and name not in published:
                        published[name] = time.time()
        assert job.poll() is None, job.stderr.read().decode()[-2000:]
    finally:
        _stop(job)
    manifests = sorted(published)
    assert manifests == [f"step-{s:08d}.json" for s in range(HORIZON)]
    for name, seen in published.items():
        manifest = json.load(open(os.path.join(out, name)))
        end = origin + SIZE * (manifest["step"] + 1)
        # published once every key's record is in: within the release delay + 1 s (+ 0.2 s,
        # the polling here) of the step's end
        assert seen - end <= SIZE * DELAY + 1.2, (name, seen - end)
    from transforms import ContinualCount, SecretRef, TimeSteps
    batch, _ = run(ContinualCount(steps=TimeSteps(origin, SIZE, HORIZON), public_keys=KEYS,
                                  epsilon=1.0, secret=SecretRef(literal=b"live"),
                                  insecure=True), sent)
    live = [json.loads(line) for s in range(HORIZON)
            for line in open(os.path.join(out, f"step-{s:08d}.jsonl"))]
    assert live == sorted(batch, key=lambda r: (r["step"], r["key"]))  # bit for bit
