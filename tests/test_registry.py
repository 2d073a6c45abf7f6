"""The registry rows (transforms/registry.py) declare what each statistic can do, and the
drivers ask them only: each declared capability holds for the class, and no other."""
from __future__ import annotations

import glob
import os

import pytest

from pipelines import config as job_config
from pipelines import run as job_run
from transforms import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {job_config.load(path).transform: path
           for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_checkpoint_is_declared_exactly_for_one_part_truncations_with_a_flat_state(name):
    """A streaming checkpoint stores each unit's truncation state as a flat tuple
    (`Problem.flat_state`) and one key state per key: declared iff the transform's truncation
    keeps one and it releases one part (a mean releases two: a count and a sum)."""
    job = job_config.load(CONFIGS[name]).replace(
        secret=job_config.SecretSpec(seed=7, insecure=True))
    transform = job_run.build_transform(job)
    flat = getattr(transform, "problem", None) is not None and \
        transform.problem.flat_state() is not None
    from transforms.mean import ContinualMean
    one_part = not isinstance(transform, ContinualMean)
    assert (flat and one_part) == registry.can(name, registry.CHECKPOINT)


def test_the_gate_votes_by_roles_the_transform_reads():
    for name, spec in registry.SPECS.items():
        assert set(spec.unit_roles) <= set(spec.roles), name
        assert set(spec.can) <= set(registry.CAPABILITIES), name


def test_every_registry_name_has_a_bundled_config_but_the_declared_release():
    assert set(CONFIGS) | {"release"} == set(registry.NAMES)
