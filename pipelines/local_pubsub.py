"""Beam's local runner reading Pub/Sub, made to survive what Pub/Sub does.

Beam 2.77's local reader (`runners/direct/transform_evaluator.py`, `_PubSubReadEvaluator`)
pulls up to 10 messages with the client's default gRPC receive limit of 4 MB, and fails the job
on any error of the pull. So a 3 MB and a 2 MB message in one pull fail the job, and so does a
subscription missing for a moment (an emulator or a service restart) or a deadline. `install()`
(called by the local streaming driver, `pipelines.run`) changes this in this process:

- a recorded pull takes up to `MAX_MESSAGES` messages (Beam's takes 10, and the local runner
  schedules its reader only when the rest of the pipeline is idle: about 10 pulls a second);
  the subscriber's channel takes `MAX_RECEIVE` bytes: a full pull of Pub/Sub's 10 MB messages;
- a pull that fails with a transient error (`TRANSIENT`: not found, unavailable, deadline
  exceeded, internal, aborted, resource exhausted) is retried with backoff (0.5 s doubling to
  10 s) for up to `retry_seconds`; then the job fails with one line saying `--continue` resumes
  it. A failed pull acknowledged nothing, so a retried one loses nothing;
- its watermark is paced (`local_watermark`, set with `local_watermark.pace`): a step is
  released only after every unit's contribution to it arrived, however far behind the clock
  the job runs;
- with `record(receipts)` (a checkpointed release), every pull's messages are written down
  before they are acknowledged (Beam acknowledges as it pulls): a job killed at any point
  loses no message it read; its continuation replays what it read and did not release.

Dataflow reads Pub/Sub with its own service-side reader; none of this applies there.
"""
from __future__ import annotations

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


def retried(pull, retry_seconds: float = RETRY_SECONDS, sleep=time.sleep, clock=time.monotonic):
    """`pull()` retried on transient errors (see the module docstring), else its result."""
    transient = transient_errors()
    start, wait = clock(), BACKOFF[0]
    while True:
        try:
            return pull()
        except transient as error:
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


# where each pull's messages are recorded before they are acknowledged (`record`), or None
RECEIPTS = [None]


def record(receipts) -> None:
    """Records every pulled message with `receipts(messages)` (a `stream.ReceiptLog`) before
    the pull is acknowledged: a job killed after its pull loses nothing (its continuation
    replays what was recorded and not released); None stops recording."""
    RECEIPTS[0] = receipts


def read_recorded(evaluator, retry_seconds: float):
    """Beam's local pull (`_read_from_pubsub` without a timestamp attribute: each message at
    its publish time), its messages recorded before their acknowledgement."""
    from apache_beam.io.gcp.pubsub import PubsubMessage
    from apache_beam.utils.timestamp import Timestamp
    client = evaluator._get_subscriber_client(evaluator._applied_ptransform)
    response = retried(lambda: client.pull(subscription=evaluator._sub_name,
                                           max_messages=MAX_MESSAGES, timeout=30),
                       retry_seconds)
    messages = [PubsubMessage._from_message(rm.message) for rm in response.received_messages]
    if messages:
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


def install(retry_seconds: float = RETRY_SECONDS) -> None:
    """Hardens the local runner's Pub/Sub reader in this process (idempotent)."""
    from apache_beam.runners.direct import transform_evaluator as te
    DRAINING[0] = False
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
        if timestamp_attribute is not None or RECEIPTS[0] is None:
            pulled = retried(lambda: original_read(self, timestamp_attribute), retry_seconds)
        else:
            pulled = read_recorded(self, retry_seconds)
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
            holds[None] = local_watermark.paced_hold(self, self._dp_pulled, holds[None])
        return result

    evaluator._dp_original_read = original_read
    evaluator._dp_original_finish = original_finish
    evaluator.finish_bundle = finish_bundle
    evaluator._get_subscriber_client_state_unlocked = classmethod(client_state)
    evaluator._read_from_pubsub = read_from_pubsub
    evaluator._dp_hardened = retry_seconds
