"""Scheduled runs: resume = one continuous run, reruns spend nothing, crashes leave the previous
checkpoint intact, the ledger refuses conflicting configs, the stored secret stays private."""
from __future__ import annotations

import glob
import json
import os
import stat

import pytest
import yaml

from pipelines import config as job_config
from pipelines import run as job_run
from pipelines import schedule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORIGIN = 1767571200.0  # 2026-01-05T00:00:00Z
HOUR = 3600.0


def write_config(tmp_path, name="cart_items.yaml", **changes):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", name)))
    config["output"]["path"] = str(tmp_path / "out")
    config["output"]["formats"] = ["jsonl"]
    config["steps"]["horizon"] = 12
    for section, value in changes.items():
        config[section] = value
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def records_of(patterns):
    rows = []
    for pattern in patterns:
        for path in glob.glob(pattern):
            rows.extend(json.loads(line) for line in open(path))
    return sorted(rows, key=lambda r: (r["key"], r["step"]))


def continuous(tmp_path, config):
    assert job_run.main(["--config", config]) == 0
    job = job_config.load(config)
    return records_of([os.path.join(job.output_path, job.job, "records-*.jsonl")])


def test_resuming_after_several_runs_equals_one_continuous_run(tmp_path):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    for hours in (3, 3.5, 7, 12, 30):
        summary = schedule.run_once(config, state, ORIGIN + hours * HOUR)
    assert summary["released_after"] == 12
    resumed = records_of(summary["records"])
    assert len(resumed) == 4 * 12
    assert resumed == continuous(tmp_path, config)


def test_rerun_returns_stored_records_and_spends_nothing(tmp_path):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    first = schedule.run_once(config, state, ORIGIN + 5 * HOUR)
    again = schedule.run_once(config, state, ORIGIN + 5.5 * HOUR)
    assert again["new_steps"] == 0 and again["spent"].startswith("nothing")
    assert records_of(again["records"]) == records_of(first["records"])
    assert len(schedule.committed_checkpoints(state)) == 1


def test_crash_mid_run_keeps_previous_checkpoint_and_next_run_completes(tmp_path, monkeypatch):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    original = schedule._ReleaseKeys.process

    def crash(self, item):
        raise RuntimeError("killed mid-way")
        yield from original(self, item)

    monkeypatch.setattr(schedule._ReleaseKeys, "process", crash)
    with pytest.raises(Exception, match="killed mid-way"):
        schedule.run_once(config, state, ORIGIN + 9 * HOUR)
    monkeypatch.setattr(schedule._ReleaseKeys, "process", original)
    assert [r for r, _ in schedule.committed_checkpoints(state)] == [4]
    assert len(glob.glob(os.path.join(state, "ckpt-*"))) == 2  # the uncommitted one is ignored
    final = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    assert records_of(final["records"]) == continuous(tmp_path, config)


@pytest.mark.parametrize("change,field", [
    ({"privacy": {"rho": 0.25}}, "privacy"),
    ({"steps": {"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600, "horizon": 24}},
     "horizon"),
    ({"bounds": {"max_flips": 3, "max_keys_per_unit": 4, "semantics": "count"}}, "bounds"),
    ({"public_keys": ["berlin", "lisbon"]}, "public_keys"),
])
def test_ledger_refuses_a_conflicting_config(tmp_path, change, field):
    state = str(tmp_path / "state")
    schedule.run_once(write_config(tmp_path), state, ORIGIN + 4 * HOUR)
    conflicting = write_config(tmp_path, **change)
    with pytest.raises(ValueError, match=rf"^`{field}` must be what this state directory "
                                         rf"already released with"):
        schedule.run_once(conflicting, state, ORIGIN + 8 * HOUR)
    assert schedule.main(["--config", conflicting, "--state-dir", state,
                          "--now", "2026-01-05T08:00:00Z"]) == 2


def test_stored_secret_is_private_and_stable(tmp_path):
    config = write_config(tmp_path, secret={"stored": True})
    state = str(tmp_path / "state")
    first = schedule.run_once(config, state, ORIGIN + 6 * HOUR)
    secret_path = os.path.join(state, "secret")
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    secret = open(secret_path).read()
    schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    assert open(secret_path).read() == secret
    for path in glob.glob(os.path.join(state, "**", "*"), recursive=True) + glob.glob(
            str(tmp_path / "out" / "**" / "*"), recursive=True):
        if os.path.isfile(path) and path != secret_path:
            assert secret not in open(path, errors="ignore").read(), path
    assert len(records_of(first["records"])) == 4 * 6
    with pytest.raises(ValueError, match=r"^`secret.stored` must be used with a state directory"):
        job_run.build_transform(job_config.load(config))


def test_events_of_released_steps_are_late_dead_letters(tmp_path):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 6 * HOUR)
    second = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    folder = schedule.committed_checkpoints(state)[-1][1]
    dead = [json.loads(line) for path in glob.glob(os.path.join(folder, "dead_letters-*"))
            for line in open(path)]
    # the source still holds steps 0..5, which the first run released: they are late now;
    # events after the 12-step horizon are dead letters too (outside the horizon)
    late = [d for d in dead if d["reason"].startswith("late: step")]
    assert late and {int(d["reason"].split()[2]) for d in late} <= set(range(6))
    assert all(d in late or "outside the horizon" in d["reason"] for d in dead)
    assert second["new_steps"] == 6
