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
from pipelines import checkpoints, schedule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORIGIN = 1767571200.0  # 2026-01-05T00:00:00Z
HOUR = 3600.0


def write_config(tmp_path, name="cart_items.yaml", **changes):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", name)))
    config["output"]["path"] = str(tmp_path / "out")
    config["output"]["formats"] = ["jsonl"]
    config["steps"]["horizon"] = 12
    config["secret"] = {"seed": 2026, "insecure": True}  # reproducible: schedule == run
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
    return records_of([os.path.join(job.output.path, job.job, "records-*.jsonl")])


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
    assert len(checkpoints.committed_checkpoints(state)) == 1


@pytest.mark.parametrize("change,field", [
    ({"privacy": {"rho": 0.25}}, "privacy.rho"),
    ({"steps": {"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600, "horizon": 24}},
     "steps.horizon"),
    ({"bounds": {"max_flips": 3, "max_keys_per_unit": 4, "semantics": "count"}},
     "bounds.max_flips"),
    ({"public_keys": ["berlin", "lisbon"]}, "public_keys"),
    ({"input": {"path": "demo:carts.jsonl", "format": "jsonl", "fields": {
        "timestamp": "ts", "op": "op", "item": "ts", "key": "store"}}}, "input.fields.item"),
])
def test_ledger_refuses_a_conflicting_config(tmp_path, change, field):
    state = str(tmp_path / "state")
    schedule.run_once(write_config(tmp_path), state, ORIGIN + 4 * HOUR)
    conflicting = write_config(tmp_path, **change)
    with pytest.raises(ValueError, match=rf"^`{field}` must be what this release was started "
                                         rf"with .*a new state directory would be a new "
                                         rf"release: it spends the budget again"):
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


def test_events_of_released_steps_are_skipped_not_stored(tmp_path):
    """The source still holds the steps an earlier run released: a resumed run skips them (the
    state directory does not pile up raw rows of released steps as dead letters)."""
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 6 * HOUR)
    second = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    folder = checkpoints.committed_checkpoints(state)[-1][1]
    dead = [json.loads(line) for path in glob.glob(os.path.join(folder, "dead_letters-*"))
            for line in open(path)]
    # only events after the 12-step horizon are dead letters (outside the horizon)
    assert dead and all("outside the horizon" in d["reason"] for d in dead)
    assert second["new_steps"] == 6


def test_ledger_binds_secret_release_id_and_resolved_mechanism(tmp_path, monkeypatch):
    """The ledger stores the release id, the secret's HMAC fingerprint (never the secret) and
    the mechanism auto resolved to; a different secret value mid-release is refused."""
    monkeypatch.setenv("DP_TEST_SECRET", "first-secret-value")
    config = write_config(tmp_path, secret={"env": "DP_TEST_SECRET"})
    state = str(tmp_path / "state")
    first = schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    ledger = json.load(open(os.path.join(checkpoints.committed_checkpoints(state)[-1][1],
                                         checkpoints.LEDGER)))
    assert ledger["release_id"] == first["release_id"] and len(first["release_id"]) == 32
    assert ledger["mechanism"] != "auto" and ledger["mechanism"] == ledger["descriptor"][
        "mechanism"]
    assert "first-secret-value" not in json.dumps(ledger)
    assert len(ledger["secret_fingerprint"]) == 64
    monkeypatch.setenv("DP_TEST_SECRET", "rotated-secret-value")
    with pytest.raises(ValueError, match=r"^`secret` must be the secret this release started "
                                         r"with .*a new state directory would be a new release"):
        schedule.run_once(config, state, ORIGIN + 8 * HOUR)
    monkeypatch.setenv("DP_TEST_SECRET", "first-secret-value")
    second = schedule.run_once(config, state, ORIGIN + 8 * HOUR)
    assert second["release_id"] == first["release_id"]  # the same release continues
    rows = records_of(second["records"])
    assert {r["release_id"] for r in rows} == {first["release_id"]}
    assert all(r["private"] is True for r in rows)


def test_without_a_configured_secret_the_scheduler_keeps_one_in_the_state_directory(tmp_path):
    config = write_config(tmp_path)
    raw = yaml.safe_load(open(config))
    del raw["secret"]
    open(config, "w").write(yaml.safe_dump(raw))
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    assert stat.S_IMODE(os.stat(os.path.join(state, "secret")).st_mode) == 0o600
    assert schedule.run_once(config, state, ORIGIN + 8 * HOUR)["released_after"] == 8


def test_two_concurrent_runs_commit_exactly_once(tmp_path):
    """Two scheduled runs started together on one state directory: exactly one commits (exit
    0), the other exits 3 naming the state directory; one commit marker per step range and
    only the winner's records are published."""
    import subprocess
    import sys
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    command = [sys.executable, "-m", "pipelines.schedule", "--config", config, "--state-dir",
               state, "--now", "2026-01-05T06:00:00Z"]
    runs = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 3], results
    loser = [err for code, err in results if code == 3][0]
    assert f"in the state directory {state}" in loser.strip().splitlines()[-1]
    assert len(glob.glob(os.path.join(state, checkpoints.COMMITS, "*"))) == 1
    assert len(checkpoints.committed_checkpoints(state)) == 1
    job = job_config.load(config)
    published = glob.glob(os.path.join(job.output.path, f"{job.job}-scheduled", "*",
                                        "records-steps-*"))
    assert len(published) == 1  # jsonl only, from the winner


def test_marker_is_create_if_absent(tmp_path):
    path = str(tmp_path / "commits" / "from-00000000.json")
    assert checkpoints.create_if_absent(path, b"first")
    assert not checkpoints.create_if_absent(path, b"second")
    assert open(path, "rb").read() == b"first"
    with pytest.raises(ValueError, match=r"^`--state-dir` must be a local path or gs://"):
        checkpoints.create_if_absent("s3://bucket/state/commits/x.json", b"x")


@pytest.mark.parametrize("name", sorted({n for n in os.listdir(os.path.join(ROOT, "configs"))
                                          if n.endswith(".yaml")} - {"cart_items.yaml"}))  # five runs: tested above
def test_every_bundled_config_resumes_to_one_continuous_run(tmp_path, name):
    """Two scheduled runs (checkpoint states of every problem written, then read back through
    the JSON codec and written again) equal one pipelines.run with the same insecure seed:
    both drive the same stages. Longer chains of runs: the cart_items tests above."""
    config = write_config(tmp_path, name)
    state = str(tmp_path / "state")
    for hours in (5, 30):
        summary = schedule.run_once(config, state, ORIGIN + hours * HOUR)
    assert summary["released_after"] == 12
    assert [r for r, _ in checkpoints.committed_checkpoints(state)] == [5, 12]
    assert records_of(summary["records"]) == continuous(tmp_path, config)


def test_a_run_killed_after_its_commit_is_published_by_the_next_run(tmp_path, monkeypatch):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    original = schedule.publish

    def killed(*args):
        raise RuntimeError("killed after the commit")

    monkeypatch.setattr(schedule, "publish", killed)
    with pytest.raises(RuntimeError, match="killed after the commit"):
        schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    monkeypatch.setattr(schedule, "publish", original)
    job = job_config.load(config)
    published = os.path.join(job.output.path, f"{job.job}-scheduled", "*",
                             "records-steps-0-4-*")
    assert not glob.glob(published)
    again = schedule.run_once(config, state, ORIGIN + 4.5 * HOUR)  # nothing new to release
    assert again["new_steps"] == 0
    assert records_of([published]) == records_of(again["records"])


def _kill_in(monkeypatch, point):
    """Makes the next run die at `point`; returns the function that undoes it."""
    from transforms.release import RecordMaker
    owner, name = {"in the pipeline": (RecordMaker, "record"),
                   "mid-publish": (schedule, "write_records_files")}[point]
    original = getattr(owner, name)

    def killed(*args, **kwargs):
        if point == "mid-publish":  # the first format is published, then the run dies
            rows, prefix, formats = args
            original(rows, prefix, formats[:1])
        raise RuntimeError(f"killed {point}")

    monkeypatch.setattr(owner, name, killed)
    return lambda: monkeypatch.setattr(owner, name, original)


@pytest.mark.parametrize("point", ["in the pipeline", "mid-publish"])
def test_runs_killed_at_any_point_converge_to_one_uninterrupted_run(tmp_path, monkeypatch,
                                                                    point):
    config = write_config(tmp_path, output={"path": str(tmp_path / "out"),
                                            "formats": ["jsonl", "csv"]})
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 3 * HOUR)
    undo = _kill_in(monkeypatch, point)
    with pytest.raises(Exception, match=f"killed {point}"):
        schedule.run_once(config, state, ORIGIN + 7 * HOUR)
    undo()
    if point == "in the pipeline":  # the killed run's folder exists but was never committed
        assert [r for r, _ in checkpoints.committed_checkpoints(state)] == [3]
        assert len(glob.glob(os.path.join(state, "ckpt-*"))) == 2
    final = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    assert records_of(final["records"]) == continuous(tmp_path, config)
    job = job_config.load(config)
    published = glob.glob(os.path.join(final["published"], "*"))
    assert not [p for p in published if p.endswith(".partial")]
    assert records_of([p for p in published if p.endswith(".jsonl")]) == \
        records_of(final["records"])


def started_under_v3(monkeypatch):
    """Transforms built without a noise version (a new release) derive v3 noise, as the code
    before v4 did; undone by `monkeypatch.undo()`."""
    build = job_run.build_transform

    def old_code(*args, noise_version=None, **kwargs):
        return build(*args, noise_version=noise_version or "v3", **kwargs)
    monkeypatch.setattr(job_run, "build_transform", old_code)


def test_a_release_started_under_v3_continues_under_v3(tmp_path, monkeypatch):
    """A release started before noise v4 keeps deriving v3 noise after the upgrade (the
    ledger's descriptor names it): the resumed records equal one continuous v3 run, not v4."""
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    started_under_v3(monkeypatch)
    schedule.run_once(config, state, ORIGIN + 3 * HOUR)
    v3 = continuous(tmp_path, config)
    monkeypatch.undo()  # the upgrade
    summary = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    resumed = records_of(summary["records"])
    assert len(resumed) == 4 * 12 and resumed == v3
    assert resumed != continuous(tmp_path, config)  # a new release derives v4
    ledger = json.load(open(glob.glob(os.path.join(state, "ckpt-*", checkpoints.LEDGER))[-1]))
    assert ledger["descriptor"]["noise_derivation"].startswith("v3/")


def test_code_that_derives_noise_differently_cannot_continue_a_release(tmp_path, monkeypatch,
                                                                          capsys):
    """After an upgrade that no longer derives a release's noise as it started (here: v3
    dropped), continuing it would publish a second noise of nodes already released (averaging
    them removes noise): the descriptor names the derivation, and the resume is refused in
    one line."""
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    started_under_v3(monkeypatch)
    schedule.run_once(config, state, ORIGIN + 3 * HOUR)
    monkeypatch.undo()
    from transforms.mechanisms import noise
    monkeypatch.setattr(noise, "NOISE_VERSIONS", ("v4",))
    capsys.readouterr()
    code = schedule.main(["--config", config, "--state-dir", state, "--now",
                          "2026-01-05T07:00:00Z"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "`release.noise_derivation` must be what this release was started with" in err


def _numeric_ids_config(tmp_path, fmt, types=None, secret=None, mixed=False, job=None):
    """One user (numeric id 7) active on key "a" at every step of 8: with max_contributions 2
    the released total may grow by 2 at most over the whole release. `mixed`: JSON lines spell
    the id 7 and "7" in turn."""
    rows = [{"ts": ORIGIN + step * HOUR + 60, "user": "7" if mixed and step % 2 else 7,
             "region": "a"} for step in range(8)]
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    if fmt == "jsonl":
        data = folder / "events.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        data = folder / "events.csv"
        data.write_text("ts,user,region\n" + "".join(
            f"{r['ts']},{r['user']},{r['region']}\n" for r in rows))
    source = {"path": str(data), "format": fmt, "timestamp_format": "seconds",
              "fields": {"timestamp": "ts", "unit": "user", "key": "region"}}
    if types:
        source["types"] = types
    return write_config(tmp_path, "active_users.yaml", input=source, public_keys=["a"],
                        bounds={"max_contributions": 2, "max_contributions_per_step": 1,
                                "max_keys_per_unit": 1},
                        privacy={"epsilon": 1.0}, secret=secret or {"seed": 5, "insecure": True},
                        steps={"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600,
                               "horizon": 8}, **({"job": job} if job else {}))


@pytest.mark.parametrize("first,second,field", [
    ({"fmt": "csv"}, {"fmt": "jsonl"}, "input.format"),
    ({"fmt": "jsonl", "types": {"unit": "int"}}, {"fmt": "jsonl", "types": {"unit": "id"}},
     "input.types.unit"),
    ({"fmt": "jsonl"}, {"fmt": "jsonl", "types": {"unit": "int"}}, "input.types.unit"),
])
@pytest.mark.parametrize("secret", [None, {"stored": True}])
def test_reading_the_input_otherwise_mid_release_is_refused(tmp_path, first, second, field,
                                                            secret):
    """Break 1 as it was run: steps 0-4 read as CSV, then the same data as JSON lines (or the
    unit's declared type changed): the saved unit states no longer joined the new run's units
    and one user's contribution to the total was [1,2,2,2,3,4,4,4] under bound 2. Now refused
    in one line (exit 2), nothing published, under a seed and a stored secret alike."""
    state = str(tmp_path / "state")
    before = _numeric_ids_config(tmp_path, first["fmt"], first.get("types"), secret)
    assert schedule.main(["--config", before, "--state-dir", state,
                          "--now", "2026-01-05T04:00:00Z"]) == 0
    after = _numeric_ids_config(tmp_path, second["fmt"], second.get("types"), secret)
    with pytest.raises(ValueError, match=rf"^`{field}` must be what this release was started "
                                         rf"with"):
        schedule.run_once(after, state, ORIGIN + 8 * HOUR)
    assert [r for r, _ in checkpoints.committed_checkpoints(state)] == [4]


def test_a_numeric_unit_id_is_one_unit_whatever_the_file_format(tmp_path):
    """Unit ids are canonicalised (`io.UNIT_IDS`): 7 and "7" in JSON lines and "7" in CSV are
    one user (one cap of 2), so a release reads the same truncated totals from either file."""
    csv_config = _numeric_ids_config(tmp_path, "csv", job="ids-csv")  # a job per file: its
    jsonl_config = _numeric_ids_config(tmp_path, "jsonl", mixed=True, job="ids-jsonl")  # set
    truth = [r["value"] for r in continuous(tmp_path, csv_config)]
    assert truth == [r["value"] for r in continuous(tmp_path, jsonl_config)]


def test_a_copy_of_the_state_directory_cannot_publish_the_release_elsewhere(tmp_path):
    """Attack F6: a backup of the state directory run with another output.path (or job name)
    continued the same release there: the same noise on other data. The ledger binds where the
    release publishes."""
    import shutil
    state = str(tmp_path / "state")
    config = write_config(tmp_path)
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    copy = str(tmp_path / "copy")
    shutil.copytree(state, copy)
    base = yaml.safe_load(open(config))
    moved = write_config(tmp_path, output=dict(base["output"], path=str(tmp_path / "elsewhere")))
    with pytest.raises(ValueError, match=r"^`output\.path` must be what this release was "
                                         r"started with"):
        schedule.run_once(moved, copy, ORIGIN + 8 * HOUR)
    renamed = write_config(tmp_path, job="renamed")
    with pytest.raises(ValueError, match=r"^`job` must be what this release was started with"):
        schedule.run_once(renamed, copy, ORIGIN + 8 * HOUR)


def test_one_window_is_published_from_one_checkpoint_only(tmp_path):
    """Two state directories of one release running at once commit in their own commits/;
    the output's claim of the window lets only one of them publish it (the other raises and
    its files are never written)."""
    state = str(tmp_path / "state")
    config = write_config(tmp_path)
    summary = schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    job = job_config.load(config)
    [(_, folder)] = checkpoints.committed_checkpoints(state)
    published = sorted(glob.glob(os.path.join(summary["published"], "*")))
    before = [open(p, "rb").read() for p in published]
    with pytest.raises(checkpoints.ConcurrentRun, match=r"published from another checkpoint"):
        schedule.publish(job, summary["release_id"], folder + "-copy", 0, 4)
    assert [open(p, "rb").read() for p in published] == before
    execution = checkpoints.read_json(checkpoints.marker_path(state, 0))["execution"]
    with pytest.raises(checkpoints.ConcurrentRun, match=r"published from another checkpoint"):
        schedule.publish(job, summary["release_id"], folder, 0, 4, "another execution")
    schedule.publish(job, summary["release_id"], folder, 0, 4, execution)  # a retry: allowed
    assert [open(p, "rb").read() for p in published] == before


def test_a_relative_output_path_binds_the_folder_it_names_from_where_it_ran(tmp_path,
                                                                            monkeypatch):
    """Attack (round 2) F1: `output.path: output` run from another directory with a copy of the
    state directory published the release a second time there. The ledger binds the absolute
    folder."""
    config = write_config(tmp_path, output={"path": "output", "formats": ["jsonl"]})
    job = job_config.load(config)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    here = checkpoints.fingerprint(job)["output.path"]
    monkeypatch.chdir(tmp_path / "b")
    assert checkpoints.fingerprint(job)["output.path"] != here == str(tmp_path / "a" / "output")


def test_a_publication_claim_of_a_release_before_execution_tokens_is_still_its_own(tmp_path):
    """Attack (round 2) F5: claims written before they named the execution made every later
    run exit 3 ("another state directory"): the stuck release of a routine upgrade."""
    config = write_config(tmp_path)
    job = job_config.load(config)
    path = os.path.join(job.output.path, ".releases", f"{job.job}-scheduled-{'a' * 32}",
                        "from-00000000.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        json.dump({"checkpoint": "ckpt-00000004-x", "steps": [0, 4]}, handle)
    schedule.claim_publication(job, "a" * 32, "/s/ckpt-00000004-x", 0, 4, "token")
    with pytest.raises(checkpoints.ConcurrentRun):
        schedule.claim_publication(job, "a" * 32, "/s/ckpt-00000004-y", 0, 4, "token")


# ----- the run summary: what pipelines.run prints -------------------------------------------------
def _schedule_main(capsys, config, state, hours, *extra):
    capsys.readouterr()
    now = f"2026-01-05T{hours:02d}:00:00Z" if hours < 24 else "2026-01-06T12:00:00Z"
    code = schedule.main(["--config", config, "--state-dir", state, "--now", now, *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def test_a_scheduled_run_prints_what_run_prints(tmp_path, capsys):
    """Each scheduled run prints the mechanism and why, MaxSE, the steps it released, where
    the records and release.json are, and (operator-only, NOT private) its own steps'
    truncation and dead letters; the runs' counts add up to the continuous run's, and the
    run that releases the last step says the release is complete, with the run's MaxSE."""
    config = write_config(tmp_path, name="active_users.yaml")
    state = str(tmp_path / "state")
    first, err = _schedule_main(capsys, config, state, 5)
    assert "INSECURE demo release (fixed seed)" in err  # as run says it
    second = json.loads(_schedule_main(capsys, config, state, 12, "--json")[0])
    third, _ = _schedule_main(capsys, config, state, 30)  # nothing newly complete
    assert job_run.main(["--config", config, "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert job_run.main(["--config", config]) == 0
    ran_text = capsys.readouterr().out.splitlines()
    lines = first.splitlines()
    assert lines[0] == ran_text[0]  # job, mechanism and why (the plan command)
    assert "MaxSE" in lines[1] and "of the steps released so far" in lines[1]
    release = ran["public"]["release_id"]
    assert lines[2] == (f"release {release}: steps released 0 -> 5 of 12 (5 new); budget "
                        f"spent: the release's budget (once for all T steps)")
    folder = os.path.join(str(tmp_path / "out"), "active-users-scheduled", release)
    assert lines[3].startswith(f"records:      {folder}/records-steps-*.jsonl (30 records")
    assert lines[4] == f"manifest:     {folder}/release.json"
    heading = lines.index("operator-only (NOT private, exact counts of this run's steps "
                          "0 -> 5): ")
    assert " events in these steps, " in lines[heading + 1]  # its parts, a line each
    assert "release complete" not in first
    # --json: a public and an operator-only part, as run --json
    assert set(second) == {"job", "public", "operator_not_private"}
    public, operator = second["public"], second["operator_not_private"]
    assert (public["released_before"], public["released_after"], public["new_steps"]) == \
        (5, 12, 7) and public["complete"] is True
    assert public["max_se"] == ran["public"]["max_se"] and public["records"] == 6 * 12
    assert public["mechanism"] == ran["public"]["mechanism"] and \
        public["why"] == ran["public"]["why"]
    # operator-only counts of this run's steps; with the first run's: the continuous run's
    first_json = first.split("exact counts of this run's steps 0 -> 5): ", 1)[1]
    first_events = int(first_json.split(" events", 1)[0])
    assert first_events + operator["events_in_window"] == ran["operator_not_private"][
        "events_in_window"]
    assert operator["truncation_warning"] is None
    # nothing new: the release's summary, nothing ran, and it is complete
    assert "steps released 12 -> 12 of 12 (0 new); budget spent: nothing" in third
    assert "operator-only (NOT private, exact counts of the data): nothing ran" in third
    assert f"MaxSE {ran['public']['max_se']:.2f} (largest per-step standard deviation)" in third
    assert third.splitlines()[-1].startswith("release complete: all 12 steps are released")


def test_the_scheduled_release_publishes_its_manifest_through_its_commit(tmp_path, capsys):
    """release.json, as pipelines.run writes it, beside the records: from the committed
    ledger (covered by the MAC'd marker), written by the commit after the records, and
    repaired from the verified ledger like every published file."""
    config = write_config(tmp_path, name="active_users.yaml")
    state = str(tmp_path / "state")
    summary = schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    folder = summary["published"]
    manifest_path = os.path.join(folder, "release.json")
    published = open(manifest_path, "rb").read()
    ledger = json.load(open(os.path.join(checkpoints.committed_checkpoints(state)[-1][1],
                                         checkpoints.LEDGER)))
    assert json.loads(published) == ledger["release_manifest"]
    assert ledger["release_manifest"] == job_run.release_manifest(summary["transform"])
    assert json.loads(published)["release_id"] == summary["release_id"]
    assert "secret" not in json.loads(published)["display"]
    # the same manifest, byte for byte, as a continuous run's (same seeded release)
    assert job_run.main(["--config", config]) == 0
    job = job_config.load(config)
    assert open(os.path.join(job.public_path, "release.json"), "rb").read() == published
    # a lost or altered manifest is rewritten by the next run, from the verified ledger
    os.remove(manifest_path)
    again = schedule.run_once(config, state, ORIGIN + 4.5 * HOUR)
    assert again["new_steps"] == 0 and open(manifest_path, "rb").read() == published
    open(manifest_path, "w").write('{"release_id": "forged"}')
    schedule.run_once(config, state, ORIGIN + 8 * HOUR)
    assert open(manifest_path, "rb").read() == published
    # the ledger is what the commit marker covers: altering it is refused, never published
    last = checkpoints.committed_checkpoints(state)[-1][1]
    ledger_path = os.path.join(last, checkpoints.LEDGER)
    forged = json.load(open(ledger_path))
    forged["release_manifest"]["private"] = "forged"
    open(ledger_path, "w").write(json.dumps(forged, indent=2, sort_keys=True))
    os.remove(manifest_path)
    with pytest.raises(ValueError, match=r"^`checkpoint` must be intact"):
        schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    assert not os.path.exists(manifest_path)
    capsys.readouterr()


def test_a_scheduled_run_warns_when_its_bounds_cut_most_events(tmp_path, capsys):
    config = write_config(tmp_path, name="seconds_on_page.yaml",
                          bounds={"max_value": 300, "max_keys_per_unit": 1})  # 1 s per user
    out, _ = _schedule_main(capsys, config, str(tmp_path / "state"), 6)
    line = out.splitlines()[-1]
    assert line.startswith("WARNING (operator-only, NOT private): the contribution bounds cut ")
    assert line.endswith(f"python3 -m pipelines.caps --config {config} "
                         f"--vary max_contributions=1,300,600,1200,2400")
    counts = out.split("exact counts of this run's steps 0 -> 6): ", 1)[1]
    events, cut = int(counts.split(" events")[0]), int(counts.split("steps, ")[1].split(" ")[0])
    assert cut * 2 > events and f"cut {100.0 * cut / events:.1f} % of the {events} events" in line


def test_a_file_added_to_a_published_release_folder_is_named_at_each_run(tmp_path, capsys):
    """A file nobody of the release wrote (`records-*` is what readers of the folder read)
    is named by every later run, in one line, and left in place."""
    config = write_config(tmp_path, name="active_users.yaml")
    state = str(tmp_path / "state")
    out, err = _schedule_main(capsys, config, state, 5)
    assert "warning" not in err
    job = job_config.load(config)
    folder = schedule.published_folder(job, json.load(open(glob.glob(os.path.join(
        job.output.path, "*-scheduled", "*", "release.json"))[0]))["release_id"])
    planted = os.path.join(folder, "records-extra.jsonl")
    open(planted, "w").write("{}\n")
    out, err = _schedule_main(capsys, config, state, 12)
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert lines == [f"warning: {planted} is not a file of release "
                     f"{os.path.basename(folder)} (left in place; the release's files are "
                     f"release.json and records-steps-*)"] and os.path.exists(planted)
    os.remove(planted)
    named = os.path.join(folder, "records-steps-x-00000-of-00001.jsonl")  # read as the release's
    open(named, "w").write("{}\n")
    code = schedule.main(["--config", config, "--state-dir", state, "--now",
                          "2026-01-05T13:00:00Z"])
    assert code == 2 and capsys.readouterr().err.strip() == (
        f"error: `published folder` must be holding only the files of the release's committed "
        f"windows (remove the file); got '{named}'.")


def test_a_bound_given_as_null_then_left_out_is_one_line(tmp_path):
    """The ledger's bounds hold value_resolution: null; the next config leaves it out (the
    same value by default, another config): refused in one line naming the entry (it was
    'min() arg is an empty sequence')."""
    base = yaml.safe_load(open(os.path.join(ROOT, "configs", "seconds_on_page.yaml")))
    state = str(tmp_path / "state")
    first = write_config(tmp_path, "seconds_on_page.yaml",
                         bounds=dict(base["bounds"], value_resolution=None))
    schedule.run_once(first, state, ORIGIN + 4 * HOUR)
    second = write_config(tmp_path, "seconds_on_page.yaml", bounds=dict(base["bounds"]))
    with pytest.raises(ValueError, match=r"^`bounds.value_resolution` must be what this "
                                         r"release was started with \(None; "):
        schedule.run_once(second, state, ORIGIN + 8 * HOUR)


def test_a_long_public_keys_change_names_the_keys_that_moved():
    """Lists of public keys are not printed whole: their sizes and a key added or removed."""
    job = job_config.load("demo:active_users")
    spent = checkpoints.fingerprint(job)
    spent["public_keys"] = [f"region-{i:03d}" for i in range(40)]
    ledger = {"secret_fingerprint": "f", "config": spent}
    with pytest.raises(ValueError) as refused:
        checkpoints.check_ledger(ledger, job, "f")
    message = str(refused.value)
    assert message.startswith("`public_keys` must be what this release was started with "
                              "(\"40 entries, with 'region-000'\"; ") and len(message) < 300
    assert message.endswith("got \"6 entries, with 'eu-west'\".")


def unbounded_config(tmp_path, **changes):
    """cart_items with no horizon (zCDP: no horizon-free mechanism is pure DP)."""
    config = write_config(tmp_path, **{"privacy": {"rho": 0.5}, **changes})
    raw = yaml.safe_load(open(config))
    raw["steps"]["horizon"] = "unbounded"
    with open(config, "w") as out:
        yaml.safe_dump(raw, out)
    return config


def resumed_equals_one_run(tmp_path, hours):
    """Records of scheduled runs at `hours` after the origin, and of one run at the last."""
    config = unbounded_config(tmp_path)
    for hour in hours:
        summary = schedule.run_once(config, str(tmp_path / "state"), ORIGIN + hour * HOUR)
        assert not summary["public"]["complete"]
        assert summary["public"]["state_bytes_per_key_now"] == 16 + 9 + 16 * hour
    once = unbounded_config(tmp_path, output={"path": str(tmp_path / "once"),
                                              "formats": ["jsonl"]})
    alone = schedule.run_once(once, str(tmp_path / "alone"), ORIGIN + hours[-1] * HOUR)
    assert alone["release_id"] == summary["release_id"]
    resumed = records_of(summary["records"])
    assert len(resumed) == 4 * hours[-1]
    assert {r["mechanism"] for r in resumed} == {"log_sqrt_toeplitz"}
    assert resumed == records_of(alone["records"])
    return summary


def test_a_release_with_no_horizon_resumed_equals_one_run(tmp_path):
    last = resumed_equals_one_run(tmp_path, [1, 5, 6, 30])
    out = job_run.describe_run(last["job_config"], last["transform"], last["public"],
                               last["operator_not_private"])
    assert "no horizon (up to 1048576 steps) x 3600 s" in out and "release complete" not in out
    assert "steps released 6 -> 30 (no horizon; 24 new)" in out
    assert "state: 505 B per key at step 30 (a release with no horizon" in out


@pytest.mark.slow
def test_a_release_with_no_horizon_resumed_over_20_runs_equals_one_run(tmp_path):
    resumed_equals_one_run(tmp_path, list(range(1, 21)))


def test_a_release_with_no_horizon_under_float_noise_says_no_state_growth(tmp_path):
    config = unbounded_config(tmp_path, privacy={"rho": 0.5, "noise": "float"})
    summary = schedule.run_once(config, str(tmp_path / "state"), ORIGIN + 3 * HOUR)
    assert summary["released_after"] == 3 and "state_bytes_per_key_now" not in summary["public"]


def test_a_release_with_no_horizon_cannot_continue_with_one(tmp_path):
    config = unbounded_config(tmp_path)
    schedule.run_once(config, str(tmp_path / "state"), ORIGIN + 3 * HOUR)
    raw = yaml.safe_load(open(config))
    raw["steps"]["horizon"] = 1 << 20  # its reach, as a horizon: another release
    with open(config, "w") as out:
        yaml.safe_dump(raw, out)
    with pytest.raises(ValueError, match=r"^`steps.horizon` must be what this release was "
                                         r"started with \('unbounded'; "):
        schedule.run_once(config, str(tmp_path / "state"), ORIGIN + 5 * HOUR)


def test_one_run_of_a_release_with_no_horizon_is_refused(tmp_path, capsys):
    assert job_run.main(["--config", unbounded_config(tmp_path)]) == 2
    assert "`steps.horizon` must be a number of steps for a one-off batch run (a release " \
           "with no horizon continues with python3 -m pipelines.schedule); got 'unbounded'." \
           in capsys.readouterr().err
