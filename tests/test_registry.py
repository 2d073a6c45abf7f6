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


def _throwaway_spec():
    sum_spec = registry.SPECS["sum"]
    import dataclasses
    return dataclasses.replace(sum_spec, name="total", class_name="ContinualTotal",
                               module="tests.support.throwaway",
                               summary="running total of clamped values per key")


def test_a_statistic_added_through_the_registry_alone_runs_everywhere(tmp_path, monkeypatch,
                                                                      capsys):
    """One registry row and one class (tests/support/throwaway.py): `run`, `schedule`,
    `plan --config` and private key selection take it, and it calibrates as the statistic it
    copies does (another statistic is another release: its own id and noise)."""
    import json

    import yaml

    from pipelines import plan, schedule
    monkeypatch.setitem(registry.SPECS, "total", _throwaway_spec())
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "seconds_on_page.yaml")))
    raw["secret"] = {"seed": 5, "insecure": True}
    raw["output"] = {"path": str(tmp_path / "sum"), "formats": ["jsonl"]}
    (tmp_path / "sum.yaml").write_text(yaml.safe_dump(raw))
    total = dict(raw, transform="total", output={"path": str(tmp_path / "total"),
                                                  "formats": ["jsonl"]})
    (tmp_path / "total.yaml").write_text(yaml.safe_dump(total))

    def records(folder):
        return sorted((json.loads(line) for path in glob.glob(
            os.path.join(folder, "**", "records-*.jsonl"), recursive=True)
            for line in open(path)), key=lambda r: (r["key"], r["step"]))
    assert job_run.main(["--config", str(tmp_path / "sum.yaml")]) == 0
    assert job_run.main(["--config", str(tmp_path / "total.yaml")]) == 0
    def calibration(rows):
        return [(r["key"], r["step"], r["mechanism"], r["stddev"]) for r in rows]
    copied, added = records(str(tmp_path / "sum")), records(str(tmp_path / "total"))
    assert added and calibration(added) == calibration(copied)
    assert added[0]["release_id"] != copied[0]["release_id"]
    assert plan.main(["--config", str(tmp_path / "total.yaml")]) == 0
    assert "job " in capsys.readouterr().out
    assert schedule.main(["--config", str(tmp_path / "total.yaml"), "--state-dir",
                          str(tmp_path / "state"), "--now", "2100-01-01T00:00:00Z"]) == 0
    selecting = dict(total, output={"path": str(tmp_path / "selected"), "formats": ["jsonl"]},
                     privacy=dict(raw["privacy"], selection_delta=1e-6))
    selecting.pop("public_keys", None)
    selecting["input"] = dict(raw["input"], types={"key": "str"})
    (tmp_path / "selected.yaml").write_text(yaml.safe_dump(selecting))
    assert job_run.main(["--config", str(tmp_path / "selected.yaml")]) == 0
