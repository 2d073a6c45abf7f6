"""kill -9 against the live streaming job: a release killed at any point and continued with
`--continue` publishes every step once, loses no event and counts none twice (not run in CI;
needs gcloud's pubsub emulator, and Linux: the kills are fired by inotify).

    python3 benchmarks/streaming_kills.py [--trials 65] [--seed 777] [--json PATH] [--keep]
                                          [--mechanism sqrt_toeplitz]

About 35 s a trial on a 2-core machine (the default 65 trials: about 40 minutes). The script
starts the Pub/Sub emulator itself. Each trial runs in a fresh temporary folder (removed at the
end unless `--keep`), on a fresh topic and subscription: the job of
configs/streaming/active_users.yaml (8 steps of 2 s, allowed lateness 0.5 s, keys eu/us/apac)
is launched with `pipelines.run` and killed (SIGKILL to its process group) the moment a chosen
file appears (inotify IN_CREATE): a file of a step's commit (`step-N.claim`, `keys-at-N.json`,
`steps/step-N.jsonl|csv|json`) or the k-th receipt record; or else at a random time.
`--continue` then runs until every step is published. Some continuations are killed too (at
their claim `from-F.json`, a receipt, a file of their first commit, a random time), and some
start late (steps already due) or after the horizon. One event is published every 0.1 s through
the horizon, also while the job is down. Trial 0 is a positive control: one event of step 0 is
published 7 s late, so the job must dead-letter it and the comparison must see it.

Per trial:
- stuck: two continuations after the last kill still left a step unpublished (a launch
  killed before it claimed its release is launched again, without `--continue`, as the
  refusal of `--continue` says);
- tracebacks: on any run's stderr;
- steps ok: each step's three files, one record per key, the manifest's SHA-256 equal to the
  files, no other file;
- records == batch: the records equal, bit for bit, a batch run over exactly the events sent
  (same secret, so same noise);
- late dead letters;
- events lost: counted neither in the records nor as a dead letter, per key and step (batch
  step value - live step value - dead-lettered);
- counted twice.

Prints a line per trial, then the totals as a markdown table; `--json PATH` writes each trial's
results as a JSON line. Exits 1 when a release was stuck, a run printed a traceback, an event
was lost or counted twice, or the records differ from batch in a trial other than the control.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import fnmatch
import glob
import hashlib
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import yaml  # noqa: E402

from pipelines.emulator import Heartbeats, PubSubEmulator, available  # noqa: E402

SIZE, HORIZON, LATENESS = 2.0, 8, 0.5
LEAD = 7  # seconds from a trial's start to its step 0
EVERY = 0.1  # seconds between two events
HEARTBEAT = 0.3
POLL = 0.004
RUN_TIMEOUT = 150  # seconds a continuation may run
NOTHING_STARTED = "`--continue` must be used where a release of job"
STUCK_AFTER = 2  # continuations after the last kill that still leave a step missing: stuck
CONTROL_LATE = 9.0  # the control's event of step 0 is published at origin + 9 s (7 s late)
KEYS = ["eu", "us", "apac"]
FIELDS = {"timestamp": "t", "unit": "user", "key": "region"}
JOB = "active-users-live"
OPERATOR = JOB + "-operator"
CHECKPOINT = OPERATOR + "/checkpoint"
RECEIPTS = CHECKPOINT + "/received/*/received-*.jsonl"
SUFFIXES = (".json", ".jsonl", ".csv")
USER = re.compile(r"u\d+-\d+")
KEY_LEVEL = re.compile(r"^\('(\w+)', (\d+), ([0-9.eE+-]+)\)$")
IN_CREATE, IN_MOVED_TO, IN_CLOEXEC = 0x100, 0x80, 0o2000000
KINDS = ("commit file", "continuation claim", "receipt", "random")

# kill targets: ("glob", pattern under the output folder, count): once `count` files match;
# ("new", pattern, count): once `count` files match that did not when the run started;
# ("time", seconds): that long after the run started


def claim_file(step: int) -> tuple:
    return ("glob", f"{CHECKPOINT}/step-{step:08d}.claim", 1)


def keys_file(step: int) -> tuple:
    return ("glob", f"{CHECKPOINT}/keys-at-{step:08d}.json", 1)


def step_file(step: int, suffix: str) -> tuple:
    return ("glob", f"{JOB}/steps/step-{step:08d}.{suffix}", 1)


def receipts(count: int) -> tuple:
    return ("glob", RECEIPTS, count)


CONT_CLAIM = ("new", CHECKPOINT + "/from-*.json", 1)
CONT_RECEIPTS = ("new", RECEIPTS, 3)
CONT_STEP_CLAIM = ("new", CHECKPOINT + "/step-*.claim", 1)
CONT_KEYS = ("new", CHECKPOINT + "/keys-at-*.json", 1)
CONT_JSONL = ("new", JOB + "/steps/step-*.jsonl", 1)


def kill_kind(target: tuple) -> str:
    if target[0] == "time":
        return "random"
    if "received-" in target[1]:
        return "receipt"
    if "/from-" in target[1]:
        return "continuation claim"
    return "commit file"


def describe(target: tuple) -> str:
    if target[0] == "time":
        return f"random +{target[1]:.1f}s"
    name = os.path.basename(target[1])
    if "received-" in name:
        return f"receipt #{target[2]}" if target[0] == "glob" else f"{target[2]} new receipts"
    return name if target[0] == "glob" else "its " + name.replace("*", "N")


class Inotify:
    """Kernel file-creation events in the folders that match a pattern (a kill within about
    1 ms of the link that creates a file, where a 4 ms poll lands one or more files later).
    Linux only."""

    def __init__(self):
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.watched = {}

    def watch(self, folders: str) -> None:
        for folder in glob.glob(folders):
            if folder not in self.watched.values() and os.path.isdir(folder):
                wd = self.libc.inotify_add_watch(self.fd, folder.encode(),
                                                 IN_CREATE | IN_MOVED_TO)
                if wd >= 0:
                    self.watched[wd] = folder

    def wait(self, timeout: float) -> list:
        """The paths created since the last call (waits up to `timeout` for one)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        paths, i = [], 0
        while i + 16 <= len(data):
            wd, _, _, length = struct.unpack_from("iIII", data, i)
            name = data[i + 16:i + 16 + length].rstrip(b"\0").decode()
            i += 16 + length
            if wd in self.watched:
                paths.append(os.path.join(self.watched[wd], name))
        return paths

    def close(self) -> None:
        os.close(self.fd)


class Trigger:
    """When to kill a run: `fired()` once its target holds; `wait` returns early when a file
    is created in the target's folders."""

    def __init__(self, live: str, target):
        self.target, self.inotify = target, None
        if target is None:
            return
        if target[0] == "time":
            self.at = time.time() + target[1]
            return
        self.pattern, self.count = os.path.join(live, target[1]), target[2]
        self.before = set(glob.glob(self.pattern)) if target[0] == "new" else set()
        self.inotify = Inotify()

    def fired(self) -> bool:
        if self.target is None:
            return False
        if self.target[0] == "time":
            return time.time() >= self.at
        return len(set(glob.glob(self.pattern)) - self.before) >= self.count

    def wait(self, seconds: float) -> None:
        if self.inotify is None:
            time.sleep(seconds)
            return
        self.inotify.watch(os.path.dirname(self.pattern))
        for path in self.inotify.wait(seconds):
            if fnmatch.fnmatch(path, self.pattern):
                return

    def close(self) -> None:
        if self.inotify is not None:
            self.inotify.close()


MECHANISM = [None]  # --mechanism (None: the config's own)


def write_config(folder: str, name: str, origin: float, source: dict) -> str:
    path = os.path.join(ROOT, "configs", "streaming", "active_users.yaml")
    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    raw["input"] = source
    raw["steps"] = {"origin": origin, "size_seconds": SIZE, "horizon": HORIZON}
    if source.get("kind") == "pubsub":
        raw["steps"]["allowed_lateness_seconds"] = LATENESS
    raw["public_keys"] = KEYS
    raw["bounds"] = {"max_contributions": 4, "max_contributions_per_step": 2,
                     "max_keys_per_unit": 1}
    raw["secret"] = {"seed": 11, "insecure": True}
    raw["output"] = {"path": os.path.join(folder, name), "formats": ["jsonl", "csv"]}
    if MECHANISM[0] is not None:  # --mechanism: under rho = 0.5
        raw["privacy"], raw["mechanism"] = {"rho": 0.5}, {"name": MECHANISM[0]}
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(raw, handle)
    return path


def read_lines(path: str) -> list:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def listing(folder: str) -> list:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


class Trial:
    """One release on a fresh topic: launched, killed, continued until every step is out,
    with events published every EVERY seconds through the horizon."""

    def __init__(self, emulator, index: int, plan: dict, folder: str):
        self.emulator, self.index, self.plan, self.folder = emulator, index, plan, folder
        self.topic = f"kills-{index}-{int(time.time())}"
        subscription = emulator.subscription(self.topic, f"job-{self.topic}")
        self.origin = float(int(time.time()) + LEAD)
        self.config = write_config(folder, "live", self.origin, {
            "kind": "pubsub", "subscription": subscription, "timestamp_attribute": "ms",
            "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS})
        self.live = os.path.join(folder, "live")
        self.public = os.path.join(self.live, JOB)
        self.operator = os.path.join(self.live, OPERATOR)
        self.checkpoint = os.path.join(self.live, CHECKPOINT)
        self.launch = [sys.executable, "-m", "pipelines.run", "--config", self.config]
        self.sent, self.futures, self.kills, self.runs = [], [], [], []
        self.next_send, self.events, self.injected = 0.0, 0, False

    def rel(self, moment: float) -> float:
        return round(moment - self.origin, 3)

    def publish(self, row: dict, step: int, now: float, **extra) -> None:
        self.futures.append(self.emulator.publish(self.topic, row, ms=int(row["t"] * 1000)))
        self.sent.append(dict(row, step=step, sent_at=now, **extra))

    def tick(self) -> None:
        """Publishes the events that are due (one every EVERY seconds of the horizon, and the
        control's late one)."""
        now = time.time()
        if now < self.next_send:
            return
        self.next_send = now + EVERY
        late_at = self.plan.get("inject_late")
        if late_at is not None and not self.injected and now >= self.origin + late_at:
            self.injected = True
            row = {"user": f"u{self.index}-99999", "region": "eu", "t": self.origin + 0.5}
            self.publish(row, 0, now, control_late=True)
        step = int((now - self.origin) // SIZE) if now >= self.origin else -1
        if 0 <= step < HORIZON:
            i = self.events
            row = {"user": f"u{self.index}-{i}", "region": KEYS[i % len(KEYS)], "t": now}
            self.publish(row, step, now)
            self.events += 1

    def pause_until(self, moment: float) -> None:
        while time.time() < moment:
            self.tick()
            time.sleep(POLL)

    def snapshot(self) -> dict:
        """What exists right after a kill."""
        names = listing(self.checkpoint)
        return {"checkpointed": [int(n[8:16]) for n in names if n.startswith("keys-at-")],
                "claims": [n for n in names if n.endswith(".claim") or n.startswith("from-")],
                "step_files": [n for n in listing(os.path.join(self.public, "steps"))
                               if not n.startswith(".")],
                "receipt_files": len(glob.glob(os.path.join(self.live, RECEIPTS)))}

    def complete(self) -> bool:
        steps = os.path.join(self.public, "steps")
        return all(os.path.exists(os.path.join(steps, f"step-{s:08d}.json"))
                   for s in range(HORIZON))

    def drive(self, args: list, target, timeout: float) -> dict:
        """Runs `args` until it exits, its target fires (SIGKILL to its process group) or
        `timeout` seconds pass, publishing meanwhile."""
        n = len(self.runs)
        run = {"run": n, "args": args[5:], "killed": None, "timeout": False,
               "err": os.path.join(self.folder, f"run{n}.err")}
        trigger = Trigger(self.live, target)
        with open(os.path.join(self.folder, f"run{n}.out"), "w") as out, \
                open(run["err"], "w") as err:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=err,
                                    start_new_session=True)
        run["started_rel"], deadline = self.rel(time.time()), time.time() + timeout
        try:
            while proc.poll() is None:
                self.tick()
                trigger.wait(POLL)
                if trigger.fired():
                    self.kill(proc, run, target)
                elif time.time() > deadline:
                    run["timeout"] = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            trigger.close()
        run["rc"], run["ended_rel"] = proc.returncode, self.rel(time.time())
        self.runs.append(run)
        return run

    def kill(self, proc, run: dict, target: tuple) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        now = time.time()
        run["killed"] = {"run": run["run"], "target": describe(target),
                         "kind": kill_kind(target), "at_rel": self.rel(now),
                         **self.snapshot()}
        self.kills.append(run["killed"])

    def run(self) -> bool:
        """Launch, then continuations until every step is published; True when stuck."""
        with Heartbeats(self.emulator, self.topic, every=HEARTBEAT):
            self.drive(self.launch, self.plan["launch"],
                       self.origin + SIZE * HORIZON + 60 - time.time())
            stuck = self.continue_until_complete()
        for future in self.futures:
            future.result(timeout=30)  # a failed publish raises, rather than "losing" it
        return stuck

    def continue_until_complete(self) -> bool:
        pending, uninterrupted, first = list(self.plan["continuations"]), 0, True
        while not self.complete():
            if uninterrupted >= STUCK_AFTER:
                return True
            if first and self.plan.get("cont_delay"):  # a late continuation: steps are due
                self.pause_until(time.time() + self.plan["cont_delay"])
            if first and self.plan.get("cont_at") is not None:  # after the horizon
                self.pause_until(self.origin + self.plan["cont_at"])
            first = False
            target = pending.pop(0) if pending else None
            # as the refusal says: a launch killed before it claimed its release started none,
            # so the operator launches it again rather than continue it
            again = self.runs and NOTHING_STARTED in open(self.runs[-1]["err"]).read()
            run = self.drive(self.launch + ([] if again else ["--continue"]), target,
                             RUN_TIMEOUT)
            uninterrupted = 0 if run["killed"] else uninterrupted + 1
        return False


# ---- checks ------------------------------------------------------------------------------


def tracebacks(trial: Trial) -> tuple:
    """([{run, the traceback's last lines}], [{run, rc, `error` lines}]) of every run."""
    found, errors = [], []
    for run in trial.runs:
        with open(run["err"], encoding="utf-8", errors="replace") as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
        if any("Traceback" in line for line in lines):
            found.append({"run": run["run"], "lines": lines[-15:]})
        error = [line for line in lines if line.startswith("error")]
        if error:
            errors.append({"run": run["run"], "rc": run["rc"], "lines": error[-3:]})
    return found, errors


def check_steps(trial: Trial) -> tuple:
    """(problems, {(step, key): the published record}) of the steps folder."""
    folder = os.path.join(trial.public, "steps")
    expected = {f"step-{s:08d}{suffix}" for s in range(HORIZON) for suffix in SUFFIXES}
    extra = sorted(set(listing(folder)) - expected)
    problems = [f"unexpected files in steps/: {extra[:6]}"] if extra else []
    published = {}
    for s in range(HORIZON):
        base = os.path.join(folder, f"step-{s:08d}")
        if not all(os.path.exists(base + suffix) for suffix in SUFFIXES):
            problems.append(f"step {s}: missing files")
            continue
        rows = read_lines(base + ".jsonl")
        if sorted(r["key"] for r in rows) != sorted(KEYS) or any(r["step"] != s for r in rows):
            problems.append(f"step {s}: records {[(r['step'], r['key']) for r in rows]}")
        with open(base + ".json", encoding="utf-8") as handle:
            manifest = json.load(handle)
        if manifest["records"] != len(KEYS):
            problems.append(f"step {s}: manifest records {manifest['records']}")
        for fmt, facts in manifest["files"].items():
            with open(os.path.join(folder, facts["name"]), "rb") as handle:
                if hashlib.sha256(handle.read()).hexdigest() != facts["sha256"]:
                    problems.append(f"step {s}: {fmt} SHA-256 mismatch")
        published.update({(s, r["key"]): r for r in rows})
    return problems, published


def dead_letters(trial: Trial) -> dict:
    """The dead letters: by code, the events they stand for per (step, key) (matched by user,
    or by the (key, step, value) form of a key-level late letter), the late events among
    them, the users dead-lettered twice and the letters matched to no event."""
    by_user = {row["user"]: row for row in trial.sent}
    letters = [letter for path in glob.glob(os.path.join(trial.operator, "dead_letters-*.jsonl"))
               for letter in read_lines(path)]
    per_step_key, users = collections.Counter(), collections.Counter()
    late, unmatched = 0, []
    for letter in letters:
        record, events = letter.get("record", ""), 0
        user = USER.search(record)
        key_level = KEY_LEVEL.match(record)
        if user and user.group(0) in by_user:
            row, events = by_user[user.group(0)], 1
            per_step_key[(row["step"], row["region"])] += 1
            users[user.group(0)] += 1
        elif key_level:
            events = float(key_level.group(3))
            per_step_key[(int(key_level.group(2)), key_level.group(1))] += events
        else:
            unmatched.append(letter)
        late += events if letter.get("code") == "late" else 0
    return {"codes": dict(collections.Counter(letter.get("code") for letter in letters)),
            "per_step_key": per_step_key, "late_events": late, "unmatched": unmatched[:5],
            "users_twice": [user for user, count in users.items() if count > 1][:10]}


def batch_records(trial: Trial) -> tuple:
    """({(step, key): record} of a batch run over exactly the events sent, None) or
    (None, the end of its stderr)."""
    data = os.path.join(trial.folder, "events.jsonl")
    with open(data, "w", encoding="utf-8") as handle:
        for row in trial.sent:
            handle.write(json.dumps({k: row[k] for k in ("user", "region", "t")}) + "\n")
    config = write_config(trial.folder, "batch", trial.origin, {
        "path": data, "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS,
        "max_dead_letter_fraction": 1.0})
    done = subprocess.run([sys.executable, "-m", "pipelines.run", "--config", config], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return None, done.stderr[-2000:]
    records = [record for path in glob.glob(os.path.join(trial.folder, "batch", JOB,
                                                         "records-*.jsonl"))
               for record in read_lines(path)]
    return {(r["step"], r["key"]): r for r in records}, None


def accounting(trial: Trial, published: dict, batch: dict, dead: dict) -> dict:
    """Records against batch, and per (step, key) the events counted neither in the records
    nor as a dead letter (same noise: batch step value - live step value = events not
    counted)."""
    sent = collections.Counter((row["step"], row["region"]) for row in trial.sent)
    exact, differ, lost = 0, [], {}
    for s in range(HORIZON):
        for key in KEYS:
            expected, got = batch.get((s, key)), published.get((s, key))
            if expected is None or got is None:
                differ.append(f"{s}/{key}")
                continue
            if expected == got:
                exact += 1
            else:
                differ.append(f"{s}/{key}")
            missing = expected["step_value"] - got["step_value"]
            gone = round(missing - dead["per_step_key"].get((s, key), 0), 6)
            if abs(gone) > 1e-6:
                lost[f"{s}/{key}"] = {"sent": sent.get((s, key), 0), "not_counted": missing,
                                      "dead": dead["per_step_key"].get((s, key), 0),
                                      "lost": gone}
    return {"records_equal_batch": exact == len(KEYS) * HORIZON and not differ,
            "differ": differ, "lost_by_step_key": lost,
            "events_lost": sum(v["lost"] for v in lost.values() if v["lost"] > 0),
            "counted_twice": -sum(v["lost"] for v in lost.values() if v["lost"] < 0)}


def check(trial: Trial, stuck: bool) -> dict:
    last_kill = max((run["run"] for run in trial.runs if run["killed"]), default=0)
    found, errors = tracebacks(trial)
    problems, published = check_steps(trial)
    dead = dead_letters(trial)
    result = {"trial": trial.index, "kind": trial.plan["kind"], "plan": trial.plan,
              "origin": trial.origin, "sent": len(trial.sent), "stuck": stuck,
              "kills": trial.kills, "continuations": len(trial.runs) - 1,
              "continuations_after_last_kill": len(trial.runs) - 1 - last_kill,
              "runs": [{k: v for k, v in run.items() if k != "err"} for run in trial.runs],
              "tracebacks": found, "error_lines": errors,
              "steps_ok": not problems and not stuck, "step_problems": problems,
              "dead_letters": dead["codes"], "late_dead_letters": dead["codes"].get("late", 0),
              "late_events": dead["late_events"], "dead_unmatched": dead["unmatched"],
              "users_dead_lettered_twice": dead["users_twice"],
              "stray_temps": [os.path.relpath(path, trial.live) for path in glob.glob(
                  os.path.join(trial.live, "**", ".tmp-*"), recursive=True)][:5],
              "records_equal_batch": None, "events_lost": None, "counted_twice": None}
    batch, why = batch_records(trial)
    if batch is None:
        result["batch_error"] = why
        return result
    result.update(accounting(trial, published, batch, dead))
    return result


# ---- the trials --------------------------------------------------------------------------


def make_plan(kind: str, launch: tuple, continuations=(), **extra) -> dict:
    return dict(kind=kind, launch=launch, continuations=list(continuations), **extra)


def common_plans(rng: random.Random) -> list:
    """27 trials: kills at each file of a step's commit, at receipts, at random times."""
    def step():
        return rng.randrange(HORIZON - 1)

    def at_random():  # from the launch: -6 s to +17 s around step 0
        return ("time", round(rng.uniform(1.0, LEAD + SIZE * HORIZON + 1), 2))

    def cont_random():
        return ("time", round(rng.uniform(2, 10), 2))

    return [make_plan("claim", claim_file(0)),
            make_plan("claim", claim_file(step()), [CONT_CLAIM]),
            make_plan("claim", claim_file(step()), [CONT_KEYS]),
            make_plan("claim", claim_file(step())),
            make_plan("keys", keys_file(step())),
            make_plan("keys", keys_file(step()), [CONT_CLAIM, CONT_CLAIM]),
            make_plan("keys", keys_file(step()), [CONT_RECEIPTS]),
            make_plan("keys", keys_file(step())),
            make_plan("jsonl", step_file(step(), "jsonl")),
            make_plan("jsonl", step_file(step(), "jsonl"), [CONT_STEP_CLAIM]),
            make_plan("jsonl", step_file(step(), "jsonl")),
            make_plan("csv", step_file(step(), "csv")),
            make_plan("csv", step_file(step(), "csv"), [CONT_CLAIM]),
            make_plan("csv", step_file(step(), "csv")),
            make_plan("json", step_file(step(), "json")),
            make_plan("json", step_file(step(), "json"), [CONT_JSONL]),
            make_plan("json", step_file(step(), "json")),
            make_plan("receipt", receipts(rng.randrange(1, 8))),
            make_plan("receipt", receipts(rng.randrange(10, 40)), [CONT_RECEIPTS]),
            make_plan("receipt", receipts(rng.randrange(10, 60))),
            make_plan("receipt", receipts(rng.randrange(20, 60)), [CONT_CLAIM]),
            make_plan("receipt", receipts(rng.randrange(5, 60)), [CONT_KEYS]),
            make_plan("random", at_random()),
            make_plan("random", at_random(), [cont_random()]),
            make_plan("random", at_random()),
            make_plan("random", at_random(), [CONT_CLAIM]),
            make_plan("random", at_random(), [cont_random(), cont_random()])]


def late_plans() -> list:
    """6 trials whose first continuation starts late: steps already due (`cont_delay` seconds
    after the launch's kill), or 22 s after the horizon's end (`cont_at`, from step 0)."""
    return [make_plan("late-cont", keys_file(1), cont_delay=6.0),
            make_plan("late-cont", claim_file(2), cont_delay=7.0),
            make_plan("late-cont", receipts(15), [CONT_KEYS], cont_delay=6.5),
            make_plan("after-horizon", keys_file(1), cont_at=SIZE * HORIZON + SIZE * 10 + 2),
            make_plan("late-cont", receipts(30), [CONT_RECEIPTS], cont_delay=8.0),
            make_plan("late-cont", step_file(2, "csv"), [CONT_CLAIM], cont_delay=6.0)]


def one_round(rng: random.Random) -> list:
    """33 trials in a random order, the late ones spread among the others."""
    common, late = common_plans(rng), late_plans()
    rng.shuffle(common)
    rng.shuffle(late)
    out = []
    for i, trial in enumerate(common):
        out.append(trial)
        if i % 6 == 2 and late:
            out.append(late.pop(0))
    return out + late


def schedule(trials: int, rng: random.Random) -> list:
    """The control first, then rounds of `one_round` until `trials`."""
    plans = [make_plan("control-late", keys_file(2), inject_late=CONTROL_LATE)]
    while len(plans) < trials:
        plans += one_round(rng)
    return plans[:trials]


def one_trial(emulator, index: int, chosen: dict, keep: bool) -> dict:
    folder = tempfile.mkdtemp(prefix=f"streaming-kills-t{index:02d}-")
    start = time.time()
    try:
        trial = Trial(emulator, index, chosen, folder)
        result = check(trial, trial.run())
    finally:
        if keep:
            print(f"  kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    result["folder"] = folder if keep else None
    result["seconds"] = round(time.time() - start, 1)
    return result


def yes(value) -> str:
    return "?" if value is None else "yes" if value else "no"


def trial_line(r: dict) -> str:
    on_launch = sum(1 for kill in r["kills"] if kill["run"] == 0)
    kills = "; ".join(f"{kill['target']} {kill['at_rel']:+.1f}s" for kill in r["kills"])
    return (f"t{r['trial']:02d} {r['kind']:13s} kills {len(r['kills'])} (launch {on_launch}) "
            f"conts {r['continuations']} ({r['continuations_after_last_kill']} after the last "
            f"kill) stuck {yes(r['stuck'])} tracebacks {len(r['tracebacks'])} steps ok "
            f"{yes(r['steps_ok'])} == batch {yes(r['records_equal_batch'])} late "
            f"{r['late_dead_letters']} sent {r['sent']} lost {r['events_lost']} twice "
            f"{r['counted_twice']} {r['seconds']:.0f}s [{kills or 'no kill'}]"
            + (f"\n  batch failed: {r['batch_error'].strip().splitlines()[-1:]}"
               if r.get("batch_error") else ""))


def misses(results: list) -> tuple:
    """(the trials whose records differ from batch, other than the control; whether the
    control's do, as they must)."""
    others = [r["trial"] for r in results
              if r["kind"] != "control-late" and r["records_equal_batch"] is not True]
    control = [r for r in results if r["kind"] == "control-late"]
    return others, bool(control) and control[0]["records_equal_batch"] is False


def totals(results: list) -> str:
    kills = [kill for r in results for kill in r["kills"]]
    on_launch = sum(1 for kill in kills if kill["run"] == 0)
    kinds = collections.Counter(kill["kind"] for kill in kills)
    equal = sum(1 for r in results if r["records_equal_batch"])
    others, control_missed = misses(results)
    note = ("the only miss is the control, by design" if control_missed and not others else
            f"misses: {', '.join(f't{i:02d}' for i in others) or 'none'}; the control "
            + ("missed, by design" if control_missed else "did NOT miss: the check is blind"))
    rows = [
        ("trials", len(results)),
        ("kill -9s", f"{len(kills)} (launch {on_launch}, continuation {len(kills) - on_launch})"),
        ("kills by kind", ", ".join(f"{kind} {kinds.get(kind, 0)}" for kind in KINDS)),
        ("stuck releases", sum(1 for r in results if r["stuck"])),
        ("runs with a traceback", sum(len(r["tracebacks"]) for r in results)),
        ("trials with a step problem", sum(1 for r in results if r["step_problems"])),
        ("records == batch", f"{equal}/{len(results)} ({note})"),
        ("late dead letters", sum(r["late_dead_letters"] for r in results)),
        ("events sent", f"{sum(r['sent'] for r in results):,}"),
        ("events lost (neither counted nor dead-lettered)",
         f"{sum(r['events_lost'] or 0 for r in results):g}"),
        ("counted twice", f"{sum(r['counted_twice'] or 0 for r in results):g}"),
        ("max continuations after the last kill",
         max((r["continuations_after_last_kill"] for r in results), default=0))]
    return "\n".join(["| | total |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows])


def failed(results: list) -> bool:
    others, control_missed = misses(results)
    return bool(others) or not control_missed or any(
        r["stuck"] or r["tracebacks"] or r["step_problems"] or r["events_lost"] is None
        or r["events_lost"] > 0 or r["counted_twice"] > 0 for r in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=65, help="the first is the control")
    parser.add_argument("--seed", type=int, default=777, help="draws the trials' kill points")
    parser.add_argument("--json", metavar="PATH", help="writes each trial's results as a JSON "
                                                       "line")
    parser.add_argument("--keep", action="store_true",
                        help="keeps each trial's folder (its runs' stdout and stderr, the "
                             "release, the batch run)")
    parser.add_argument("--mechanism", help="the release's mechanism under rho = 0.5 (e.g. "
                                            "sqrt_toeplitz: key states that grow, checkpointed "
                                            "as step entries)")
    args = parser.parse_args(argv)
    MECHANISM[0] = args.mechanism
    if not sys.platform.startswith("linux"):
        print("skipped: the kills are fired by inotify (Linux only)")
        return 0
    why = available()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    plans = schedule(args.trials, random.Random(args.seed))
    print(f"{args.trials} trials (seed {args.seed}): {HORIZON} steps of {SIZE:g} s, allowed "
          f"lateness {LATENESS:g} s, keys {'/'.join(KEYS)}, an event every {EVERY:g} s; "
          f"times relative to step 0", flush=True)
    results = []
    with PubSubEmulator(project="dp-kills") as emulator:
        for index, each in enumerate(plans):
            results.append(one_trial(emulator, index, each, args.keep))
            print(trial_line(results[-1]), flush=True)
            if args.json:
                with open(args.json, "a" if index else "w", encoding="utf-8") as handle:
                    handle.write(json.dumps(results[-1], default=str) + "\n")
    print()
    print(totals(results))
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
