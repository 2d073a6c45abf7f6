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


def test_the_verdict_counts_malformed_records_and_refuses_no_good_record_at_any_limit():
    gate.verdict(10, 0, {"bad_value": [5, 0, "x"]}, 0.5)                 # half: passes
    gate.verdict(10, 0, {"late": [10, 0, "x"], "exact_totals": [3, 0, "x"]}, 0.5)  # not input
    gate.verdict(10, 0, {"outside_horizon": [9, 0, "x"]}, 0.5)  # history: not malformed
    gate.verdict(0, 0, {}, 0.0)                                          # empty input passes
    with pytest.raises(gate.GarbageInput, match="got 6 malformed and 0 outside the horizon "
                                                "of 10 records"):
        gate.verdict(10, 0, {"bad_value": [6, 0, "x"]}, 0.5)
    with pytest.raises(gate.GarbageInput, match="got 0 malformed and 10 outside the horizon"):
        gate.verdict(10, 0, {"outside_horizon": [10, 0, "x"]}, 0.5)  # a horizon missing it all
    gate.verdict(10, 0, {"outside_horizon": [10, 0, "x"]}, 1.0)  # the operator's override
    with pytest.raises(gate.GarbageInput, match="got 3 malformed and 0 outside the horizon of 3"):
        gate.verdict(0, 3, {"unparseable": [3, 0, "invalid JSON line"]}, 1.0)
    with pytest.raises(gate.GarbageInput, match=r"missing_field \(a row without a mapped "
                                                r"field\): 4, e.g. missing field 'x'"):
        gate.verdict(4, 0, {"missing_field": [4, 0, "missing field 'x'"]}, 1.0)
    with pytest.raises(gate.GarbageInput, match="and 1 unreadable file"):
        gate.verdict(100, 1, {"unparseable": [0, 1, "unreadable Parquet file"]}, 0.5)
    gate.verdict(100, 1, {"unparseable": [0, 1, "unreadable Parquet file"]}, 1.0)
    assert INPUT_CODES < set(CODES)


def test_a_refusal_prints_no_record_detail():
    """A record's detail (its cells) may be personal data: the refusal names codes and counts,
    and only the config-made detail of a missing field."""
    with pytest.raises(gate.GarbageInput) as refused:
        gate.verdict(3, 0, {"bad_value": [3, 0, "`user` must be an integer; got 'alice@x'"]},
                     0.5)
    assert "alice" not in str(refused.value)


def test_a_job_whose_every_record_is_a_dead_letter_exits_2_and_publishes_nothing(tmp_path,
                                                                                   capsys):
    """The newcomer's `key: cntry`: every record lacks the field."""
    path = _job(tmp_path, input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert job_run.main(["--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "got 3861 malformed and 0 outside the horizon of 3861 records" in err
    assert "missing_field" in err and "missing field 'cntry'" in err
    assert "Nothing was published and no privacy budget was spent" in err
    where = err.split("This run's dead letters: ")[1].split(" (operator-only")[0]
    assert len(glob.glob(where)) == 1 and "/.staging-" in where
    assert "[while running" not in err and out == ""
    assert _public_files(tmp_path) == []
    assert not os.path.exists(tmp_path / "out" / "active-users")


def _demo_rows():
    return [json.loads(line) for line in open(os.path.join(ROOT, "pipelines", "demo_data",
                                                           "active_users.jsonl"))]


def test_a_horizon_that_misses_all_data_is_refused_but_history_outside_it_is_not(tmp_path,
                                                                              capsys):
    missed = _job(tmp_path, steps__origin="2025-01-05T00:00:00Z")  # a year early
    assert job_run.main(["--config", str(missed)]) == 2
    err = capsys.readouterr().err
    assert "got 0 malformed and 3861 outside the horizon of 3861 records" in err, err
    assert _public_files(tmp_path) == []
    short = _job(tmp_path, "short.yaml", steps__horizon=12)  # 12 of the demo's 48 hours
    assert job_run.main(["--config", str(short)]) == 0
    summary = json.load(open(tmp_path / "out" / "active-users-operator" / "summary.json"))
    assert list(summary["dead_letters"]) == ["outside_horizon"]
    assert summary["dead_letter_examples"]["outside_horizon"].startswith("event time ")
    letters = [json.loads(line) for p in glob.glob(
        str(tmp_path / "out" / "active-users-operator" / "dead_letters-*")) for line in open(p)]
    assert letters and {letter["code"] for letter in letters} == {"outside_horizon"}
    assert sum(summary["dead_letters"].values()) == len(letters)


def test_the_fraction_of_malformed_records_is_the_operators(tmp_path, capsys):
    rows = _demo_rows()
    data = tmp_path / "events.jsonl"
    with open(data, "w") as handle:  # 40 % good, 60 % without their region
        for i, row in enumerate(rows[:1000]):
            handle.write(json.dumps(row if i % 5 < 2 else {k: v for k, v in row.items()
                                                           if k != "region"}) + "\n")
    strict = _job(tmp_path, input__path=str(data))
    assert job_run.main(["--config", str(strict)]) == 2
    assert "got 600 malformed and 0 outside the horizon of 1000 records" in \
        capsys.readouterr().err
    allowed = _job(tmp_path, "allowed.yaml", input__path=str(data),
                   input__max_dead_letter_fraction=0.9)
    assert job_run.main(["--config", str(allowed)]) == 0
    summary = json.load(open(tmp_path / "out" / "active-users-operator" / "summary.json"))
    assert summary["dead_letters"] == {"missing_field": 600}


def test_a_few_bad_bytes_cannot_hide_most_of_the_input(tmp_path, capsys):
    """Adversary's B1/B2: an open CSV quote swallowing the rest of the file, a JSON array on
    one line and unreadable Parquet files each stand for the records they hide."""
    rows = _demo_rows()
    fields = ["ts", "user", "region"]
    csv_path = tmp_path / "stray.csv"
    with open(csv_path, "w") as handle:
        handle.write(",".join(fields) + "\n")
        for i, row in enumerate(rows):
            user = ('"' + row["user"]) if i == 100 else row["user"]
            handle.write(f"{row['ts']},{user},{row['region']}\n")
    stray = _job(tmp_path, "csv.yaml", input__path=str(csv_path), input__format="csv")
    assert job_run.main(["--config", str(stray)]) == 2
    assert f"got {len(rows) - 100} malformed" in capsys.readouterr().err
    array = tmp_path / "array.jsonl"
    with open(array, "w") as handle:
        for row in rows[:100]:
            handle.write(json.dumps(row) + "\n")
        handle.write(json.dumps(rows[100:]) + "\n")  # a JSON file's array on one line
    jsonl = _job(tmp_path, "array.yaml", input__path=str(array))
    assert job_run.main(["--config", str(jsonl)]) == 2
    assert f"got {len(rows) - 100} malformed" in capsys.readouterr().err
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:100]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[100:]), folder / "part-1.parquet")
    data = (folder / "part-1.parquet").read_bytes()
    (folder / "part-1.parquet").write_bytes(data[:len(data) // 2])  # cut: unreadable
    cut = _job(tmp_path, "pq.yaml", input__path=str(folder / "*.parquet"),
               input__format="parquet")
    assert job_run.main(["--config", str(cut)]) == 2
    assert "and 1 unreadable file(s)" in capsys.readouterr().err
    anything = _job(tmp_path, "pq1.yaml", input__path=str(folder / "*.parquet"),
                    input__format="parquet", input__max_dead_letter_fraction=1.0)
    assert job_run.main(["--config", str(anything)]) == 0
    assert _public_files(tmp_path)


def test_the_parquet_reader_counts_its_rows_and_is_gated_alike(tmp_path, capsys):
    rows = [json.loads(line) for line in open(os.path.join(ROOT, "pipelines", "demo_data",
                                                           "active_users.jsonl"))]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "events.parquet")
    bad = _job(tmp_path, input__path=str(tmp_path / "events.parquet"), input__format="parquet",
               input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert job_run.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"got {len(rows)} malformed and 0 outside the horizon of {len(rows)} records" \
        in err, err
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


def test_a_scheduled_release_may_start_after_the_history_its_source_holds(tmp_path):
    """Adversary's B3: the source keeps its history, from before the release's origin."""
    late = _job(tmp_path, steps__origin="2026-01-06T04:00:00Z", steps__horizon=20)
    assert schedule.main(["--config", str(late), "--state-dir", str(tmp_path / "state"),
                          "--now", "2026-01-06T10:10:00Z"]) == 0


def test_a_second_review_of_hidden_records(tmp_path, capsys):
    """Second adversary review: a CSV header whose open quote swallows the file, JSON records
    run together on one long line, a Parquet page that fails mid-read: each refused in one
    line, nothing public."""
    rows = _demo_rows()
    header = tmp_path / "header.csv"
    with open(header, "w") as handle:
        handle.write('ts,user,"region\n')
        for row in rows:
            handle.write(f"{row['ts']},{row['user']},{row['region']}\n")
    together = tmp_path / "together.jsonl"
    with open(together, "w") as handle:
        for row in rows[:10]:
            handle.write(json.dumps(row) + "\n")
        handle.write("".join(json.dumps(row) for row in rows[10:]) + "\n")
    corrupt = tmp_path / "corrupt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), corrupt, compression="snappy")
    data = bytearray(corrupt.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 200):
        data[i] ^= 0x55
    corrupt.write_bytes(bytes(data))
    cases = [(header, "csv", "3862 malformed"), (together, "jsonl", "1 unreadable file"),
             (corrupt, "parquet", "`input.path` must be Parquet files whose every page reads")]
    for i, (path, fmt, message) in enumerate(cases):
        job = _job(tmp_path, f"case{i}.yaml", input__path=str(path), input__format=fmt)
        assert job_run.main(["--config", str(job)]) == 2, fmt
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert _public_files(tmp_path) == []
