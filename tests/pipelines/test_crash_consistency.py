"""Crash-consistent state (found by a kill -9 and disk-full campaign; each test broke the code
before): files appear whole or not at all, lost commit markers are refused instead of
publishing again, published files are checked and repaired, full or read-only storage ends in
one line, and the run's public and operator folders switch together."""
from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import stat

import pytest

from pipelines import checkpoints, schedule, storage
from pipelines import config as job_config
from pipelines import run as job_run
from tests.pipelines.test_schedule import HOUR, ORIGIN, continuous, records_of, write_config
from tests.support.storage import ROOT, killed_after_opening, tmpfs  # noqa: F401 (a fixture)

NOW = {hours: f"2026-01-05T{hours:02d}:00:00Z" for hours in range(24)}


def _schedule(config, state, hours, capsys=None):
    code = schedule.main(["--config", config, "--state-dir", state, "--now", NOW[hours]])
    return code, (capsys.readouterr().err if capsys is not None else None)


def _published_files(job):
    """Every file under the job's published folders (hidden ones too) -> its bytes."""
    return {os.path.relpath(os.path.join(folder, name), job.output.path):
            open(os.path.join(folder, name), "rb").read()
            for folder, _, names in os.walk(schedule.published_root(job)) for name in names}


# 1. Files appear whole or not at all.

def test_a_kill_right_after_the_marker_is_created_leaves_no_empty_marker(tmp_path):
    path = str(tmp_path / "commits" / "from-00000000.json")
    code = killed_after_opening("from-00000000.json", f"pipelines.checkpoints.create_if_absent("
                                                      f"{path!r}, b'{{\"whole\": 1}}')")
    assert code == -9
    assert not os.path.exists(path)  # before: a 0-byte marker every later run refused
    [temp] = glob.glob(str(tmp_path / "commits" / ".tmp-*"))  # what the kill left: ignored
    assert checkpoints.create_if_absent(path, b'{"whole": 2}')  # nothing blocks the next one
    assert open(path, "rb").read() == b'{"whole": 2}'
    assert storage.remove_stale_temps(str(tmp_path / "commits")) == [temp]  # its process died
    assert os.listdir(tmp_path / "commits") == ["from-00000000.json"]


def test_a_kill_while_a_ledger_or_manifest_is_rewritten_keeps_the_old_one(tmp_path):
    path = str(tmp_path / "ledger.json")
    checkpoints.write_text(path, '{"old": true}')
    code = killed_after_opening("ledger.json", f"pipelines.checkpoints.write_text({path!r}, "
                                               f"'{{\"new\": true}}')")
    assert code == -9
    assert open(path).read() == '{"old": true}'  # before: an empty ledger


def test_a_kill_while_the_stored_secret_is_created_leaves_no_empty_secret(tmp_path):
    state = str(tmp_path / "state")
    code = killed_after_opening("secret", f"pipelines.checkpoints.stored_secret({state!r})")
    assert code == -9
    assert not os.path.exists(os.path.join(state, "secret"))  # before: an empty secret file
    [temp] = glob.glob(os.path.join(state, ".tmp-*"))
    assert stat.S_IMODE(os.stat(temp).st_mode) == 0o600  # never readable by others
    first = checkpoints.stored_secret(state).secret_bytes()
    assert len(first) == 64
    assert stat.S_IMODE(os.stat(os.path.join(state, "secret")).st_mode) == 0o600
    assert checkpoints.stored_secret(state).secret_bytes() == first  # created once
    assert os.listdir(state) == ["secret"]  # the killed run's temporary file is cleaned


def test_an_empty_secret_or_marker_left_by_the_version_before_is_replaced(tmp_path):
    """Versions before created, then wrote: a kill in between left empty files that nothing
    ever used. They are replaced (the stored secret) or removed (a marker), not refused."""
    config = write_config(tmp_path, secret={"stored": True})
    state = tmp_path / "state"
    (state / checkpoints.COMMITS).mkdir(parents=True)
    (state / "secret").write_bytes(b"")
    (state / checkpoints.COMMITS / "from-00000000.json").write_bytes(b"")
    summary = schedule.run_once(config, str(state), ORIGIN + 4 * HOUR)
    assert summary["released_after"] == 4
    assert len((state / "secret").read_bytes()) == 64
    assert json.loads((state / checkpoints.COMMITS / "from-00000000.json").read_text())[
        "steps"] == [0, 4]


def test_a_first_run_killed_in_its_commit_before_the_marker_is_retried(tmp_path, monkeypatch):
    """Its folder holds the ledger and the manifest but no marker and no `_COMMITTED`: a
    killed run, retried normally (not refused as a lost marker)."""
    from pipelines import commit
    config = write_config(tmp_path)
    state = str(tmp_path / "state")

    def killed(path, data, *args):
        raise RuntimeError("killed before the marker")

    monkeypatch.setattr(commit, "create_if_absent", killed)
    with pytest.raises(Exception, match="killed before the marker"):
        schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    monkeypatch.undo()
    [folder] = glob.glob(os.path.join(state, "ckpt-*"))
    assert os.path.exists(os.path.join(folder, checkpoints.LEDGER))
    assert checkpoints.committed_checkpoints(state) == []
    final = schedule.run_once(config, state, ORIGIN + 12 * HOUR)
    assert records_of(final["records"]) == continuous(tmp_path, config)


# 2. Checkpoints or published sets without their markers are refused, never a fresh start.

def _lose_commits(state, job):
    shutil.rmtree(os.path.join(state, checkpoints.COMMITS))


def _lose_last_marker(state, job):
    os.remove(sorted(glob.glob(os.path.join(state, checkpoints.COMMITS, "from-*")))[-1])


def _lose_first_marker(state, job):
    os.remove(checkpoints.marker_path(state, 0))


def _lose_state_directory(state, job):
    shutil.rmtree(state)


LOSSES = {"commits/ deleted": _lose_commits, "the last marker deleted": _lose_last_marker,
          "the first marker deleted": _lose_first_marker,
          "the state directory deleted, the output kept": _lose_state_directory}


@pytest.mark.parametrize("secret", ["insecure seed", "stored"])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_lost_commit_markers_are_refused_not_published_again(tmp_path, capsys, loss, secret):
    config = write_config(tmp_path, **({"secret": {"stored": True}} if secret == "stored"
                                       else {}))
    job = job_config.load(config)
    state = str(tmp_path / "state")
    for hours in (4, 8):
        assert _schedule(config, state, hours)[0] == 0
    published = _published_files(job)
    LOSSES[loss](state, job)
    capsys.readouterr()
    code, err = _schedule(config, state, 12, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: `state directory` must be holding the markers of all the job "
                          "committed ("), err
    assert len(err.split("; got ")[0]) < 200, err  # then the path
    assert _published_files(job) == published  # nothing published again, no second release


def test_a_new_state_directory_for_an_output_that_holds_a_release_is_refused(tmp_path):
    config = write_config(tmp_path)
    schedule.run_once(config, str(tmp_path / "first"), ORIGIN + 4 * HOUR)
    with pytest.raises(ValueError, match=r"^`state directory` must be holding the markers "
                                         r"of all the job committed .*records-steps-0-4-"):
        schedule.run_once(config, str(tmp_path / "second"), ORIGIN + 4 * HOUR)


# 3. Republishing checks every published file against its verified checkpoint.

def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])


def _flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 3] ^= 0x04
    open(path, "wb").write(bytes(data))


DAMAGES = {"deleted": os.remove, "truncated": _truncate, "altered": _flip,
           "emptied": lambda path: open(path, "wb").close()}


@pytest.fixture(scope="module")
def published_release(tmp_path_factory):
    """Three windows published in three formats; (config, state, the published bytes)."""
    tmp = tmp_path_factory.mktemp("published")
    config = write_config(tmp, output={"path": str(tmp / "out"),
                                       "formats": ["parquet", "jsonl", "csv"]})
    state = str(tmp / "state")
    for hours in (3, 7, 12):
        schedule.run_once(config, state, ORIGIN + hours * HOUR)
    return config, state, _published_files(job_config.load(config))


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_a_damaged_published_file_is_rewritten_by_the_next_run(published_release, tmp_path,
                                                               damage, fmt):
    config, original_state, published = published_release
    job = job_config.load(config)
    state = str(tmp_path / "state")
    shutil.copytree(original_state, state)  # markers name folders by their base name
    target = sorted(p for p in glob.glob(os.path.join(schedule.published_root(job), "*",
                                                       f"records-steps-3-7-*.{fmt}")))[0]
    saved = open(target, "rb").read()
    try:
        DAMAGES[damage](target)
        folder = os.path.dirname(target)
        open(os.path.join(folder, ".tmp-999999999-0badc0de-x"), "w").close()  # a dead writer's
        open(target + ".partial", "w").close()  # a half-written file of the version before
        again = schedule.run_once(config, state, ORIGIN + 12.5 * HOUR)
        assert again["new_steps"] == 0
        assert _published_files(job) == published  # byte for byte, every file of every window
    finally:
        open(target, "wb").write(saved)


def test_a_published_window_is_only_repaired_from_a_verified_checkpoint(published_release,
                                                                          tmp_path):
    """The records of an earlier window's checkpoint were altered: the run refuses (naming the
    file) instead of republishing them or trusting the published copy."""
    config, original_state, _ = published_release
    state = str(tmp_path / "state")
    shutil.copytree(original_state, state)
    first = checkpoints.committed_checkpoints(state)[0][1]
    records = glob.glob(os.path.join(first, "records-*.jsonl"))[0]
    _flip(records)
    with pytest.raises(ValueError, match=r"^`checkpoint` must be intact \(a file's size or "
                                         r"SHA-256 differs from its manifest\); got '.*records-"):
        schedule.run_once(config, state, ORIGIN + 12.5 * HOUR)


def test_a_commit_killed_before_its_flag_gets_it_from_the_next_run(tmp_path):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    [(_, folder)] = checkpoints.committed_checkpoints(state)
    os.remove(os.path.join(folder, checkpoints.COMMITTED))  # killed right after its marker
    schedule.run_once(config, state, ORIGIN + 4.5 * HOUR)
    assert os.path.exists(os.path.join(folder, checkpoints.COMMITTED))


# 4. Full or read-only storage: one line naming the path, exit code 2.

@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EACCES])
def test_a_storage_error_in_the_scheduler_is_one_line(tmp_path, capsys, monkeypatch, number):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")

    def failing(handle):
        raise OSError(number, os.strerror(number))  # as write(2)/fsync(2): no file named

    monkeypatch.setattr(os, "fsync", failing)
    capsys.readouterr()
    code, err = _schedule(config, state, 4, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: `") and state in err and os.strerror(number) in err
    monkeypatch.undo()
    assert _schedule(config, state, 4)[0] == 0  # nothing was left that blocks the next run


def test_a_storage_error_in_a_run_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path)

    def full(handle):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    capsys.readouterr()
    code = job_run.main(["--config", config])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "release.json` must be writable storage (free space" in err and "ENOSPC" in err


def test_storage_error_lines_name_the_file_behind_a_runner_error():
    inner = OSError(errno.EROFS, os.strerror(errno.EROFS), "/data/state/commits/.tmp-1-ab-x",
                    None, "/data/state/commits/from-00000000.json")  # link(2) of a temp file
    try:
        try:
            raise inner
        except OSError as error:
            raise RuntimeError("OSError: [Errno 30] ... [while running 'Commit']") from error
    except RuntimeError as wrapped:
        line = storage.storage_error(wrapped)
    assert line.startswith("`/data/state/commits/from-00000000.json` must be writable "
                           "storage (make it writable, then run again")
    assert line.endswith("got 'Read-only file system' (EROFS).")
    text = RuntimeError("OSError: [Errno 28] No space left on device: '/out/x.jsonl' "
                        "[while running 'Write']")
    assert storage.storage_error(text).startswith("`/out/x.jsonl` must be writable storage")
    assert storage.storage_error(ValueError("[Errno 2] No such file")) is None


def _one_line(result):
    return result.returncode == 2 and result.stderr.count("\n") == 1


def _cli(module, *args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", f"pipelines.{module}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_a_full_disk_ends_in_one_line_and_the_next_run_completes(tmp_path, tmpfs):
    """A real full disk (a 48 KiB tmpfs) under both drivers, then the space freed."""
    disk = tmpfs.mount("disk", "48k")
    config = write_config(tmp_path, output={"path": str(disk / "out"),
                                            "formats": ["jsonl", "csv"]})
    state = str(disk / "state")
    for module, args in (("schedule", ["--state-dir", state, "--now", NOW[12]]), ("run", [])):
        result = _cli(module, "--config", config, *args)
        assert _one_line(result), result.stderr
        assert "must be writable storage (free space" in result.stderr
        assert "(ENOSPC)" in result.stderr and str(disk) in result.stderr
    tmpfs.remount(disk, "size=16m")
    for module, args in (("schedule", ["--state-dir", state, "--now", NOW[12]]), ("run", [])):
        result = _cli(module, "--config", config, *args)
        assert result.returncode == 0, result.stderr
    job = job_config.load(config)
    reference = records_of([os.path.join(job.public_path, "records-*.jsonl")])
    published = glob.glob(os.path.join(schedule.published_root(job), "*", "records-*.jsonl"))
    assert records_of(published) == reference and len(reference) == 4 * 12


def test_a_read_only_state_directory_ends_in_one_line(tmp_path, tmpfs):
    disk = tmpfs.mount("state", "4m")
    config = write_config(tmp_path)
    state = str(disk / "state")
    assert _cli("schedule", "--config", config, "--state-dir", state, "--now",
                NOW[4]).returncode == 0
    tmpfs.remount(disk, "ro")
    result = _cli("schedule", "--config", config, "--state-dir", state, "--now", NOW[8])
    assert _one_line(result), result.stderr
    assert "(EROFS)" in result.stderr and state in result.stderr
    tmpfs.remount(disk, "rw")
    assert _cli("schedule", "--config", config, "--state-dir", state, "--now",
                NOW[8]).returncode == 0
