"""Crash-consistent files on local paths, and one-line errors for full or read-only storage.

Everything the jobs commit (commit markers, ledgers, manifests, the stored secret, published
record files, the run's output sets) appears whole or not at all, also when the process is
killed (kill -9, an OOM kill, a preempted VM) or the disk fills up mid-write:

- `replace_atomically(path, data)`: the data is written and fsynced under a temporary name in
  the same folder, then renamed over `path` (rename(2) is atomic), then the folder is fsynced;
- create-if-absent (`transforms.durable.create_if_absent`, which both live in): the
  same kind of temporary file is hard-linked to `path` (link(2) fails with EEXIST when `path`
  exists), so the file carries its content from the moment it exists.

Temporary files start with `.tmp-` (`.tmp-<pid>-<random>-<name>` here): nothing reads them
(checkpoint manifests and published-file checks skip them), and `remove_stale_temps` deletes
those whose process is gone (or, when the name holds no process id or the process may be on
another host or in another container, that are an hour old).

Object stores (gs://) need none of this: an object appears whole when its upload completes.
"""
from __future__ import annotations

import errno
import os
import re
import time
from typing import Iterable, Optional

# the atomic files themselves live with the plugin (its claims use them)
from transforms.durable import (TEMP_PREFIX, named_error, remove_quietly, write_temp,  # noqa: F401
                                fsync_folder, is_local, is_temp, replace_atomically,
                                temp_path)

_TEMP = re.compile(r"\.tmp-(\d+)-[0-9a-f]{8}-")
STALE_SECONDS = 3600.0

def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True


def remove_stale_temps(folder: str) -> list:
    """Deletes the temporary files in the local `folder` that no running process will rename
    or link any more (their process is gone, or they are an hour old); returns them."""
    if not is_local(folder) or not os.path.isdir(folder):
        return []
    removed = []
    for name in os.listdir(folder):
        if not name.startswith(TEMP_PREFIX):
            continue
        path = os.path.join(folder, name)
        match = _TEMP.match(name)
        try:
            old = time.time() - os.lstat(path).st_mtime > STALE_SECONDS
        except OSError:
            continue
        if old or (match and not _running(int(match.group(1)))):
            if os.path.isdir(path) and not os.path.islink(path):
                continue  # not ours (our temporaries are files or links)
            remove_quietly(path)
            removed.append(path)
    return removed


# Storage the job cannot write: one line naming the path, exit code 2 (not a traceback).
STORAGE_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EFBIG: "EFBIG",
                  errno.EACCES: "EACCES", errno.EPERM: "EPERM", errno.EROFS: "EROFS"}
_MESSAGE = re.compile(r"\[Errno (\d+)\] ([^:'\n\[]+?)(?:: '([^'\n]*)'|\s*\[|\s*$)", re.M)


def _errors_in(error: BaseException) -> Iterable[BaseException]:
    """`error`, its causes and contexts, and the per-path errors Beam's BeamIOError carries."""
    seen, stack = set(), [error]
    while stack:
        current = stack.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        details = getattr(current, "exception_details", None)
        if isinstance(details, dict):
            stack.extend(e for e in details.values() if isinstance(e, BaseException))
        stack.extend([current.__cause__, current.__context__])


def storage_error(error: BaseException, where: Iterable[str] = ()) -> Optional[str]:
    """One line for an error that is (or was caused by) a full disk, a quota, a read-only
    filesystem or a permission denied, naming the path; None for any other error. `where`:
    the folders the job writes, named when the error names no path (a runner's error text)."""
    found = None
    for current in _errors_in(error):
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            path = current.filename
            if path is not None and is_temp(path) and current.filename2 is not None:
                path = current.filename2  # a link or rename of a temporary file into place
            found = (current.errno, current.strerror or os.strerror(current.errno),
                     None if path is None else os.fsdecode(path))
            if found[2]:
                break
            continue
        for match in _MESSAGE.finditer(str(current)):  # an error re-raised as text (a runner)
            number = int(match.group(1))
            if number in STORAGE_ERRNOS and (found is None or not found[2]):
                found = (number, match.group(2).strip(), match.group(3))
        if found and found[2]:
            break
    if found is None:
        return None
    number, reason, path = found
    place = path or " or ".join(_affected(number, [str(w) for w in where])) or \
        "the job's folders"
    advice = ("free space" if number in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
              else "make it writable")
    return (f"`{place}` must be writable storage ({advice}, then run again: the next run "
            f"finishes or discards what this one left, nothing committed is lost); got "
            f"{reason!r} ({STORAGE_ERRNOS[number]}).")


def _affected(number: int, folders: list) -> list:
    """Of the folders a job writes, those on a full (or read-only) filesystem, when the error
    names no file (Beam's sinks do not); all of them if none can be told apart."""
    def state(folder):
        while folder and not os.path.exists(folder):
            folder = os.path.dirname(folder.rstrip("/"))
        try:
            stat = os.statvfs(folder or ".")
        except OSError:
            return None
        if number == errno.EROFS:
            return bool(stat.f_flag & os.ST_RDONLY)
        if number in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return stat.f_bavail * stat.f_frsize < (1 << 20)
        return None
    local = [f for f in folders if is_local(f)]
    hit = [f for f in local if state(f)]
    return hit or folders

