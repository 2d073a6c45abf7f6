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


FREE = TimeSteps(1_700_000_000.0, 3600.0, "unbounded")


@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_with_no_horizon_auto_is_the_horizon_free_mechanism_with_the_least_error(noise):
    from transforms.calibration import HORIZON_FREE_PROBE  # (its probe length)
    from transforms.mechanisms import MECHANISMS, ConstantNoiseSource, make
    plan = plan_release(ReleaseSpec.of("count", steps=FREE, public_keys=["a"], rho=0.5,
                                       noise=noise, max_contributions=4))
    assert plan.descriptor["horizon"] == "unbounded"
    assert MECHANISMS[plan.mechanism].horizon_free
    # every horizon-free mechanism that takes this noise, at its own calibration
    errors = {}
    for name in ("log_sqrt_toeplitz", "hybrid"):
        try:
            probe = make(name, HORIZON_FREE_PROBE, rho=0.5, max_contributions=4,
                         interval_bound=4, noise=noise, noise_source=ConstantNoiseSource(0.0))
        except ValueError:
            continue
        errors[name] = max(probe.noise_std()[[(1 << j) - 1 for j in range(13)]])
    assert plan.mechanism == min(errors, key=errors.get)
    assert len(errors) == (2 if noise == "float" else 1)


@pytest.mark.parametrize("choices,error", [
    ({"rho": 0.5, "mechanism": "binary_tree"},
     r"^`mechanism` must be one of 'log_sqrt_toeplitz', 'hybrid' or 'auto' for steps with no "
     r"horizon \(binary_tree is calibrated for a horizon T\); got 'binary_tree'\.$"),
    ({"epsilon": 1.0}, r"^`privacy` must be rho, or epsilon and delta, for steps with no "),
    ({"rho": 0.5, "mechanism": "hybrid"}, r"^`noise` must be 'float' for hybrid"),
])
def test_with_no_horizon_other_mechanisms_and_pure_dp_are_refused(choices, error):
    with pytest.raises(ValueError, match=error):
        plan_release(ReleaseSpec.of("count", steps=FREE, public_keys=["a"], **choices))


def test_with_no_horizon_keys_selected_privately_are_refused():
    with pytest.raises(ValueError, match=r"^`public_keys` must be given for steps with no "):
        plan_release(ReleaseSpec.of("count", steps=FREE, rho=0.5, selection_delta=1e-6))


def test_with_no_horizon_a_mean_is_refused():
    with pytest.raises(ValueError, match=r"^`steps` must be a horizon T for a mean "):
        plan_release(ReleaseSpec.of("mean", steps=FREE, public_keys=["a"], rho=0.5,
                                    max_value=10.0))


def test_no_horizon_is_another_release_than_its_reach_as_a_horizon():
    fixed = TimeSteps(FREE.origin, FREE.size, FREE.horizon)
    free = plan_release(ReleaseSpec.of("count", steps=FREE, public_keys=["a"], rho=0.5,
                                       mechanism="log_sqrt_toeplitz", noise="float"))
    known = plan_release(ReleaseSpec.of("count", steps=fixed, public_keys=["a"], rho=0.5,
                                        mechanism="log_sqrt_toeplitz", noise="float"))
    assert free.digest != known.digest and known.descriptor["horizon"] == FREE.horizon
