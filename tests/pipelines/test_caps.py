"""pipelines.caps: what each candidate cap would cut of the data (operator-only) against the
noise it costs, computed with the job's own truncation machine."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from pipelines import caps
from pipelines import run as job_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_caps_agree_with_the_job_and_trade_cut_for_noise(tmp_path, capsys):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    config["output"] = {"path": str(tmp_path), "formats": ["jsonl"]}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert caps.main(["--config", str(path), "--vary", "max_contributions=2,6,12",
                      "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["not_private"] is True
    rows = {row["bounds"]["max_contributions"]: row for row in data["rows"]}
    cut = {k: sum(row["cut_not_private"].values()) for k, row in rows.items()}
    assert cut[2] > cut[6] > cut[12] > 0                          # larger caps cut less
    assert rows[2]["max_se"] < rows[6]["max_se"] < rows[12]["max_se"]  # and cost more noise
    # the configured cap (6) cuts exactly what the job itself reports cutting
    assert job_run.main(["--config", str(path), "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert cut[6] == sum(run["operator_not_private"]["truncated"].values())
    assert rows[6]["events_not_private"] == run["operator_not_private"]["events_in_window"]
    assert rows[6]["max_se"] == pytest.approx(run["public"]["max_se"], rel=1e-12)


@pytest.mark.parametrize("args,message", [
    (["--vary", "nope=1,2"], "`vary` must be NAME=V1,V2,... with NAME one of the transform's"),
    (["--vary", "max_contributions=0,2"], "`vary max_contributions` must be a comma-separated"),
    (["--vary", "max_contributions=a"], "`vary max_contributions` must be a comma-separated"),
    ([], "`vary` must be given at least once"),
])
def test_bad_arguments_are_one_line(args, message, capsys):
    assert caps.main(["--config", "demo:active_users", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_transforms_without_caps_are_refused(capsys):
    assert caps.main(["--config", "demo:signups", "--vary", "max_contributions=2"]) == 2
    assert "`transform` must be one with contribution caps" in capsys.readouterr().err


def test_the_worst_keys_are_the_shares_of_each_keys_events_cut(monkeypatch):
    """Per key: the share of its events the caps cut; over every key, the events cut add up
    to the total cut (count: one event is one unit of input), the largest shares first."""
    import collections
    from pipelines import config as job_config
    from pipelines import job_release
    job = job_config.load("demo:active_users")
    plan = job_release.release_plan(job)
    histories = caps.unit_histories(job, plan, 100_000)
    monkeypatch.setattr(caps, "WORST_KEYS", 1000)
    found = caps.cut_by(plan.truncation.problem, histories)
    events = collections.Counter(key for _, by_step in histories
                                 for payloads in by_step.values() for key, _ in payloads)
    shares = [k["share_cut"] for k in found["worst_keys"]]
    assert shares == sorted(shares, reverse=True) and len(shares) == len(events) == 6
    cut = sum(k["share_cut"] * events[k["key"]] for k in found["worst_keys"])
    # (shares are rounded to 1e-4)
    assert cut == pytest.approx(sum(found["cut"].values()), abs=1e-4 * sum(events.values()))


def test_signed_sums_list_no_worst_keys():
    """With signed values a key's kept total nets out its signs, so input minus kept is not
    what was cut: no per-key shares (the run's operator summary leaves them out too), never a
    share above 100 %."""
    from transforms import truncations
    signed = truncations.sum_(max_value=10.0, min_value=-10.0, max_contributions=5)
    histories = [("u", {0: [("a", 400.0), ("a", -300.0)], 1: [("b", -500.0)]})]
    found = caps.cut_by(signed.problem, histories)
    assert found["worst_keys"] == [] and found["events"] == 3
    plain = truncations.sum_(max_value=10.0, max_contributions=5)
    assert caps.cut_by(plain.problem, [("u", {0: [("a", 80.0), ("b", 60.0)]})])[
        "worst_keys"] == [{"key": "b", "share_cut": 1.0}, {"key": "a", "share_cut": 0.375}]
