"""Checkpoints of an unbounded (streaming) release: what lets a stopped job continue it.

A streaming release keeps its states in Beam. To continue it after its job stopped (killed,
cancelled, drained), a job needs, at the last published step s, every public key's sealed
mechanism state and every unit's truncation state, and must prove it has all of them (a unit
resumed without its state would spend its cap again). The checkpoint folder holds:

- `units/<execution>/units-<random>.jsonl`: the unit log of one execution of a job graph
  (the events reach it only once the execution claimed the release). Each bundle of the truncation stage
  writes, per unit and per step it processed, (unit, step, state after the step) in
  `finish_bundle`, so before any contribution of that bundle leaves it (a bundle's outputs are
  committed after it finishes). Each file ends with its MAC (the release's secret and
  binding, and the file's name).
- `keys-at-<s>.json`: written once step s's records are all in and BEFORE its files are
  published: the records of step s, every public key's sealed state after s (a growing input
  history as the step's own entry: `transforms.key_history`), and the names of
  the unit log files present then. A contribution released at step s or before left its
  bundle after that bundle's file was written, and the key released it before the step was
  complete: so the listed files hold every unit state behind what was published. MAC'd.
- `step-<s>.claim`: the execution that claimed step s first: its claim token, its execution id
  and its epoch (create-if-absent). A later epoch takes the step over when the claimant did
  not checkpoint it (it stopped between the two): what decides is `keys-at-<s>.json`, written
  once (`durable.create_if_absent`), so a step is never checkpointed, nor published, twice.
- `from-<first>.json` (`from-<first>-<attempt>.json` for a retry): a continuation's claim of
  the steps from `first`, made only while no step from `first` on is checkpointed; its epoch
  (first, attempt) supersedes every earlier one at the steps from `first` on.

A continuation from s verifies the checkpoints' MACs, reads every unit log file the last one
lists (a file missing, or one whose MAC fails, is refused: its units would spend their caps
again) and takes each unit's latest state as of s, counting an entry only if the execution
that wrote it published its step (`units/<execution>/`, named in the step's MAC'd checkpoint):
what a stopped execution, or one that lost a step's claim, processed of a step another
published was never released.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import uuid
from typing import Dict, List, Tuple

from transforms.durable import create_if_absent, matching
from transforms.key_history import Histories, compacted
from transforms.streams import codec
from transforms.validation import fail

_DOMAIN = b"dp-continual-release/stream-checkpoint\x00"


def _key(config) -> bytes:
    return _DOMAIN + config.secret.secret_bytes() + config.release_binding


def sealed(config, name: str, data: bytes) -> bytes:
    """`data` followed by a last line holding its MAC (bound to the file's `name`)."""
    mac = hmac.new(_key(config), name.encode("utf-8") + b"\x00" + data, hashlib.sha256)
    return data + json.dumps({"mac": mac.hexdigest()}).encode("utf-8") + b"\n"


def unsealed(config, name: str, data: bytes) -> bytes:
    """The content of a `sealed` file, refused unless its MAC holds."""
    body, _, last = data.rstrip(b"\n").rpartition(b"\n")
    body = body + b"\n" if body else b""
    try:
        mac = json.loads(last.decode("utf-8"))["mac"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        mac = None
    expected = hmac.new(_key(config), name.encode("utf-8") + b"\x00" + body,
                        hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
        fail("checkpoint file", "one this release wrote, unaltered (its MAC holds)", name)
    return body


def join(folder: str, *parts: str) -> str:
    return "/".join([folder.rstrip("/"), *parts])


def keys_name(step: int) -> str:
    return f"keys-at-{step:08d}.json"


class UnitLog:
    """The truncation stage's writer of unit log entries (one file per bundle)."""

    def __init__(self, folder: str, config, execution: str):
        self.folder, self.config, self.execution = folder, config, execution

    def start(self):
        self.lines: List[str] = []

    def add(self, unit, step: int, state) -> None:
        """The unit's state after `step`."""
        self.lines.append(codec.dumps([unit, step, state]))

    def flush(self) -> None:
        """Writes the bundle's entries (before the bundle's outputs leave it)."""
        if self.lines:
            name = f"units-{uuid.uuid4().hex}.jsonl"
            data = ("\n".join(self.lines) + "\n").encode("utf-8")
            folder = join(self.folder, "units", self.execution)
            if "://" not in folder:
                os.makedirs(folder, exist_ok=True)
            create_if_absent(join(folder, name), sealed(self.config, name, data))
            self.lines = []


def unit_log_files(folder: str) -> List[str]:
    """The unit log's files, relative to `folder` (units/<execution>/units-<random>.jsonl)."""
    return ["/".join(path.rsplit("/", 3)[-3:])
            for path in matching(join(folder, "units", "*", "units-*.jsonl"))]


def _read(path: str) -> bytes:
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.open(path) as handle:
        return handle.read()


def sealed_bodies(config, folder: str, pattern: str):
    """(path, content) of every `sealed` file under `folder` matching `pattern`, each MAC
    verified (a damaged one is refused naming it)."""
    for path in matching(join(folder, pattern)):
        yield path, unsealed(config, path.rsplit("/", 1)[-1], _read(path))


def key_checkpoint(config, step: int, records: list, key_states: list,
                   unit_logs: List[str], execution: str) -> bytes:
    """Step `step`'s checkpoint, MAC'd: its records, its keys' states, the unit log files
    written by then, and the execution that published it (whose unit log entries of this
    step are the release's)."""
    data = json.dumps({"release_id": config.release_id, "step": step, "unit_logs": unit_logs,
                       "execution": execution, "records": records,
                       "key_states": [codec.dumps(pair)
                                      for pair in compacted(key_states, step)]},
                      sort_keys=True).encode("utf-8") + b"\n"
    return sealed(config, keys_name(step), data)


def read_key_checkpoint(config, folder: str, step: int) -> dict:
    name = keys_name(step)
    body = json.loads(unsealed(config, name, _read(join(folder, name))).decode("utf-8"))
    if body.get("release_id") != config.release_id or body.get("step") != step:
        fail("checkpoint file", f"of release {config.release_id} at step {step}", name)
    body["key_states"] = [tuple(codec.loads(line)) for line in body["key_states"]]
    return body


def replayed_step(config, folder: str, step: int, records: list, key_states: list,
                  execution: str) -> bool:
    """Whether step `step` is checkpointed already by `execution` with these records and key
    states: the runner restored the job from a state before the step and released it again
    (Flink's failover), the same step (the unit log files listed may differ: the replay wrote
    its own)."""
    if not matching(join(folder, keys_name(step))):
        return False
    body = read_key_checkpoint(config, folder, step)
    exact = (lambda rows: json.dumps(rows, sort_keys=True))  # 1 and 1.0 differ, as in files
    return body["execution"] == execution and exact(body["records"]) == exact(records) and \
        [codec.dumps(pair) for pair in body["key_states"]] == \
        [codec.dumps(pair) for pair in compacted(key_states, step)]


def claim_name(first: int, attempt: int = 1) -> str:
    """A continuation's claim of the steps from `first`: its first attempt `from-F.json` (as
    before attempts), a later one `from-F-A.json`."""
    return f"from-{first:08d}.json" if attempt == 1 else f"from-{first:08d}-{attempt:02d}.json"


# the epoch of an execution: (its first step, its attempt); the launch that started the release
# is (0, 0), a continuation (first, attempt >= 1). A later epoch supersedes an earlier one at
# every step from its first on (`superseding`).
LAUNCH = (0, 0)


def epochs(folder: str) -> List[Tuple[int, int]]:
    """The epochs of the continuations claimed in `folder`, sorted."""
    found = []
    for path in matching(join(folder, "from-*.json")):
        stem = path.rsplit("/", 1)[-1][len("from-"):-len(".json")]
        first, _, attempt = stem.partition("-")
        if first.isdigit() and (attempt == "" or attempt.isdigit()):
            found.append((int(first), int(attempt) if attempt else 1))
    return sorted(found)


def superseding(folder: str, epoch: Tuple[int, int], step: int) -> List[Tuple[int, int]]:
    """The epochs later than `epoch` that claimed `step` (their first <= step): an execution of
    `epoch` must not publish `step` once one exists."""
    return [e for e in epochs(folder) if e > tuple(epoch) and e[0] <= step]


def _numbered(folder: str, prefix: str) -> List[int]:
    """The steps N of the files `<prefix>N.json` in `folder`, sorted."""
    found = []
    for path in matching(join(folder, f"{prefix}*.json")):
        digits = path.rsplit("/", 1)[-1][len(prefix):-len(".json")]
        if digits.isdigit():
            found.append(int(digits))
    return sorted(found)


def continuation_claims(folder: str) -> List[int]:
    """The first steps of the continuations claimed in `folder` (each once, whatever its
    attempts)."""
    return sorted({first for first, _ in epochs(folder)})


def checkpointed_steps(folder: str) -> List[int]:
    return _numbered(folder, "keys-at-")


def unit_states_at(config, folder: str, step: int, files: List[str],
                   publisher: Dict[int, str]) -> Dict[object, Tuple[int, object]]:
    """Every unit's latest logged state as of `step`, {unit: (its step, state)}, from the unit
    log `files` (each present and MAC'd, else refused). An entry counts only if the execution
    that wrote it published its step (`publisher`, from the MAC'd checkpoints): what an
    execution processed of a step another one published (it stopped, or lost the step's
    claim) was never released. Two counted entries of one unit and step that differ (a retried
    bundle that saw other events) are refused."""
    from apache_beam.io.filesystems import FileSystems
    latest: Dict[object, Tuple[int, object]] = {}
    for name in files:
        execution, base = name.split("/")[1], name.rsplit("/", 1)[-1]
        path = join(folder, name)
        if not FileSystems.exists(path):
            fail("unit log", f"holding every file the checkpoint at step {step} lists (its "
                             f"units would spend their caps again)", name)
        body = unsealed(config, base, _read(path))
        for line in body.decode("utf-8").splitlines():
            unit, at, state = codec.loads(line)
            if at > step or publisher.get(at) != execution:
                continue
            found = latest.get(unit)
            if found is not None and found[0] == at and found[1] != state:
                fail("unit log", f"one state per unit and step (two differ at step {at}: "
                                 f"which one was released is unknown)", name)
            if found is None or found[0] < at:
                latest[unit] = (at, state)
    return latest


def verified_resume(config, folder: str, public_keys) -> Tuple[int, dict, dict, list]:
    """The last checkpointed step s, the units' states as of s, the keys' sealed states after s
    and the records of s; refused unless every checkpoint up to s is there and MAC'd and every
    unit log file the last one lists is there and MAC'd. With no checkpoint at all (no step
    was published: files follow their checkpoint), s = -1 and no states: the release starts
    again from step 0."""
    steps = checkpointed_steps(folder)
    if not steps:  # nothing was published: the release starts again from step 0
        return -1, {}, {}, []
    last = steps[-1]
    if steps != list(range(last + 1)):
        fail("checkpoint", f"of every step 0 to {last}", f"steps {steps}")
    body, publisher, histories = None, {}, Histories()
    for step in steps:
        body = read_key_checkpoint(config, folder, step)
        publisher[step] = body.get("execution")
        histories.add(step, body["key_states"])
    units = unit_states_at(config, folder, last, body["unit_logs"], publisher)
    keys = histories.states()  # (the last step's, histories rebuilt)
    missing = [k for k in public_keys if k not in keys]
    if missing:
        fail("checkpoint", f"holding every public key's state at step {last}", missing[:3])
    return last, units, keys, body["records"]
