"""Checks that a package imports and runs without Apache Beam (in a fresh interpreter)."""
import subprocess
import sys


def assert_runs_without_beam(statement: str) -> None:
    code = (f"import sys; {statement}; "
            "bad = sorted(n for n in sys.modules if n.split('.')[0] == 'apache_beam'); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
