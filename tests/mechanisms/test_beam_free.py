"""The numpy core must import and run without Apache Beam."""
import subprocess
import sys


def test_mechanisms_import_no_apache_beam():
    code = ("import sys, transforms.mechanisms as m; "
            "m.make('binary_tree', 8, epsilon=1.0, seed=1).release([1] * 8); "
            "bad = sorted(n for n in sys.modules if n.split('.')[0] == 'apache_beam'); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
