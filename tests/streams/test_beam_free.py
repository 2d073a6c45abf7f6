import subprocess
import sys


def test_streams_import_no_apache_beam():
    code = ("import sys, transforms.streams as s; "
            "s.count_distinct_streams([(0, '+', 'a')], 2, 1); "
            "bad = sorted(n for n in sys.modules if n.split('.')[0] == 'apache_beam'); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
