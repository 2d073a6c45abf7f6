"""The Pub/Sub server for the live streaming tests, started and stopped by the fixture: the
local Pub/Sub emulator where it is installed (`pipelines.emulator`), else an in-process server
speaking the same gRPC API (`tests.support.fake_pubsub`), which the test output then names (a
warning). DP_TEST_PUBSUB=in-process picks the latter on any machine; without
google-cloud-pubsub the tests are skipped and say why."""
from __future__ import annotations

import os
import shutil
import warnings

import pytest

from pipelines.emulator import PubSubEmulator, available


@pytest.fixture
def emulator():
    if shutil.which("gcloud") is None or os.environ.get("DP_TEST_PUBSUB") == "in-process":
        pytest.importorskip("google.cloud.pubsub_v1",
                            reason="google-cloud-pubsub is not installed")
        from tests.support.fake_pubsub import InProcessPubSub
        why = "DP_TEST_PUBSUB=in-process" if shutil.which("gcloud") else \
            "the Pub/Sub emulator is not installed"
        warnings.warn(f"live Pub/Sub tests run on {InProcessPubSub.kind} ({why})")
        with InProcessPubSub(project="dp-test") as running:
            yield running
        return
    why = available()
    if why is not None:
        pytest.skip(why)
    with PubSubEmulator(project="dp-test") as running:
        yield running
