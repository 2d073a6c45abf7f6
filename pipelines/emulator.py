"""The local Google Cloud Pub/Sub emulator, started and stopped by the code that needs it.

    with PubSubEmulator(project="dp-demo") as emulator:     # sets PUBSUB_EMULATOR_HOST
        emulator.subscription("events", "events-job")      # -> projects/dp-demo/subscriptions/...
        emulator.publish("events", {"user": "u1"}, ts=1767225600000)

`gcloud beta emulators pubsub start` runs the emulator as a Java child that outlives gcloud: it
is started in its own process group and the whole group is stopped. An idle emulator holds a
pull up to 30 s; `Heartbeats` publishes a `heartbeat` message every `every` seconds (the
streaming job drops them, `pipelines.stream`) so that the watermark keeps moving.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Optional

from transforms.validation import fail

MISSING = ("the Pub/Sub emulator is not installed: install the Google Cloud CLI with its "
           "pubsub-emulator component (gcloud components install pubsub-emulator, or the Debian "
           "package google-cloud-cli-pubsub-emulator) and Java 11+")


def free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def available() -> Optional[str]:
    """None when the emulator and the client library are here, else why not (one line)."""
    if shutil.which("gcloud") is None:
        return MISSING
    try:
        import google.cloud.pubsub_v1  # noqa: F401
    except ImportError:
        return ("google-cloud-pubsub is not installed (pip install -e \".[pubsub]\")")
    return None


def stop_group(process: subprocess.Popen) -> None:
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


class PubSubEmulator:
    """A running emulator for `project` (a context manager); its host is exported as
    PUBSUB_EMULATOR_HOST while it runs, so Beam's connector and the client library use it."""

    def __init__(self, project: str = "dp-demo", start_seconds: float = 30.0):
        self.project, self.start_seconds = project, start_seconds
        self.process = self.publisher = None
        self._previous_host = None

    def __enter__(self) -> "PubSubEmulator":
        why = available()
        if why is not None:
            fail("Pub/Sub emulator", "installed", why)
        from google.cloud import pubsub_v1
        self.host = f"127.0.0.1:{free_port()}"
        self._previous_host = os.environ.get("PUBSUB_EMULATOR_HOST")
        os.environ["PUBSUB_EMULATOR_HOST"] = self.host
        try:
            self._start()
            self.publisher = pubsub_v1.PublisherClient()
            self.subscriber = pubsub_v1.SubscriberClient()
            self._wait_listening()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        self.process = subprocess.Popen(
            ["gcloud", "beta", "emulators", "pubsub", "start", f"--host-port={self.host}",
             f"--project={self.project}"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)

    def _wait_listening(self) -> None:
        deadline = time.time() + self.start_seconds
        while True:  # the emulator starts in about 2 s
            try:
                self.publisher.list_topics(request={"project": f"projects/{self.project}"},
                                           timeout=2)
                return
            except Exception:  # noqa: BLE001 (not listening yet)
                if time.time() > deadline or self.process.poll() is not None:
                    fail("Pub/Sub emulator", f"started within {self.start_seconds:g} s",
                         f"not listening on {self.host}")
                time.sleep(0.2)

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stops the emulator (it forgets every topic, subscription and message), waits
        `down_seconds`, and starts it again on the same host (an operator's restart)."""
        stop_group(self.process)
        time.sleep(down_seconds)
        self._start()
        self._wait_listening()

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            stop_group(self.process)
        if self._previous_host is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = self._previous_host

    def topic(self, name: str) -> str:
        return self.publisher.topic_path(self.project, name)

    def subscription(self, topic: str, name: str) -> str:
        """Creates `topic` (if new) and the subscription `name` to it; returns its path."""
        path = self.subscriber.subscription_path(self.project, name)
        try:
            self.publisher.create_topic(name=self.topic(topic))
        except Exception as error:  # noqa: BLE001 (AlreadyExists)
            if "AlreadyExists" not in type(error).__name__:
                raise
        self.subscriber.create_subscription(name=path, topic=self.topic(topic))
        return path

    def publish(self, topic: str, record: Optional[dict], **attributes):
        """One message: `record` as a JSON object (None: an empty heartbeat), attributes as
        strings. Returns its future (`.result()` waits until the emulator has it: waiting on
        each message in turn caps a publisher at a few dozen messages a second)."""
        data = b"" if record is None else json.dumps(record).encode("utf-8")
        return self.publisher.publish(self.topic(topic), data,
                                      **{k: str(v) for k, v in attributes.items()})


class Heartbeats:
    """Publishes a heartbeat message to `topic` every `every` seconds, in a thread, while in
    its `with` block. `ts` is the wall clock (ms): the watermark follows it."""

    def __init__(self, emulator: PubSubEmulator, topic: str, every: float = 0.5):
        self.emulator, self.topic, self.every = emulator, topic, every
        self.done, self.paused = threading.Event(), threading.Event()  # set: no heartbeats
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self.done.wait(self.every):
            if self.paused.is_set():
                continue
            try:
                self.emulator.publish(self.topic, None, heartbeat=1,
                                      ts=int(time.time() * 1000)).result()
            except Exception:  # noqa: BLE001 (the emulator stopping)
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(timeout=5)
