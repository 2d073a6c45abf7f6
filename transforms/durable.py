"""Files that appear whole or not at all on local paths (a kill -9, an OOM kill, a preempted VM
or a full disk mid-write leaves at most a temporary file that nothing reads).

- `replace_atomically(path, data)`: the data is written and fsynced under a temporary name in
  the same folder, then renamed over `path` (rename(2) is atomic), then the folder is fsynced;
- `create_if_absent(path, data)`: the same kind of temporary file is hard-linked to `path`
  (link(2) fails with EEXIST when `path` exists), so the file carries its content from the
  moment it exists: the create-if-absent of every claim and commit marker.

Temporary files are named `.tmp-<pid>-<random>-<name>` beside their target. Object stores
(gs://) need none of this: an object appears whole when its upload completes, and gs:// has an
atomic create-if-absent (a generation-match precondition).
"""
from __future__ import annotations

import errno
import glob
import os
import uuid
from typing import List

from transforms.validation import fail

TEMP_PREFIX = ".tmp-"


def is_local(path) -> bool:
    return "://" not in str(path)


def matching(pattern: str) -> List[str]:
    """The files matching a glob, sorted: a local pattern through `glob` (Beam's local match
    walks the pattern's folder and all below it and stats every file: a streaming release's
    checkpoint folder gains two files per step, so each match would cost more every step),
    any other through Beam's filesystems (no match: [])."""
    if is_local(pattern):
        return sorted(path for path in glob.glob(pattern) if os.path.isfile(path))
    from apache_beam.io.filesystems import FileSystems  # (Beam: only for remote paths)
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # noqa: BLE001 (no match)
        return []


def is_temp(path) -> bool:
    return os.path.basename(str(path).rstrip("/")).startswith(TEMP_PREFIX)


def temp_path(path: str) -> str:
    """A temporary name beside `path` (same folder, so a rename or link stays atomic)."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f"{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{name}")


def fsync_folder(folder: str) -> None:
    """Makes a rename or link in `folder` durable (a power loss keeps it); best effort on
    filesystems that cannot sync a directory."""
    try:
        handle = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def named_error(error: OSError, path: str) -> OSError:
    """`error` naming `path` (a failed write(2) or fsync(2) names no file)."""
    if error.errno is None or (error.filename and not is_temp(error.filename)):
        return error
    named = OSError(error.errno, error.strerror or os.strerror(error.errno or 0), path)
    named.__cause__ = error
    return named


def write_temp(path: str, data: bytes, mode: int) -> str:
    """`data` in a new, fsynced temporary file beside `path` (created with `mode`, so a secret
    is never readable by others, not even while it is written); returns its name."""
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise named_error(error, folder) from None
    temp = temp_path(path)
    try:
        handle = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    except OSError as error:
        raise named_error(error, path) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(handle, view):]
        os.fsync(handle)
    except OSError as error:
        os.close(handle)
        remove_quietly(temp)
        raise named_error(error, path) from None
    os.close(handle)
    return temp


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def replace_atomically(path: str, data: bytes, mode: int = 0o644) -> None:
    """Writes `data` to the local `path`, replacing it whole: readers see the old content or
    the new one, never a mix, an empty or a truncated file."""
    temp = write_temp(path, data, mode)
    try:
        os.replace(temp, path)
    except OSError as error:
        remove_quietly(temp)
        raise named_error(error, path) from None
    fsync_folder(os.path.dirname(path))


def create_if_absent(path: str, data: bytes, mode: int = 0o644) -> bool:
    """Atomically create `path` holding `data` unless it exists: True if this call created it.

    Local paths: `data` is written and fsynced under a temporary name, hard-linked to `path`,
    then the folder is fsynced. gs://: an object write with if_generation_match=0 (needs
    google-cloud-storage, the [gcp] extra; GCS preconditions are strongly consistent). Other
    filesystems offer no atomic create-if-absent through Beam and are refused."""
    if is_local(path):
        temp = write_temp(path, data, mode)
        try:
            os.link(temp, path)
        except OSError as error:
            if error.errno == errno.EEXIST:
                return False
            raise named_error(error, path) from None
        finally:
            remove_quietly(temp)
        fsync_folder(os.path.dirname(path) or ".")
        return True
    if path.startswith("gs://"):
        from google.api_core.exceptions import PreconditionFailed
        from google.cloud import storage as gcs
        bucket, _, name = path[len("gs://"):].partition("/")
        try:
            gcs.Client().bucket(bucket).blob(name).upload_from_string(
                data, if_generation_match=0)
        except PreconditionFailed:
            return False
        return True
    fail("path", "a local path or gs:// (an atomic create-if-absent is needed)", path)


def sync_files(paths) -> None:
    """fsyncs local files written by others (Beam's sinks do not) and their folders, before a
    commit names them: a power loss after the commit must not leave a committed file empty."""
    folders = set()
    for path in paths:
        if not is_local(path) or not os.path.isfile(path):
            continue
        handle = os.open(path, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
        folders.add(os.path.dirname(path) or ".")
    for folder in sorted(folders):
        fsync_folder(folder)
