"""Live streaming from Pub/Sub on the local emulator: events published in real time over 5
steps of 2 s, read by `ReadFromPubSub(timestamp_attribute=...)` on Beam's local streaming
runner, released by ContinualCount and published per step by WriteStepFiles (the transforms'
API, without the job driver). The emulator is started and stopped by the fixture; without it the
test is skipped and says why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pipelines.emulator import stop_group
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


@pytest.mark.slow  # tests/pipelines/test_stream.py runs the same path from a config in CI
def test_a_live_stream_publishes_every_step_once_within_the_release_delay(emulator, tmp_path):
    subscription = emulator.subscription("events", "events-job")
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
            emulator.publish("events", data, ts=int(now * 1000))
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
        stop_group(job)
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
