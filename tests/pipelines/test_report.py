"""pipelines.report: charts per key and a summary, with the zero-noise truth for demo data."""
from __future__ import annotations

import glob
import os

import pytest
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
    assert "MaxSE" in text and "true value inside the interval" in text and "epsilon = 1," in text


def test_report_missing_input(capsys):
    assert report.main(["--input", "/nonexistent/records-*.parquet"]) == 2
    assert capsys.readouterr().err.startswith("error: `input` must be a release folder")


def _signups_run(tmp_path, name, formats=("jsonl", "parquet")):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["output"] = {"path": str(tmp_path / name), "formats": list(formats)}
    config["steps"]["horizon"] = 6
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 0
    return tmp_path / name / "signups"


def test_report_reads_a_run_folder_once_although_it_holds_two_formats(tmp_path):
    folder = _signups_run(tmp_path, "a")
    rows = report.read_records(str(folder))
    assert len(rows) == 3 * 6 and len({(r["key"], r["step"]) for r in rows}) == 3 * 6
    assert report.records_files(str(folder))[0].endswith(".parquet")
    assert report.read_records(str(folder / "records-*")) == rows  # a glob over both formats


def test_report_refuses_a_mix_of_releases_in_one_line(tmp_path, capsys):
    first, second = _signups_run(tmp_path, "a", ("jsonl",)), _signups_run(tmp_path, "b",
                                                                          ("jsonl",))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for index, folder in enumerate((first, second)):
        for path in glob.glob(str(folder / "records-*.jsonl")):
            os.link(path, mixed / f"records-{index}.jsonl")
    assert report.main(["--input", str(mixed), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must hold the records of one release; got 2 releases" in err


def test_report_refuses_two_different_records_for_one_key_and_step():
    row = {"release_id": "r", "key": "a", "step": 0, "value": 1.0}
    assert report.one_release([row, dict(row)]) == [row]   # identical copies merge
    try:
        report.one_release([row, dict(row, value=2.0)])
    except ValueError as error:
        assert "two different records for key 'a', step 0" in str(error)
    else:
        raise AssertionError("conflicting records were accepted")


def test_report_reads_a_state_directory_as_one_release(tmp_path):
    from pipelines import schedule
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["steps"]["horizon"] = 6
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    state = str(tmp_path / "state")
    for now in ("2026-01-05T02:00:00Z", "2026-01-05T06:00:00Z"):
        assert schedule.main(["--config", str(path), "--state-dir", state, "--now", now]) == 0
    rows = report.read_records(state)
    assert sorted({r["step"] for r in rows}) == list(range(6)) and len(rows) == 3 * 6
    published = glob.glob(str(tmp_path / "out" / "signups-scheduled" / "*"))
    assert len(published) == 1 and report.read_records(published[0]) == rows


def _truth_config(tmp_path, name, **changes):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "signups.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["steps"]["horizon"] = 6
    for section, value in changes.items():
        config[section] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_report_refuses_a_truth_config_that_is_not_the_releases(tmp_path, capsys):
    """The newcomer's mismatches: a shorter horizon (was an IndexError), another transform
    (was "0 of 98" in silence), other bounds (was 98/98): each refused in one line, exit 2."""
    release = _truth_config(tmp_path, "release")
    assert job_run.main(["--config", release]) == 0
    folder = str(tmp_path / "out" / "signups")
    base = yaml.safe_load(open(release))
    shorter = _truth_config(tmp_path, "shorter", steps=dict(base["steps"], horizon=4))
    bounds = dict(base.get("bounds") or {})
    first_bound = sorted(bounds)[0]
    other_bounds = _truth_config(tmp_path, "bounds", bounds=dict(
        bounds, **{first_bound: bounds[first_bound] + 1}))
    other_transform = _truth_config(
        tmp_path, "transform", transform="count", bounds={"max_contributions": 1},
        input=dict(base["input"], fields={"timestamp": "ts", "unit": "region",
                                          "key": "region"}))
    for config, field in ((shorter, "horizon"), (other_bounds, "bounds"),
                          (other_transform, "transform")):
        for given in (folder, os.path.join(folder, "records-*.jsonl")):
            assert report.main(["--input", given, "--out", str(tmp_path / "r"),
                                "--truth-config", config]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: `truth-config` must describe the release it is "
                                  f"compared with (its {field}") and err.count("\n") == 1
    assert report.main(["--input", folder, "--out", str(tmp_path / "r"),
                        "--truth-config", release]) == 0


def test_without_a_descriptor_the_records_still_refuse_a_shorter_horizon(tmp_path, capsys):
    release = _truth_config(tmp_path, "release")
    assert job_run.main(["--config", release]) == 0
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    for path in glob.glob(str(tmp_path / "out" / "signups" / "records-*.jsonl")):
        (lonely / os.path.basename(path)).write_text(open(path).read())
    base = yaml.safe_load(open(release))
    shorter = _truth_config(tmp_path, "shorter", steps=dict(base["steps"], horizon=4))
    assert report.main(["--input", str(lonely), "--out", str(tmp_path / "r"),
                        "--truth-config", shorter]) == 2
    assert "its records reach step 5); got a horizon of 4." in capsys.readouterr().err


def _released(tmp_path, name, horizon, **changes):
    """(config, its path, the release folder, its records, the truth) of bundled config `name`
    run with `horizon` steps and `changes` (top-level sections)."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", f"{name}.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["steps"]["horizon"] = horizon
    config.update(changes)
    release = tmp_path / f"{name}.yaml"
    release.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(release)]) == 0
    folder = str(tmp_path / "out" / config["job"])
    rows = report.read_records(folder)
    return config, release, folder, rows, report.true_totals(
        str(release), rows, report.release_descriptor(folder))


def test_a_mean_release_reports_against_its_exact_truncated_mean(tmp_path, capsys):
    """`report --truth-config` on a ContinualMean: the truth is the zero-noise mean of the
    same truncation (checked equal to the exact mean in tests/test_mean.py); a config with
    another max_value is refused."""
    config, release, folder, rows, truth = _released(tmp_path, "mean_seconds", 6)
    assert set(truth) == {r["key"] for r in rows} and all(len(v) == 6 for v in truth.values())
    assert all(0.0 <= v <= 300.0 for values in truth.values() for v in values)
    assert report.main(["--input", folder, "--out", str(tmp_path / "r"),
                        "--truth-config", str(release)]) == 0
    config["bounds"] = dict(config["bounds"], max_value=200)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert report.main(["--input", folder, "--out", str(tmp_path / "r"),
                        "--truth-config", str(other)]) == 2
    assert "must describe the release it is compared with (its bounds" in capsys.readouterr().err


def test_a_release_that_selects_keys_reports_against_the_truth_of_its_keys(tmp_path):
    """Without public keys, `report --truth-config` checks each published key against its true
    running total (0 before its first data), from its selection step on. Fixed seed:
    deterministic (a record 8 sd off has probability ~1e-5)."""
    _, release, folder, rows, truth = _released(
        tmp_path, "page_visitors", 12, privacy={"epsilon": 2.0, "selection_delta": 1e-3},
        secret={"seed": 5, "insecure": True})
    assert {r["key"] for r in rows} <= set(truth) and len(truth) > len({r["key"] for r in rows})
    errors = [(r["value"] - truth[r["key"]][r["step"]]) / r["stddev"] for r in rows]
    assert max(abs(e) for e in errors) < 8  # the truth of the key, not of another key
    assert report.main(["--input", folder, "--out", str(tmp_path / "charts"),
                        "--truth-config", str(release)]) == 0


def test_a_selecting_releases_report_has_its_mechanisms_maxse_and_one_chart_per_key(tmp_path):
    """Its records start at each key's selection step, so the largest published stddev may
    miss the noisiest steps: the report's MaxSE is the run summary's (the mechanism's, from
    the descriptor). Keys written alike in a file name ("a/b", "a b") get a chart each; a
    release with no key selected yet is one line."""
    import json as jsonlib
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "page_visitors.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["mechanism"] = {"name": "binary_tree"}
    config["secret"] = {"seed": 4, "insecure": True}
    config["input"]["path"] = str(tmp_path / "views.jsonl")
    with open(tmp_path / "views.jsonl", "w", encoding="utf-8") as handle:
        for user in range(400):  # both keys only at the last step: the smallest stddev
            for page in ("a/b", "a b"):
                handle.write(jsonlib.dumps({"ts": "2026-01-06T23:30:00Z", "user": f"u{user}",
                                            "page": page}) + "\n")
    path = tmp_path / "pages.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path), "--json"]) == 0
    folder = str(tmp_path / "out" / "page-visitors")
    rows = report.read_records(folder)
    assert {r["key"] for r in rows} == {"a/b", "a b"} and {r["step"] for r in rows} == {47}
    assert report.main(["--input", folder, "--out", str(tmp_path / "r")]) == 0
    text = open(tmp_path / "r" / "summary.md", encoding="utf-8").read()
    expected = report.selecting_max_se(report.release_descriptor(folder))
    assert expected > max(r["stddev"] for r in rows)
    assert f"MaxSE (largest per-step noise standard deviation): {expected:.3f}" in text
    assert len(os.listdir(tmp_path / "r")) == 3  # two charts and the summary
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "records-00000.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"^`input` must hold at least one record; got 1 "
                                         r"empty records file"):
        report.read_records(str(empty))
