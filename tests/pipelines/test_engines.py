"""The project's jobs on Apache Flink and Apache Spark through Beam's portable runners
(pipelines/engines.py): the same records as the local runner, bit for bit.

The engine runs need the job servers that `python3 -m pipelines.engines fetch` puts in place
(CI's install step does) and Java 17; without them they are skipped, saying so."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

from pipelines import engines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(os.path.basename(path) for path in glob.glob(os.path.join(ROOT, "configs",
                                                                            "*.yaml")))


def needs(runner: str):
    engine = engines.ENGINES[runner]
    return pytest.mark.skipif(
        not engines.installed(engine) or shutil.which("java") is None,
        reason=f"{engine.name}'s job server is not installed (python3 -m pipelines.engines "
               f"fetch {engine.name})")


def test_the_manifest_names_the_main_class_and_every_jar_in_lines_of_72_bytes(tmp_path):
    jars = [str(tmp_path / f"library-with-a-long-name-{i:03d}.jar") for i in range(40)]
    data = engines.manifest("org.example.Main", jars)
    lines = data.split(b"\r\n")
    assert all(len(line) <= 72 for line in lines)
    assert data.endswith(b"\r\n\r\n")
    unwrapped = data.replace(b"\r\n ", b"").decode("utf-8").splitlines()
    assert "Main-Class: org.example.Main" in unwrapped
    class_path = [line for line in unwrapped if line.startswith("Class-Path: ")]
    assert class_path[0][len("Class-Path: "):].split(" ") == ["file:" + jar for jar in jars]


def test_a_run_on_an_engine_gets_an_embedded_engine_and_loopback(monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "HOME", str(tmp_path))
    flink = engines.ENGINES["FlinkRunner"]
    os.makedirs(flink.folder)
    with zipfile.ZipFile(flink.jar, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", engines.manifest(flink.main, []))
    args = engines.runner_args("FlinkRunner", ["--runner=FlinkRunner", "--parallelism=4"])
    assert args == ["--runner=FlinkRunner", "--parallelism=4", "--flink_master=[local]",
                    "--environment_type=LOOPBACK"]  # the caller's parallelism kept
    assert engines.runner_args("DirectRunner", ["--runner=DirectRunner"]) == [
        "--runner=DirectRunner"]


def test_a_missing_engine_is_one_line_saying_how_to_fetch_it(monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "HOME", str(tmp_path))
    with pytest.raises(ValueError) as error:
        engines.runner_args("SparkRunner", ["--runner=SparkRunner"])
    message = str(error.value)
    assert message.startswith("`--runner SparkRunner` must have its job server installed "
                              "(python3 -m pipelines.engines fetch spark); got none in ")
    assert "\n" not in message and len(message) < 200


def test_runs_refuse_an_engine_that_is_not_installed_before_anything_starts(tmp_path):
    config = _config(tmp_path, "signups.yaml", "flink")
    env = dict(os.environ, DP_ENGINES=str(tmp_path / "none"))
    done = subprocess.run([sys.executable, "-m", "pipelines.run", "--config", config,
                           "--runner", "FlinkRunner"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error: `--runner FlinkRunner` must have its job server "
                                  "installed"), done.stderr
    assert not os.path.exists(tmp_path / "flink")


def _config(tmp_path, name: str, where: str, secret=None) -> str:
    with open(os.path.join(ROOT, "configs", name)) as handle:
        raw = yaml.safe_load(handle)
    raw["output"]["path"] = str(tmp_path / where)
    raw["secret"] = secret if secret is not None else {"seed": 11, "insecure": True}
    path = tmp_path / f"{where}-{name}"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _run(config: str, *args, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "pipelines.run", "--config", config,
                           "--json", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def _published(folder) -> dict:
    """The records (every JSON line, sorted: the shards differ with the parallelism) and the
    manifest of the job under `folder`."""
    [job] = [name for name in os.listdir(folder) if not name.endswith("-operator")
             and not name.startswith(".")]
    records = sorted(line for path in glob.glob(os.path.join(folder, job, "records-*.jsonl"))
                     for line in open(path).read().splitlines() if line)
    with open(os.path.join(folder, job, "release.json")) as handle:
        manifest = json.load(handle)
    return {"records": records, "manifest": manifest}


def _same_as_local(tmp_path, name: str, runner: str) -> None:
    engine = engines.ENGINES[runner].name
    local = _run(_config(tmp_path, name, "local"))
    remote = _run(_config(tmp_path, name, engine), "--runner", runner)
    here, there = _published(tmp_path / "local"), _published(tmp_path / engine)
    assert here["records"] and there["records"] == here["records"]
    assert there["manifest"] == here["manifest"]
    # the operator's exact counts (Beam metrics) come back from the engine too
    ours, theirs = (json.loads(done.stdout)["operator_not_private"] for done in (local, remote))
    assert theirs == ours


@needs("FlinkRunner")
def test_a_bundled_job_on_flink_publishes_the_local_runners_records_bit_for_bit(tmp_path):
    _same_as_local(tmp_path, "signups.yaml", "FlinkRunner")


@needs("SparkRunner")
def test_a_bundled_job_on_spark_publishes_the_local_runners_records_bit_for_bit(tmp_path):
    _same_as_local(tmp_path, "cart_items.yaml", "SparkRunner")


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["FlinkRunner", "SparkRunner"])
@pytest.mark.parametrize("name", CONFIGS)
def test_every_bundled_job_on_each_engine_equals_the_local_runner(tmp_path, name, runner):
    if not engines.installed(engines.ENGINES[runner]):
        pytest.skip(f"{runner}'s job server is not installed")
    _same_as_local(tmp_path, name, runner)


@pytest.mark.slow  # three jobs, two on Flink: about a minute
@needs("FlinkRunner")
def test_scheduled_runs_on_flink_continue_one_release_as_one_local_run(tmp_path):
    """Two `pipelines.schedule` runs on Flink (the second continues from the first's
    checkpoint) publish what one local `pipelines.run` of the whole horizon publishes."""
    with open(os.path.join(ROOT, "configs", "cart_items.yaml")) as handle:
        raw = yaml.safe_load(handle)
    raw["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    raw["steps"]["horizon"] = 12
    raw["secret"] = {"seed": 2026, "insecure": True}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(raw))
    summaries = []
    for now in ("2026-01-05T05:00:00Z", "2026-01-06T06:00:00Z"):
        done = subprocess.run([sys.executable, "-m", "pipelines.schedule", "--config",
                               str(config), "--state-dir", str(tmp_path / "state"), "--now",
                               now, "--json", "--runner", "FlinkRunner"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        summaries.append(json.loads(done.stdout)["public"])
    assert [(s["released_before"], s["released_after"]) for s in summaries] == [(0, 5), (5, 12)]
    order = (lambda record: (record["key"], record["step"]))
    pattern = summaries[-1]["records_path"]
    scheduled = sorted((json.loads(line) for path in glob.glob(pattern)
                        for line in open(path)), key=order)
    raw["output"]["path"] = str(tmp_path / "whole")
    whole = tmp_path / "whole.yaml"
    whole.write_text(yaml.safe_dump(raw))
    _run(str(whole))
    local = sorted((json.loads(line) for path in glob.glob(str(
        tmp_path / "whole" / raw["job"] / "records-*.jsonl")) for line in open(path)),
                   key=order)
    assert len(scheduled) == 12 * len(raw["public_keys"]) and scheduled == local


def _layout(folder) -> list:
    """Every file under `folder`, ids and shard counts replaced: what a run wrote, by kind."""
    import re
    found = []
    for path in glob.glob(os.path.join(folder, "**", "*"), recursive=True) + glob.glob(
            os.path.join(folder, ".*", "**", "*"), recursive=True):
        if os.path.isfile(path):
            name = re.sub(r"[0-9a-f]{8,32}", "ID", os.path.relpath(path, folder))
            found.append(re.sub(r"-\d{5}-of-\d{5}", "-SHARD", name))
    return sorted(set(found))


def _job_servers(tmp_path) -> set:
    """The processes running `java -jar` with `tmp_path` on their command line."""
    found = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except OSError:
            continue
        if b"-jar" in words and any(str(tmp_path).encode() in word for word in words):
            found.add(pid)
    return found


@needs("FlinkRunner")
def test_a_private_run_on_flink_claims_and_commits_as_a_local_run(tmp_path):
    """No seed: each run draws a fresh secret, claims its release once beside the output and
    commits its set; on Flink the files are those of a local run, and the records private.
    The run leaves no job server behind (`engines.job_server`: Beam's own stops only at the
    interpreter's exit, which the commands skip)."""
    local = _run(_config(tmp_path, "signups.yaml", "local", secret={}))
    before = _job_servers(tmp_path)
    flink = _run(_config(tmp_path, "signups.yaml", "flink", secret={}), "--runner",
                 "FlinkRunner", env=dict(os.environ, TMPDIR=str(tmp_path)))  # its folder here
    assert _job_servers(tmp_path) - before == set()
    assert _layout(tmp_path / "flink") == _layout(tmp_path / "local")
    ids = [json.loads(done.stdout)["public"]["release_id"] for done in (local, flink)]
    assert ids[0] != ids[1]
    claims = os.listdir(tmp_path / "flink" / ".releases")
    assert sorted(claims) == [f"signups-{ids[1]}", f"signups-{ids[1]}.claim"]
    published = _published(tmp_path / "flink")
    assert published["manifest"]["release_id"] == ids[1]
    assert {json.loads(line)["private"] for line in published["records"]} == {True}


def test_a_cluster_master_needs_the_environment_of_its_workers_said(monkeypatch, tmp_path):
    """LOOPBACK added by default would make a remote cluster call back into this process;
    where the workers run is the user's to say (it decides which paths they reach)."""
    monkeypatch.setattr(engines, "HOME", str(tmp_path))
    flink = engines.ENGINES["FlinkRunner"]
    os.makedirs(flink.folder)
    open(flink.jar, "wb").close()
    with pytest.raises(ValueError, match=r"^`--environment_type` must be given with "
                                         r"`--flink_master` .*; got none\.$"):
        engines.runner_args("FlinkRunner", ["--runner=FlinkRunner", "--flink_master",
                                            "jobmanager:8081"])
    args = engines.runner_args("FlinkRunner", ["--runner=FlinkRunner", "--flink_master",
                                               "jobmanager:8081", "--environment_type=PROCESS"])
    assert "--environment_type=LOOPBACK" not in args and "--flink_master=[local]" not in args


@pytest.mark.parametrize("args,runner,local", [
    ([], "FnApiRunner", True),
    (["--runner=DirectRunner"], "DirectRunner", True),
    (["--runner", "flink"], "FlinkRunner", False),  # no LOOPBACK given: workers elsewhere
    (["--runner=FlinkRunner", "--environment_type=LOOPBACK"], "FlinkRunner", True),
    (["--runner=FlinkRunner", "--environment_type", "beam:env:loopback:v1"], "FlinkRunner",
     True),
    (["--runner=FlinkRunner", "--environment_type=PROCESS"], "FlinkRunner", False),
    (["--runner=SparkRunner", "--environment_type=EXTERNAL"], "SparkRunner", False),
    (["--runner=sparkrunner", "--environment_type=loopback"], "SparkRunner", False),
    (["--runner=PrismRunner"], "PrismRunner", True),  # Prism's default: LOOPBACK
    (["--runner=PrismRunner", "--environment_type=DOCKER"], "PrismRunner", False),
    # Beam keeps the last --runner: a local-looking first one changes nothing
    (["--runner", "FlinkRunner", "--environment_type=LOOPBACK", "--runner=DataflowRunner"],
     "DataflowRunner", False),
    (["--runner=DirectRunner", "--runner", "apache_beam.runners.dataflow.DataflowRunner"],
     "DataflowRunner", False),
])
def test_local_paths_only_where_the_workers_are_this_process(args, runner, local):
    """Local paths, local claims and a fresh local secret are accepted only when the SDK
    workers are this machine's processes (transforms.continual.workers_here)."""
    assert engines.runner_of(args) == runner
    assert engines.local_paths(args) is local


def test_the_runner_named_last_is_the_one_checked_and_the_only_one_passed_on():
    assert engines.with_runner(["--runner", "FlinkRunner", "--x=1", "--runner=DataflowRunner"],
                               "DataflowRunner") == ["--x=1", "--runner=DataflowRunner"]


@pytest.mark.slow  # a cluster's two JVMs, then the job: about 45 s
@needs("FlinkRunner")
def test_a_job_on_a_standalone_flink_cluster_equals_the_local_runner(tmp_path):
    """A JobManager and a TaskManager process with 2 slots (`FlinkCluster`): the job is
    submitted to them, parallelism 2, the SDK workers this process (LOOPBACK)."""
    with engines.FlinkCluster(slots=2, folder=str(tmp_path / "cluster")) as cluster:
        local = _run(_config(tmp_path, "mean_seconds.yaml", "local"))
        remote = _run(_config(tmp_path, "mean_seconds.yaml", "flink"), "--runner",
                      "FlinkRunner", f"--flink_master={cluster.master}",
                      "--environment_type=LOOPBACK")
        jobs = cluster.overview()
    assert jobs["jobs-finished"] == 1 and jobs["slots-total"] == 2
    here, there = _published(tmp_path / "local"), _published(tmp_path / "flink")
    assert here["records"] and there == here
    assert json.loads(remote.stdout)["operator_not_private"] == json.loads(
        local.stdout)["operator_not_private"]
