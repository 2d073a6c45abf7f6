"""Real storage failures for tests: small or read-only tmpfs mounts (root only), and a process
killed (SIGKILL) right after it opened a given file for writing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def can_mount() -> str:
    """'' when tmpfs mounts work here, else why not (the tests that need one skip)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount / umount"
    return ""


class Tmpfs:
    """tmpfs mounts under a test's folder, unmounted at the end."""

    def __init__(self, base):
        self.base, self.mounted = base, []

    def mount(self, name: str, size: str):
        why = can_mount()
        if why:
            pytest.skip(why)
        path = self.base / name
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                               str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        self.mounted.append(path)
        return path

    @staticmethod
    def remount(path, options: str) -> None:
        """e.g. "ro", "rw,size=16m": a full disk freed, or a folder made read-only."""
        subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)

    def unmount_all(self) -> None:
        for path in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        self.mounted = []


@pytest.fixture
def tmpfs(tmp_path):
    mounts = Tmpfs(tmp_path)
    yield mounts
    mounts.unmount_all()


KILLED_AFTER_OPEN = r'''
import builtins, io, os, signal, sys
name = sys.argv[1]
statement = sys.argv[2]
import pipelines.checkpoints, pipelines.schedule  # imported before anything is patched


def writes(mode=None, flags=None):
    if flags is not None:
        return bool(flags & (os.O_WRONLY | os.O_RDWR))
    return any(c in str(mode or "r") for c in "wax+")


def killing(real, is_os):
    def opener(file, *args, **kwargs):
        result = real(file, *args, **kwargs)
        if isinstance(file, (str, bytes, os.PathLike)) and \
                name in os.path.basename(os.fsdecode(file)):
            mode = args[0] if args else kwargs.get("flags" if is_os else "mode")
            if writes(flags=mode) if is_os else writes(mode=mode):
                os.kill(os.getpid(), signal.SIGKILL)  # right after the create, before a byte
        return result
    return opener


os.open = killing(os.open, True)
builtins.open = io.open = killing(io.open, False)
exec(statement)
'''


def killed_after_opening(name: str, statement: str) -> int:
    """Runs `statement` (Python, with pipelines.checkpoints imported) in a process that is
    killed with SIGKILL right after it opens for writing a file whose name holds `name` (the
    file itself, or a temporary file written for it); returns its exit code (-9: killed)."""
    return subprocess.run([sys.executable, "-c", KILLED_AFTER_OPEN, name, statement],
                          cwd=ROOT, capture_output=True, text=True, timeout=120).returncode
