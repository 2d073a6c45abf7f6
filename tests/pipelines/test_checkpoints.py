"""Checkpoint integrity: every kind of state file deleted, truncated, altered or added (and the
manifest or the commit marker themselves) gives a one-line error naming the file; never a
silent resume. Killed runs' folders are cleaned by the next run."""
from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from pipelines import checkpoints, schedule
from pipelines import config as job_config
from transforms.streams import codec
from tests.pipelines.test_schedule import ORIGIN, HOUR, continuous, records_of, write_config


def _first_file(folder, pattern):
    return sorted(glob.glob(os.path.join(folder, pattern)))[0]


def _delete(path):
    os.remove(path)


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])


def _flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))


def _add_sibling(path):
    shutil.copy(path, path + ".extra")


CORRUPTIONS = {"delete": _delete, "truncate": _truncate, "flip a bit": _flip,
               "add a file": _add_sibling}
FILES = ["units-*", "keys-*", "records-*.jsonl", "dead_letters-*", "ledger.json",
         "manifest.json"]


@pytest.fixture(scope="module")
def committed_state(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    config = write_config(tmp)
    state = str(tmp / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    return config, state


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
@pytest.mark.parametrize("pattern", FILES)
def test_a_corrupted_checkpoint_is_refused_naming_the_file(committed_state, tmp_path, kind,
                                                           pattern):
    config, original = committed_state
    state = str(tmp_path / "state")
    shutil.copytree(original, state)
    folder = checkpoints.committed_checkpoints(state)[-1][1].replace(original, state)
    # the marker names the original folder: point a copy of the marker at the copy
    marker = checkpoints.marker_path(state, 0)
    text = open(marker).read().replace(original, state)
    open(marker, "w").write(text)
    target = _first_file(folder, pattern)
    CORRUPTIONS[kind](target)
    with pytest.raises(ValueError, match=r"^`checkpoint` must be intact \(.*\); got '.*"
                                         + os.path.basename(target).replace(".", r"\.")):
        schedule.run_once(config, state, ORIGIN + 8 * HOUR)


def test_an_altered_commit_marker_is_refused(committed_state, tmp_path):
    config, original = committed_state
    state = str(tmp_path / "state")
    shutil.copytree(original, state)
    marker = checkpoints.marker_path(state, 0)
    open(marker, "w").write("{not json")
    with pytest.raises(ValueError, match=r"^`checkpoint` must be intact .*from-00000000\.json"):
        schedule.run_once(config, state, ORIGIN + 8 * HOUR)


def test_stale_folders_of_killed_runs_are_removed_and_the_release_converges(tmp_path):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    stale = os.path.join(state, "ckpt-00000003-deadbeef")   # a killed run's leftovers
    os.makedirs(os.path.join(stale, "beam-temp-x"))
    pending = os.path.join(state, "ckpt-00000011-cafecafe")  # may be a run in progress
    os.makedirs(pending)
    final = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    assert not os.path.exists(stale) and os.path.exists(pending)
    assert records_of(final["records"]) == continuous(tmp_path, config)


def test_a_reset_contribution_count_with_a_recomputed_manifest_is_refused(committed_state,
                                                                            tmp_path):
    """The attack a state-directory writer has without the secret: reset a unit's truncation
    state (its contributions would count again: the budget spent twice on it), recompute the
    manifest and the marker's SHA-256. The marker's MAC under the release's secret refuses it."""
    config, original = committed_state
    state = str(tmp_path / "state")
    shutil.copytree(original, state)
    marker_file = checkpoints.marker_path(state, 0)
    marker = json.loads(open(marker_file).read().replace(original, state))
    folder = marker["checkpoint"]
    units = _first_file(folder, "units-*")
    lines = open(units).read().splitlines()
    unit, used = codec.loads(lines[0])
    fresh = ((), {})  # an item's state before any flip (cart_items: count_distinct)
    assert used != fresh  # the item did contribute
    open(units, "w").write("\n".join([codec.dumps((unit, fresh))] + lines[1:]) + "\n")
    marker["manifest_sha256"] = checkpoints.write_manifest(folder)  # what an attacker can do
    open(marker_file, "w").write(json.dumps(marker))
    with pytest.raises(ValueError, match=r"^`checkpoint` must be committed under this "
                                         r"release's secret \(its commit marker's MAC"):
        schedule.run_once(config, state, ORIGIN + 8 * HOUR)
    # the control: the same edit with the MAC recomputed under the secret is accepted
    secret = job_config.load(config).secret.ref()
    marker["manifest_mac"] = checkpoints.marker_mac(secret, marker["release_id"],
                                                    marker["steps"], marker["manifest_sha256"])
    open(marker_file, "w").write(json.dumps(marker))
    schedule.run_once(config, state, ORIGIN + 8 * HOUR)
