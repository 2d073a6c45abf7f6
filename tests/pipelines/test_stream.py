"""The streaming job (pipelines/stream.py through `pipelines.run`) from a config with
`input.kind: pubsub`, live on the local Pub/Sub emulator (started and stopped here)."""
from __future__ import annotations

import ast
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from pipelines import config as job_config
from pipelines import run as job_run
from pipelines import schedule
from pipelines.emulator import Heartbeats
from tests.support import live as live_support
from transforms import stream_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE, HORIZON, LATENESS = 2.0, 5, 0.5
KEYS = ["eu", "us", "apac"]


def write_config(tmp_path, name: str, origin: float, source: dict) -> str:
    """configs/streaming/active_users.yaml with steps of 2 s from `origin`, a fixed seed and
    `source` as its input."""
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "streaming", "active_users.yaml")))
    raw["input"] = source
    raw["steps"] = {"origin": origin, "size_seconds": SIZE, "horizon": HORIZON}
    if source.get("kind") == "pubsub":
        raw["steps"]["allowed_lateness_seconds"] = LATENESS
    raw["public_keys"] = KEYS
    raw["bounds"] = {"max_contributions": 4, "max_contributions_per_step": 2,
                     "max_keys_per_unit": 1}
    raw["secret"] = {"seed": 11, "insecure": True}
    raw["output"] = {"path": str(tmp_path / name), "formats": ["jsonl", "csv"]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


FIELDS = {"timestamp": "t", "unit": "user", "key": "region"}


def run_live(emulator, tmp_path, pause=()):
    """The streaming job from a config, fed live: events over 5 steps of 2 s, 3 keys ("apac"
    has none in steps 1 and 3), one event of step 1 sent two steps late (or more, after a pause); nothing at all (no
    heartbeat either) during the steps in `pause`. -> (origin, events sent on time, when each
    step manifest appeared, the job's stdout)."""
    subscription = emulator.subscription("events", "job")
    origin = float(int(time.time()) + 7)  # the job is reading before step 0 begins
    config = write_config(tmp_path, "live", origin, {
        "kind": "pubsub", "subscription": subscription, "timestamp_attribute": "ms",
        "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS})
    job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", config],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps_folder = tmp_path / "live" / "active-users-live" / "steps"
    sent, seen, i, late_sent = [], {}, 0, False
    with Heartbeats(emulator, "events", every=0.3) as heartbeats:
        while time.time() < origin + SIZE * (HORIZON + 2) and job.poll() is None:
            now = time.time()
            step = int((now - origin) // SIZE)
            if step in pause:
                heartbeats.paused.set()
            else:
                heartbeats.paused.clear()
            if 0 <= step < HORIZON and step not in pause:
                region = KEYS[i % 3]
                if not (region == "apac" and step in (1, 3)):
                    row = {"user": f"u{i % 11}", "region": region, "t": now} if sent else \
                        {"user": "off-key", "region": "not-public", "t": now}  # the first
                    emulator.publish("events", row, ms=int(now * 1000))
                    sent.append(row)
                if step >= 3 and not late_sent:  # step 1's event, 2+ steps after its end
                    late = {"user": "late-user", "region": "eu", "t": origin + SIZE + 0.5}
                    emulator.publish("events", late, ms=int(late["t"] * 1000))
                    late_sent = True
            i += 1
            time.sleep(0.15)
            for path in glob.glob(str(steps_folder / "step-*.json")):
                seen.setdefault(os.path.basename(path), time.time())
        out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err[-3000:]
    return origin, sent, seen, out


def check_against_batch(tmp_path, origin, sent):
    """The published steps: one record per public key per step, equal bit for bit to the
    batch job's records of the events sent on time (same seed); one late dead letter."""
    live = live_support.published_records(tmp_path / "live" / "active-users-live", HORIZON,
                                          KEYS)
    operator = tmp_path / "live" / "active-users-live-operator"
    dead = live_support.dead_letters(operator)
    # published two steps after its step's end: late by Pub/Sub's clock, however far behind
    # the job's watermark is (a silent source stops it)
    late = [d for d in dead if d["code"] == "late"]
    assert len(late) == 1 and late[0]["reason"].startswith("late: published ") and \
        late[0]["reason"].endswith(" s after the end of step 1 (allowed lateness 0.5 s)"), dead
    # an event of a key that is not public leaves a trace (operator-only)
    assert [d["reason"] for d in dead if d["code"] != "late"] == [
        "key 'not-public' is not in public_keys: its total of step 0 is not released"]
    summary = json.load(open(operator / "summary.json"))
    assert summary["steps_published"] == HORIZON and summary["dead_letters"] == {
        "late": 1, "not_public_key": 1}
    assert live == live_support.batch_records(  # bit for bit
        tmp_path, lambda source: write_config(tmp_path, "batch", origin, source), sent, FIELDS)


def test_a_streaming_job_publishes_each_step_once_and_equals_the_batch_run(emulator, tmp_path):
    """Every step's files appear within the release delay + 1 s of the step's end, one
    record per public key per step, the late event is a dead letter naming its step, and the
    records equal the batch job's on the same (on-time) events bit for bit."""
    origin, sent, seen, out = run_live(emulator, tmp_path)
    assert sorted(seen) == [f"step-{s:08d}.json" for s in range(HORIZON)], out
    for name, when in seen.items():
        step = int(name[5:13])
        # published once every key's record is in: within the release delay (one step) + 1 s
        # of the step's end (+ 0.15 s, the polling here)
        assert when - (origin + SIZE * (step + 1)) <= SIZE + 1.15, (name, when)
    check_against_batch(tmp_path, origin, sent)
    csv_rows = open(tmp_path / "live" / "active-users-live" / "steps" /
                    "step-00000002.csv").read().splitlines()
    assert len(csv_rows) == 1 + len(KEYS)  # the same records in each format


@pytest.mark.slow  # 25 s; the jumps themselves run in CI with TestStream (tests/test_streaming.py)
def test_a_live_source_silent_for_two_steps_releases_them_once_when_it_resumes(emulator,
                                                                                tmp_path):
    """No message at all in steps 2 and 3 (an idle source: the emulator holds its pull, the
    watermark stops), then events again: the watermark jumps across both step ends at once and
    every step is still released once, equal to the batch run."""
    origin, sent, seen, out = run_live(emulator, tmp_path, pause=(2, 3))
    assert sorted(seen) == [f"step-{s:08d}.json" for s in range(HORIZON)], out
    check_against_batch(tmp_path, origin, sent)


def test_a_folder_that_holds_a_release_is_not_launched_into_again(tmp_path, capsys):
    """A streaming release stopped (or still running) is not launched again as a new release:
    the job is refused in one line before it starts (exit 2), nothing written."""
    config = write_config(tmp_path, "live", 1_800_000_000.0, {
        "kind": "pubsub", "subscription": "projects/dp-test/subscriptions/s",
        "timestamp_attribute": "ms", "format": "jsonl", "fields": FIELDS})
    public = tmp_path / "live" / "active-users-live"
    public.mkdir(parents=True)
    (public / "release.json").write_text(json.dumps({"release_id": "ab" * 16}))
    before = sorted(os.listdir(tmp_path / "live"))
    assert job_run.main(["--config", config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: `output.path` must be a folder without a release of job "
                   f"active-users-live (release {'ab' * 16} was published there: continue it "
                   f"from its last checkpointed step with --continue, or start a new release "
                   f"with a new output.path or job name); got '{tmp_path / 'live'}'."]
    assert sorted(os.listdir(tmp_path / "live")) == before


KAFKA = {"kind": "kafka", "bootstrap_servers": "localhost:9", "topic": "events",
         "format": "jsonl", "fields": FIELDS}


@pytest.mark.parametrize("args,message", [
    ([], "`--runner` must be FlinkRunner for a Kafka input (docs/engines.md); got 'none'."),
    (["--runner", "SparkRunner"], "`--runner` must be FlinkRunner for a Kafka input"),
    (["--runner", "FlinkRunner", "--continue"], "`--continue` must be left out for a Kafka "
                                                "input (Flink restores a failed job"),
    (["--runner", "FlinkRunner", "--output_executable_path=job.jar"],
     "`--output_executable_path` must be left out for a Kafka release (it is claimed at "
     "launch: a jar run twice would release it twice); got 'job.jar'."),
])
def test_a_kafka_job_runs_on_flink_once(tmp_path, capsys, args, message):
    """Kafka is read on Flink only (Beam's cross-language read), and a Kafka release is not
    continued by a later launch (Flink restores it from its own checkpoints)."""
    config = write_config(tmp_path, "live", 1_800_000_000.0, KAFKA)
    assert job_run.main(["--config", config, *args]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
    assert not (tmp_path / "live").exists()


def test_a_kafka_release_is_not_continued_as_a_pubsub_one(tmp_path, capsys):
    """The release's manifest names its source: a config edited from kafka to pubsub does not
    continue a Kafka release (its unit log was written by a job Flink may have restored)."""
    config = write_config(tmp_path, "live", 1_800_000_000.0, {
        "kind": "pubsub", "subscription": "projects/dp-test/subscriptions/s",
        "format": "jsonl", "fields": FIELDS})
    public = tmp_path / "live" / "active-users-live"
    public.mkdir(parents=True)
    (public / "release.json").write_text(json.dumps({"release_id": "ab" * 16,
                                                    "source": "kafka"}))
    assert job_run.main(["--config", config, "--continue"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: `--continue` must be used on a Pub/Sub release (this one read 'kafka': Flink "
        "restores a Kafka release from its own checkpoints; a stopped one ends); got 'kafka'.")
    assert job_run.main(["--config", config]) == 2  # nor launched into again
    assert "start a new release with a new output.path" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--streaming"], "`--streaming` must be left out for file input"),
])
def test_streaming_options_on_files_are_refused(tmp_path, capsys, args, message):
    config = write_config(tmp_path, "batch", 1_800_000_000.0, {
        "path": "demo:active_users.jsonl", "format": "jsonl", "fields": {
            "timestamp": "ts", "unit": "user", "key": "region"}})
    assert job_run.main(["--config", config, *args]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def _wait_for(path, deadline: float) -> bool:
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def batch_records(tmp_path, origin, sent, horizon):
    """The records of one batch run of the live job's config over the events `sent` (the same
    seed; no input gate: a streaming job has none), over `horizon` steps."""
    def config_of(source):
        path = write_config(tmp_path, "batch", origin, source)
        raw = yaml.safe_load(open(path))
        raw["steps"]["horizon"] = horizon
        open(path, "w").write(yaml.safe_dump(raw))
        return path
    return live_support.batch_records(tmp_path, config_of, sent, FIELDS)


class Publisher:
    """Publishes an event every `every` seconds while `stop()` is false, in the steps
    `steps_with_events` (step numbers from `origin`), recording each event sent."""

    def __init__(self, emulator, origin: float, users: int = 5, every: float = 0.15):
        self.emulator, self.origin, self.users, self.every = emulator, origin, users, every
        self.sent, self.i = [], 0

    def until(self, stop, steps_with_events):
        while not stop():
            now = time.time()
            if int((now - self.origin) // SIZE) in steps_with_events:
                row = {"user": f"u{self.i % self.users}", "region": KEYS[self.i % 3], "t": now}
                self.emulator.publish("events", row, ms=int(now * 1000))
                self.sent.append(row)
            self.i += 1
            time.sleep(self.every)


def _launched(emulator, tmp_path, horizon):
    """(origin, the launch command, the running job, its public steps folder) of a live job."""
    _, origin, config = _live_job(emulator, tmp_path, horizon)
    launch = [sys.executable, "-m", "pipelines.run", "--config", config]
    job = subprocess.Popen(launch, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    return origin, launch, job, tmp_path / "live" / "active-users-live" / "steps"


def _live_job(emulator, tmp_path, horizon):
    """(subscription, origin, config) of a live job of `horizon` steps starting in 7 s."""
    subscription = emulator.subscription("events", "job")
    origin = float(int(time.time()) + 7)
    config = write_config(tmp_path, "live", origin, {
        "kind": "pubsub", "subscription": subscription, "timestamp_attribute": "ms",
        "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS})
    raw = yaml.safe_load(open(config))
    raw["steps"]["horizon"] = horizon
    open(config, "w").write(yaml.safe_dump(raw))
    return subscription, origin, config


@pytest.mark.slow  # 40 s: headroom under CI's 10 minutes (the suite took 8:48 on 2 cores);
# tests/test_stream_checkpoint.py checks continuations from checkpoints in the default suite
def test_a_killed_streaming_job_continues_from_its_checkpoint(emulator, tmp_path):
    """Events in steps 0-1; the job is killed (SIGKILL) once step 1 is published; `--continue`
    resumes the release from its checkpoint: steps 0 and 1 are not rewritten (bytes unchanged),
    the steps after continue the same release, and all steps equal one batch run of all the
    events with the same seed. Without --continue a relaunch is refused; a finished release
    has nothing to continue."""
    horizon = 12
    subscription, origin, config = _live_job(emulator, tmp_path, horizon)
    steps = tmp_path / "live" / "active-users-live" / "steps"
    launch = [sys.executable, "-m", "pipelines.run", "--config", config]
    first = subprocess.Popen(launch, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    publisher = Publisher(emulator, origin)
    sent = publisher.sent

    def publish_until(stop: float, steps_with_events):
        publisher.until(lambda: time.time() >= stop, steps_with_events)

    with Heartbeats(emulator, "events", every=0.3):
        publish_until(origin + 2 * SIZE, (0, 1))  # events in steps 0 and 1 only
        assert _wait_for(steps / "step-00000001.json", origin + 5 * SIZE), \
            first.communicate(timeout=5)
        os.killpg(first.pid, signal.SIGKILL)  # no drain, no goodbye
        first.wait()
        before = {name: (steps / name).read_bytes() for name in os.listdir(steps)}
        assert {"step-00000000.json", "step-00000000.jsonl", "step-00000001.json",
                "step-00000001.jsonl"} <= set(before)
        refused = subprocess.run(launch, cwd=ROOT, capture_output=True, text=True)
        assert refused.returncode == 2 and "--continue" in refused.stderr
        second = subprocess.Popen(launch + ["--continue"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        checkpoints = tmp_path / "live" / "active-users-live-operator" / "checkpoint"
        assert _wait_for(checkpoints / "from-00000002.json", time.time() + 20)  # its claim
        time.sleep(1.5)  # the continuation starts reading
        resumed_from = int((time.time() - origin) // SIZE) + 1
        assert resumed_from < horizon - 1
        publish_until(origin + SIZE * horizon, range(resumed_from, horizon))
        out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err[-3000:]
    for name, data in before.items():
        assert (steps / name).read_bytes() == data, name  # not rewritten
    live = [json.loads(line) for s in range(horizon)
            for line in open(steps / f"step-{s:08d}.jsonl")]
    batch = batch_records(tmp_path, origin, sent, horizon)
    assert live == sorted(batch, key=lambda r: (r["step"], r["key"]))  # one release
    again = subprocess.run(launch + ["--continue"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "published all 12" in again.stderr, again.stderr


def _parsed(job, data, published=None, **attributes):
    import datetime
    from apache_beam.io.gcp.pubsub import PubsubMessage
    from pipelines.stream import ParseMessage
    fn = ParseMessage(job)
    fn.setup()
    out = list(fn.process(PubsubMessage(data, attributes, publish_time=None if published is None
                                        else datetime.datetime.fromtimestamp(
                                            published, datetime.timezone.utc))))
    return [o.value["reason"] if hasattr(o, "tag") else o for o in out]


def test_lateness_is_judged_on_the_publish_time_not_on_the_jobs_watermark(tmp_path):
    """An event counts if Pub/Sub received it by its step's end + the allowed lateness
    (0.5 s), whenever the job reads it; later, it is a `late` dead letter naming its step."""
    from pipelines import config as job_config
    origin = 1_800_000_000.0
    job = job_config.load(write_config(tmp_path, "live", origin, {
        "kind": "pubsub", "subscription": "projects/dp-test/subscriptions/s",
        "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS}))
    row = {"user": "u", "region": "eu", "t": origin + 3.0}  # step 1, ends at origin + 4
    data = json.dumps(row).encode()
    assert _parsed(job, data, published=origin + 4.5) == [row]
    assert _parsed(job, data, published=origin + 4.501) == [
        "late: published 0.501 s after the end of step 1 (allowed lateness 0.5 s)"]
    outside = {"user": "u", "region": "eu", "t": origin + 99.0}  # AssignSteps says outside
    assert _parsed(job, json.dumps(outside).encode(), published=origin + 999) == [outside]
    assert _parsed(job, data) == [row]  # no publish time (a runner without it): the watermark


def test_a_bad_message_is_one_dead_letter_and_a_heartbeat_nothing(tmp_path):
    """The timestamp attribute is read by the job, not Beam's reader (where a bad one fails
    the read of the messages around it): missing, unreadable, out of range, or another time
    than the record's is a dead letter; a heartbeat with data is one too."""
    from pipelines import config as job_config
    job = job_config.load(write_config(tmp_path, "live", 1_800_000_000.0, {
        "kind": "pubsub", "subscription": "projects/dp-test/subscriptions/s",
        "timestamp_attribute": "ms", "format": "jsonl", "timestamp_format": "seconds",
        "fields": FIELDS}))
    row = {"user": "u", "region": "eu", "t": 1_800_000_001.5}
    data = json.dumps(row).encode()
    assert _parsed(job, data, ms="1800000001500") == [row]
    assert _parsed(job, data, ms="2027-01-15T08:00:01.5Z") == [row]  # RFC 3339, as Beam
    assert _parsed(job, b"", heartbeat="1") == []
    assert _parsed(job, data, heartbeat="1") == ["bad message: a heartbeat with data"]
    assert _parsed(job, data) == ["bad message: `attribute 'ms'` must be milliseconds since "
                                  "the epoch or an RFC 3339 time in the years 1 to 9999; got "
                                  "None."]
    for bad in ("abc", "1" * 17, "-99999999999999"):
        assert _parsed(job, data, ms=bad)[0].startswith("bad message: `attribute 'ms'` must")
    assert _parsed(job, data, ms="1800000003600") == [
        "bad message: its attribute 'ms' (1800000003.6) and its 't' (1800000001.5) are not "
        "the same time"]
    assert _parsed(job, b"not json", ms="1800000001500")[0].startswith("invalid JSON line")


def test_a_checkpointed_release_is_not_updated_in_place(tmp_path, capsys):
    """Dataflow's --update keeps a job's Beam state under a new job graph (a new execution,
    whose unit log the checkpoints would not count): refused, drain and --continue instead."""
    config = write_config(tmp_path, "live", 1_800_000_000.0, {
        "kind": "pubsub", "subscription": "projects/dp-test/subscriptions/s",
        "timestamp_attribute": "ms", "format": "jsonl", "fields": FIELDS})
    assert job_run.main(["--config", config, "--update"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: `--update` must be left out for a checkpointed streaming release")


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", ["checkpoint/step-00000001.claim",
                                        "checkpoint/keys-at-00000001.json",
                                        "steps/step-00000001.jsonl"])
def test_a_kill_at_a_file_of_a_steps_commit_never_wedges_the_release(emulator, tmp_path,
                                                                       kill_after):
    """kill -9 as soon as one file of step 1's commit appears (its claim, its checkpoint, its
    first public file; polled from outside); `--continue` (at most twice) publishes every
    remaining step once, one record per public key, with no traceback."""
    horizon = 8
    subscription, origin, config = _live_job(emulator, tmp_path, horizon)
    public = tmp_path / "live" / "active-users-live"
    watched = {"checkpoint": tmp_path / "live" / "active-users-live-operator" / "checkpoint",
               "steps": public / "steps"}
    prefix, name = kill_after.split("/")
    launch = [sys.executable, "-m", "pipelines.run", "--config", config]
    first = subprocess.Popen(launch, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    i = 0

    def publish_for(seconds: float):
        nonlocal i
        stop = time.time() + seconds
        while time.time() < stop:
            now = time.time()
            if 0 <= (now - origin) // SIZE < horizon:
                row = {"user": f"u{i % 5}", "region": KEYS[i % 3], "t": now}
                emulator.publish("events", row, ms=int(now * 1000))
            i += 1
            time.sleep(0.1)

    with Heartbeats(emulator, "events", every=0.3):
        deadline = origin + 6 * SIZE
        while not (watched[prefix] / name).exists() and time.time() < deadline:
            publish_for(0.05)
        assert (watched[prefix] / name).exists(), first.communicate(timeout=5)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        runs, err = 0, ""
        while len(glob.glob(str(public / "steps" / "step-*.json"))) < horizon:
            assert runs < 2, f"stuck after {runs} continuations: {err[-2000:]}"
            job = subprocess.Popen(launch + ["--continue"], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
            while job.poll() is None and time.time() < origin + SIZE * (horizon + 20):
                publish_for(0.3)
            out, err = job.communicate(timeout=60)
            runs += 1
            assert "Traceback" not in err, err[-3000:]
    for step in range(horizon):
        rows = [json.loads(line) for line in open(public / "steps" / f"step-{step:08d}.jsonl")]
        assert sorted(r["key"] for r in rows) == sorted(KEYS), step


@pytest.mark.slow
def test_a_missing_subscription_and_messages_up_to_10_mb_do_not_end_the_job(emulator,
                                                                           tmp_path):
    """Messages of 2, 5 and 9.9 MB in one pull are three events (the reader's 4 MB limit
    failed the pull before); the subscription deleted for 6 s mid-job (a restart) is waited
    for: every step is published, exit 0, no traceback."""
    horizon = 10
    subscription, origin, config = _live_job(emulator, tmp_path, horizon)
    job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", config],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    big_sent = deleted = restored = False
    i = 0
    with Heartbeats(emulator, "events", every=0.3):
        while time.time() < origin + SIZE * (horizon + 3) and job.poll() is None:
            now = time.time()
            step = int((now - origin) // SIZE)
            if step == 1 and not big_sent:
                for mb in (2, 5, 9.9):  # Pub/Sub's limit is 10 MB (10^7 bytes) a message
                    row = {"user": f"big{mb}", "region": "eu", "t": now,
                           "pad": "x" * int(mb * 1e6 - 200)}
                    emulator.publish("events", row, ms=int(now * 1000)).result()
                big_sent = True
            if step == 3 and not deleted:
                emulator.subscriber.delete_subscription(subscription=subscription)
                deleted, gone = True, now
            if deleted and not restored and now > gone + 6:
                emulator.subscriber.create_subscription(name=subscription,
                                                        topic=emulator.topic("events"))
                restored = True
            if 0 <= step < horizon:
                emulator.publish("events", {"user": f"u{i % 5}", "region": KEYS[i % 3], "t": now},
                                 ms=int(now * 1000))
            i += 1
            time.sleep(0.15)
        out, err = job.communicate(timeout=90)
    assert job.returncode == 0 and "Traceback" not in err, err[-3000:]
    steps = tmp_path / "live" / "active-users-live" / "steps"
    assert len(glob.glob(str(steps / "step-*.json"))) == horizon
    operator = tmp_path / "live" / "active-users-live-operator"
    letters = [json.loads(line) for path in glob.glob(str(operator / "dead_letters-*"))
               for line in open(path)]
    assert not [d for d in letters if "big" in d["record"]], letters[:3]


@pytest.mark.slow
def test_a_continuation_started_long_after_the_horizon_publishes_every_step(emulator, tmp_path):
    """Killed after step 1; `--continue` launched 20 steps (40 s) after the horizon's end,
    past the 2 steps + 30 s the driver used to wait from the horizon's end: the steps left are
    released as the heartbeats' watermark passes them, exit 0."""
    horizon = 6
    origin, launch, first, steps = _launched(emulator, tmp_path, horizon)
    with Heartbeats(emulator, "events", every=0.3):
        Publisher(emulator, origin).until(
            lambda: (steps / "step-00000001.json").exists() or time.time() > origin + 6 * SIZE,
            range(-1, horizon + 1))
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        time.sleep(max(0.0, origin + SIZE * (horizon + 20) - time.time()))
        second = subprocess.run(launch + ["--continue"], cwd=ROOT, capture_output=True,
                                text=True, timeout=120)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert len(glob.glob(str(steps / "step-*.json"))) == horizon, second.stdout


@pytest.mark.slow
def test_events_a_killed_job_read_are_released_by_its_continuation(emulator, tmp_path):
    """Killed as step 1 is published (it has read, and Beam has acknowledged, events of the
    steps after it); `--continue` replays what the job recorded before each acknowledgement:
    every step equals one batch run of every event sent, bit for bit (before the record, the
    events read after the last checkpoint were lost)."""
    horizon = 6
    origin, launch, first, steps = _launched(emulator, tmp_path, horizon)
    publisher = Publisher(emulator, origin, users=7, every=0.12)
    sent = publisher.sent

    def publish(stop):
        publisher.until(stop, range(horizon))

    with Heartbeats(emulator, "events", every=0.3):
        publish(lambda: (steps / "step-00000001.json").exists()
                or time.time() > origin + 8 * SIZE)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        second = subprocess.Popen(launch + ["--continue"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        publish(lambda: time.time() > origin + SIZE * horizon)
        out, err = second.communicate(timeout=90)
    assert second.returncode == 0, err[-3000:]
    live = [json.loads(line) for s in range(horizon)
            for line in open(steps / f"step-{s:08d}.jsonl")]
    batch = batch_records(tmp_path, origin, sent, horizon)
    assert live == sorted(batch, key=lambda r: (r["step"], r["key"]))


@pytest.mark.slow
def test_events_sent_while_the_job_was_down_are_released_when_it_continues_late(emulator,
                                                                                tmp_path):
    """Killed as step 1 is published; events keep coming for 3 more steps while nothing runs;
    `--continue` starts after steps 2 and 3 were due: it reads what the killed job recorded
    and the backlog, and its watermark crosses each step's deadlines in order
    (`local_watermark`), so every step equals one batch run of every event sent and nothing is
    `late` (before the pacing, these steps' events were `late` dead letters)."""
    horizon = 7
    origin, launch, first, steps = _launched(emulator, tmp_path, horizon)
    publisher = Publisher(emulator, origin, users=7, every=0.12)
    with Heartbeats(emulator, "events", every=0.3):
        publisher.until(lambda: (steps / "step-00000001.json").exists()
                        or time.time() > origin + 8 * SIZE, range(horizon))
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        publisher.until(lambda: time.time() > origin + 4.6 * SIZE, range(horizon))
        second = subprocess.Popen(launch + ["--continue"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        publisher.until(lambda: time.time() > origin + SIZE * horizon, range(horizon))
        out, err = second.communicate(timeout=120)
    assert second.returncode == 0 and "Traceback" not in err, err[-3000:]
    operator = tmp_path / "live" / "active-users-live-operator"
    dead = [json.loads(line) for path in glob.glob(str(operator / "dead_letters-*.jsonl"))
            for line in open(path)]
    assert dead == []
    live = [json.loads(line) for s in range(horizon)
            for line in open(steps / f"step-{s:08d}.jsonl")]
    batch = batch_records(tmp_path, origin, publisher.sent, horizon)
    assert live == sorted(batch, key=lambda r: (r["step"], r["key"]))


@pytest.mark.slow
def test_what_the_job_read_when_its_last_step_is_published_leaves_as_dead_letters(emulator,
                                                                                  tmp_path):
    """Events past the horizon keep arriving (every 20 ms) while the last step is published:
    the job drains (it pulls no more, and what it read goes through): every message it
    recorded is a dead letter (`outside_horizon`), none vanishes with the job; the messages it
    did not pull stay in the subscription."""
    horizon = 3
    origin, launch, job, steps = _launched(emulator, tmp_path, horizon)
    publisher = Publisher(emulator, origin, users=5, every=0.1)
    outside = 0
    with Heartbeats(emulator, "events", every=0.3):
        publisher.until(lambda: time.time() > origin + SIZE * horizon, range(horizon))
        while job.poll() is None and time.time() < origin + SIZE * (horizon + 20):
            row = {"user": "after", "region": "eu", "t": origin + SIZE * (horizon + 50)}
            emulator.publish("events", row, ms=int(row["t"] * 1000))
            outside += 1
            time.sleep(0.02)
    out, err = job.communicate(timeout=90)
    assert job.returncode == 0 and "Traceback" not in err, err[-3000:]
    operator = tmp_path / "live" / "active-users-live-operator"
    dead = [json.loads(line) for path in glob.glob(str(operator / "dead_letters-*.jsonl"))
            for line in open(path)]
    recorded = [item for path in glob.glob(
        str(operator / "checkpoint" / "received" / "*" / "received-*.jsonl"))
        for item in map(json.loads, open(path)) if "id" in item
        and "heartbeat" not in item["attributes"]]
    read_after = len(recorded) - len(publisher.sent)
    assert outside > 50 and read_after > 0
    assert sorted(d["code"] for d in dead) == ["outside_horizon"] * read_after
    live = [json.loads(line) for s in range(horizon)
            for line in open(steps / f"step-{s:08d}.jsonl")]
    batch = batch_records(tmp_path, origin, publisher.sent, horizon)
    assert live == sorted(batch, key=lambda r: (r["step"], r["key"]))


def test_a_continuation_writes_the_dead_letters_of_recorded_messages_no_execution_wrote(
        tmp_path):
    """A job killed after recording a pull and before writing its dead letters: the
    continuation derives them again from the record (publish-time lateness included) and
    writes those no dead-letter file holds, as a multiset (two identical bad messages, one
    written before the kill: one more now)."""
    import datetime

    from apache_beam.io.gcp.pubsub import PubsubMessage

    from pipelines import config as job_config
    from pipelines.stream import WriteBundleFiles, unwritten_dead_letters
    origin = 1_800_000_000.0
    job = job_config.load(write_config(tmp_path, "live", origin, {
        "kind": "pubsub", "subscription": "projects/dp-test/subscriptions/s",
        "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS}))

    def message(data, published):
        return PubsubMessage(data, {}, message_id=str(published), publish_time=(
            datetime.datetime.fromtimestamp(published, datetime.timezone.utc)))
    good = json.dumps({"user": "u", "region": "eu", "t": origin + 1.0}).encode()
    messages = [message(b"not json", origin + 1), message(b"not json", origin + 2),
                message(good, origin + 1.5), message(good, origin + 9.0)]  # the last: late
    assert [d["code"] for d in unwritten_dead_letters(job, messages)] == [
        "unparseable", "unparseable", "late"]
    writer = WriteBundleFiles(f"{job.operator_path}/dead_letters")  # the killed job's bundle
    os.makedirs(job.operator_path, exist_ok=True)
    writer.start_bundle()
    writer.process(unwritten_dead_letters(job, messages[:1])[0])
    writer.finish_bundle()
    assert [d["code"] for d in unwritten_dead_letters(job, messages)] == ["unparseable", "late"]


@pytest.mark.slow
def test_a_restart_of_the_emulator_mid_job_does_not_end_the_release(emulator, tmp_path):
    """The emulator process stopped for 3 s at step 2 and started again (it forgets every
    topic, subscription and message; the operator creates them again): the job's pulls fail
    meanwhile and are retried, no traceback, every step is published and equals one batch run
    of every event sent (none is sent while it is down or just before: those are lost with
    the emulator's memory, not by the job)."""
    from pipelines.emulator import PubSubEmulator
    if not isinstance(emulator, PubSubEmulator):
        pytest.skip("restarts the Pub/Sub emulator process (not installed here)")
    horizon = 6
    subscription, origin, config = _live_job(emulator, tmp_path, horizon)
    job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", config],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    publisher = Publisher(emulator, origin, users=7, every=0.12)
    with Heartbeats(emulator, "events", every=0.3) as heartbeats:
        publisher.until(lambda: time.time() > origin + 2 * SIZE, range(horizon))
        heartbeats.paused.set()
        time.sleep(1.0)  # what was published is pulled (and recorded) before the restart
        emulator.restart(down_seconds=3.0)
        emulator.subscription("events", subscription.rsplit("/", 1)[1])
        heartbeats.paused.clear()
        publisher.until(lambda: time.time() > origin + SIZE * horizon, range(horizon))
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0 and "Traceback" not in err, err[-3000:]
    steps = tmp_path / "live" / "active-users-live" / "steps"
    live = [json.loads(line) for s in range(horizon)
            for line in open(steps / f"step-{s:08d}.jsonl")]
    batch = batch_records(tmp_path, origin, publisher.sent, horizon)
    assert live == sorted(batch, key=lambda r: (r["step"], r["key"]))


@pytest.mark.slow  # about 6 minutes: 1,050 steps of 0.25 s, live
def test_a_stream_with_no_horizon_runs_past_1000_steps_as_scheduled_runs_release_it(emulator,
                                                                                   tmp_path):
    """`steps.horizon: unbounded`, steps of 0.25 s: the job publishes step after step past
    1,000 until stopped (SIGINT), each step within a second of its end; its records equal
    a scheduled release of the same events (files, the same seed) bit for bit; each key's
    checkpointed state at step t is the size the plan states (25 + 16 t B, sealed)."""
    size, count = 0.25, 1050
    _, origin, config = _live_job(emulator, tmp_path, "unbounded")
    raw = yaml.safe_load(open(config))
    raw["steps"] = {"origin": origin, "size_seconds": size, "horizon": "unbounded",
                    "allowed_lateness_seconds": size / 2}
    raw["privacy"], raw["mechanism"] = {"rho": 0.5}, {"name": "auto"}
    open(config, "w").write(yaml.safe_dump(raw))
    job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", config],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    steps = tmp_path / "live" / "active-users-live" / "steps"
    last = steps / f"step-{count - 1:08d}.json"
    sent, i = [], 0
    with Heartbeats(emulator, "events", every=0.1):
        while not last.exists() and job.poll() is None and \
                time.time() < origin + size * count + 60:
            now = time.time()
            if 0 <= now - origin < size * count:
                row = {"user": f"u{i % 200}", "region": KEYS[i % 3], "t": now}
                emulator.publish("events", row, ms=int(now * 1000))
                sent.append(row)
            i += 1
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGINT)
        out, err = job.communicate(timeout=60)
    assert last.exists(), err[-3000:]
    operator = tmp_path / "live" / "active-users-live-operator"
    summary = json.load(open(operator / "summary.json"))
    assert summary["horizon"] == "unbounded" and summary["steps_published"] >= count
    assert summary["seconds_after_step_end"]["max"] < 1.0 + size, summary
    assert f"{summary['steps_published']} steps published (stopped: --continue resumes" in out
    live = live_support.published_records(tmp_path / "live" / "active-users-live", count, KEYS)
    assert {r["mechanism"] for r in live} == {"log_sqrt_toeplitz"}
    late = {ast.literal_eval(d["record"])["t"] for d in live_support.dead_letters(operator)
            if d["code"] == "late"}  # published after their step's lateness (a busy machine)
    assert len(late) <= len(sent) // 100, late
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in sent if row["t"] not in late))
    raw["input"] = {"path": str(data), "format": "jsonl", "timestamp_format": "seconds",
                    "fields": FIELDS, "max_dead_letter_fraction": 1.0}
    raw["steps"] = {k: raw["steps"][k] for k in ("origin", "size_seconds", "horizon")}
    raw["output"] = {"path": str(tmp_path / "scheduled"), "formats": ["jsonl"]}
    batch = tmp_path / "scheduled.yaml"
    batch.write_text(yaml.safe_dump(raw))
    scheduled = schedule.run_once(str(batch), str(tmp_path / "state"), origin + size * count)
    assert live == sorted(live_support.records(scheduled["records"]),
                          key=lambda r: (r["step"], r["key"]))
    release = job_run.build_transform(job_config.load(config), checkpoint="unused").config
    last, _, states, _ = stream_checkpoint.verified_resume(  # as --continue rebuilds them
        release, str(operator / "checkpoint"), KEYS)
    assert last == summary["last_step"] and sorted(states) == sorted(KEYS)
    assert {len(state[0]) for state in states.values()} == {summary["state_bytes_per_key"]} \
        == {25 + 16 * (last + 1)}
    # each step's checkpoint holds each key's step entry, not its history (O(keys) per step)
    entries = [repr(stream_checkpoint.read_key_checkpoint(
        release, str(operator / "checkpoint"), step)["key_states"]) for step in (100, last)]
    assert abs(len(entries[1]) - len(entries[0])) < 3 * 20, entries  # (a value's digits)

