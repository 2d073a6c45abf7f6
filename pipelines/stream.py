"""The streaming job: one config with `input.kind: pubsub` (or `kafka`, on Flink), released step
by step as it runs.

    python3 -m pipelines.run --config my_stream.yaml            # local: Beam's streaming runner
    python3 -m pipelines.run --config my_stream.yaml --runner DataflowRunner ...   # launches

Stages, with the element after each:

    ReadFromPubSub(subscription)                        PubsubMessage (at its publish time)
    (Kafka: ReadFromKafka(topic), AsMessages            the same, at its Kafka timestamp)
    ParseMessages                                       its record (a dict) or a dead letter
    ToElements                                          the transform's element at its record's
                                                        time, or a dead letter
    (count, sum: the events wait for the release's claim; each unit's state after each step
     goes to the execution's unit log, `transforms.stream_checkpoint`)
    <transform>, claimed by release.json                records at each step's release
    WriteStepFiles                                      steps/step-N.<format> + step-N.json, once
    StepStatus                                          operator/steps/step-N.json (publication lag)
    dead letters                                        operator/dead_letters-<bundle>.jsonl

`release.json` is the release's claim: the job creates it (create-if-absent) before any step
can be published (Kafka on Flink: the driver, right before it submits the job), so a second launch into the same folder fails before it writes anything. A
message with the attribute `heartbeat` is not an event (publishers of an idle topic send them
so that the watermark moves: the local emulator holds an idle pull up to 30 s); it is dropped
before parsing.

A count or sum is checkpointed (`transforms.stream_checkpoint`, in the operator folder): each
step is claimed by its execution and checkpointed before its files are written. A stopped job
continues with `--continue` (`Continuation`: the checkpoint verified, the steps from the last
checkpointed one + 1 claimed once, the units' and keys' states resumed). A job launched again
into a folder that holds a release without `--continue` is refused; a new release needs a new
output folder or job name.
"""
from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import List

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipelines import config as job_config
from pipelines import io, kafka_local
from pipelines.checkpoints import read_json, write_text
from transforms import registry
from transforms.claims import ClaimOnce, guard, guarded
from transforms.durable import create_if_absent
from transforms.messages import DEAD_LETTER, METRICS, dead_letter
from transforms.messages import StepWindow
from transforms.step_files import StepCheckpoint, WriteStepFiles, publish_step, step_name
from transforms.streams.records import Reason
from transforms.validation import fail
from transforms import stream_checkpoint as ck
from pipelines.commit import dead_letter_files
from pipelines.storage import remove_stale_temps
from transforms.claims import read_claim
from transforms.mechanisms.choose import state_bytes_per_key
from pipelines import commit

HEARTBEAT = "heartbeat"  # a message attribute: the message is not an event


def steps_folder(public_folder: str) -> str:
    return f"{public_folder.rstrip('/')}/steps"


def release_claim(job: job_config.JobConfig, manifest: dict) -> ClaimOnce:
    """The streaming release's claim and manifest in one: `<public>/release.json`."""
    return ClaimOnce(f"{job.public_path.rstrip('/')}/release.json", manifest,
                     f"the folder {job.public_path} (it holds a release of job {job.job}; a "
                     f"streaming release is launched once: a new release needs a new output "
                     f"folder or job name)")


def attribute_seconds(name: str, attribute) -> float:
    """A message's timestamp attribute (milliseconds since the epoch, or RFC 3339 as Beam's
    Pub/Sub reader takes it) -> seconds, else a one-line error."""
    from apache_beam.utils.timestamp import Timestamp
    text = attribute if isinstance(attribute, str) else ""
    try:
        seconds = int(text) / 1000.0 if text.lstrip("-").isdigit() and len(text) <= 16 \
            else float(Timestamp.from_rfc3339(text))
    except (ValueError, OverflowError, TypeError):
        seconds = None
    if seconds is None or not job_config.TIME_RANGE[0] <= seconds <= job_config.TIME_RANGE[1]:
        fail(f"attribute {name!r}", "milliseconds since the epoch or an RFC 3339 time in the "
                                    "years 1 to 9999", attribute)
    return seconds


class ParseMessage(beam.DoFn):
    """PubsubMessage -> its record (one JSON object, a dict), or a dead letter. A heartbeat
    (the attribute `heartbeat` and no data) is dropped, counted (operator-only). With a
    timestamp attribute, the record's own timestamp field (its event time, as in a file) must
    agree with it to the millisecond: a message without it, with an unreadable one or with
    another time is a dead letter (the attribute is parsed here, not by the reader, where a
    bad one would fail the read of the messages around it). A record published (Pub/Sub's
    publish time) after its step's end + `allowed_lateness_seconds` is a `late` dead letter:
    lateness is judged on Pub/Sub's clock, not on the job's watermark, so it does not depend
    on when the job read the message (a lagging, paused or restarted job, or a replay)."""

    def __init__(self, job: job_config.JobConfig, skip_ids=frozenset()):
        self.skip_ids = frozenset(skip_ids)  # redelivered messages a continuation replays
        self.attribute = job.input.timestamp_attribute
        self.field = job.input.fields["timestamp"]
        self.timestamp_format = job.input.timestamp_format
        self.heartbeats = Metrics.counter(METRICS, "heartbeats")
        self.steps = job.steps.time_steps()
        self.lateness = job.steps.allowed_lateness_seconds

    def setup(self):
        self.parse = io.ParseJson()

    def process(self, message):
        if self.skip_ids and getattr(message, "message_id", None) in self.skip_ids:
            return  # recorded by an earlier execution: replayed once, from its record
        attributes = dict(message.attributes or {})
        if HEARTBEAT in attributes:
            if not message.data:
                self.heartbeats.inc()
                return
            yield dead_letter(message.data, Reason("bad_message",
                                                     "bad message: a heartbeat with data"))
            return
        stamped = None
        if self.attribute is not None:
            try:
                stamped = attribute_seconds(self.attribute, attributes.get(self.attribute))
            except ValueError as error:
                yield dead_letter(message.data, Reason("bad_message", f"bad message: {error}"))
                return
        published = message.publish_time.timestamp() if getattr(
            message, "publish_time", None) is not None else None
        for row in self.parse.process(message.data):
            if (stamped is not None or published is not None) and isinstance(row, dict) \
                    and self.field in row:
                try:
                    seconds = io.parse_cell(self.field, "timestamp", row[self.field],
                                            self.timestamp_format)
                except ValueError:
                    seconds = None  # the record's own error: ToElement dead-letters it
                late = self._late(seconds, published)
                if late is not None:
                    yield dead_letter(row, late)
                    continue
                if stamped is not None and seconds is not None and \
                        abs(seconds - stamped) >= 0.001:
                    yield dead_letter(row, Reason(
                        "bad_message", f"bad message: its attribute {self.attribute!r} "
                                       f"({stamped!r}) and its {self.field!r} ({seconds!r}) "
                                       f"are not the same time"))
                    continue
            yield row


    def _late(self, seconds, published):
        """The `late` reason of a record of event time `seconds` published at `published`,
        or None (on time, outside the horizon: AssignSteps says so, or no time)."""
        step = None if seconds is None or published is None else self.steps.step_of(seconds)
        if step is None:
            return None
        after = published - self.steps.end(step)
        if after <= self.lateness:
            return None
        return Reason("late", f"late: published {after:.3f} s after the end of step {step} "
                              f"(allowed lateness {self.lateness:g} s)")


def read_elements(pipeline, job: job_config.JobConfig, remote: bool,
                  continuation: "Continuation" = None, messages=None):
    """-> (elements with event times, [dead-letter PCollections]) from the subscription. The
    reader stamps messages with their publish time (the watermark follows it); each element's
    event time is its record's timestamp field, as in a file. A continuation also replays
    what earlier executions recorded (`ReceiptLog`): the events of its steps (earlier ones were
    published or dead-lettered by the execution that read them), and skips those messages if
    Pub/Sub delivers them again. `messages`: read elsewhere (a Kafka topic's records)."""
    source = job.input
    if messages is None:
        messages = pipeline | "ReadFromPubSub" >> beam.io.ReadFromPubSub(
            subscription=source.subscription, with_attributes=True,
            # the local runner refuses id_label; Dataflow deduplicates redelivered messages
            id_label=source.id_attribute if remote else None)
    replayed = list(continuation.replayed) if continuation is not None else []
    rows = messages | "ParseMessages" >> beam.ParDo(ParseMessage(
        job, {m.message_id for m in replayed})).with_outputs(DEAD_LETTER, main="rows")
    elements = rows.rows | "ToElements" >> beam.ParDo(io.ToElement(job)).with_outputs(
        DEAD_LETTER, main="elements")
    dead = [rows[DEAD_LETTER], elements[DEAD_LETTER]]
    if continuation is not None and continuation.unwritten:
        dead.append(pipeline | "UnwrittenDeadLetters" >> beam.Create(
            continuation.unwritten, reshuffle=False))
    if not replayed:
        return elements.elements, dead
    steps, first = job.steps.time_steps(), continuation.first
    again = (pipeline | "Recorded" >> beam.Create(replayed, reshuffle=False)
             | "ParseRecorded" >> beam.ParDo(ParseMessage(job)).with_outputs(DEAD_LETTER,
                                                                            main="rows"))
    recorded = again.rows | "RecordedElements" >> beam.ParDo(io.ToElement(job)).with_outputs(
        DEAD_LETTER, main="elements")
    unreleased = recorded.elements | "OfStepsLeft" >> beam.ParDo(_FromStep(steps, first))
    # (the replay's own dead letters are `continuation.unwritten`, once each)
    return (elements.elements, unreleased) | "WithRecorded" >> beam.Flatten(), dead


class WriteBundleFiles(beam.DoFn):
    """Operator-only lines (dead letters) -> one JSON-lines file per bundle under `prefix`,
    created whole (create-if-absent of a fresh name) when the bundle finishes."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def start_bundle(self):
        self.lines = []

    def process(self, record):
        self.lines.append(json.dumps(record, sort_keys=True))

    def finish_bundle(self):
        if self.lines:
            path = f"{self.prefix}-{uuid.uuid4().hex}.jsonl"
            create_if_absent(path, ("\n".join(self.lines) + "\n").encode("utf-8"))
            self.lines = []


class StepStatus(beam.DoFn):
    """A published step's manifest -> the operator's note of it: when it was published and how
    long after its step's end (operator-only: publication times follow the data's arrival)."""

    def __init__(self, folder: str, steps):
        self.folder, self.steps = folder, steps

    def process(self, manifest):
        now = time.time()
        status = {"step": manifest["step"], "records": manifest["records"], "published_at": now,
                  "seconds_after_step_end": now - self.steps.end(manifest["step"])}
        create_if_absent(step_name(self.folder, manifest["step"], ".json"),
                         json.dumps(status, sort_keys=True).encode("utf-8"))
        yield status


class _FromStep(beam.DoFn):
    """Elements whose event time is in a step from `first` on."""

    def __init__(self, steps, first: int):
        self.steps, self.first = steps, first

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        step = self.steps.step_of(timestamp.micros / 1e6)
        if step is not None and step >= self.first:
            yield beam.window.TimestampedValue(element, timestamp)


class ReceiptLog:
    """What an execution of a checkpointed release read from Pub/Sub, recorded before each pull
    is acknowledged (`local_pubsub.record`): `<checkpoint>/received/<execution>/<random>.jsonl`,
    one MAC'd file per pull (operator-only: the messages are the data). A continuation replays
    the recorded events of the steps not yet published (`Continuation.replayed`)."""

    def __init__(self, folder: str, config, execution: str):
        self.folder, self.config, self.execution = folder, config, execution

    def __call__(self, messages) -> None:
        import base64
        lines = [json.dumps({"id": m.message_id, "data": base64.b64encode(m.data).decode(
            "ascii"), "attributes": dict(m.attributes or {}),
            "published": m.publish_time.isoformat() if m.publish_time else None},
            sort_keys=True) for m in messages]
        name = f"received-{uuid.uuid4().hex}.jsonl"
        folder = ck.join(self.folder, "received", self.execution)
        if "://" not in folder:
            os.makedirs(folder, exist_ok=True)
        data = ("\n".join(lines) + "\n").encode("utf-8")
        create_if_absent(ck.join(folder, name), ck.sealed(self.config, name, data))


def received_messages(config, folder: str) -> list:
    """Every message the release's executions recorded (`ReceiptLog`), each file's MAC
    verified (a damaged one is refused naming it), once per message id."""
    import base64
    import datetime
    from apache_beam.io.gcp.pubsub import PubsubMessage
    seen, out = set(), []
    for _, body in ck.sealed_bodies(config, folder, "received/*/received-*.jsonl"):
        for line in body.decode("utf-8").splitlines():
            item = json.loads(line)
            if item["id"] in seen:
                continue
            seen.add(item["id"])
            published = item.get("published")
            out.append(PubsubMessage(base64.b64decode(item["data"]), item["attributes"],
                                     message_id=item["id"], publish_time=(
                                         datetime.datetime.fromisoformat(published)
                                         if published else None)))
    return out


def unwritten_dead_letters(job: job_config.JobConfig, messages: list) -> list:
    """The dead letters that reading `messages` (recorded by earlier executions) gives
    (`ParseMessage`, `io.ToElement`: deterministic, lateness by publish time included) and
    that no dead-letter file under the operator folder holds yet: an execution killed after
    recording a pull and before writing its dead letters loses none of them. Matched as a
    multiset of whole dead letters (two identical ones are two)."""
    if not messages:
        return []
    import collections
    from apache_beam.io.filesystems import FileSystems
    parse, to_element = ParseMessage(job), io.ToElement(job)
    parse.setup()
    letters = []
    for message in messages:
        for row in parse.process(message):
            outs = [row] if isinstance(row, beam.pvalue.TaggedOutput) else \
                to_element.process(row)
            letters.extend(out.value for out in outs
                           if isinstance(out, beam.pvalue.TaggedOutput))
    if not letters:
        return []
    written = collections.Counter()
    for path in dead_letter_files(job.operator_path):
        with FileSystems.open(path) as handle:
            written.update(line for line in handle.read().decode("utf-8").splitlines()
                           if line.strip())
    unwritten = []
    for letter in letters:
        line = json.dumps(letter, sort_keys=True)
        if written[line] > 0:
            written[line] -= 1
        else:
            unwritten.append(letter)
    return unwritten


def checkpoint_folder(job: job_config.JobConfig) -> str:
    """Operator-only (the keys' mechanism states and the units' truncation states)."""
    return f"{job.operator_path.rstrip('/')}/checkpoint"


def checkpointed(job: job_config.JobConfig) -> bool:
    """Whether the job's release can be continued (`transforms.stream_checkpoint`: the
    transforms whose truncation keeps a flat state)."""
    return registry.can(job.transform, registry.CHECKPOINT)


class Continuation:
    """A stopped streaming release, verified (`stream_checkpoint.verified_resume`): it
    continues from `first` = its last checkpointed step + 1."""

    def __init__(self, job: job_config.JobConfig, transform):
        self.folder = checkpoint_folder(job)
        last, self.units, self.keys, self.records = ck.verified_resume(
            transform.config, self.folder, job.public_keys)
        self.first = last + 1
        # what earlier executions read (recorded before Beam acknowledged it): replayed, its
        # events of the steps from `first` on (the ones no step published yet) counted again
        self.replayed = received_messages(transform.config, self.folder)
        # their dead letters that the executions which read them did not write (killed first)
        self.unwritten = unwritten_dead_letters(job, self.replayed)
        # every step checkpointed: nothing to release (`republish` restores missing files)
        self.complete = self.first >= job.steps.horizon
        self.republished = []

    @property
    def attempt(self) -> int:
        """This continuation's attempt at its first step: one more than the claims made from
        it before (continuations that stopped before checkpointing any step)."""
        return 1 + max((a for f, a in ck.epochs(self.folder) if f == self.first), default=0)

    def claim(self, transform) -> ClaimOnce:
        """The continuation's claim of the steps from `first`, once per attempt
        (`from-<first>.json`, then `from-<first>-<attempt>.json`): made only while no step
        from `first` on is checkpointed (the proof is the checkpoint chain: an earlier
        continuation from `first` that published nothing is superseded, one that published a
        step is continued from after it); two concurrent continuations race for one name."""
        folder, first = self.folder, self.first
        self.epoch = (first, self.attempt)

        def nothing_later(what):
            later = [s for s in ck.checkpointed_steps(folder) if s >= first]
            if later:
                fail("claim", f"new: {what} was continued before (step {later[0]} is "
                              f"checkpointed: --continue again resumes after it)", later[0])
        return ClaimOnce(ck.join(folder, ck.claim_name(*self.epoch)),
                         {"release_id": transform.release_id, "first": first,
                          "attempt": self.epoch[1]},
                         f"steps from {first} of release {transform.release_id} (attempt "
                         f"{self.epoch[1]})", precondition=nothing_later)

    def republish(self, job: job_config.JobConfig, transform) -> List[int]:
        """The files of every checkpointed step whose manifest is missing (a job stopped
        between a step's checkpoint and its files: the same bytes, from the checkpoint's
        records); -> those steps."""
        from apache_beam.io.filesystems import FileSystems
        folder, done = steps_folder(job.public_path), []
        received = ck.join(self.folder, "received")
        executions = [ck.join(received, name) for name in sorted(os.listdir(received))] \
            if os.path.isdir(received) else []
        for stopped in (folder, self.folder, job.operator_path, *executions):  # a killed
            remove_stale_temps(stopped)                                    # job's temp files
        for step in range(self.first):
            if not FileSystems.exists(step_name(folder, step, ".json")):
                records = ck.read_key_checkpoint(transform.config, self.folder, step)["records"]
                publish_step(folder, step, sorted(records, key=lambda r: r["key"]),
                             job.output.formats)
                done.append(step)
        return done


def build(pipeline, job: job_config.JobConfig, transform, manifest: dict, remote: bool,
          continuation: Continuation = None, kafka_expansion: str = None):
    """The streaming job's graph (the module docstring's stages); `continuation`: the steps
    from its first, from its verified checkpoint; `kafka_expansion`: a Kafka input's
    expansion service (Flink). -> the release's `ClaimedByDriver` for the driver to claim
    right before it runs the job (Kafka), else None (the job claims)."""
    in_driver = kafka_expansion is not None  # Flink: claimed here (`ClaimedByDriver`)
    if continuation is None:
        passed, first = guard(pipeline, release_claim(job, manifest), "ClaimRelease",
                              in_driver), 0
        epoch = (0, 0)
    else:
        passed, first = guard(pipeline, continuation.claim(transform), "ClaimContinuation"), \
            continuation.first
        epoch = continuation.epoch
        if first > 0:  # from step 0 (nothing was published): the release's fresh states
            transform.resume(
                StepWindow(first, job.steps.horizon),
                unit_states=pipeline | "UnitStates" >> beam.Create(
                    list(continuation.units.items()), reshuffle=False),
                key_states=pipeline | "KeyStates" >> beam.Create(
                    list(continuation.keys.items()), reshuffle=False))
    messages = None if job.input.kind != "kafka" else kafka_local.read_messages(
        pipeline, job.input.bootstrap_servers, job.input.topic, kafka_expansion,
        f"dp-{transform.release_id}-{passed.token}")  # the launch's own group: the topic whole
    elements, dead = read_elements(pipeline, job, remote, continuation, messages)
    transform.claimed_by(passed)  # nothing is published before the claim
    result = elements | job.transform >> transform
    step_checkpoint = None if transform.checkpoint is None else StepCheckpoint(
        transform.config, transform.checkpoint, first, result.key_states, passed,
        transform.execution, epoch[1])
    manifests = result.records | "PublishSteps" >> WriteStepFiles(
        steps_folder(job.public_path), job.public_keys, job.output.formats, step_checkpoint)
    _ = manifests | "StepStatus" >> beam.ParDo(StepStatus(
        steps_folder(job.operator_path), job.steps.time_steps()))
    dead_letters = guarded(dead + [result.dead_letters] | "AllDeadLetters" >> beam.Flatten(),
                           passed, "CheckedDeadLetters")
    _ = dead_letters | "WriteDeadLetters" >> beam.ParDo(WriteBundleFiles(
        f"{job.operator_path.rstrip('/')}/dead_letters"))
    return passed if in_driver else None


def published_steps(job: job_config.JobConfig, read: dict = None) -> dict:
    """step -> its operator note (a step republished from its checkpoint has none: its
    publication time is unknown), for the steps published so far (local folders). `read`:
    the notes read by an earlier call, by path (each is written once), kept so that a job
    followed for many steps reads each once."""
    found, read = {}, {} if read is None else read
    for folder, note in ((steps_folder(job.public_path), False),
                         (steps_folder(job.operator_path), True)):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.startswith("step-") and name.endswith(".json"):
                path = os.path.join(folder, name)
                status = read.get(path)
                try:
                    status = read[path] = status or read_json(path)
                except (OSError, ValueError):
                    continue
                if note:
                    found[status["step"]] = status
                else:
                    found.setdefault(status["step"], {
                        "step": status["step"], "records": status["records"],
                        "seconds_after_step_end": None})
    return found


def published_release(job: job_config.JobConfig):
    """The release.json of the job's folder, or None; a damaged one is one error naming it."""
    try:
        return read_claim(f"{job.public_path.rstrip('/')}/release.json")
    except OSError:
        return {"release_id": "unreadable"}


def refuse_published_folder(job: job_config.JobConfig) -> None:
    """A folder that holds a release is not launched into again as a new release (one line,
    before launching): it continues, with --continue, or a new release goes elsewhere."""
    release = published_release(job)
    if release is not None:
        resume = "continue it from its last checkpointed step with --continue, or " \
            if release.get("source", "pubsub") == "pubsub" else ""
        job_config.fail("output.path", f"a folder without a release of job {job.job} (release "
                                       f"{release.get('release_id')} was published there: "
                                       f"{resume}start a new release with a new output.path "
                                       f"or job name)", job.output.path)


class Watch:
    """The local driver's view of a running streaming job: it runs `wait_until_finish` in a
    thread (the local runner returns only when the job ends or fails) and reads the operator
    folder for the steps published."""

    def __init__(self, result):
        self.result, self.error = result, None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self):
        try:
            self.result.wait_until_finish()
        except BaseException as error:  # noqa: BLE001 (reported by the driver)
            self.error = error

    @property
    def ended(self) -> bool:
        return not self.thread.is_alive()

    def stop(self) -> None:
        try:
            self.result.cancel()
        except Exception:  # noqa: BLE001 (a runner that cannot cancel: the process ends)
            pass


def operator_summary(job: job_config.JobConfig, published: dict, delay_steps: int) -> dict:
    """What the operator folder's summary.json says of a running streaming job (NOT private:
    exact dead-letter counts and publication times; with no horizon, also each key's state
    after the last step published, which grows with the steps: `state_bytes_per_key`)."""
    lags = [published[step]["seconds_after_step_end"] for step in sorted(published)
            if published[step]["seconds_after_step_end"] is not None]
    summary = {"steps_published": len(published), "horizon": job.steps.shown_horizon,
               "last_step": max(published, default=None),
               "release_delay_steps": delay_steps,
               "seconds_after_step_end": {"max": max(lags, default=None),
                                          "last": lags[-1] if lags else None},
               **commit.dead_letters_by_code(job.operator_path)}
    descriptor = ((published_release(job) or {}).get("descriptor") or {}) \
        if job.steps.unbounded and published else {}
    if "mechanism" in descriptor:  # (a release's own: its resolved mechanism)
        summary["state_bytes_per_key"] = state_bytes_per_key(
            descriptor["mechanism"], job.steps.horizon, job.privacy.noise, max(published) + 1)
    return summary


def step_line(job: job_config.JobConfig, status: dict) -> str:
    rows = [json.loads(line) for line in open(step_name(
        steps_folder(job.public_path), status["step"], ".jsonl"))] \
        if "jsonl" in job.output.formats else []
    values = ", ".join(f"{r['key']} {r['value']:g}" for r in rows[:6]) + (
        ", ..." if len(rows) > 6 else "")
    lag = status["seconds_after_step_end"]
    when = "published before this job" if lag is None else \
        f"published {lag:.1f} s after the step's end"
    return f"step {status['step']}: {status['records']} records, {when}" + (
        f": {values}" if values else "")


def follow(job: job_config.JobConfig, watch: Watch, out, delay_steps: int, poll: float = 0.2,
           grace_seconds: float = None, before=()) -> int:
    """Prints each step as it is published and keeps the operator summary current; returns
    once every step is published (0), the job failed (2), or the last step's release time is
    `grace_seconds` behind the wall clock with steps missing (1). `before`: the steps
    published before the job started (a continued release); a step this job publishes is
    printed once its operator note (its lag) is written too."""
    steps = job.steps.time_steps()
    # a job started after the horizon's end (a late continuation) is given the grace from its
    # start: its due steps are released as its input's watermark reaches them
    last_release = max(steps.end(steps.horizon - 1 + delay_steps), time.time())
    grace = grace_seconds if grace_seconds is not None else 2 * job.steps.size_seconds + 30
    shown, written, read = set(), None, {}
    while True:
        published = published_steps(job, read)
        for step in sorted(set(published) - shown):
            if published[step]["seconds_after_step_end"] is None and step not in before:
                continue  # its files are in, its operator note not yet
            print(step_line(job, published[step]), file=out, flush=True)
            shown.add(step)
        if written != len(shown):
            summary = operator_summary(job, published, delay_steps)
            write_text(os.path.join(job.operator_path, "summary.json"),
                       json.dumps(summary, indent=2, sort_keys=True))
            written = len(shown)
        if len(shown) == steps.horizon:
            return 0
        if watch.ended:
            return 2 if watch.error is not None else 1
        if time.time() > last_release + grace:
            return 1
        time.sleep(poll)
