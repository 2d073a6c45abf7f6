"""A kill -9 campaign against both drivers, as subprocesses (`python3 -m pipelines.run` and
`python3 -m pipelines.schedule`) on a small bundled config with an insecure seed.

Each driver is killed with SIGKILL at a random time, or right when one of its commit's files
appears (a checkpoint folder, the ledger, the manifest, a marker's temporary file, the marker,
`_COMMITTED`, a published file; a staging folder, `_SWAPPING`, the set moved beside the
current one, the `current` switch, a temporary link), polled from outside: no hook in the
product code. After every kill the same command runs again to completion, and:
- nothing is stuck: that run exits 0;
- nothing is published twice and nothing damaged is left: the scheduler's published files are
  exactly its committed windows, each (key, step) once, every file byte for byte what an
  uninterrupted run with the same seed publishes (its records encoded); a run's public and
  operator folders are one release, equal to an uninterrupted run's;
- right after a kill of `pipelines.run`, a reader sees one whole release in the public and
  operator folders together (two seeds alternate, so old and new differ);
- deleting the markers of a release is refused (exit 2, one line), not published again.
Disk-full runs (a small tmpfs, root only) end in one line and complete once space is freed.

The full campaign (>= 40 kills per driver) is `-m slow`; a short one (3 kills per driver)
runs in CI.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pipelines import checkpoints, schedule
from pipelines import config as job_config
from tests.pipelines.test_schedule import ROOT, records_of, write_config
from tests.support.storage import tmpfs  # noqa: F401 (a fixture)
from transforms.sinks import encode_records

FORMATS = ["jsonl", "csv"]
HORIZON = 12
SEEDS = (2026, 7)


def _now(hours: int) -> str:
    return f"2026-01-05T{hours:02d}:00:00Z"


def _config(folder, seed=SEEDS[0], output=None):
    folder.mkdir(parents=True, exist_ok=True)
    return write_config(folder, secret={"seed": seed, "insecure": True},
                        output={"path": str(output or folder / "out"), "formats": FORMATS})


def _command(module, config, *args):
    return [sys.executable, "-m", f"pipelines.{module}", "--config", config, *args]


def _complete(command):
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (command, result.stderr[-3000:])
    return result


IMMEDIATE = "!"  # a trigger named "...!" is polled without pause and kills at once


def _kill(command, name, trigger, deadline: float, rng) -> str:
    """Starts `command`, polls `trigger()` (None: kill at `deadline` seconds) and kills the
    process with SIGKILL once it holds (after 0-5 ms more, or at once for an immediate one:
    the instant of a single file operation). -> "killed", or "finished" when it ended first
    (it must then have succeeded)."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    immediate = name.endswith(IMMEDIATE)
    start = time.monotonic()
    while process.poll() is None:
        late = time.monotonic() - start >= deadline
        if late or (trigger is not None and trigger()):
            if not late and not immediate:
                time.sleep(rng.uniform(0, 0.005))
            break
        if not immediate:
            time.sleep(0.0005)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    err = process.communicate(timeout=600)[1]
    if process.returncode == -signal.SIGKILL:
        return "killed"
    assert process.returncode == 0, err[-3000:]
    return "finished"


# Kills at an exact file operation: the unmodified driver runs under an audit hook
# (sys.addaudithook, a test harness like strace; nothing in the product code) that counts the
# driver's file operations under the watched folders and SIGKILLs the process at the n-th.
AT_OPERATION = r'''
import os, runpy, signal, sys
module, watched, target, log = sys.argv[1], sys.argv[2].split(os.pathsep), int(sys.argv[3]), \
    os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
EVENTS = {"open": 0, "os.rename": 1, "os.remove": 0, "os.rmdir": 0, "os.mkdir": 0,
          "os.symlink": 1, "os.link": 1, "shutil.rmtree": 0}  # -> the argument naming the file
WRITE = os.O_WRONLY | os.O_RDWR
count = [0]


def hook(event, args):
    if event not in EVENTS:
        return
    if event == "open" and (isinstance(args[0], int) or not (
            (args[2] or 0) & WRITE or any(c in (args[1] or "") for c in "wax+"))):
        return
    named = args[:1] if event == "open" else args[:2]
    paths = [os.path.abspath(os.fsdecode(a)) for a in named
             if isinstance(a, (str, bytes, os.PathLike))]
    if not any(p.startswith(w) for p in paths for w in watched):
        return
    count[0] += 1
    name = os.path.basename(paths[min(EVENTS[event], len(paths) - 1)])
    os.write(log, f"{count[0]} {event} {name}\n".encode())
    if count[0] == target:
        os.kill(os.getpid(), signal.SIGKILL)


sys.addaudithook(hook)
sys.argv = [module] + sys.argv[5:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
'''


def _at_operation(command, watched, n: int, log):
    """`command` (a driver's) run under the audit hook that kills it at its n-th file operation
    under `watched` (0: never); the operations are logged to `log`."""
    module = command[2]  # [python, "-m", module, args...]
    return [sys.executable, "-c", AT_OPERATION, module, os.pathsep.join(
        os.path.abspath(str(w)) for w in watched), str(n), str(log), *command[3:]]


def _kill_at_operation(command, watched, n, log) -> tuple:
    """-> ("killed" or "finished", the operation it was killed at)."""
    open(log, "w").close()
    result = subprocess.run(_at_operation(command, watched, n, log), cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    lines = open(log).read().splitlines()
    if result.returncode == -signal.SIGKILL:
        return "killed", lines[-1].split(" ", 1)[1]
    assert result.returncode == 0, result.stderr[-3000:]
    return "finished", None


def _at(where) -> str:
    """An outcome's name: the operation a run was killed at, or none (a run that does fewer
    operations than the calibration run, e.g. one with no earlier set to remove, finished)."""
    return "beyond the run's operations" if where is None else \
        f"at {where.split()[0]} of {_kind(where)}"


def _operations(command, watched, log) -> int:
    """How many file operations an uninterrupted run of `command` does under `watched`."""
    assert _kill_at_operation(command, watched, 0, log)[0] == "finished"
    return len(open(log).read().splitlines())


def _listing(folder):
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


# The scheduler.

def _schedule_triggers(state, published_root):
    """name -> a predicate that holds once the run got there (None: a random time)."""
    before = {n for n in _listing(state) if n.startswith("ckpt-")}
    commits = os.path.join(state, checkpoints.COMMITS)
    markers_before = _listing(commits)

    def new_folders():
        return [os.path.join(state, n) for n in _listing(state)
                if n.startswith("ckpt-") and n not in before]

    def in_new_folder(test):
        return lambda: any(test(_listing(f)) for f in new_folders())

    def published(test):
        return lambda: any(test(_listing(os.path.join(published_root, r)))
                           for r in _listing(published_root))

    return {
        "at a random time": None,
        "checkpoint folder created": lambda: bool(new_folders()),
        "states written": in_new_folder(lambda names: any(n.startswith("units-")
                                                          for n in names)),
        "ledger written": in_new_folder(lambda names: checkpoints.LEDGER in names),
        "manifest written": in_new_folder(lambda names: checkpoints.MANIFEST in names),
        "marker being created": lambda: any(n.startswith(".tmp-") for n in _listing(commits)),
        "marker created" + IMMEDIATE: lambda: bool(
            {n for n in _listing(commits) if n.startswith("from-")} - markers_before),
        "_COMMITTED written": in_new_folder(lambda names: checkpoints.COMMITTED in names),
        "publishing": published(lambda names: any(n.startswith(".tmp-") for n in names)),
    }


def _check_schedule(job, state, hours, reference):
    """The state and the publication after a run to `hours` completed."""
    chain = checkpoints.marker_chain(state)
    assert chain and chain[-1]["end"] == min(hours, HORIZON)
    for link in chain:
        assert os.path.exists(os.path.join(link["folder"], checkpoints.COMMITTED))
    [release] = os.listdir(schedule.published_root(job))
    folder = schedule.published_folder(job, release)
    names = sorted(os.listdir(folder))
    expected = {}
    for link in chain:
        rows = [r for r in reference if link["start"] <= r["step"] < link["end"]]
        for fmt in FORMATS:
            expected[f"records-steps-{link['start']}-{link['end']}-00000-of-00001.{fmt}"] = \
                encode_records(rows, fmt)
    # the release manifest, as pipelines.run writes it, from the last commit's ledger
    ledger = json.load(open(os.path.join(chain[-1]["folder"], checkpoints.LEDGER)))
    expected["release.json"] = json.dumps(ledger["release_manifest"], indent=2, sort_keys=True,
                                          default=str).encode("utf-8")
    assert names == sorted(expected), names  # the committed windows and manifest, no temps
    for name in names:  # nothing damaged or published under two windows
        assert open(os.path.join(folder, name), "rb").read() == expected[name], name
    published = records_of([os.path.join(folder, "*.jsonl")])
    steps = collections.Counter((r["key"], r["step"]) for r in published)
    assert set(steps.values()) == {1}
    assert published == [r for r in reference if r["step"] < min(hours, HORIZON)]


def _markers_lost_are_refused(config, state, job):
    """Deleting a release's markers: refused in one line, nothing published again."""
    before = {p: open(p, "rb").read() for p in glob.glob(
        os.path.join(schedule.published_root(job), "*", "*"))}
    commits = os.path.join(state, checkpoints.COMMITS)
    shutil.move(commits, commits + ".saved")
    result = subprocess.run(_command("schedule", config, "--state-dir", state, "--now",
                                     _now(HORIZON)), cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "must be holding the markers of all the job committed" in result.stderr
    assert {p: open(p, "rb").read() for p in glob.glob(
        os.path.join(schedule.published_root(job), "*", "*"))} == before
    shutil.move(commits + ".saved", commits)


def _reference(base, seed):
    """An uninterrupted `pipelines.run` with the seed: its public records and release id."""
    config = _config(base / f"reference-{seed}", seed)
    _complete(_command("run", config))
    job = job_config.load(config)
    public = job.public_path
    return {"rows": records_of([os.path.join(public, "records-*.jsonl")]),
            "csv": sorted(open(glob.glob(os.path.join(public, "records-*.csv"))[0]).read()
                          .splitlines()),
            "release_id": json.load(open(os.path.join(public, "release.json")))["release_id"]}


def schedule_campaign(base, kills: int, at_operations: int, rng,
                      seconds: float) -> collections.Counter:
    """`kills` kills timed from outside (polled files, random times) and `at_operations`
    kills at an exact file operation, each followed by a run to completion and the checks."""
    reference = _reference(base, SEEDS[0])["rows"]
    outcomes, killed, episode = collections.Counter(), collections.Counter(), 0
    log = base / "operations.log"
    operations = None
    while killed["timed"] < kills or killed["at an operation"] < at_operations:
        folder = base / f"schedule-{episode}"
        config = _config(folder)
        job = job_config.load(config)
        state = str(folder / "state")
        watched = [state, job.output.path]
        hours = sorted(rng.sample(range(1, HORIZON), 3)) + [HORIZON]
        for hour in hours:
            command = _command("schedule", config, "--state-dir", state, "--now", _now(hour))
            if operations is None:  # calibrated on a first run of a scratch state directory
                scratch = base / "calibration"
                operations = _operations(_command(
                    "schedule", _config(scratch), "--state-dir", str(scratch / "state"),
                    "--now", _now(HORIZON)), [scratch], log)
            if killed["at an operation"] < at_operations and (
                    killed["timed"] >= kills or rng.random() < 0.5):
                outcome, where = _kill_at_operation(command, watched, rng.randint(
                    1, operations), log)
                outcomes[(_at(where), outcome)] += 1
                killed["at an operation"] += outcome == "killed"
            else:
                triggers = _schedule_triggers(state, schedule.published_root(job))
                name = rng.choice(sorted(triggers))
                outcome = _kill(command, name, triggers[name], rng.uniform(0.05, seconds), rng)
                outcomes[(name, outcome)] += 1
                killed["timed"] += outcome == "killed"
            _complete(command)  # never stuck
            _check_schedule(job, state, hour, reference)
        _markers_lost_are_refused(config, state, job)
        episode += 1
    return outcomes


def _kind(where) -> str:
    """An operation's file, its run-specific parts (ids, shards) dropped: "ledger.json"."""
    name = where.split(" ", 1)[1] if where and " " in where else str(where)
    if name.startswith(".tmp-"):
        return "a temporary file"
    for prefix in ("ckpt-", ".staging-", "records-steps-", "records-", "units-", "keys-",
                   "dead_letters-", "from-", "beam-temp-"):
        if name.startswith(prefix):
            return prefix + "*"
    if len(name) == 8 and all(c in "0123456789abcdef" for c in name):
        return "a set (.sets-<job>-operator/<id>)"
    return name if len(name) < 24 else "a Beam temporary file"


# pipelines.run

def _run_triggers(job):
    out = job.output.path
    sets = os.path.join(out, f".sets-{job.job}-operator")
    prefix = f".staging-{job.job}-"
    before = {n for n in _listing(out) if n.startswith(prefix)}
    sets_before = _listing(sets)
    try:
        current = os.readlink(os.path.join(sets, "current"))
    except OSError:
        current = None

    def staging():
        return [os.path.join(out, n) for n in _listing(out)
                if n.startswith(prefix) and n not in before]

    def current_now():
        try:
            return os.readlink(os.path.join(sets, "current"))
        except OSError:
            return None

    def folder(path):
        try:
            return os.stat(path).st_ino
        except OSError:
            return None
    operator = folder(job.operator_path)

    return {
        "at a random time": None,
        "staging folder created": lambda: bool(staging()),
        "records staged": lambda: any(
            any(n.startswith("records-") for n in _listing(os.path.join(s, "public")))
            for s in staging()),
        "commit started": lambda: any(
            "release.json" in _listing(os.path.join(s, "public")) for s in staging()),
        "_SWAPPING written": lambda: any("_SWAPPING" in _listing(s) for s in staging()),
        "set moved beside the current one": lambda: bool(
            {n for n in _listing(sets) if not n.startswith(".tmp-")} - sets_before - {current}),
        "temporary link": lambda: any(n.startswith(".tmp-") for n in _listing(sets)),
        "current switched": lambda: current_now() != current,
        "operator folder switched" + IMMEDIATE: lambda: folder(job.operator_path) != operator,
    }


def _visible(job):
    """The release a reader sees in the public folder (release.json, records) and the operator
    folder (summary.json); all None when there is none yet."""
    def read(path, field):
        try:
            return json.load(open(path))[field]
        except FileNotFoundError:
            return None
    public = job.public_path
    records = glob.glob(os.path.join(public, "records-*.jsonl"))
    ids = {r["release_id"] for r in records_of(records)} if records else {None}
    assert len(ids) == 1, ids  # never two releases mixed in one folder
    return (read(os.path.join(public, "release.json"), "release_id"), ids.pop(),
            read(os.path.join(job.operator_path, "summary.json"), "release_id"))


def _check_run(job, reference):
    public = job.public_path
    assert _visible(job) == (reference["release_id"],) * 3
    assert records_of([os.path.join(public, "records-*.jsonl")]) == reference["rows"]
    assert sorted(open(glob.glob(os.path.join(public, "records-*.csv"))[0]).read()
                  .splitlines()) == reference["csv"]
    out = job.output.path
    assert not [n for n in os.listdir(out) if n.startswith((".staging-", ".tmp-"))]
    sets = os.path.join(out, f".sets-{job.job}-operator")
    if os.path.isdir(sets):  # (the campaign also runs against other designs of the switch)
        assert sorted(os.listdir(sets)) == sorted(["current", os.readlink(
            os.path.join(sets, "current"))])  # the previous sets are gone
    for folder in (public, job.operator_path):
        assert not [n for n in os.listdir(folder) if n.startswith(".tmp-")]


def run_campaign(base, kills: int, at_operations: int, rng,
                 seconds: float) -> collections.Counter:
    references = {seed: _reference(base, seed) for seed in SEEDS}
    out = base / "run" / "out"
    # one config file, edited between runs (a batch run refuses to replace the output of
    # another config file that kept the job's name)
    configs = {seed: open(_config(base / "run" / str(seed), seed, out)).read()
               for seed in SEEDS}
    edited = base / "run" / "job.yaml"
    edited.write_text(configs[SEEDS[0]])
    job = job_config.load(str(edited))
    outcomes, killed, turn = collections.Counter(), collections.Counter(), 0
    log = base / "operations.log"
    scratch = base / "calibration"
    operations = _operations(_command("run", _config(scratch)), [scratch], log)
    while killed["timed"] < kills or killed["at an operation"] < at_operations:
        seed = SEEDS[turn % 2]  # alternating: the previous release differs from the new one
        turn += 1
        edited.write_text(configs[seed])
        command = _command("run", str(edited))
        if killed["at an operation"] < at_operations and (
                killed["timed"] >= kills or rng.random() < 0.5):
            outcome, where = _kill_at_operation(command, [out], rng.randint(1, operations), log)
            outcomes[(_at(where), outcome)] += 1
            killed["at an operation"] += outcome == "killed"
        else:
            triggers = _run_triggers(job)
            name = rng.choice(sorted(triggers))
            outcome = _kill(command, name, triggers[name], rng.uniform(0.05, seconds), rng)
            outcomes[(name, outcome)] += 1
            killed["timed"] += outcome == "killed"
        visible = _visible(job)  # right after the kill: one whole release, or none yet
        assert visible in ((None,) * 3,) + tuple((r["release_id"],) * 3
                                                 for r in references.values()), visible
        _complete(command)
        _check_run(job, references[seed])
    return outcomes


def _report(name, outcomes):
    kills = sum(n for (_, outcome), n in outcomes.items() if outcome == "killed")
    lines = [f"{name}: {kills} kills, {sum(outcomes.values()) - kills} runs finished first; "
             f"every one then completed by the next run and checked"]
    for (where, outcome), n in sorted(outcomes.items()):
        lines.append(f"  {where:44s} {outcome:9s} {n}")
    print("\n".join(lines))



def _seconds(base, rng):
    """How long an uninterrupted run of each driver takes here (the random kills spread over
    it)."""
    config = _config(base / "timing")
    start = time.monotonic()
    _complete(_command("run", config))
    run = time.monotonic() - start
    start = time.monotonic()
    _complete(_command("schedule", config, "--state-dir", str(base / "timing" / "state"),
                       "--now", _now(HORIZON)))
    return run, time.monotonic() - start


def _campaign(tmp_path, kills, at_operations):
    """CAMPAIGN_SEED, CAMPAIGN_KILLS, CAMPAIGN_AT_OPERATIONS and CAMPAIGN_DRIVERS
    ("schedule,run") vary it."""
    rng = random.Random(int(os.environ.get("CAMPAIGN_SEED", "20260105")))
    drivers = os.environ.get("CAMPAIGN_DRIVERS", "schedule,run").split(",")
    run_seconds, schedule_seconds = _seconds(tmp_path, rng)
    if "schedule" in drivers:
        outcomes = schedule_campaign(tmp_path / "s", kills, at_operations, rng,
                                     schedule_seconds)
        _report("pipelines.schedule", outcomes)
        assert sum(n for (_, o), n in outcomes.items() if o == "killed") >= kills + at_operations
    if "run" in drivers:
        outcomes = run_campaign(tmp_path / "r", kills, at_operations, rng, run_seconds)
        _report("pipelines.run", outcomes)
        assert sum(n for (_, o), n in outcomes.items() if o == "killed") >= kills + at_operations


@pytest.mark.slow  # about 55 s: headroom under CI's 10 minutes (the fresh-clone run took 9:11)
def test_a_short_kill_campaign(tmp_path):
    """Three kills per driver: two timed from outside, one at a file operation."""
    _campaign(tmp_path, kills=2, at_operations=1)


@pytest.mark.slow
def test_the_kill_campaign(tmp_path):
    """>= 40 kills per driver timed from outside, and as many at exact file operations."""
    _campaign(tmp_path, kills=int(os.environ.get("CAMPAIGN_KILLS", "40")),
              at_operations=int(os.environ.get("CAMPAIGN_AT_OPERATIONS", "40")))


def _disk_full(tmp_path, tmpfs, sizes):  # noqa: F811 (the fixture)
    """Each driver on a tmpfs of each size: it succeeds, or ends in one line (ENOSPC) and
    the next run, with space freed, completes to what an uninterrupted run publishes."""
    reference = _reference(tmp_path, SEEDS[0])
    outcomes = collections.Counter()
    for size in sizes:
        disk = tmpfs.mount(f"disk-{size}", size)
        config = _config(tmp_path / f"config-{size}", output=disk / "out")
        job = job_config.load(config)
        state = str(disk / "state")
        for module, args in (("schedule", ["--state-dir", state, "--now", _now(HORIZON)]),
                             ("run", [])):
            result = subprocess.run(_command(module, config, *args), cwd=ROOT,
                                    capture_output=True, text=True, timeout=600)
            if result.returncode == 0:
                outcomes[(module, "fit")] += 1
                continue
            assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
            assert "(ENOSPC)" in result.stderr and str(disk) in result.stderr, result.stderr
            outcomes[(module, "disk full")] += 1
        tmpfs.remount(disk, "size=16m")
        _complete(_command("schedule", config, "--state-dir", state, "--now", _now(HORIZON)))
        _check_schedule(job, state, HORIZON, reference["rows"])
        _complete(_command("run", config))
        _check_run(job, reference)
    return outcomes


def test_a_disk_full_run(tmp_path, tmpfs):  # noqa: F811 (the fixture)
    outcomes = _disk_full(tmp_path, tmpfs, ["96k"])
    assert outcomes[("schedule", "disk full")] == 1


@pytest.mark.slow
def test_disk_full_at_every_size(tmp_path, tmpfs):  # noqa: F811 (the fixture)
    """From too small to hold anything to large enough for both drivers (about 800 KiB): the
    disk fills at every stage (the checkpoint, its commit, the publication, the run's output
    set and its switch)."""
    outcomes = _disk_full(tmp_path, tmpfs, [f"{k}k" for k in range(16, 1200, 48)])
    print(dict(outcomes))
    assert outcomes[("schedule", "disk full")] >= 5 and outcomes[("run", "disk full")] >= 5
    assert outcomes[("schedule", "fit")] >= 1 and outcomes[("run", "fit")] >= 1
