"""The job runner end to end on the bundled demo data, and from an installed sdist."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import run as job_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_job_writes_every_key_and_step(tmp_path):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"]["path"] = str(tmp_path)
    config["steps"]["horizon"] = 12
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    table = pq.read_table(glob.glob(str(tmp_path / "active-users" / "records-*.parquet"))[0])
    assert table.num_rows == 6 * 12
    dead = [line for f in glob.glob(str(tmp_path / "active-users-operator" /
                                        "dead_letters-*.jsonl")) for line in open(f)]
    assert len(dead) > 0  # events after the 12-step horizon are dead letters, not dropped


def test_a_rerun_replaces_the_output_set_whole(tmp_path):
    """Files of an earlier run (other shard names) and a killed run's staging folder never mix
    into the new set."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["output"] = {"path": str(tmp_path), "formats": ["jsonl", "csv"]}
    config["secret"] = {"seed": 3, "insecure": True}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    first = sorted(os.listdir(tmp_path / "signups"))
    (tmp_path / "signups" / "records-00007-of-00009.jsonl").write_text("{}\n")  # stale shard
    killed = tmp_path / ".staging-signups-0badc0de" / "public"
    killed.mkdir(parents=True)
    (killed / "records-00000-of-00001.jsonl").write_text("{}\n")
    assert job_run.main(["--config", str(path)]) == 0
    assert sorted(os.listdir(tmp_path / "signups")) == first
    assert "release.json" in first and not list(tmp_path.glob(".staging-*"))
    assert os.listdir(tmp_path / "signups-operator")


def test_bad_config_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("job: x\ntransform: nope\n")
    assert job_run.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`input` must be given" in err or "`transform`" in err


def test_sdist_installs_and_runs_the_demo_job_like_a_dataflow_worker(tmp_path):
    """Build an sdist, install it (no deps: they are the image's) into a fresh virtualenv,
    and run a job from outside the source tree using the packaged demo data."""
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True)
    sdist = glob.glob(str(tmp_path / "*.tar.gz"))[0]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    sdist], check=True, capture_output=True)
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "cart_items.yaml")))
    config["output"]["path"] = str(tmp_path / "out")
    job = tmp_path / "elsewhere" / "job.yaml"
    job.parent.mkdir()
    job.write_text(yaml.safe_dump(config))
    result = subprocess.run([python, "-c", "import pipelines, sys; print(pipelines.__file__)"],
                            cwd=str(job.parent), capture_output=True, text=True, check=True)
    assert "site-packages" in result.stdout  # the installed copy, not the source tree
    result = subprocess.run([python, "-m", "pipelines.run", "--config", str(job)],
                            cwd=str(job.parent), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    table = pq.read_table(glob.glob(str(tmp_path / "out" / "cart-items" / "records-*.parquet"))[0])
    assert table.num_rows == 4 * 48
    # a bundled config by name, from the installed package (its output path is relative)
    result = subprocess.run([python, "-m", "pipelines.run", "--config", "demo:active_users"],
                            cwd=str(job.parent), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert glob.glob(str(job.parent / "output" / "active-users" / "records-*.parquet"))


def _config(tmp_path, **changes):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    for dotted, value in changes.items():
        section, _, field = dotted.partition("__")
        if field:
            config[section][field] = value
        else:
            config[section] = value
    return config


@pytest.mark.parametrize("changes,message", [
    ({"steps__origin": 1e15}, "`steps.origin` must be a time in the years 1 to 9999"),
    ({"steps__size_seconds": 1e300}, "`steps.size_seconds` must be small enough"),
    ({"steps__horizon": 2 ** 40}, "`steps.horizon` must be <= 4194304"),
    ({"bounds__max_contributions": 10 ** 30}, "`bounds.max_contributions` must be <= "),
    ({"input__path": "/no/such/file.jsonl"}, "`input.path` must be matching at least one file"),
    ({"input__path": "/no/such/dir/*.jsonl"}, "`input.path` must be matching at least one"),
    ({"input__path": "no/such/file.jsonl"}, "`input.path` must be matching at least one file "
                                            f"(a relative path is read from the current "
                                            f"folder, {os.getcwd()}); got 'no/such/file.jsonl'."),
    ({"secret": {"env": "DP_TEST_UNSET_VARIABLE"}}, "`secret` must be set in the environment "
                                                    "variable DP_TEST_UNSET_VARIABLE"),
    ({"secret": {"path": "/no/such/secret"}}, "`secret.path` must be a readable file"),
    ({"input__types": {"key": "float"}}, "`input.types.key` must be one of 'id', 'str', 'int'"),
    ({"public_keys": [1, 2]}, "`public_keys` must be of the declared key type"),
])
def test_config_errors_are_one_line_before_the_pipeline_starts(tmp_path, capsys, changes,
                                                               message):
    config = _config(tmp_path, **changes)
    if "public_keys" in changes:
        config["input"]["types"] = {"key": "str"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_a_relative_input_path_beside_the_config_says_how_to_name_it(tmp_path, capsys,
                                                                     monkeypatch):
    """A relative input.path is read from the current folder; when only the config's folder
    has it, the one-line error gives the path to use from here."""
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "events.jsonl").write_text(open(os.path.join(
        ROOT, "pipelines", "demo_data", "signups.jsonl")).read())
    config = _config(tmp_path, input__path="events.jsonl")
    (folder / "job.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    assert job_run.main(["--config", "jobs/job.yaml"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: `input.path` must be matching at least one file from the current "
                   "folder (the config's folder has it: give 'jobs/events.jsonl'); got "
                   "'events.jsonl'.\n"), err
    config["input"]["path"] = "jobs/events.jsonl"
    (folder / "job.yaml").write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", "jobs/job.yaml"]) == 0


def test_a_copied_config_that_kept_the_job_name_does_not_replace_the_others_output(
        tmp_path, capsys):
    """A batch run replaces its job's output set; one written by another config file (a copy
    that kept `job:`) is not silently replaced: the one-line error names it. The same file,
    edited, runs again."""
    config = _config(tmp_path)
    config["secret"] = {"seed": 3, "insecure": True}
    first, copy = tmp_path / "first.yaml", tmp_path / "copy.yaml"
    first.write_text(yaml.safe_dump(config))
    copy.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(first)]) == 0
    capsys.readouterr()
    assert job_run.main(["--config", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: `job` must be a name of its own ({tmp_path / 'out' / 'signups'} "
                   f"holds the output of {first}; rename `job:`, or remove that folder and "
                   f"the job's operator folders); got 'signups'.\n"), err
    config["privacy"] = {"epsilon": 2.0}
    first.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(first)]) == 0
    config["job"] = "signups-copy"
    copy.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(copy)]) == 0


def test_config_file_problems_are_one_line(tmp_path, capsys):
    duplicate = tmp_path / "dup.yaml"
    duplicate.write_text(open(os.path.join(ROOT, "configs", "signups.yaml")).read()
                         + "\njob: again\n")
    unwritable = tmp_path / "ro"
    unwritable.mkdir()
    unwritable.chmod(0o500)
    config = _config(tmp_path, output={"path": str(unwritable / "sub"), "formats": ["jsonl"]})
    ro_path = tmp_path / "ro.yaml"
    ro_path.write_text(yaml.safe_dump(config))
    cases = [(str(duplicate), "`config` must be free of duplicate keys; got 'job'"),
             (str(tmp_path), "`config` must be an existing YAML file")]
    if os.geteuid() != 0:  # root can write anywhere
        cases.append((str(ro_path), "`output.path` must be a writable folder"))
    for path, message in cases:
        assert job_run.main(["--config", path]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def active_users_12_hours(tmp_path):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path), "formats": ["jsonl"]}
    config["steps"]["horizon"] = 12
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_job_prints_no_warning_and_reports_truncation_to_the_operator(tmp_path, capfd):
    path = active_users_12_hours(tmp_path)
    assert job_run.main(["--config", str(path)]) == 0
    out, err = capfd.readouterr()
    assert "WARNING" not in err and "Traceback" not in err, err
    assert "operator-only (NOT private, exact counts of the data)" in out
    summary = json.load(open(tmp_path / "active-users-operator" / "summary.json"))
    assert summary["events_in_window"] > 0
    assert sum(summary["truncated"].values()) > 0  # the demo's caps do cut, named by bound
    assert set(summary["truncated"]) <= {"max_contributions", "max_contributions_per_step",
                                         "max_keys_per_unit"}
    assert sum(summary["dead_letters"].values()) > 0       # events after the 12-step horizon
    assert not (tmp_path / "active-users" / "summary.json").exists()  # not in the public set


def test_run_summary_json_is_public_and_names_why_the_mechanism_won(tmp_path, capsys):
    path = active_users_12_hours(tmp_path)
    capsys.readouterr()
    assert job_run.main(["--config", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    public, operator = summary["public"], summary["operator_not_private"]
    rows = [json.loads(line) for f in glob.glob(str(tmp_path / "active-users" / "*.jsonl"))
            for line in open(f)]
    assert public["records"] == len(rows) == 6 * 12
    assert public["max_se"] == max(r["stddev"] for r in rows)
    assert {r["release_id"] for r in rows} == {public["release_id"]}
    assert public["mechanism"] == rows[0]["mechanism"]
    # the plan command it names recommends exactly the mechanism the run used
    from pipelines import plan
    command = public["why"].split("the table: ", 1)[1].split()
    assert command[:3] == ["python3", "-m", "pipelines.plan"]
    assert plan.main(command[3:] + ["--json"]) == 0
    recommended = json.loads(capsys.readouterr().out)["recommended"]
    assert (recommended["mechanism"], recommended["params"]) == (
        public["mechanism"], public["mechanism_params"])
    # the operator part: exact counts that add up (events in the horizon >= those cut)
    assert operator["events_in_window"] >= sum(operator["truncated"].values()) > 0


@pytest.mark.parametrize("name,changes", [
    ("active_users", {}), ("active_users", {"max_keys_per_unit": 3}), ("seconds_on_page", {}),
    ("cart_items", {"max_keys_per_unit": 2}), ("friend_degrees", {}), ("signups", {}),
    ("signups", {"max_state_bytes_per_key": 500})])  # the square root (793 B) over budget
def test_the_plan_command_a_run_names_recommends_what_auto_chose(name, changes, capsys):
    from pipelines import config as job_config
    from pipelines import plan
    from transforms.release import NoNoise
    job = job_config.load(f"demo:{name}")
    budget = changes.pop("max_state_bytes_per_key", None)
    job = job.replace(bounds=dict(job.bounds, **changes),
                      secret=job_config.SecretSpec(insecure=True))
    if budget is not None:
        job = job.replace(mechanism=dataclasses.replace(job.mechanism,
                                                        max_state_bytes_per_key=budget))
    transform = job_run.build_transform(job, noise_source=NoNoise())
    command = job_run.plan_command(transform.descriptor,
                                   job.mechanism.max_state_bytes_per_key).split()
    if budget is not None:
        assert transform.descriptor["mechanism"] != "sqrt_toeplitz"
    capsys.readouterr()
    assert plan.main(command[3:] + ["--json"]) == 0
    recommended = json.loads(capsys.readouterr().out)["recommended"]
    assert (recommended["mechanism"], recommended["params"]) == (
        transform.descriptor["mechanism"], transform.descriptor["params"])
    assert recommended["calibration"] == transform.descriptor["calibration"]


def test_a_job_exits_with_its_code_and_flushed_output_without_the_interpreter_teardown():
    """`logs.exit_now` (the CLIs that run Beam or read Arrow end with it): the code and
    everything printed reach the caller; the teardown, where pyarrow's thread pools can abort
    a finished job (apache/arrow#34314), is skipped (an atexit hook does not run)."""
    script = ("import atexit, sys; from pipelines import logs; "
              "atexit.register(lambda: print('teardown ran')); "
              "print('summary', end=''); sys.stderr.write('warned'); logs.exit_now(3)")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True)
    assert (result.returncode, result.stdout, result.stderr) == (3, "summary", "warned")


def test_streaming_with_file_input_is_refused_not_run_as_batch(capsys):
    from pipelines import run as job_run
    from pipelines import schedule
    assert job_run.main(["--config", "demo:active_users", "--streaming"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `--streaming` must be left out for file input") and \
        err.count("\n") == 1
    with pytest.raises(ValueError, match=r"^`--streaming` must be left out for file input"):
        schedule.run_once("demo:active_users", "/nonexistent-state", 0.0, ["--streaming"])


def test_a_mean_run_says_its_parts_errors_and_the_means_error_per_count(tmp_path, capsys):
    """The run summary of a mean gives what `plan --mean-max-value` gives (the parts' MaxSE
    and the mean's standard error times the count), not the records' capped stddev."""
    import yaml

    from pipelines import plan
    from pipelines import run as job_run
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "mean_seconds.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["steps"]["horizon"] = 6
    path = tmp_path / "mean.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path), "--json"]) == 0
    public = json.loads(capsys.readouterr().out)["public"]
    assert plan.main(["--horizon", "6", "--epsilon", "2", "--max-contributions", "10",
                      "--mean-max-value", "300", "--gate-share", "0.02", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert public["se_times_count"] == pytest.approx(planned["mean_se_times_count"], rel=1e-12)
    assert public["part_max_se"]["count"] == pytest.approx(
        planned["parts"]["count"]["recommended"]["max_se"], rel=1e-12)


def test_a_remote_runner_is_refused_local_paths_and_a_missing_gcp_extra_in_one_line(
        tmp_path, capsys, monkeypatch):
    """The documented Dataflow command (docs/operations.md#dataflow) with its example config,
    and the bundled config with a secret: each one line, exit 2, before anything starts."""
    import importlib.util
    dataflow = ["--runner", "DataflowRunner", "--project", "my-project", "--region",
                "europe-west1", "--temp_location", "gs://my-bucket/tmp", "--setup_file",
                "./setup.py"]
    monkeypatch.setenv("DP_TEST_SECRET", "ab" * 32)
    local = _config(tmp_path, secret={"env": "DP_TEST_SECRET"})
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(local))
    assert job_run.main(["--config", str(path), *dataflow]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`input.path` must be a path every DataflowRunner worker " \
                                    "can reach" in err, err
    local["input"]["path"] = "gs://my-bucket/events/*.jsonl"
    path.write_text(yaml.safe_dump(local))
    assert job_run.main(["--config", str(path), *dataflow]) == 2
    err = capsys.readouterr().err
    assert "`output.path` must be a path every DataflowRunner worker can reach" in err, err
    if importlib.util.find_spec("google.cloud.storage") is None:  # this machine: no [gcp]
        example = os.path.join(ROOT, "configs", "dataflow", "active_users.yaml")
        assert job_run.main(["--config", example, *dataflow]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "`--runner` must be launched where the [gcp] extra is " \
                                        "installed" in err and "Traceback" not in err, err
    docs = open(os.path.join(ROOT, "docs", "operations.md")).read()
    assert "--config configs/dataflow/active_users.yaml" in docs


# ----- the truncation warning --------------------------------------------------------------------
def _cutting_sum(tmp_path):
    """The sum job with `max_contributions` left at its default (1 second per user): the
    bounds cut most events."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "seconds_on_page.yaml")))
    del config["bounds"]["max_contributions"]
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["steps"]["horizon"] = 12
    config["secret"] = {"seed": 11, "insecure": True}
    path = tmp_path / "cutting.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_run_whose_bounds_cut_most_events_warns_and_names_the_caps_command(tmp_path, capsys):
    """More than half the events cut: one WARNING line (operator-only) with the share, the
    bound that cut most and a `pipelines.caps` command that runs and shows the same cut for
    the configured value."""
    from pipelines import caps
    path = _cutting_sum(tmp_path)
    assert job_run.main(["--config", path, "--json"]) == 0
    operator = json.loads(capsys.readouterr().out)["operator_not_private"]
    events, truncated = operator["events_in_window"], operator["truncated"]
    share = 100.0 * sum(truncated.values()) / events
    assert share > 50
    warning = operator["truncation_warning"]
    assert warning.startswith(f"WARNING (operator-only, NOT private): the contribution bounds "
                              f"cut {share:.1f} % of the {events} events")
    assert f"(most by max_contributions: {truncated['max_contributions']})" in warning
    command = warning.split(" with ", 1)[1]
    assert command == (f"python3 -m pipelines.caps --config {path} "
                       f"--vary max_contributions=1,300,600,1200,2400")
    stored = json.load(open(tmp_path / "out" / "seconds-on-page-operator" / "summary.json"))
    assert stored["truncation_warning"] == warning  # operator-only, beside the dead letters
    assert job_run.main(["--config", path]) == 0
    printed = capsys.readouterr().out.splitlines()
    heading = max(i for i, line in enumerate(printed) if line.startswith("operator-only (NOT "))
    assert printed[-1] == warning and all(line.startswith("  ")  # the summary's parts
                                          for line in printed[heading + 1:-1])
    # the named command runs, and cuts what the run cut at the configured value
    assert caps.main(command.split()[3:] + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    first = next(r for r in rows if r["bounds"] == {"max_contributions": 1})
    assert first["events_not_private"] == events
    assert sum(first["cut_not_private"].values()) == sum(truncated.values())
    assert [r["bounds"]["max_contributions"] for r in rows] == [1, 300, 600, 1200, 2400]


def test_a_run_cutting_less_than_half_has_no_warning(tmp_path, capsys):
    path = active_users_12_hours(tmp_path)
    assert job_run.main(["--config", str(path), "--json"]) == 0
    operator = json.loads(capsys.readouterr().out)["operator_not_private"]
    assert 0 < sum(operator["truncated"].values()) * 2 <= operator["events_in_window"]
    assert operator["truncation_warning"] is None
    assert job_run.main(["--config", str(path)]) == 0
    assert "WARNING" not in capsys.readouterr().out


def test_a_run_whose_keys_are_mostly_not_public_warns(tmp_path, capsys):
    """Public keys spelled otherwise than the data's (here: case) leave the release mostly
    noise on keys without data: the gate refuses it; with the gate off (fraction 1) it is
    published and the operator is told (adversary's W4)."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path), "formats": ["jsonl"]}
    config["public_keys"] = ["EU-WEST", "eu-north"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 2
    assert "noisy excess" in capsys.readouterr().err
    config["input"]["max_dead_letter_fraction"] = 1.0
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "are of keys not in public_keys and were dropped" in out, out
    summary = json.load(open(tmp_path / "active-users-operator" / "summary.json"))
    assert summary["dropped_non_public_keys"] > summary["kept_public_keys"] > 0
    config["public_keys"] = ["eu-west", "eu-north", "us-east", "us-west", "apac", "latam"]
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    assert "not in public_keys" not in capsys.readouterr().out


def test_a_job_without_public_keys_publishes_selected_keys_and_tells_the_operator(tmp_path,
                                                                                 capsys):
    """page_visitors: the public summary counts the keys its records hold and states the rule
    (threshold, delta); the exact count of keys with data is operator-only; every published
    key has every step from its selection step on, at or above the threshold there."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "page_visitors.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["secret"] = {"seed": 7, "insecure": True}
    path = tmp_path / "pages.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    public, operator = summary["public"], summary["operator_not_private"]
    rows = [json.loads(line) for f in glob.glob(str(tmp_path / "out" / "page-visitors" /
                                                     "*.jsonl")) for line in open(f)]
    keys = {}
    for row in rows:
        keys.setdefault(row["key"], []).append(row)
    tau = public["selection"]["threshold"]
    assert public["public_keys"] is None and public["selected_keys"] == len(keys) > 0
    assert public["selection"]["delta"] == 1e-6 and public["budget_spent"] == {
        "epsilon": 1.0, "delta": 1e-6}
    for key, items in keys.items():
        items.sort(key=lambda r: r["step"])
        assert [r["step"] for r in items] == list(range(items[0]["step"], 48))
        assert items[0]["value"] >= tau and items[0]["delta"] == 1e-6
    assert operator["keys_with_data"] > operator["keys_selected"] == len(keys)
    assert "keys_with_data" not in public and "keys_with_data" not in json.dumps(rows)
    assert job_run.main(["--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"key(s) selected privately (a key is published from the first step its noisy " \
           f"running total reaches {tau:g}; selection delta 1e-06)" in text
    assert f"{operator['keys_with_data']} keys with data (in the release so far), " \
           f"{len(keys)} of them selected" in text


def test_a_selecting_runs_summary_is_in_value_units_and_its_maxse_is_the_mechanisms(tmp_path,
                                                                                   capsys):
    """A sum without public keys: the summary's threshold and bound are in value units (the
    grid's units times g), as `plan --config` prints them; its MaxSE is the mechanism's
    largest per-step stddev even when no key is selected (the records hold none)."""
    from pipelines import plan
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "seconds_on_page.yaml")))
    del config["public_keys"]
    config["input"]["types"] = {"key": "str"}
    config["privacy"] = {"rho": 0.5, "delta": 1e-12}
    config["steps"]["horizon"] = 3
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["secret"] = {"seed": 3, "insecure": True}
    path = tmp_path / "sum.yaml"
    path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert job_run.main(["--config", str(path), "--json"]) == 0
    public = json.loads(capsys.readouterr().out)["public"]
    assert plan.main(["--config", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["streams"][0]
    assert public["max_se"] == pytest.approx(planned["runs"]["max_se"], rel=1e-12)
    assert public["selection"]["threshold"] == pytest.approx(
        planned["selection"]["threshold"], rel=1e-12)
    assert public["selection"]["contribution_bound"] == pytest.approx(600.0)  # k, in seconds
    # 2 hours at epsilon 0.1: no page reaches the threshold, the MaxSE is still the job's
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "page_visitors.yaml")))
    config["steps"]["horizon"] = 2
    config["privacy"] = {"epsilon": 0.1, "selection_delta": 1e-12}
    config["output"] = {"path": str(tmp_path / "out2"), "formats": ["jsonl"]}
    config["secret"] = {"seed": 3, "insecure": True}
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path), "--json"]) == 0
    public = json.loads(capsys.readouterr().out)["public"]
    assert public["records"] == 0 and public["selected_keys"] == 0
    assert plan.main(["--config", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["streams"][0]
    assert public["max_se"] > 0
    assert public["max_se"] == pytest.approx(planned["runs"]["max_se"], rel=1e-12)



def test_the_summary_shows_the_first_reason_of_the_most_common_dead_letter(tmp_path, capsys):
    """Times in epoch milliseconds read as ISO/seconds: every record is a dead letter, and
    the operator's line says what to set (the reason of its first dead letter)."""
    import json as json_module
    origin = 1767571200  # configs/active_users.yaml's origin
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json_module.dumps({"user": f"u{i}", "region": "apac",
                                                 "ts": (origin + 60 * i) * 1000}) + "\n"
                              for i in range(20)))
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    raw["input"].update(path=str(events), max_dead_letter_fraction=1.0)
    raw.update(output={"path": str(tmp_path / "out"), "formats": ["jsonl"]},
               secret={"seed": 1, "insecure": True})
    config = tmp_path / "ms.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert job_run.main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "20 dead letters (bad_timestamp: 20; the first bad_timestamp: `ts` must be a time " \
           "in the years 1 to 9999 (milliseconds? set input.timestamp_format: " \
           "milliseconds)" in out, out


def signed_delays(path, seed=13):
    """Departure delays in minutes, flights-like: 3 carriers x 400 aircraft, each aircraft
    flying 1-10 times over 31 days (the unit: an aircraft; max_contributions 10 cuts
    nothing); LGA's mostly early (negative), a few delays beyond either end of [-60, 120]."""
    rng = np.random.default_rng(seed)
    rows, means = [], {"EWR": 6.0, "JFK": 2.0, "LGA": -9.0}
    for carrier, centre in means.items():
        for plane in range(400):
            for _ in range(int(rng.integers(1, 11))):
                delay = float(np.round(rng.normal(centre, 14.0) if rng.random() < 0.85
                                       else rng.choice([-1, 1]) * rng.exponential(70.0)))
                day = int(rng.integers(0, 31))
                rows.append({"ts": 1_356_998_400 + day * 86_400 + int(rng.integers(0, 86_400)),
                             "tail": f"{carrier}-{plane}", "carrier": carrier,
                             "delay": delay})
    with open(path, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return rows


def test_a_signed_mean_is_not_biased_by_clamping_at_zero_and_counts_the_clamped_values(
        tmp_path, capsys):
    """#42's flights case: a mean of delays with min_value -60. Every carrier's published mean
    at the last step covers the truth (values clamped to [-60, 120] on the grid; nothing
    truncated); the truth had negatives been clamped to 0 (the old rule) lies outside LGA's
    interval; the operator summary counts the values clamped at each end exactly. The fixed
    insecure seed makes this deterministic (with fresh noise, three 95 % intervals all cover
    with probability >= 0.95^3 = 0.857)."""
    rows = signed_delays(tmp_path / "delays.jsonl")
    config = {"job": "delays", "transform": "mean",
              "input": {"path": str(tmp_path / "delays.jsonl"),
                        "fields": {"timestamp": "ts", "unit": "tail", "key": "carrier",
                                   "value": "delay"}},
              "steps": {"origin": "2013-01-01T00:00:00Z", "size_seconds": 86400,
                        "horizon": 31},
              "privacy": {"epsilon": 2.0},
              "bounds": {"min_value": -60, "max_value": 120, "max_contributions": 10},
              "public_keys": ["EWR", "JFK", "LGA"], "secret": {"seed": 5, "insecure": True},
              "output": {"path": str(tmp_path / "out"), "formats": ["jsonl"]}}
    path = tmp_path / "delays.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for f in glob.glob(str(tmp_path / "out" / "delays" / "*.jsonl"))
               for line in open(f)]
    g = 1.2  # max(|-60|, 120) / 100
    for carrier in ("EWR", "JFK", "LGA"):
        values = np.array([r["delay"] for r in rows if r["carrier"] == carrier])
        truth = g * np.mean(np.floor(np.clip(values, -60, 120) / g + 0.5))
        at_zero = g * np.mean(np.floor(np.clip(values, 0, 120) / g + 0.5))
        last = next(r for r in records if r["key"] == carrier and r["step"] == 30)
        assert last["ci_low"] <= truth <= last["ci_high"], (carrier, truth, last)
        if carrier == "LGA":
            assert not last["ci_low"] <= at_zero <= last["ci_high"], (at_zero, last)
            assert last["value"] < 0
    delays = np.array([r["delay"] for r in rows])
    operator = summary["operator_not_private"]
    assert operator["clamped"] == {"values_below_min_value": int(np.sum(delays < -60)),
                                   "values_above_max_value": int(np.sum(delays > 120))}
    assert min(operator["clamped"].values()) > 0
    assert operator["truncated"] == {}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_field_that_is_not_a_column_is_refused_before_anything_is_spent(tmp_path, capsys,
                                                                           fmt):
    """A CSV header and Parquet schemas are the input's schema, not its data: a misspelled
    field is a free one-line error, not a run the input gate refuses (and charges)."""
    rows = [{"ts": "2026-01-05T00:30:00Z", "user": f"u{i}", "region": "eu-west"}
            for i in range(5)]
    data = tmp_path / f"events.{fmt}"
    if fmt == "csv":
        data.write_text("ts,user,region\n" + "".join(
            f"{r['ts']},{r['user']},{r['region']}\n" for r in rows))
    else:
        import pyarrow as pa
        pq.write_table(pa.Table.from_pylist(rows), data)
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["input"].update(path=str(data), format=fmt,
                           fields={"timestamp": "ts", "unit": "acount", "key": "region"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 2
    assert capsys.readouterr().err == ("error: `input.fields.unit` must be a column of the "
                                       "input (ts, user, region); got 'acount'.\n")
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_a_coarse_value_grid_is_pointed_out_from_the_config(tmp_path, capsys):
    """value_resolution 100 for values up to 300: each value moves by up to 50, said once (a
    note from the config alone; the default grid, max / 100, says nothing)."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "seconds_on_page.yaml")))
    config.update(output={"path": str(tmp_path), "formats": ["jsonl"]},
                  secret={"seed": 1, "insecure": True})
    path = tmp_path / "job.yaml"
    for grid, noted in ((100, True), (None, False)):
        config["bounds"]["value_resolution"] = grid
        path.write_text(yaml.safe_dump(config))
        assert job_run.main(["--config", str(path)]) == 0
        out = capsys.readouterr().out
        assert ("NOTE: value_resolution 100 is coarse for values up to 300: each value is "
                "rounded to a multiple of it (by up to 50)" in out) == noted, out


def test_a_csv_without_a_header_is_refused_without_showing_its_first_record(tmp_path, capsys):
    """A headerless CSV's first line is a record: none of the fields is a column, and the
    one-line error says so without echoing its cells (a person's data)."""
    data = tmp_path / "events.csv"
    data.write_text("2026-01-05T00:10:00Z,alice@example.com,eu-west\n"
                    "2026-01-05T00:20:00Z,bob@example.com,us-east\n")
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["input"].update(path=str(data), format="csv")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == ("error: `input.fields.key` must be a column of the input (none of "
                   "input.fields is: is the first line a header?); got 'region'.\n"), err
    assert "alice" not in err
