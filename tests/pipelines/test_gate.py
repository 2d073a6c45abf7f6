"""The input gate (pipelines/gate.py) and dead letters counted by stable code."""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import config as job_config
from pipelines import gate
from pipelines import run as job_run
from pipelines import schedule
from pipelines import job_release
from transforms import registry
from transforms.mechanisms.noise import ConstantNoiseSource, KeyedNoiseSource
from transforms.streams.records import CODES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _job(tmp_path, **changes):
    """The demo job's config with `changes`, written to the test's one config file: a test's
    configs are edits of one job's config (a batch run refuses to replace the output of
    another config file that kept the job's name)."""
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    config["secret"] = {"seed": 7, "insecure": True}
    for dotted, value in changes.items():
        section, _, field = dotted.partition("__")
        config[section][field] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def why(err: str) -> str:
    """The whole text of a refusal whose line ends in `Why: <file>`."""
    return open(err.split(" Why: ")[1].split()[0]).read()


def _public_files(tmp_path):
    return [p for p in glob.glob(str(tmp_path / "out" / "**"), recursive=True)
            if os.path.isfile(p) and "operator" not in p and "/.staging" not in p
            and "/.releases/" not in p]


def _problem(transform):
    """The transform's truncation with every required bound 1 (its `parse` is what counts)."""
    row = registry.SPECS[transform]
    return row.truncate({k: 1 for k, v in row.bounds.items() if v == registry.REQUIRED},
                        "discrete").problem


def _rule(limit=0.5, budget=None, transform="count", keys=("a", "b")):
    return gate.Gate(transform, registry.SPECS[transform].shape, limit, False, 0.0, 3600.0, 48,
                     frozenset(keys), {"share": 0.02, "budget": budget or {"epsilon": 0.02}},
                     _problem(transform))


def _source(value=0):
    return lambda: ConstantNoiseSource(value)


def test_the_threshold_is_the_noise_quantile_exactly():
    """P(X > tau) <= BETA < P(X > tau - 1), from the sampler's own law (both noise kinds)."""
    for budget in ({"epsilon": 0.02}, {"epsilon": 1.0}, {"rho": 0.01}, {"rho": 5.0}):
        sampler = _rule(budget=budget).sampler()
        tau = _rule(budget=budget).threshold()
        pmf = sampler.pmf(1e-15)
        centre = (len(pmf) - 1) // 2
        above = lambda t: float(np.sum(pmf[centre + t + 1:]))  # noqa: E731
        assert above(tau) <= gate.BETA < above(tau - 1), (budget, tau)


def test_the_score_counts_units_by_their_vote_and_unattributed_lines_by_their_records():
    rule = _rule(limit=0.5)  # p/q = 1/2: unusable +1, used -1, outside 0
    assert rule.score([10, 3, 5, 4]) == -10 + 3 + 0 + 4
    assert gate.vote([2, 2, 0, 2]) == gate.USED and gate.vote([0, 1, 3, 3]) == gate.OUTSIDE
    rule9 = _rule(limit=0.9)  # p/q = 9/10: unusable +1, used -9; one unit moves it by 9
    assert rule9.scores() == ((-9, 1, 0, 1), 1, 9)
    assert rule.verdict([10, 0, 0, 9], (0, 0), {}, _source())        # -1: passes
    assert rule.verdict([10, 0, 0, 9], (1 + rule.threshold(), 0), {}, _source())
    with pytest.raises(gate.GarbageInput, match="noisy excess"):
        rule.verdict([10, 0, 0, 9], (2 + rule.threshold(), 0), {}, _source())
    with pytest.raises(gate.GarbageInput, match="spent epsilon 0.02"):
        rule.verdict([0, 400, 0, 0], (0, 0), {}, _source())          # the newcomer's keys
    assert rule.verdict([0, 0, 400, 0], (0, 0), {}, _source())       # history: not garbage


def test_an_unreadable_file_is_structural_and_nothing_else_refuses_without_the_private_gate():
    structural = dataclasses.replace(_rule(), private=None)
    assert structural.verdict([0, 0, 0, 0], (10 ** 6, 0), {}, None)  # no private gate
    with pytest.raises(gate.GarbageInput, match="files that can be read"):
        structural.verdict([0, 0, 0, 0], (0, 1), {}, None)
    assert dataclasses.replace(structural, limit=1.0).verdict([0, 0, 0, 0], (0, 1), {}, None)


def test_a_refusal_prints_no_record_detail():
    """A record's detail (its cells) may be personal data: the refusal names codes and counts
    (operator-only), and only the config-made detail of a missing field."""
    with pytest.raises(gate.GarbageInput) as refused:
        _rule().verdict([0, 0, 0, 3000], (0, 0), {"bad_value": [
            3000, 0, "`user` must be an integer; got 'alice@x'"]}, _source())
    assert "alice" not in str(refused.value) and "bad_value: 3000" in str(refused.value)


def test_a_job_whose_every_record_is_a_dead_letter_exits_2_and_publishes_nothing(tmp_path,
                                                                                   capsys):
    """The newcomer's `key: cntry`: every record lacks the field; its unit is readable, so
    every user votes malformed."""
    path = _job(tmp_path, input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert job_run.main(["--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert len(err.split(" Why: ")[0]) < 200, err  # then the path of the whole text
    assert "noisy excess" in err and "(nothing published; the gate spent epsilon 0.02)" in err
    assert " Most: missing_field. Why: " in err, err  # the code to fix, on screen
    whole = why(err)  # the exact tallies and the dead letters: in the operator folder
    assert "missing_field: 3861" in whole and "missing field 'cntry'" in whole, whole
    where = whole.split("This run's dead letters: ")[1].split(" (operator-only")[0]
    assert len(glob.glob(where)) == 1 and "/.staging-" in where
    assert "[while running" not in err and out == ""
    assert _public_files(tmp_path) == []
    assert not os.path.exists(tmp_path / "out" / "active-users")


def test_the_newcomers_public_keys_in_another_case_are_refused(tmp_path, capsys):
    """Public keys that match none of the data (case) publish nothing: every user votes
    off_key, a noisy excess far over the threshold (904 users, noise sd 70.7, tau 311: this
    seed's run and any other refuse it with probability 1 - 0.5 exp(-593/50) > 1 - 1e-5)."""
    path = _job(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["public_keys"] = [key.upper() for key in config["public_keys"]]
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "noisy excess" in err and err.count("\n") == 1, err
    assert " Most: units off public_keys (check public_keys, input.fields.key). Why: " in err
    assert "Units (operator-only, exact): used 0, off_key " in why(err)
    assert _public_files(tmp_path) == []


def test_timestamps_in_milliseconds_read_as_seconds_are_refused_with_the_hint(tmp_path,
                                                                            capsys):
    """Every timestamp in milliseconds, read as seconds: the refusal's line says what to set."""
    data = tmp_path / "ms.jsonl"
    with open(data, "w") as handle:
        for row in _demo_rows():
            seconds = job_config.parse_time("ts", row["ts"])
            handle.write(json.dumps(dict(row, ts=int(seconds * 1000))) + "\n")
    path = _job(tmp_path, input__path=str(data), input__timestamp_format="seconds")
    assert job_run.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert " Most: bad_timestamp (milliseconds? see input.timestamp_format). Why: " in err, err
    assert len(err.split(" Why: ")[0]) < 200, err


def _publish_rates(score_a, score_b, runs, budget, seed):
    """How often the gate publishes at two scores, each run a fresh release (fresh noise)."""
    rule = _rule(budget=budget)
    published = [0, 0]
    rng = random.Random(seed)
    for _ in range(runs):
        release = rng.getrandbits(256).to_bytes(32, "big")
        source = (lambda r=release: KeyedNoiseSource(b"k" * 16, release=r))
        for i, score in enumerate((score_a, score_b)):
            try:
                rule.verdict([0, 0, 0, 0], (score, 0), {}, source)
                published[i] += 1
            except gate.GarbageInput:
                pass
    return published


def _cp(k, n, alpha):
    """Clopper-Pearson two-sided (1 - alpha) interval of k successes in n."""
    from scipy.stats import beta as beta_law  # noqa: PLC0415
    low = 0.0 if k == 0 else beta_law.ppf(alpha / 2, k, n - k + 1)
    high = 1.0 if k == n else beta_law.ppf(1 - alpha / 2, k + 1, n - k)
    return low, high


def _check_flip(runs, seed):
    """The issue's flip: one unit's vote moves the score by one unit's influence (1 at
    f = 1/2). Runs at the threshold, where the decision is most sensitive; the publish rates
    of the neighbours must not be told apart beyond e^eps_gate: the CP lower bound of each
    ratio stays <= e^eps (false failure <= 1e-6 per side by the CP level)."""
    eps = 0.02
    tau = _rule().threshold()
    with_victim, without = _publish_rates(tau, tau + 1, runs, {"epsilon": eps}, seed)
    for a, b in ((with_victim, without), (runs - with_victim, runs - without),
                 (without, with_victim), (runs - without, runs - with_victim)):
        low_a, _ = _cp(a, runs, 1e-6)
        _, high_b = _cp(b, runs, 1e-6)
        assert low_a / max(high_b, 1e-12) <= math.exp(eps), (a, b)
    return with_victim, without


def test_neighbouring_inputs_publish_at_rates_within_the_gates_epsilon_fast():
    _check_flip(300, 1)


@pytest.mark.slow
def test_neighbouring_inputs_publish_at_rates_within_the_gates_epsilon():
    a, b = _check_flip(2000, 2)
    assert 0.2 < a / 2000 < 0.8  # at the threshold: both outcomes happen (the flip is noisy)


def _demo_rows():
    return [json.loads(line) for line in open(os.path.join(ROOT, "pipelines", "demo_data",
                                                           "active_users.jsonl"))]


def test_records_outside_the_horizon_are_history_not_garbage(tmp_path, capsys):
    """Outside-horizon votes are neutral (a source may hold history): the private gate cannot
    tell 'no record in the horizon' from 'one', so a horizon that misses the data publishes
    noise (docs/privacy.md states it; the operator summary counts the events in it)."""
    missed = _job(tmp_path, steps__origin="2025-01-05T00:00:00Z")  # a year early
    assert job_run.main(["--config", str(missed)]) == 0
    assert "3861 dead letters (outside_horizon: 3861; the first outside_horizon: " in \
        capsys.readouterr().out
    short = _job(tmp_path, steps__horizon=12)  # 12 of the demo's 48 hours
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
    with open(data, "w") as handle:  # 20 % good, 80 % without their region
        for i, row in enumerate(rows):
            handle.write(json.dumps(row if i % 5 < 1 else {k: v for k, v in row.items()
                                                           if k != "region"}) + "\n")
    strict = _job(tmp_path, input__path=str(data))
    assert job_run.main(["--config", str(strict)]) == 2
    assert "missing_field: 3088" in why(capsys.readouterr().err)
    allowed = _job(tmp_path, input__path=str(data),
                   input__max_dead_letter_fraction=0.9)
    assert job_run.main(["--config", str(allowed)]) == 0
    summary = json.load(open(tmp_path / "out" / "active-users-operator" / "summary.json"))
    assert summary["dead_letters"] == {"missing_field": 3088}


def test_a_few_bad_bytes_cannot_hide_most_of_the_input(tmp_path, capsys):
    """Adversary's B1/B2: an open CSV quote swallowing the rest of the file, a JSON array on
    one line and unreadable Parquet files each stand for the records they hide."""
    rows = _demo_rows()
    fields = ["ts", "user", "region"]
    csv_path = tmp_path / "stray.csv"
    with open(csv_path, "w") as handle:
        handle.write(",".join(fields) + "\n")
        for i, row in enumerate(rows):
            region = ('"' + row["region"]) if i == 100 else row["region"]
            handle.write(f"{row['ts']},{row['user']},{region}\n")
    stray = _job(tmp_path, input__path=str(csv_path), input__format="csv")
    assert job_run.main(["--config", str(stray)]) == 0  # (second adversary review of #38)
    assert "3860 events in the horizon" in capsys.readouterr().out  # one record lost, not all
    letters = [json.loads(line) for p in glob.glob(
        str(tmp_path / "out" / "active-users-operator" / "dead_letters-*")) for line in open(p)]
    assert len(letters) == 1 and letters[0]["code"] == "unparseable"
    assert letters[0]["unit"] == repr(rows[100]["user"])  # its unit's one malformed vote
    array = tmp_path / "array.jsonl"
    with open(array, "w") as handle:
        for row in rows[:100]:
            handle.write(json.dumps(row) + "\n")
        handle.write(json.dumps(rows[100:]) + "\n")  # a JSON file's array on one line
    jsonl = _job(tmp_path, input__path=str(array))
    assert job_run.main(["--config", str(jsonl)]) == 2
    assert "noisy excess" in capsys.readouterr().err  # the array's items, by weight
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:100]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[100:]), folder / "part-1.parquet")
    data = (folder / "part-1.parquet").read_bytes()
    (folder / "part-1.parquet").write_bytes(data[:len(data) // 2])  # cut: unreadable
    cut = _job(tmp_path, input__path=str(folder / "*.parquet"),
               input__format="parquet")
    assert job_run.main(["--config", str(cut)]) == 2
    assert "got 1 file(s) that cannot be read" in capsys.readouterr().err
    anything = _job(tmp_path, input__path=str(folder / "*.parquet"),
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
    assert job_run.main(["--config", str(bad)]) == 2  # the schema lacks it: refused for free
    err = capsys.readouterr().err
    assert err == ("error: `input.fields.key` must be a column of the input (region, seconds, "
                   "ts, user); got 'cntry'.\n"), err
    assert _public_files(tmp_path) == []
    good = _job(tmp_path, input__path=str(tmp_path / "events.parquet"),
                input__format="parquet")
    assert job_run.main(["--config", str(good)]) == 0


def test_a_refused_scheduled_run_leaves_no_release_so_the_fixed_config_starts_it(tmp_path,
                                                                                   capsys):
    state = str(tmp_path / "state")
    bad = _job(tmp_path, input__fields={"timestamp": "ts", "unit": "user", "key": "cntry"})
    assert schedule.main(["--config", str(bad), "--state-dir", state,
                          "--now", "2026-01-06T12:00:00Z"]) == 2
    err = capsys.readouterr().err
    assert "Most: missing_field" in err and err.count("\n") == 1, err
    assert "missing_field: 3861" in why(err)  # the refusal's whole text, in the state dir
    assert not os.path.exists(os.path.join(state, "ledger.json"))
    refusals = glob.glob(os.path.join(state, "gate-refusals", "*.json"))  # what it spent
    assert len(refusals) == 1 and "the gate spent epsilon 0.02" in open(refusals[0]).read()
    assert not glob.glob(os.path.join(state, "commits", "*"))
    assert _public_files(tmp_path) == []
    fixed = _job(tmp_path)  # another field map: refused if the release had begun
    assert schedule.main(["--config", str(fixed), "--state-dir", state,
                          "--now", "2026-01-06T12:00:00Z"]) == 0
    assert glob.glob(str(tmp_path / "out" / "active-users-scheduled" / "*" / "records-*"))
    manifest, = glob.glob(str(tmp_path / "out" / "active-users-scheduled" / "*" /
                              "release.json"))
    assert json.load(open(manifest))["gate_refusals_before"] == {
        "count": 1, "spent": {"epsilon": 0.02}}  # what the refused run spent, stated


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
    cases = [(header, "csv", "`input.fields.key` must be a column of the input (ts, user, "
                             "'region\\n'); got 'region'."),  # a free refusal (the schema)
             (together, "jsonl", "Most: unparseable."),
             (corrupt, "parquet", "`input.path` must be Parquet files whose every page reads")]
    for i, (path, fmt, message) in enumerate(cases):
        job = _job(tmp_path, input__path=str(path), input__format=fmt)
        assert job_run.main(["--config", str(job)]) == 2, fmt
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert _public_files(tmp_path) == []


def test_the_figures_docs_privacy_states_are_the_gates():
    """docs/privacy.md's noise figures at the default share are what the rule computes."""
    text = " ".join(open(os.path.join(ROOT, "docs", "privacy.md")).read().split())
    for budget, words in (({"epsilon": 0.02}, "{sd:.1f} units for epsilon 1 (tau {tau})"),
                          ({"rho": 0.01}, "{sd:.1f} for rho 0.5 (tau {tau})")):
        rule = _rule(budget=budget)
        phrase = words.format(sd=math.sqrt(rule.sampler().variance), tau=rule.threshold())
        assert phrase in text, phrase
    assert gate.BETA == 1e-3 and "P(X > tau) <= 1e-3" in text


def test_a_nul_byte_in_a_record_is_that_records_not_the_files(tmp_path, capsys):
    """Adversary review of #38, 1: a NUL byte in the first record no longer stops the run (the
    file's first bytes are a person's record; only a compressed or Parquet file's magic, which
    no text record starts with, is structural)."""
    rows = _demo_rows()
    path = tmp_path / "nul.csv"
    with open(path, "w") as handle:
        handle.write("ts,user,region\n")
        handle.write(f"{rows[0]['ts']},vic\x00tim,{rows[0]['region']}\n")
        for row in rows[1:]:
            handle.write(f"{row['ts']},{row['user']},{row['region']}\n")
    job = _job(tmp_path, input__path=str(path), input__format="csv")
    assert job_run.main(["--config", str(job)]) == 0
    assert "3861 events in the horizon" in capsys.readouterr().out


def test_a_units_good_and_bad_records_are_one_gate_unit_in_every_transform():
    """Adversary review of #38, 3: integer edge ids were keyed two ways (a malformed record of
    an edge voted apart from its well-formed ones); the gate keys a row as `ToElement` does."""
    from pipelines import config as job_config
    from pipelines import io
    for name, good, unit_roles in (
            ("friend_degrees", {"ts": 1767571300, "a": 7, "b": 8, "op": "+"}, ("a", "b")),
            ("active_users", {"ts": "2026-01-05T00:10:00Z", "user": 7, "region": "x"},
             ("unit",)),
            ("cart_items", {"ts": "2026-01-05T00:10:00Z", "op": "+", "item": 7, "store": "c"},
             ("item",))):
        job = job_config.load(os.path.join(ROOT, "configs", f"{name}.yaml"))
        fields = job.input.fields
        row = {}
        for role, column in fields.items():
            row[column] = next((v for k, v in good.items() if k == column or k == role),
                               good.get(column))
        elements = list(io.ToElement(job).process(row))
        assert len(elements) == 1 and not hasattr(elements[0], "tag"), (name, elements)
        rule = gate.Gate.of(job, job_release.release_plan(job), private=False)
        unit, _ = rule.record_votes(elements[0].value, 1767571300.0)
        bad = dict(row, **{fields["timestamp"]: "not a time"})
        letter, = list(io.ToElement(job).process(bad))
        assert letter.value["unit"] == unit, (name, letter.value, unit)


def test_records_the_transform_refuses_vote_malformed():
    """Adversary review of #38, 6: an element the transform dead-letters (a misspelt op, a
    self-loop) is a malformed vote, not a used one."""
    rule = dataclasses.replace(_rule(transform="degree_count"), public_keys=None)
    assert rule.record_votes(("+", (1, 2)), 10.0) == (gate.unit_of(
        "degree_count", {"a": 1, "b": 2}), gate.USED)
    assert rule.record_votes(("x", (1, 2)), 10.0)[1] == gate.MALFORMED
    assert rule.record_votes(("+", (1, 1)), 10.0)[1] == gate.MALFORMED


def test_a_long_bad_json_line_counts_the_records_run_together_in_it():
    """Adversary review of #38, 5: weighed by its records (objects run together), not bytes."""
    from pipelines.io import ParseJson
    one = b'{"user": "victim", "note": "' + b"x" * 70000 + b"\n"
    three = b'{"a": 1}{"a": 2} {"a": 3' + b" " * 70000 + b"\n"
    weights = [list(ParseJson().process(line))[0].value.get("weight", 1)
               for line in (one, three)]
    assert weights == [1, 3]


def _score_of(tmp_path, name, lines):
    """The gate's exact score of a JSON-lines input, through the real reader and votes."""
    import apache_beam as beam
    from pipelines import config as job_config
    from pipelines import io
    data = tmp_path / f"{name}.jsonl"
    data.write_bytes(b"".join(lines))
    job = job_config.load(str(_job(tmp_path, input__path=str(data))))
    rule = dataclasses.replace(_rule(), transform="count", shape=("unit", "key"),
                               public_keys=frozenset(job.public_keys),
                               origin=job.steps.origin, size=job.steps.size_seconds,
                               horizon=job.steps.horizon)
    out = tmp_path / f"{name}.score"
    with beam.Pipeline(runner="FnApiRunner") as pipeline:
        elements, dead = io.read_elements(pipeline, job)
        read = dead | "Dead" >> beam.Flatten()
        votes = gate.votes_of(rule, elements, read)
        lines_ = read | beam.CombineGlobally(gate.LinesFn())
        _ = votes | beam.Map(lambda v, l: out.write_text(json.dumps(
            rule.score(v) + rule.scores()[1] * l[0])), beam.pvalue.AsSingleton(lines_))
    return int(out.read_text())


def test_one_persons_records_move_the_score_by_at_most_one_units_influence(tmp_path):
    """The issue's attacks through the real reader: 99 users' events and 100 malformed lines,
    with and without the victim's one event, the victim's own malformed lines (attributable:
    one vote), and one garbage line of 70 KB (one record, not a veto)."""
    rows = _demo_rows()
    users = sorted({row["user"] for row in rows})[:99]
    base = [json.dumps(row).encode() + b"\n" for row in rows if row["user"] in users]
    garbage = [b"not json %d\n" % i for i in range(100)]
    victim = dict(rows[0], user="victim")
    score = {
        "without": _score_of(tmp_path, "without", base + garbage),
        "with": _score_of(tmp_path, "with",
                          base + garbage + [json.dumps(victim).encode() + b"\n"]),
        "victim_bad": _score_of(tmp_path, "bad", base + garbage + [
            json.dumps(dict(victim, ts="not a time")).encode() + b"\n"] * 5),
        "long_line": _score_of(tmp_path, "long", base + garbage + [
            b'{"user": "victim", "note": "' + b"x" * 70_000 + b"\n"]),
    }
    influence = _rule().scores()[2]
    assert score["with"] == score["without"] - 1          # one used vote
    assert score["victim_bad"] == score["without"] + 1    # five bad lines: one unit, one vote
    assert score["long_line"] == score["without"] + 1     # one record's weight, exactly
    assert all(abs(s - score["without"]) <= influence for s in score.values())


def test_the_config_gates_exactly_the_transforms_whose_records_name_their_unit(tmp_path):
    from transforms import registry
    assert set(gate.UNIT_ROLES) == {n for n, s in registry.SPECS.items() if s.unit_roles}
    assert "release" not in gate.UNIT_ROLES  # a declared release's records name no unit


def test_a_refusals_line_stays_under_200_characters_before_its_file():
    """Huge figures (a 9-digit excess, a long budget) drop the cause from the line, never the
    limit: the whole text is in the file."""
    cause = "Most: units off public_keys (check public_keys, input.fields.key)."
    for excess, budget in ((570, "epsilon 0.02"), (123456789, "epsilon 0.0333333333333")):
        text = (f"{gate.REFUSAL}; got a noisy excess {excess} over 311 (nothing published; the "
                f"gate spent {budget}). {cause} The excess counts units ...")
        line = "error: " + gate.headline(text, "/x/refusal.txt")
        assert len(line.split(" Why: ")[0]) < 200, line
        assert (cause in line) == (excess == 570), line
