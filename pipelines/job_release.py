"""A job config's release as a value: `release_spec` (what the job releases,
`transforms.release_plan.ReleaseSpec`) and its plan (Beam-free, no secret), which `plan`,
`report` and `caps` read; `pipelines.run.build_transform` binds the spec to a secret.
"""
from __future__ import annotations

from pipelines import config as job_config
from pipelines import gate
from transforms import registry
from transforms.release_plan import ReleasePlan, ReleaseSpec, plan_release


def release_spec(job: job_config.JobConfig, release_id=None, mechanism=None,
                 noise_version=None) -> ReleaseSpec:
    """What the job releases (`transforms.release_plan`); `release_id`, `mechanism` (name,
    params) and `noise_version` continue an existing release (the scheduler's ledger)."""
    name, params = mechanism or (job.mechanism.name, job.mechanism.params)
    choices = dict(steps=job.steps.time_steps(), mechanism=name,
                   mechanism_params=params or None, confidence=job.confidence,
                   noise=job.privacy.noise, release_id=release_id, diagnostics=True,
                   max_state_bytes_per_key=job.mechanism.max_state_bytes_per_key,
                   release_delay_steps=job.steps.release_delay_steps,
                   gate_share=job.gate_share,
                   gate_rule=gate.rule_of(job) if job.gate_share is not None else None,
                   allowed_lateness_seconds=job.steps.allowed_lateness_seconds,
                   postprocess=job.postprocess, **job.privacy.budget, **job.bounds)
    if noise_version is not None:
        choices["noise_version"] = noise_version
    if registry.SPECS[job.transform].single_key is None:
        choices["public_keys"] = job.public_keys
        if job.public_keys is None:  # keys selected privately
            choices["key_type"] = job.input.types["key"]
    return ReleaseSpec.of(job.transform, **choices)


def release_plan(job: job_config.JobConfig) -> ReleasePlan:
    """What the job's release is (Beam-free, no secret): `plan`, `report` and `caps` read it."""
    return plan_release(release_spec(job))
