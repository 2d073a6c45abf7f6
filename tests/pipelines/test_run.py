"""The job runner end to end on the bundled demo data, and from an installed sdist."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pyarrow.parquet as pq
import yaml

from pipelines import run as job_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_job_writes_every_key_and_step(tmp_path):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"]["path"] = str(tmp_path)
    config["steps"]["horizon"] = 12
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    table = pq.read_table(glob.glob(str(tmp_path / "active-users" / "records-*.parquet"))[0])
    assert table.num_rows == 6 * 12
    dead = [line for f in glob.glob(str(tmp_path / "active-users-operator" /
                                        "dead_letters-*.jsonl")) for line in open(f)]
    assert len(dead) > 0  # events after the 12-step horizon are dead letters, not dropped


def test_bad_config_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("job: x\ntransform: nope\n")
    assert job_run.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`input` must be given" in err or "`transform`" in err


def test_sdist_installs_and_runs_the_demo_job_like_a_dataflow_worker(tmp_path):
    """Build an sdist, install it (no deps: they are the image's) into a fresh virtualenv,
    and run a job from outside the source tree using the packaged demo data."""
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True)
    sdist = glob.glob(str(tmp_path / "*.tar.gz"))[0]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    sdist], check=True, capture_output=True)
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "cart_items.yaml")))
    config["output"]["path"] = str(tmp_path / "out")
    job = tmp_path / "elsewhere" / "job.yaml"
    job.parent.mkdir()
    job.write_text(yaml.safe_dump(config))
    result = subprocess.run([python, "-c", "import pipelines, sys; print(pipelines.__file__)"],
                            cwd=str(job.parent), capture_output=True, text=True, check=True)
    assert "site-packages" in result.stdout  # the installed copy, not the source tree
    result = subprocess.run([python, "-m", "pipelines.run", "--config", str(job)],
                            cwd=str(job.parent), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    table = pq.read_table(glob.glob(str(tmp_path / "out" / "cart-items" / "records-*.parquet"))[0])
    assert table.num_rows == 4 * 48
