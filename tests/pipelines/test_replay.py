"""`python3 -m pipelines.replay`: a user's own file of events, replayed live into a streaming
config's topic on the local Pub/Sub emulator (started and stopped by the command)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

from pipelines import emulator as pubsub
from pipelines import replay

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORIGIN = 1767571200.0  # 2026-01-05T00:00:00Z, configs/streaming/active_users.yaml's origin


def test_times_are_written_back_as_the_config_reads_them():
    from pipelines.io import parse_cell
    for fmt in ("iso", "seconds", "milliseconds"):
        assert parse_cell("ts", "timestamp", replay.time_text(ORIGIN + 1.5, fmt),
                          fmt) == ORIGIN + 1.5


@pytest.mark.skipif(pubsub.available() is not None, reason="no Pub/Sub emulator here")
def test_a_users_own_events_in_milliseconds_are_replayed_step_by_step(tmp_path):
    """Events of two hours (times in epoch milliseconds, one line unreadable, one outside the
    steps) replayed as two steps of 2 s: both steps published, one record per public key,
    each key's running count at least its events (noise aside: the counts are large), no
    late dead letter."""
    keys = ["eu-west", "us-east"]
    rows = [{"user": f"u{i}", "region": keys[i % 2], "ts": int((ORIGIN + 60 * i) * 1000)}
            for i in range(100)]  # 100 minutes: steps 0 and 1
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in rows)
                      + "not json\n" + json.dumps(dict(rows[0], ts=int(ORIGIN * 1000)
                                                         + 10 * 3600 * 1000)) + "\n")
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "streaming", "active_users.yaml")))
    raw["input"].update(timestamp_format="milliseconds", timestamp_attribute="ms")
    raw.update(public_keys=keys, privacy={"epsilon": 50.0})
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump(raw))
    # (a subprocess: the local streaming runner's patches stay in the process that ran it)
    done = subprocess.run([sys.executable, "-m", "pipelines.replay", "--config", str(config),
                           "--input", str(events), "--steps", "2", "--output",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "replaying 100 events of 2 steps of 3600 s as steps of 2 s (2 lines outside " \
           "those steps or unreadable, not sent)" in out and "2 of 2 steps published" in out
    folder = glob.glob(str(tmp_path / "out" / "replay-*" / "active-users-live"))[0]
    records = [json.loads(line) for step in (0, 1)
               for line in open(os.path.join(folder, "steps", f"step-{step:08d}.jsonl"))]
    assert [(r["step"], r["key"]) for r in records] == [(s, k) for s in (0, 1) for k in keys]
    assert all(r["value"] > 20 for r in records if r["step"] == 1)  # 50 events per key
    dead = [json.loads(line) for path in glob.glob(folder + "-operator/dead_letters-*.jsonl")
            for line in open(path)]
    assert not [d for d in dead if d["code"] == "late"], dead


def test_a_file_with_nothing_to_send_is_refused_before_the_emulator_starts(tmp_path, capsys):
    """CSV (or anything unreadable as JSON lines): nothing would be sent, so nothing runs."""
    events = tmp_path / "events.csv"
    events.write_text("ts,user,region\n1767571200,u1,eu-west\n")
    assert replay.main(["--config", os.path.join(ROOT, "configs", "streaming",
                                                 "active_users.yaml"),
                        "--input", str(events), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `--input` must be JSON lines with events in the config's "
                          "first 2 steps (field 'ts', iso); got ") and err.count("\n") == 1, err
    assert "2 lines, none sent" in err


def test_the_compressed_config_allows_the_publishers_own_delay(tmp_path):
    """A config with no lateness gets 1 s (an event published just after a step's end would
    be late); a larger one is compressed with the steps; neither beyond what a config may
    allow."""
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "streaming", "active_users.yaml")))
    # at least 1 s, at most what a config allows (release_delay_steps x step / 2: 1 s at 2 s)
    for given, expected, step in ((None, 1.0, 2.0), (7200.0, 1.0, 2.0), (None, 0.5, 1.0)):
        steps = dict(raw["steps"], size_seconds=3600)
        steps.pop("allowed_lateness_seconds", None)
        if given is not None:
            steps["allowed_lateness_seconds"] = given
        path = tmp_path / f"c{given}-{step}.yaml"
        path.write_text(yaml.safe_dump(dict(raw, steps=steps)))
        folder = tmp_path / f"f{given}-{step}"
        folder.mkdir()
        written = replay.compressed_config(str(path), str(folder), ORIGIN, 3, step,
                                           str(tmp_path / "out"))  # (at most delay x step / 2)
        assert yaml.safe_load(open(written))["steps"]["allowed_lateness_seconds"] == expected


def test_a_config_with_no_horizon_is_replayed_with_the_mechanism_it_runs(tmp_path):
    """Its first --steps steps as the horizon (the replay stops), released by the horizon-free
    mechanism the config would run, not by the one auto picks for that horizon."""
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "streaming", "active_users.yaml")))
    raw["steps"]["horizon"], raw["privacy"] = "unbounded", {"rho": 0.5}
    path = tmp_path / "free.yaml"
    path.write_text(yaml.safe_dump(raw))
    written = yaml.safe_load(open(replay.compressed_config(
        str(path), str(tmp_path), ORIGIN, 3, 2.0, str(tmp_path / "out"))))
    assert written["steps"]["horizon"] == 3
    assert written["mechanism"] == {"name": "log_sqrt_toeplitz",
                                    "params": {"c": 4.0, "g": 1.7, "s": 16384.0}}
