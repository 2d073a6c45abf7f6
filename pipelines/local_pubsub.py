"""Beam's local runner reading Pub/Sub, made to survive what Pub/Sub does.

Beam 2.77's local reader (`runners/direct/transform_evaluator.py`, `_PubSubReadEvaluator`)
pulls up to 10 messages with the client's default gRPC receive limit of 4 MB, and fails the job
on any error of the pull. So a 3 MB and a 2 MB message in one pull fail the job, and so does a
subscription missing for a moment (an emulator or a service restart) or a deadline. `install()`
(called by the local streaming driver, `pipelines.run`) changes this in this process:

- a pull takes up to `MAX_MESSAGES` messages (Beam's takes 10, and the local runner
  schedules its reader only when the rest of the pipeline is idle: about 10 pulls a second)
  and waits up to `PULL_SECONDS` for one (Beam's waits 30 s: an idle job's watermark stood
  still that long); the subscriber's channel takes `MAX_RECEIVE` bytes: a full pull of
  Pub/Sub's 10 MB messages;
- a pull that fails with a transient error (`TRANSIENT`: not found, unavailable, deadline
  exceeded, internal, aborted, resource exhausted) is retried with backoff (0.5 s doubling to
  10 s) for up to `retry_seconds`; then the job fails with one line saying `--continue` resumes
  it. A failed pull acknowledged nothing, so a retried one loses nothing;
- its watermark is paced (`local_watermark`, set with `local_watermark.pace`): a step is
  released only after every unit's contribution to it arrived, however far behind the clock
  the job runs; and it never passes the time up to which the subscription is known to be read
  (`Drained`): a continuation catching up a backlog releases no step before it has pulled the
  backlog's messages published in time for it, nor before the messages a killed job's open
  pull held are given out again;
- with `record(receipts)` (a checkpointed release), every pull's messages are written down
  before they are acknowledged (Beam acknowledges as it pulls): a job killed at any point
  loses no message it read; its continuation replays what it read and did not release.

Dataflow reads Pub/Sub with its own service-side reader; none of this applies there.
"""
from __future__ import annotations

import math
import os
import time

from pipelines import local_watermark

MAX_MESSAGES = 100  # per pull (Beam's reader pulls 10: about 100 messages/s on the local runner)
MAX_RECEIVE = MAX_MESSAGES * (10 << 20) + (1 << 20)  # a full pull of Pub/Sub's largest messages
RETRY_SECONDS = 120.0
BACKOFF = (0.5, 10.0)  # first wait, longest wait (doubling)


class PubSubUnavailable(RuntimeError):
    """A transient fault of Pub/Sub that outlasted the retries."""


def transient_errors() -> tuple:
    from google.api_core import exceptions
    return (exceptions.NotFound, exceptions.ServiceUnavailable, exceptions.DeadlineExceeded,
            exceptions.InternalServerError, exceptions.Aborted, exceptions.ResourceExhausted,
            exceptions.Unknown)


def retried(pull, retry_seconds: float = RETRY_SECONDS, sleep=time.sleep, clock=time.monotonic,
            failed=None):
    """`pull()` retried on transient errors (see the module docstring), else its result;
    `failed()` is called at each error retried."""
    transient = transient_errors()
    start, wait = clock(), BACKOFF[0]
    while True:
        try:
            return pull()
        except transient as error:
            if failed is not None:
                failed()
            if clock() - start + wait > retry_seconds:
                raise PubSubUnavailable(
                    f"`Pub/Sub` must answer the job's pull within {retry_seconds:g} s; got "
                    f"{type(error).__name__} ({str(error).splitlines()[0][:120]}): the release "
                    f"is stopped; `--continue` resumes it from its last checkpointed "
                    f"step.") from None
            sleep(wait)
            wait = min(wait * 2, BACKOFF[1])


def subscriber_client():
    """A subscriber whose channel receives up to MAX_RECEIVE bytes (the emulator's, when
    PUBSUB_EMULATOR_HOST is set)."""
    import grpc
    from google.cloud import pubsub
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport
    options = [("grpc.max_receive_message_length", MAX_RECEIVE),
               ("grpc.max_send_message_length", -1)]
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    if host:
        channel = grpc.insecure_channel(host, options=options)
    else:
        channel = SubscriberGrpcTransport.create_channel(options=options)
    return pubsub.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


SKEW = 0.2  # seconds a short pull's mark stays behind its start (clocks; Drained)
SLACK_SECONDS = 10.0  # full pulls for this long: the mark moves to their oldest message
# the longest a recorded pull waits for a message (Beam's waits 30 s): an idle job's watermark
# moves at least this often, and a killed job's pull stays open in Pub/Sub at most this long
PULL_SECONDS = 5.0


class Drained:
    """Up to when (seconds, publish time) the subscription is known to be read.

    A pull that returned fewer messages than it asked for found the subscription empty of
    everything published before the pull began: read up to its start, less `SKEW` (the
    publish times are the service's clock, the start this machine's). That holds for the
    Pub/Sub emulator, which hands out its backlog oldest first and in full pulls; Pub/Sub
    itself promises neither (a pull may return fewer messages than it could, in any order),
    so on it the mark is an estimate and an on-time message read after its step was released
    is a `late` dead letter, as on an overloaded job. A full pull moves the mark only when no
    short pull came for `slack` seconds (an overloaded job keeps releasing, at the pace it
    reads its backlog: up to the pull's oldest message). The mark only rises.

    Until `blind_until` (wall clock) no pull moves it: a job killed while its pull was waiting
    leaves that pull open in Pub/Sub, which hands it messages for up to the pull's timeout and
    gives them out again only once their acknowledgement deadline passed. So a continuation
    trusts no pull that began before its start + `PULL_SECONDS` + the subscription's
    acknowledgement deadline + `SKEW` (`blind_seconds`): catching up, it waits that long
    before it releases a due step, rather than release it without those messages. A pull of
    its own that failed may have been handed messages too: `failed` blinds it again as long.
    (A first launch trusts its pulls at once: a step due at its start whose messages a killed
    job of another release held are `late` dead letters.)

    >>> drained = Drained(blind_until=100.0, slack=10.0)
    >>> drained.pulled(started=99.0, asked=10, stamps=[])  # a killed job's pull may be open
    -inf
    >>> drained.pulled(started=100.0, asked=10, stamps=[41.0])  # short: up to its start
    99.8
    >>> drained.pulled(started=105.0, asked=10, stamps=[40.0] * 10)  # full: no news
    99.8
    >>> drained.pulled(started=111.0, asked=10, stamps=[60.0] * 10)  # full for 10 s: oldest
    99.8
    >>> drained.pulled(started=112.0, asked=10, stamps=[130.0] * 10)
    130.0
    >>> drained.failed(now=113.0, blind=15.0)  # a pull failed: blind again until 128
    >>> drained.pulled(started=120.0, asked=10, stamps=[])
    130.0
    """

    def __init__(self, blind_until: float = -math.inf, slack: float = SLACK_SECONDS,
                 blind: float = PULL_SECONDS + 10.0 + SKEW):
        self.blind_until, self.until, self.slack = blind_until, -math.inf, slack
        self.blind = blind  # seconds a failed pull blinds it (`blind_seconds`)
        self.short_at = None  # when the last short pull began (None: none yet)

    def pulled(self, started: float, asked: int, stamps: list) -> float:
        if started < self.blind_until:
            return self.until
        if len(stamps) < asked:
            self.short_at = started
            self.until = max(self.until, started - SKEW)
        elif self.short_at is None or started - self.short_at >= self.slack:
            if self.short_at is None:
                self.short_at = started
            else:
                self.until = max(self.until, min(stamps))
        return self.until

    def failed(self, now: float, blind: float) -> None:
        """A pull failed (it may have been handed messages Pub/Sub gives out again only after
        their acknowledgement deadline): no pull moves the mark for `blind` seconds."""
        self.blind_until = max(self.blind_until, now + blind)


def blind_seconds(subscription: str) -> float:
    """How long after its start an execution trusts no pull (`Drained`): the longest a pull
    of a killed execution stays open (`PULL_SECONDS`) + the subscription's acknowledgement
    deadline (asked once; Pub/Sub's default, 10 s, if it cannot be read)."""
    try:
        found = retried(lambda: subscriber_client().get_subscription(
            subscription=subscription, timeout=30), 30.0)
        deadline = float(found.ack_deadline_seconds or 10)
    except Exception:  # noqa: BLE001 (a subscription that cannot be read: the reader fails)
        deadline = 10.0
    return PULL_SECONDS + deadline + SKEW


# how far this process's local reader has read its subscription (`Drained`; reset by install)
DRAINED = [Drained()]


# where each pull's messages are recorded before they are acknowledged (`record`), or None
RECEIPTS = [None]


def record(receipts) -> None:
    """Records every pulled message with `receipts(messages)` (a `stream.ReceiptLog`) before
    the pull is acknowledged: a job killed after its pull loses nothing (its continuation
    replays what was recorded and not released); None stops recording."""
    RECEIPTS[0] = receipts


def read_recorded(evaluator, retry_seconds: float):
    """Beam's local pull (`_read_from_pubsub` without a timestamp attribute: each message at
    its publish time) of up to MAX_MESSAGES, waiting up to PULL_SECONDS, its messages
    recorded before their acknowledgement (`record`)."""
    from apache_beam.io.gcp.pubsub import PubsubMessage
    from apache_beam.utils.timestamp import Timestamp
    from google.api_core import exceptions
    client = evaluator._get_subscriber_client(evaluator._applied_ptransform)

    def pull():
        try:
            return client.pull(subscription=evaluator._sub_name, max_messages=MAX_MESSAGES,
                               timeout=PULL_SECONDS)
        except exceptions.DeadlineExceeded:  # Pub/Sub's answer to an idle pull: nothing
            return None
    drained = DRAINED[0]
    response = retried(pull, retry_seconds,
                       failed=lambda: drained.failed(time.time(), drained.blind))
    if response is None:
        return []
    messages = [PubsubMessage._from_message(rm.message) for rm in response.received_messages]
    if messages:
        if RECEIPTS[0] is not None:
            RECEIPTS[0](messages)
        ack_ids = [rm.ack_id for rm in response.received_messages]
        retried(lambda: client.acknowledge(subscription=evaluator._sub_name, ack_ids=ack_ids),
                retry_seconds)
    return [(Timestamp.from_utc_datetime(m.publish_time), m) for m in messages]


# whether the local reader stops reading (`drain`)
DRAINING = [False]


def drain() -> None:
    """Ends the local job as a drain: its reader pulls no more messages (the ones it did not
    pull stay in the subscription, unacknowledged) and moves its watermark to the end of time,
    so every element it read goes through the rest of the pipeline (released, or a dead letter
    written) before the job ends."""
    DRAINING[0] = True


def install(retry_seconds: float = RETRY_SECONDS, blind: float = PULL_SECONDS + 10.0 + SKEW,
            continuation: bool = False) -> None:
    """Hardens the local runner's Pub/Sub reader in this process (idempotent); `blind`: the
    seconds during which no pull is trusted to have drained the subscription after a pull
    failed, and from now on for a `continuation` (`Drained`, `blind_seconds`)."""
    from apache_beam.runners.direct import transform_evaluator as te
    DRAINING[0] = False
    DRAINED[0] = Drained(time.time() + blind if continuation else -math.inf, blind=blind)
    evaluator = te._PubSubReadEvaluator
    if getattr(evaluator, "_dp_hardened", None) == retry_seconds:
        return
    original_read = getattr(evaluator, "_dp_original_read", evaluator._read_from_pubsub)

    def client_state(cls, transform):
        state = cls._subscriber_client_cache.get(transform)
        if state is None:
            state = te._PubSubSubscriberClient(subscriber_client())
            cls._subscriber_client_cache[transform] = state
            import weakref
            weakref.finalize(transform, state.close)
        return state

    original_finish = getattr(evaluator, "_dp_original_finish", evaluator.finish_bundle)

    def read_from_pubsub(self, timestamp_attribute):
        if timestamp_attribute is not None:  # its stamps are the producers' clocks
            raise ValueError(f"`timestamp_attribute` must be unset for the local reader (the "
                             f"project's jobs read by publish time); got "
                             f"{timestamp_attribute!r}.")
        started = time.time()
        pulled = read_recorded(self, retry_seconds)
        DRAINED[0].pulled(started, MAX_MESSAGES, [stamp.micros / 1e6 for stamp, _ in pulled])
        self._dp_pulled = pulled
        return pulled

    def finish_bundle(self):
        if DRAINING[0]:  # pull nothing more; the reader is done, its watermark at the end
            from apache_beam.runners.direct.util import TransformResult
            from apache_beam.runners.direct.watermark_manager import WatermarkManager
            return TransformResult(self, [], [], None,
                                   {None: WatermarkManager.WATERMARK_POS_INF})
        # the reader's watermark, paced (`local_watermark`): Beam reports the wall clock
        self._dp_pulled = []
        result = original_finish(self)
        holds = result.keyed_watermark_holds
        if None in holds:
            holds[None] = local_watermark.paced_hold(self, self._dp_pulled, holds[None],
                                                     DRAINED[0].until)
        return result

    evaluator._dp_original_read = original_read
    evaluator._dp_original_finish = original_finish
    evaluator.finish_bundle = finish_bundle
    evaluator._get_subscriber_client_state_unlocked = classmethod(client_state)
    evaluator._read_from_pubsub = read_from_pubsub
    evaluator._dp_hardened = retry_seconds
