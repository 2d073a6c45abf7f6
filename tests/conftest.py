"""Shared pytest set-up. Test helpers and doubles live in `tests/support/`; test modules mirror
the packages they test (`tests/mechanisms`, `tests/streams`, `tests/pipelines`, and
`tests/test_<module>.py` for the Beam modules of `transforms`)."""
from __future__ import annotations

import logging

import pytest

pytest_plugins = ["tests.support.pubsub"]  # the `emulator` fixture (the local Pub/Sub emulator)


@pytest.fixture(autouse=True)
def _quiet_beam_logs():
    """Beam's import-time warnings (apitools) are not test failures; keep the output readable."""
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    yield
