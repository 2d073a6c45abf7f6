"""The input gate (pipelines/gate.py) and dead letters counted by stable code."""
from __future__ import annotations

import glob
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import gate
from pipelines import run as job_run
from pipelines import schedule
from transforms.streams.records import CODES, INPUT_CODES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _job(tmp_path, name="job.yaml", **changes):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["secret"] = {"seed": 7, "insecure": True}
    for dotted, value in changes.items():
        section, _, field = dotted.partition("__")
        config[section][field] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _public_files(tmp_path):
    return [p for p in glob.glob(str(tmp_path / "out" / "**"), recursive=True)
            if os.path.isfile(p) and "operator" not in p and "/.staging" not in p
            and "/.releases/" not in p]


def test_the_verdict_counts_input_codes_only_and_refuses_no_good_record_at_any_limit():
    gate.verdict(10, 0, {"outside_horizon": [5, "x"]}, 0.5)            # half: passes
    gate.verdict(10, 0, {"late": [10, "x"], "exact_totals": [3, "x"]}, 0.5)  # not input codes
    gate.verdict(0, 0, {}, 0.0)                                        # empty input passes
    with pytest.raises(gate.GarbageInput, match="got 6 dead letters of 10 records"):
        gate.verdict(10, 0, {"outside_horizon": [6, "x"]}, 0.5)
    with pytest.raises(gate.GarbageInput, match="got 3 dead letters of 3 records"):
        gate.verdict(0, 3, {"unparseable": [3, "invalid JSON line"]}, 1.0)
    with pytest.raises(gate.GarbageInput, match=r"missing_field \(a row without a mapped "
                                                r"field\): 4, e.g. missing field 'x'"):
        gate.verdict(4, 0, {"missing_field": [4, "missing field 'x'"]}, 1.0)
    assert INPUT_CODES < set(CODES)


def test_a_job_whose_every_record_is_a_dead_letter_exits_2_and_publishes_nothing(tmp_path,
                                                                                   capsys):
    """The newcomer's `key: cntry`: every record lacks the field."""
    path = _job(tmp_path, input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert job_run.main(["--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "got 3861 dead letters of 3861 records" in err
    assert "missing_field" in err and "missing field 'cntry'" in err
    assert "Nothing was published and no privacy budget was spent" in err
    assert "[while running" not in err and out == ""
    assert _public_files(tmp_path) == []
    assert not os.path.exists(tmp_path / "out" / "active-users")


def test_a_horizon_that_misses_most_data_is_refused_and_the_fraction_is_the_operators(
        tmp_path, capsys):
    short = _job(tmp_path, steps__horizon=12)  # 12 of the demo's 48 hours: 75 % outside
    assert job_run.main(["--config", str(short)]) == 2
    err = capsys.readouterr().err
    assert "outside_horizon" in err and "is outside the horizon" in err
    assert _public_files(tmp_path) == []
    allowed = _job(tmp_path, "allowed.yaml", steps__horizon=12,
                   input__max_dead_letter_fraction=0.9)
    assert job_run.main(["--config", str(allowed)]) == 0
    summary = json.load(open(tmp_path / "out" / "active-users-operator" / "summary.json"))
    assert list(summary["dead_letters"]) == ["outside_horizon"]
    assert summary["dead_letter_examples"]["outside_horizon"].startswith("event time ")
    letters = [json.loads(line) for p in glob.glob(
        str(tmp_path / "out" / "active-users-operator" / "dead_letters-*")) for line in open(p)]
    assert letters and {letter["code"] for letter in letters} == {"outside_horizon"}
    assert sum(summary["dead_letters"].values()) == len(letters)


def test_the_parquet_reader_counts_its_rows_and_is_gated_alike(tmp_path, capsys):
    rows = [json.loads(line) for line in open(os.path.join(ROOT, "pipelines", "demo_data",
                                                           "active_users.jsonl"))]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "events.parquet")
    bad = _job(tmp_path, input__path=str(tmp_path / "events.parquet"), input__format="parquet",
               input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert job_run.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"got {len(rows)} dead letters of {len(rows)} records" in err, err
    assert _public_files(tmp_path) == []
    good = _job(tmp_path, "good.yaml", input__path=str(tmp_path / "events.parquet"),
                input__format="parquet")
    assert job_run.main(["--config", str(good)]) == 0


def test_a_refused_scheduled_run_leaves_no_release_so_the_fixed_config_starts_it(tmp_path,
                                                                                   capsys):
    state = str(tmp_path / "state")
    bad = _job(tmp_path, input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert schedule.main(["--config", str(bad), "--state-dir", state,
                          "--now", "2026-01-06T12:00:00Z"]) == 2
    err = capsys.readouterr().err
    assert "missing_field" in err and err.count("\n") == 1, err
    assert not os.path.exists(os.path.join(state, "ledger.json"))
    assert not glob.glob(os.path.join(state, "commits", "*"))
    assert _public_files(tmp_path) == []
    fixed = _job(tmp_path, "fixed.yaml")  # another field map: refused if the release had begun
    assert schedule.main(["--config", str(fixed), "--state-dir", state,
                          "--now", "2026-01-06T12:00:00Z"]) == 0
    assert glob.glob(str(tmp_path / "out" / "active-users-scheduled" / "*" / "records-*"))


def test_doctests():
    import doctest

    from transforms.streams import records
    assert doctest.testmod(gate, optionflags=doctest.ELLIPSIS).failed == 0
    assert doctest.testmod(records).failed == 0


def test_every_reason_code_reads_back_from_a_pickled_dead_letter():
    import pickle

    from transforms.messages import dead_letter_record
    from transforms.streams.records import Reason
    for code in CODES:
        letter = dead_letter_record(("a", 1), pickle.loads(pickle.dumps(Reason(code, "why"))))
        assert letter["code"] == code and letter["reason"] == "why"
    assert dead_letter_record("x", "plain text")["code"] == "invalid_record"
    with pytest.raises(ValueError, match="`code` must be one of"):
        Reason("no_such_code", "why")
