"""Shared pytest set-up. Test helpers and doubles live in `tests/support/`; test modules mirror
the packages they test (`tests/mechanisms`, `tests/streams`, `tests/pipelines`, and
`tests/test_<module>.py` for the Beam modules of `transforms`)."""
from __future__ import annotations

import logging

import pytest

from pipelines import local_dofns

pytest_plugins = ["tests.support.pubsub"]  # the `emulator` fixture (the local Pub/Sub emulator)

# the quick tier (`python3 -m pytest -m "quick and not slow"`, about 2 minutes on 2 cores): the
# Beam-free cores, the layout and docs rules, the config and the release plans; no job runs
QUICK = ("tests/mechanisms/", "tests/streams/", "tests/test_layout.py", "tests/test_readme.py",
         "tests/test_registry.py", "tests/test_release_plan.py", "tests/test_accountant.py",
         "tests/test_secret.py", "tests/test_key_state.py", "tests/test_budget_ledger.py",
         "tests/test_doctests.py", "tests/pipelines/test_config.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith(QUICK) or ("tests/" + path).startswith(QUICK):
            item.add_marker(pytest.mark.quick)


def pytest_configure(config):
    """Pipelines built by tests find Beam's DoFn specs as the jobs do (`pipelines.run` and
    `pipelines.schedule` call this first; `tests/pipelines/test_local_dofns.py` checks it)."""
    local_dofns.remember_specs()


@pytest.fixture(autouse=True)
def _quiet_beam_logs():
    """Beam's import-time warnings (apitools) are not test failures; keep the output readable."""
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    yield
