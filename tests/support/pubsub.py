"""The Pub/Sub emulator for tests: started and stopped by the fixture (`pipelines.emulator`);
without it (or without google-cloud-pubsub) the test is skipped and says why."""
from __future__ import annotations

import pytest

from pipelines.emulator import PubSubEmulator, available


@pytest.fixture
def emulator():
    why = available()
    if why is not None:
        pytest.skip(why)
    with PubSubEmulator(project="dp-test") as running:
        yield running
