"""pipelines.report: charts per key and a summary, with the zero-noise truth for demo data."""
from __future__ import annotations

import glob
import os

import yaml

from pipelines import report
from pipelines import run as job_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_report_writes_a_png_per_key_and_a_summary(tmp_path):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["output"]["path"] = str(tmp_path / "out")
    config["steps"]["horizon"] = 8
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    records = str(tmp_path / "out" / "signups" / "records-*.jsonl")
    assert report.main(["--input", records, "--out", str(tmp_path / "report"),
                        "--truth-config", str(path)]) == 0
    charts = glob.glob(str(tmp_path / "report" / "*.png"))
    assert len(charts) == 3
    for chart in charts:
        assert open(chart, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(chart) > 5000
    text = open(tmp_path / "report" / "summary.md").read()
    assert "MaxSE" in text and "true value inside the interval" in text and "epsilon = 1.0" in text


def test_report_missing_input(capsys):
    assert report.main(["--input", "/nonexistent/records-*.parquet"]) == 2
    assert capsys.readouterr().err.startswith("error: `input` must match")
