"""A release as a value (transforms/release_plan.py): the spec refuses what the transforms
refuse, the plan is what the transform releases, and the plan holds no secret."""
from __future__ import annotations

import glob
import os

import pytest

from pipelines import config as job_config
from pipelines import job_release
from pipelines import run as job_run
from transforms import ContinualCount, TimeSteps
from transforms.release_plan import ReleaseSpec, plan_release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = TimeSteps(1_700_000_000.0, 3600.0, 24)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))))
def test_the_plan_of_a_job_is_what_its_transform_releases(path):
    job = job_config.load(path).replace(secret=job_config.SecretSpec(seed=3, insecure=True))
    plan = job_release.release_plan(job)
    transform = job_run.build_transform(job)
    assert plan.descriptor == transform.descriptor and plan.digest == transform.descriptor_digest
    assert plan.resolved_mechanism == transform.resolved_mechanism
    assert plan.budget_spent == transform.budget_spent and plan.summary() == transform.summary()
    assert not any("secret" in name for name in vars(plan))


@pytest.mark.parametrize("given,error", [
    ({"key_type": ""}, r"^`key_type` must be one of"),
    ({"key_type": 0}, r"^`key_type` must be one of"),
    ({"allowed_lateness_seconds": "soon"}, r"^`allowed_lateness_seconds` must be 0, or in"),
    ({"allowed_lateness_seconds": 3600.0}, r"^`allowed_lateness_seconds` must be 0, or in"),
    ({"release_delay_steps": True}, r"^`release_delay_steps` must be an integer >= 0"),
    ({"confidence": 1.0}, r"^`confidence` must be"),
    ({"noise": "gaussian"}, r"^`noise` must be one of"),
])
def test_the_spec_refuses_what_the_transform_refuses(given, error):
    choices = dict(steps=STEPS, epsilon=1.0, selection_delta=1e-6, **given)
    with pytest.raises(ValueError, match=error):
        ReleaseSpec.of("count", **choices)
    with pytest.raises(ValueError, match=error):
        ContinualCount(seed=1, insecure=True, **choices)


def test_a_misspelt_argument_is_refused_by_name():
    with pytest.raises(TypeError, match=r"^`epsilom` must be a bound of ContinualCount "):
        ContinualCount(steps=STEPS, public_keys=["a"], epsilom=1.0, seed=1, insecure=True)
    with pytest.raises(ValueError, match=r"^`mechanism` must be one of 'auto', "):
        plan_release(ReleaseSpec.of("count", steps=STEPS, public_keys=["a"], epsilon=1.0,
                                    mechanism={"sum": "auto", "count": "auto"}))


def test_a_subclass_is_its_own_release():
    """A subclass names itself in the descriptor, as it did before the plan existed: its
    release is another release (another digest, another id from the same seed)."""
    class RegionCounts(ContinualCount):
        pass

    common = dict(steps=STEPS, public_keys=["a"], epsilon=1.0, seed=1, insecure=True)
    mine, base = RegionCounts(**common), ContinualCount(**common)
    assert mine.descriptor["transform"] == "RegionCounts"
    assert mine.descriptor_digest != base.descriptor_digest
    assert mine.release_id != base.release_id
