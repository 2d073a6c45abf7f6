"""The budget ledger through the commands (pipelines/budget.py, pipelines.run and
pipelines.schedule): every release of a source is charged before it publishes; one over the
limit is refused in one line; two launches racing publish one; a deleted ledger, other terms
and damaged receipts are refused; the bundled config; the config's `budget:` section."""
from __future__ import annotations

import glob
import json
import os
import secrets

import pytest
import yaml

from pipelines import budget
from pipelines import run as job_run
from pipelines.config import ConfigError, validate
from transforms.validation import ValidationError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config(tmp_path, limit: dict, name: str = "job", period: str = "none") -> str:
    """configs/active_users.yaml (epsilon 1, pure) under a private secret from a file, its
    releases charged to source `web-events`."""
    secret = tmp_path / "secret"
    if not secret.exists():
        secret.write_text(secrets.token_hex(32))
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    raw.update(secret={"path": str(secret)}, output={"path": str(tmp_path / name),
                                                     "formats": ["jsonl"]},
               budget={"source": "web-events", "limit": limit, "period": period,
                       "ledger": str(tmp_path / "ledger")})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def published(tmp_path, name: str = "job") -> int:
    return len(glob.glob(str(tmp_path / name / ".releases" / "*.claim")))


def test_runs_of_one_config_publish_until_the_limit_then_are_refused_in_one_line(
        tmp_path, capsys):
    """Under epsilon 2, a config spending epsilon 1 publishes two releases; the third is
    refused before anything is claimed, in one line stating spent, asked and limit."""
    path = config(tmp_path, {"epsilon": 2})
    codes = [job_run.main(["--config", path]) for _ in range(3)]
    assert codes == [0, 0, 2]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: `budget` must be within the limit of 'web-events' (all time: 2 "
                       "release(s) spent epsilon=2, this asks epsilon=1, limit epsilon=2); got "
                       "'epsilon=3'.") and len(err[-1]) < 200
    assert published(tmp_path) == 2
    assert budget.main(["--config", path, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["total"] == {"epsilon": 2.0} and [e["n"] for e in listed["releases"]] == [1, 2]


@pytest.mark.slow  # the first test's rule, ten times (the figure): about 10 s
def test_ten_runs_under_epsilon_4_publish_four(tmp_path, capsys):
    path = config(tmp_path, {"epsilon": 4})
    codes = [job_run.main(["--config", path]) for _ in range(10)]
    assert codes == [0] * 4 + [2] * 6 and published(tmp_path) == 4
    refusals = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("error: `budget` must be within")]
    assert len(refusals) == 6 and all("4 release(s) spent epsilon=4," in r for r in refusals)


def test_a_ledger_deleted_under_a_release_that_was_charged_is_refused(tmp_path, capsys):
    """The receipt beside the release's claims outlives a deleted ledger: the next release of
    the source is refused (and so is `pipelines.budget`), nothing claimed."""
    path = config(tmp_path, {"epsilon": 3})
    assert job_run.main(["--config", path]) == 0
    for name in glob.glob(str(tmp_path / "ledger" / "web-events" / "all" / "*")):
        os.remove(name)
    assert job_run.main(["--config", path]) == 2
    assert "`budget ledger` must be holding entry 1 of period all (a receipt names it: the " \
           "ledger was deleted or cut short)" in capsys.readouterr().err
    assert published(tmp_path) == 1
    assert budget.main(["--config", path]) == 2


@pytest.mark.parametrize("section,message", [
    ({"source": "a b", "limit": {"epsilon": 1}}, r"^`budget.source` must be a name"),
    ({"source": "s", "limit": {"epsilon": 0}}, r"^`budget.limit` must be \{epsilon: E\}"),
    ({"source": "s", "limit": {"delta": 1e-6}}, r"^`budget.limit` must be"),
    ({"source": "s", "limit": {"epsilon": 1, "delta": 1}}, r"^`budget.limit` must be"),
    ({"source": "s", "limit": {"rho": 1}, "period": "week"}, r"^`budget.period` must be one"),
    ({"source": "s", "limit": {"rho": 1}, "owner": "x"}, r"^`budget` must be a mapping"),
    ({"source": "s", "limit": {"rho": 1}}, r"^`budget.ledger` must be a folder \(local or "
                                           r"gs://\) every config of the source names"),
    ({"source": "s", "limit": {"epsilon": 10 ** 400}}, r"^`budget.limit` must be"),
    ({"source": "s" * 41, "limit": {"rho": 1}}, r"^`budget.source` must be a name of up to"),
])
def test_invalid_budget_sections_name_the_field(tmp_path, section, message):
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    raw.update(budget=section, secret={"seed": 1, "insecure": True})
    with pytest.raises(ConfigError, match=message):
        validate(raw)


def test_a_budget_needs_a_configured_secret():
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "active_users.yaml")))
    raw.update(budget={"source": "s", "limit": {"epsilon": 4}, "ledger": "/tmp/ledger"})
    with pytest.raises(ConfigError, match=r"^`secret` must be configured \(env, path, "
                                          r"gcp_secret or seed\) with a budget"):
        validate(raw)


def test_the_bundled_budget_config_is_active_users_with_a_budget(tmp_path, capsys):
    from pipelines.config import load
    bundled = load(os.path.join(ROOT, "configs", "budget", "web_events.yaml"))
    plain = load(os.path.join(ROOT, "configs", "active_users.yaml"))
    for part in ("transform", "steps", "privacy", "bounds", "public_keys", "mechanism"):
        assert getattr(bundled, part) == getattr(plain, part), part
    assert bundled.budget.source == "web-events" and bundled.budget.limit == {"epsilon": 3.0}
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "budget", "web_events.yaml")))
    raw["output"]["path"] = str(tmp_path / "out")
    raw["budget"]["ledger"] = str(tmp_path / "ledger")
    path = tmp_path / "web_events.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert [job_run.main(["--config", str(path)]) for _ in range(2)] == [0, 0]
    assert "budget:       source 'web-events' (period " in capsys.readouterr().out
    assert budget.main(["--config", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["releases"]) == 1  # one release, run twice


def test_a_scheduled_release_is_charged_once_across_its_runs(tmp_path):
    """Its first run records the release; the runs that continue it record nothing new, so a
    limit that holds one release holds all its runs; a second release of the source (another
    config, its own state directory) is refused before it writes anything."""
    from pipelines import schedule
    path = config(tmp_path, {"epsilon": 1.5})
    origin = 1767571200.0  # configs/active_users.yaml's origin
    for hours in (4, 9, 20):
        summary = schedule.run_once(path, str(tmp_path / "state"), origin + hours * 3600)
        assert summary["public"]["budget_ledger"]["releases"] == 1
        manifest = json.load(open(os.path.join(summary["published"], "release.json")))
        assert manifest["budget"] == {"source": "web-events", "period": "all", "entry": 1,
                                      "limit": {"epsilon": 1.5}}
    with pytest.raises(ValidationError, match=r"^`budget` must be within the limit of "
                                              r"'web-events' \(all time: 1 release\(s\) spent "
                                              r"epsilon=1,"):
        schedule.run_once(config(tmp_path, {"epsilon": 1.5}, name="job2"),
                          str(tmp_path / "state2"), origin + 4 * 3600)
    assert not (tmp_path / "job2").exists() or not list((tmp_path / "job2").rglob("*.jsonl"))


def test_a_config_of_the_source_with_other_terms_is_refused(tmp_path, capsys):
    """The source's first release fixes its limit and period: a config with a larger limit or
    another period (whose ledger would be another folder) is refused, nothing recorded."""
    assert job_run.main(["--config", config(tmp_path, {"epsilon": 2})]) == 0
    for limit, period in (({"epsilon": 100}, "none"), ({"epsilon": 2}, "month")):
        other = config(tmp_path, limit, name="other", period=period)
        assert job_run.main(["--config", other]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: `budget` must be the terms source 'web-events' was "
                              "started with (limit epsilon=2, period none); got 'limit ")
        assert len(err) < 200
    assert published(tmp_path, "other") == 0


def test_a_release_continued_in_a_later_period_stays_charged_to_its_first(tmp_path):
    """A scheduled release started in one year and continued in the next is charged once, to
    the year it started in; the next year's ledger holds nothing of it."""
    from pipelines import schedule
    path = config(tmp_path, {"epsilon": 1.5}, period="year")
    origin = 1767571200.0  # 2026-01-05
    import datetime as dt
    real = dt.datetime

    class _NextYear(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return real(2027, 2, 1, tzinfo=dt.timezone.utc)

    first = schedule.run_once(path, str(tmp_path / "state"), origin + 4 * 3600)
    assert first["public"]["budget_ledger"]["period"] == "2026"
    budget.datetime.datetime = _NextYear
    try:
        later = schedule.run_once(path, str(tmp_path / "state"), origin + 9 * 3600)
    finally:
        budget.datetime.datetime = real
    assert (later["public"]["budget_ledger"]["period"],
            later["public"]["budget_ledger"]["entry"]) == ("2026", 1)
    assert not (tmp_path / "ledger" / "web-events" / "2027").exists()


def test_receipts_of_another_source_and_damaged_ones(tmp_path, capsys):
    """A source named like another's prefix does not read its receipts; a damaged receipt is
    one line."""
    path = config(tmp_path, {"epsilon": 3})
    raw = yaml.safe_load(open(path))
    raw["budget"]["source"] = "web-events-all"
    raw["job"] = "active-users-all"  # its own job: its own output set
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    assert job_run.main(["--config", str(other)]) == 0
    assert job_run.main(["--config", path]) == 0  # its ledger holds none of those receipts
    receipt = glob.glob(str(tmp_path / "job" / ".releases" / "budget-web-events-all-*"))[0]
    open(receipt, "w").write("{}")
    assert job_run.main(["--config", path]) == 2
    assert capsys.readouterr().err.strip().startswith(
        "error: `budget receipt` must be one a release of the source wrote (damaged); got ")


@pytest.mark.slow  # 20 trials of two batch jobs at once: about 50 s
def test_two_launches_racing_for_a_limit_that_holds_one_publish_one(tmp_path):
    """20 trials: two `pipelines.run` processes of one config (epsilon 1 each) start together
    under a limit of 1.5: exactly one exits 0 and publishes, the other exits 2 in one line."""
    import subprocess
    import sys
    for trial in range(20):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        path = config(folder, {"epsilon": 1.5})
        jobs = [subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", path],
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
        codes = sorted(job.wait(120) for job in jobs)
        assert codes == [0, 2], (trial, [job.stderr.read()[-300:] for job in jobs])
        assert published(folder) == 1
