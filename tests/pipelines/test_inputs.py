"""The job runner reads JSON lines, CSV and Parquet with the same field mapping."""
from __future__ import annotations

import csv
import glob
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import config as job_config
from pipelines import run as job_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def released(tmp_path, name):
    files = glob.glob(str(tmp_path / name / "signups" / "records-*.jsonl"))
    return sorted((json.loads(line)["key"], json.loads(line)["step"], json.loads(line)["value"])
                  for f in files for line in open(f))


def run_with(tmp_path, name, path, fmt):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["input"]["path"], config["input"]["format"] = path, fmt
    config["output"]["path"] = str(tmp_path / name)
    config["secret"] = {"seed": 2026, "insecure": True}  # the same release read three ways
    job = tmp_path / f"{name}.yaml"
    job.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(job)]) == 0
    dead = [json.loads(line) for f in glob.glob(str(tmp_path / name / "signups-operator" /
                                                    "dead_letters-*")) for line in open(f)]
    return released(tmp_path, name), dead


def test_jsonl_csv_and_parquet_inputs_give_the_same_records(tmp_path):
    rows = [json.loads(line) for line in
            open(os.path.join(job_config.DEMO_DIR, "signups.jsonl"))]
    csv_path = tmp_path / "signups.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["ts", "region", "delta"])
        writer.writeheader()
        writer.writerows(rows)
        handle.write("2026-01-05T03:00:00Z,eu-west\n")  # malformed: 2 columns
    parquet_path = tmp_path / "signups.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet_path)
    from_jsonl, _ = run_with(tmp_path, "a", "demo:signups.jsonl", "jsonl")
    from_csv, dead = run_with(tmp_path, "b", str(csv_path), "csv")
    from_parquet, _ = run_with(tmp_path, "c", str(parquet_path), "parquet")
    assert len(from_jsonl) == 3 * 48
    assert from_jsonl == from_csv == from_parquet
    assert [d["reason"] for d in dead] == ["invalid CSV line: 2 columns, the header has 3"]


def test_a_mean_reads_jsonl_and_parquet_into_the_same_records(tmp_path):
    """ContinualMean (two parts over one truncation) from the Arrow batches of a Parquet file
    and from JSON lines: the same records, value and interval, for the same insecure seed."""
    rows = [json.loads(line) for line in
            open(os.path.join(job_config.DEMO_DIR, "active_users.jsonl"))]
    parquet_path = tmp_path / "views.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet_path)
    out = {}
    for name, path, fmt in (("a", "demo:active_users.jsonl", "jsonl"),
                            ("b", str(parquet_path), "parquet")):
        config = yaml.safe_load(open(os.path.join(ROOT, "configs", "mean_seconds.yaml")))
        config["input"]["path"], config["input"]["format"] = path, fmt
        config["steps"]["horizon"] = 12
        config["output"] = {"path": str(tmp_path / name), "formats": ["jsonl"]}
        config["secret"] = {"seed": 2026, "insecure": True}
        job = tmp_path / f"{name}.yaml"
        job.write_text(yaml.safe_dump(config))
        assert job_run.main(["--config", str(job)]) == 0
        out[name] = sorted((r["key"], r["step"], r["value"], r["ci_low"], r["ci_high"])
                           for f in glob.glob(str(tmp_path / name / "mean-seconds" /
                                                  "records-*.jsonl"))
                           for r in map(json.loads, open(f)))
    assert len(out["a"]) == 6 * 12 and out["a"] == out["b"]


def test_csv_files_with_another_header_are_refused_in_one_line(tmp_path):
    """A later file with its columns in another order was read by the first file's names
    (second adversary review): now a one-line error before the job starts."""
    from pipelines import io as job_io
    (tmp_path / "a.csv").write_text("ts,user,region\n2026-01-05T00:00:00Z,u1,eu-west\n")
    (tmp_path / "b.csv").write_text("user,ts,region\nu2,2026-01-05T00:00:00Z,eu-west\n")
    with pytest.raises(ValueError, match=r"^`input.path` must be CSV files with one header"):
        job_io.csv_header(str(tmp_path / "*.csv"))
    (tmp_path / "b.csv").write_text("ts,user,region\n2026-01-05T00:00:00Z,u2,eu-west\n")
    assert job_io.csv_header(str(tmp_path / "*.csv")) == ["ts", "user", "region"]


def test_a_binary_file_in_a_text_input_is_refused_in_one_line(tmp_path):
    """A gzip file without its .gz suffix, or a Parquet file matched by a JSON lines glob, was
    read as a few garbage lines hiding all its records (second adversary review)."""
    import gzip

    from pipelines import io as job_io
    (tmp_path / "a.jsonl").write_text('{"ts": "2026-01-05T00:00:00Z"}\n')
    with gzip.open(tmp_path / "b.jsonl", "wt") as handle:
        handle.write('{"ts": "2026-01-05T00:00:00Z"}\n')
    with pytest.raises(ValueError, match=r"^`input.path` must be text files .*b\.jsonl'\.$"):
        job_io.check_text_files(str(tmp_path / "*.jsonl"))
    os.rename(tmp_path / "b.jsonl", tmp_path / "b.jsonl.gz")  # named as what it is: read
    job_io.check_text_files(str(tmp_path / "*.jsonl*"))
    pq.write_table(pa.Table.from_pylist([{"ts": 1}]), tmp_path / "c.jsonl")
    with pytest.raises(ValueError, match=r"c\.jsonl"):
        job_io.check_text_files(str(tmp_path / "*.jsonl"))
