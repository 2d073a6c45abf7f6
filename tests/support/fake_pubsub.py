"""An in-process server speaking the Pub/Sub gRPC API (google-cloud-pubsub's own protos), for
the live streaming tests on machines without the Pub/Sub emulator.

It serves what the tests and Beam's local Pub/Sub reader call: CreateTopic, ListTopics,
Publish, CreateSubscription, Pull (waiting up to the request's timeout for a message, as the
emulator holds an idle pull), Acknowledge and ModifyAckDeadline. Every subscription of a topic
gets each message once; a pulled message is gone (the reader acknowledges at once anyway).
"""
from __future__ import annotations

import itertools
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import empty_pb2, timestamp_pb2
from google.pubsub_v1 import types

from pipelines.emulator import PubSubEmulator, free_port

PULL_WAIT_SECONDS = 1.0  # an idle pull returns empty after this long (the emulator: up to 30 s)


class _Broker:
    def __init__(self):
        self.lock = threading.Condition()
        self.topics = set()
        self.subscriptions = {}  # name -> (topic, [messages])
        self.ids = itertools.count(1)

    def create_topic(self, request, context):
        with self.lock:
            if request.name in self.topics:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, "Topic already exists")
            self.topics.add(request.name)
        return request

    def list_topics(self, request, context):
        response = types.ListTopicsResponse.pb()()
        with self.lock:
            for name in sorted(self.topics):
                if name.startswith(request.project + "/"):
                    response.topics.add(name=name)
        return response

    def publish(self, request, context):
        response = types.PublishResponse.pb()()
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        with self.lock:
            if request.topic not in self.topics:
                context.abort(grpc.StatusCode.NOT_FOUND, "Topic not found")
            for message in request.messages:
                message_id = str(next(self.ids))
                stored = types.PubsubMessage.pb()()
                stored.CopyFrom(message)
                stored.message_id = message_id
                stored.publish_time.CopyFrom(now)
                for topic, queue in self.subscriptions.values():
                    if topic == request.topic:
                        queue.append(stored)
                response.message_ids.append(message_id)
            self.lock.notify_all()
        return response

    def create_subscription(self, request, context):
        with self.lock:
            if request.name in self.subscriptions:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, "Subscription already exists")
            self.subscriptions[request.name] = (request.topic, [])
        return request

    def pull(self, request, context):
        response = types.PullResponse.pb()()
        deadline = time.time() + PULL_WAIT_SECONDS
        with self.lock:
            if request.subscription not in self.subscriptions:
                context.abort(grpc.StatusCode.NOT_FOUND, "Subscription not found")
            queue = self.subscriptions[request.subscription][1]
            while not queue and time.time() < deadline:
                self.lock.wait(deadline - time.time())
            taken = queue[:max(request.max_messages, 1)]
            del queue[:len(taken)]
        for message in taken:
            response.received_messages.add(ack_id=message.message_id, message=message)
        return response

    def nothing(self, request, context):
        return empty_pb2.Empty()


def _handler(service: str, methods: dict):
    return grpc.method_handlers_generic_handler(f"google.pubsub.v1.{service}", {
        name: grpc.unary_unary_rpc_method_handler(
            function, request_deserializer=request.pb().FromString,
            response_serializer=lambda message: message.SerializeToString())
        for name, (function, request) in methods.items()})


class InProcessPubSub(PubSubEmulator):
    """`PubSubEmulator`'s interface, served in this process (see the module docstring)."""

    kind = "the in-process Pub/Sub server"

    def __enter__(self) -> "InProcessPubSub":
        import os
        from google.cloud import pubsub_v1
        broker = _Broker()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers([
            _handler("Publisher", {
                "CreateTopic": (broker.create_topic, types.Topic),
                "ListTopics": (broker.list_topics, types.ListTopicsRequest),
                "Publish": (broker.publish, types.PublishRequest)}),
            _handler("Subscriber", {
                "CreateSubscription": (broker.create_subscription, types.Subscription),
                "Pull": (broker.pull, types.PullRequest),
                "Acknowledge": (broker.nothing, types.AcknowledgeRequest),
                "ModifyAckDeadline": (broker.nothing, types.ModifyAckDeadlineRequest)})])
        self.host = f"127.0.0.1:{free_port()}"
        self.server.add_insecure_port(self.host)
        self.server.start()
        self._previous_host = os.environ.get("PUBSUB_EMULATOR_HOST")
        os.environ["PUBSUB_EMULATOR_HOST"] = self.host
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None)
        super().__exit__(*exc)
