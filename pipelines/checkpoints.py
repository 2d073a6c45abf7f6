"""The scheduler's checkpoints: a state directory of committed runs (see `pipelines.schedule`).

A checkpoint folder `ckpt-<steps released>-<id>/` holds the unit states (`units-*`), the key
states (`keys-*`), the run's records and dead letters and `ledger.json`. It becomes visible only
through its commit marker `commits/from-<first step>.json`, created with create-if-absent.
Markers, ledgers, manifests and the stored secret appear whole or not at all (`pipelines.storage`:
a temporary file, fsynced, then linked or renamed into place): a kill or a full disk never
leaves an empty or half-written one.
States are versioned JSON lines (`streams.codec`), never pickle: a state directory in a writable
bucket must not be able to run code.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
from typing import List, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines import config as job_config
from pipelines import io, storage
from transforms import durable
from transforms.secret import SecretRef
from transforms.streams import codec

COMMITTED = "_COMMITTED"
LEDGER = "ledger.json"
COMMITS = "commits"


class ConcurrentRun(RuntimeError):
    """Another run committed the same steps first; this run published nothing."""


def join(*parts) -> str:
    return FileSystems.join(*parts)


def same_checkpoint(a, b) -> bool:
    """Two spellings of one checkpoint folder (a marker names its folder as the run that
    committed it spelled the state directory: `state`, `./state`, `/abs/state`)."""
    return a is not None and b is not None and \
        os.path.basename(str(a).rstrip("/")) == os.path.basename(str(b).rstrip("/"))


def marker_path(state_dir: str, released: int) -> str:
    return join(state_dir, COMMITS, f"from-{released:08d}.json")


def marker_chain(state_dir: str) -> List[dict]:
    """The commit markers from step 0 on, each as {"start", "end", "folder" (named under
    `state_dir` as spelled here), "release_id", "path", "marker"}."""
    out, released = [], 0
    while FileSystems.exists(marker_path(state_dir, released)):
        path = marker_path(state_dir, released)
        try:
            marker = read_json(path)
            step, folder = int(marker["steps"][1]), str(marker["checkpoint"])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            job_config.fail("checkpoint", "intact (a commit marker that names its folder and "
                                          "steps)", path)
        if step <= released:
            job_config.fail("checkpoint", f"a chain of increasing steps (marker from step "
                                          f"{released})", path)
        out.append({"start": released, "end": step, "path": path, "marker": marker,
                    "release_id": marker.get("release_id"),
                    "folder": join(state_dir, os.path.basename(folder.rstrip("/")))})
        released = step
    return out


def committed_checkpoints(state_dir: str) -> List[Tuple[int, str]]:
    """The chain of committed checkpoints [(steps released, folder)], following the commit
    markers from step 0 (a checkpoint folder without a marker is a killed or losing run); each
    folder is named under `state_dir` as spelled here."""
    return [(link["end"], link["folder"]) for link in marker_chain(state_dir)]


def remove_torn_markers(state_dir: str) -> List[str]:
    """Deletes empty commit markers: versions before atomic creation created a marker and then
    wrote it, and a kill or a full disk in between left it empty. An empty marker never
    committed anything (nothing after it ran: no `_COMMITTED`, nothing published), and markers
    are now created with their content, so an empty one is always such a leftover. Local paths
    (an object appears whole with its upload)."""
    folder = join(state_dir, COMMITS)
    if not storage.is_local(folder) or not os.path.isdir(folder):
        return []
    storage.remove_stale_temps(folder)
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith("from-") and name.endswith(".json") and os.path.isfile(path) \
                and os.path.getsize(path) == 0:
            os.remove(path)
            removed.append(path)
    if removed:
        storage.fsync_folder(folder)
    return removed


MANIFEST = "manifest.json"


def _file_facts(path: str) -> dict:
    digest, size, lines = hashlib.sha256(), 0, 0
    with FileSystems.open(path) as handle:
        while True:
            chunk = handle.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
    return {"bytes": size, "lines": lines, "sha256": digest.hexdigest()}


def checkpoint_files(folder: str) -> List[str]:
    """Every file a run wrote into its checkpoint folder (Beam's temp folders excluded)."""
    metadata = FileSystems.match([join(folder, "*")])[0].metadata_list
    return sorted(m.path for m in metadata
                  if os.path.basename(m.path) not in (MANIFEST, COMMITTED)
                  and "beam-temp" not in m.path and not storage.is_temp(m.path))


def write_manifest(folder: str) -> str:
    """Lists every checkpoint file with its size, line count and SHA-256; returns the
    manifest's own SHA-256 (the commit marker records it)."""
    files = {os.path.basename(path): _file_facts(path) for path in checkpoint_files(folder)}
    text = json.dumps({"format": 1, "files": files}, indent=2, sort_keys=True)
    write_text(join(folder, MANIFEST), text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def marker_mac(secret: SecretRef, release_id: str, steps, manifest_sha256: str) -> str:
    """HMAC-SHA256 under the release's secret of what a commit marker vouches for: the release,
    its steps and the manifest (which lists every checkpoint file's SHA-256). Without the
    secret, nobody who can write the state directory can make a run resume from altered unit
    states (a reset contribution count would spend the budget again on that unit) or key
    states."""
    message = json.dumps({"release_id": release_id, "steps": list(steps),
                          "manifest_sha256": manifest_sha256}, sort_keys=True)
    return hmac.new(secret.secret_bytes(), b"dp-continual-release/checkpoint\x00"
                    + message.encode("utf-8"), hashlib.sha256).hexdigest()


def verify_marker(marker: dict, secret: SecretRef, path: str) -> str:
    """The marker's manifest SHA-256, once its MAC verifies under the secret."""
    try:
        expected = marker_mac(secret, str(marker["release_id"]), marker["steps"],
                              str(marker["manifest_sha256"]))
        given = str(marker["manifest_mac"])
    except (KeyError, TypeError):
        given, expected = "", "x"
    if not hmac.compare_digest(given, expected):
        job_config.fail("checkpoint", "committed under this release's secret (its commit marker's "
                                      "MAC does not verify: altered, or written by another "
                                      "secret or an older version)", path)
    return str(marker["manifest_sha256"])


def verified_manifest(folder: str, manifest_sha256: str) -> dict:
    """The files a checkpoint's manifest lists (name -> size, lines, SHA-256), once the
    manifest's SHA-256 is the one its commit marker recorded."""
    path = join(folder, MANIFEST)
    try:
        with FileSystems.open(path) as handle:
            text = handle.read()
    except (OSError, IOError, ValueError):
        job_config.fail("checkpoint", "intact (its manifest is missing)", path)
    if hashlib.sha256(text).hexdigest() != manifest_sha256:
        job_config.fail("checkpoint", "intact (the manifest differs from the one committed)",
                        path)
    return json.loads(text.decode("utf-8"))["files"]


def verified_file(path: str, listed: dict) -> bytes:
    """The bytes of a checkpoint file, once its size and SHA-256 are its manifest's."""
    try:
        with FileSystems.open(path) as handle:
            data = handle.read()
    except (OSError, IOError):
        data = None
    facts = listed.get(os.path.basename(path)) or {}
    if data is None or len(data) != facts.get("bytes") or \
            hashlib.sha256(data).hexdigest() != facts.get("sha256"):
        job_config.fail("checkpoint", "intact (a file's size or SHA-256 differs from its "
                                      "manifest)", path)
    return data


def verify_checkpoint(folder: str, manifest_sha256: str) -> dict:
    """Refuse to resume from a checkpoint whose files differ from its manifest (deleted,
    truncated, altered or added state files): a one-line error naming the file. Returns the
    manifest's files (name -> size, lines, SHA-256): the job checks them again where it reads
    them (`read_states`), since it reads after the driver verified."""
    listed = verified_manifest(folder, manifest_sha256)
    present = {os.path.basename(p): p for p in checkpoint_files(folder)}
    for name in sorted(set(listed) | set(present)):
        if name not in present:
            job_config.fail("checkpoint", "intact (a listed file is missing)", join(folder, name))
        if name not in listed:
            job_config.fail("checkpoint", "intact (a file not in its manifest was added)",
                            present[name])
        if _file_facts(present[name]) != listed[name]:
            job_config.fail("checkpoint", "intact (a file's size or SHA-256 differs from its "
                                          "manifest)", present[name])
    return listed


def remove_stale_checkpoints(state_dir: str, released: int, committed: List[str]) -> List[str]:
    """Deletes uncommitted checkpoint folders that can no longer commit (they end at or before
    the committed steps: killed or losing runs); a folder ending later may be a run in
    progress and is left alone. Returns what was removed."""
    removed = []
    if "://" not in state_dir:
        folders = [join(state_dir, n) for n in sorted(os.listdir(state_dir))
                   if n.startswith("ckpt-")] if os.path.isdir(state_dir) else []
    else:  # object stores have no empty folders: the files say which folders exist
        prefix = join(state_dir, "")
        folders = sorted({join(state_dir, m.path[len(prefix):].split("/")[0]) for m in
                          FileSystems.match([join(state_dir, "ckpt-*/**")])[0].metadata_list})
    committed_names = {os.path.basename(f.rstrip("/")) for f in committed}
    for folder in folders:
        if os.path.basename(folder.rstrip("/")) in committed_names:
            continue
        try:
            ends = int(os.path.basename(folder).split("-")[1])
        except (IndexError, ValueError):
            continue
        if ends <= released:
            FileSystems.delete([folder])
            removed.append(folder)
    return removed


def create_if_absent(path: str, data: bytes, mode: int = 0o644) -> bool:
    """Atomically create `path` with `data` unless it exists: True if this call created it.
    The file appears with its whole content or not at all.

    Local paths: `data` is written and fsynced under a temporary name, then hard-linked to
    `path` (link(2) fails if it exists), then the folder is fsynced (`transforms.durable`).
    gs://: an object write with if_generation_match=0 (needs google-cloud-storage, the [gcp]
    extra; GCS preconditions are strongly consistent). Other filesystems offer no atomic
    create-if-absent through Beam and are refused."""
    if "://" not in path or path.startswith("gs://"):
        return durable.create_if_absent(path, data, mode)
    job_config.fail("--state-dir", "a local path or gs:// (committing needs an atomic "
                                   "create-if-absent)", path)


def fingerprint(job: job_config.JobConfig) -> dict:
    """Every config field that defines the release, flattened to dotted names: the ledger
    refuses a run whose fingerprint differs. Where it reads is not part of it; where it
    publishes is (`job` and `output.path`: the published folder holds the release's claims of
    its windows, so a copy of the state directory pointed elsewhere cannot publish the same
    release again).

    The input's reading is part of it (`input_binding`): its format, field map, the declared
    type of every role (defaults resolved), the timestamp format and the id canonicalisation.
    They decide which unit an event belongs to: read otherwise mid-release, the same person
    could become a new unit whose saved cap is lost (a CSV id "7" and a JSON id 7 were two units
    before ids were canonicalised).

    `mechanism.max_state_bytes_per_key` is left out: it only limits which mechanism a NEW
    release may use (the resolved mechanism is in the ledger and the descriptor), so changing it
    mid-release changes nothing released."""
    output = job.output.path if "://" in job.output.path else os.path.abspath(job.output.path)
    sections = {"job": job.job, "output.path": output,
                "transform": job.transform, "input": io.input_binding(job),
                # the steps' timing (a streaming setting) is not used by scheduled runs
                "steps": {"origin": job.steps.origin, "size_seconds": job.steps.size_seconds,
                          "horizon": job.steps.shown_horizon},
                "privacy": dataclasses.asdict(job.privacy),
                "bounds": job.bounds, "public_keys": job.public_keys,
                "mechanism": {"name": job.mechanism.name, "params": job.mechanism.params},
                "confidence": job.confidence}
    flat = {}
    for name, value in sections.items():
        if isinstance(value, dict) and name != "bounds":
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    return flat


NEW_STATE_DIRECTORY = ("a new state directory would be a new release: it spends the budget "
                       "again on the same data")


def check_ledger(ledger: dict, job: job_config.JobConfig, secret_fingerprint: str) -> None:
    """Refuse a run that differs from the release this state directory started."""
    if ledger.get("secret_fingerprint") != secret_fingerprint:
        job_config.fail("secret", f"the secret this release started with (fingerprint "
                                  f"{ledger.get('secret_fingerprint', '?')[:12]}...; "
                                  f"{NEW_STATE_DIRECTORY})",
                        f"a secret with fingerprint {secret_fingerprint[:12]}...")
    spent = ledger["config"]
    for name in sorted(set(spent) - set(fingerprint(job))):  # a field this code no longer binds
        job_config.fail(name, f"a field this code still binds (the ledger was written by "
                              f"another version; {NEW_STATE_DIRECTORY})", spent[name])
    for name, value in fingerprint(job).items():
        if name in ("mechanism.name", "mechanism.params") and job.mechanism.name == "auto":
            continue  # the ledger's resolved mechanism is used
        if spent.get(name) != value:
            was = spent.get(name)
            differ = sorted(k for k in set(was) | set(value)
                            if (k in was, was.get(k)) != (k in value, value.get(k))) \
                if isinstance(was, dict) and isinstance(value, dict) else []
            if differ:  # name the entry that differs, not the whole section twice
                name, was, value = f"{name}.{differ[0]}", was.get(differ[0]), value.get(differ[0])
            if isinstance(was, list) and isinstance(value, list) and len(repr(was)) > 60:
                added = [v for v in value if v not in was][:1]  # public keys: say what moved
                removed = [v for v in was if v not in value][:1]
                was = f"{len(was)} entries" + (f", with {removed[0]!r}" if removed else "")
                value = f"{len(value)} entries" + (f", with {added[0]!r}" if added else "")
            job_config.fail(name, f"what this release was started with ({was!r}; "
                                  f"{NEW_STATE_DIRECTORY})", value)


def stored_secret(state_dir: str) -> SecretRef:
    """The release's secret kept in the state directory: created once with its content
    (`create_if_absent`: a temporary file of mode 0600 from the start, linked into place), so
    there is no readable window, no overwrite by a concurrent run, and never an empty secret.
    An empty one left by versions before (killed between creating and writing it) never
    served a run (an empty secret is refused), so it is replaced."""
    path = join(state_dir, "secret")
    if "://" not in path:
        storage.remove_stale_temps(state_dir)
        try:
            if os.path.getsize(path) == 0:
                os.remove(path)
        except FileNotFoundError:
            pass
        create_if_absent(path, secrets.token_hex(32).encode("ascii"), 0o600)
        return SecretRef(path=path)
    if not FileSystems.exists(path):  # object stores: access is the bucket's IAM policy
        create_if_absent(path, secrets.token_hex(32).encode("ascii"))
    return SecretRef(path=path)


class _ReadVerified(beam.DoFn):
    """A checkpoint file -> its decoded lines, once its SHA-256 equals the verified manifest's
    (the job reads after the driver verified: a file altered in between fails the job)."""

    def __init__(self, listed: dict):
        self.listed = listed

    def process(self, path: str):
        with FileSystems.open(path) as handle:
            data = handle.read()
        expected = self.listed.get(os.path.basename(path), {}).get("sha256")
        if hashlib.sha256(data).hexdigest() != expected:
            job_config.fail("checkpoint", "intact when the job reads it (it changed after the "
                                          "driver verified it)", path)
        for line in data.decode("utf-8").splitlines():
            if line.strip():
                yield codec.loads(line)


def read_states(pipeline, label: str, folder, name: str, listed: dict = None):
    """(unit or key, state) pairs stored by the previous run (the files of its verified
    manifest `listed`), or an empty PCollection."""
    paths = sorted(join(folder, n) for n in (listed or {}) if n.startswith(f"{name}-")) \
        if folder else []
    if not paths:
        return pipeline | f"No{label}" >> beam.Create([])
    return (pipeline | f"{label}Files" >> beam.Create(paths, reshuffle=False)
            | f"Read{label}" >> beam.ParDo(_ReadVerified(listed)))


def write_states(states, label: str, folder: str, name: str):
    """-> the written file names."""
    return (states | f"Encode{label}" >> beam.Map(codec.dumps)
            | f"Store{label}" >> beam.io.WriteToText(join(folder, name)))


def write_text(path, text):
    """Writes (or replaces) `path` whole: a reader sees the old content or the new one, never
    an empty or partial file (local paths: `storage.replace_atomically`; an object store's
    upload is atomic already)."""
    if storage.is_local(path):
        storage.replace_atomically(path, text.encode("utf-8"))
        return
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def read_json(path):
    with FileSystems.open(path) as handle:
        return json.loads(handle.read().decode("utf-8"))
