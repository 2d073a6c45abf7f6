"""Every docstring example in the plugin and the drivers runs (a module with `>>> ` in it is
found here; none is listed by hand)."""
from __future__ import annotations

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules_with_examples():
    for package in ("transforms", "pipelines"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(".py") and ">>> " in open(path, encoding="utf-8").read():
                    relative = os.path.relpath(path, ROOT)[:-len(".py")]
                    yield relative.replace(os.sep, ".").removesuffix(".__init__")


MODULES = sorted(_modules_with_examples())


def test_the_examples_are_found():
    assert "transforms.mechanisms.base" in MODULES and "pipelines.gate" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_every_example_runs(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0, name
