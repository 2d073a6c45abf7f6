"""What the live streaming tests (Pub/Sub, Kafka) compare: the steps a streaming job published
and the records of one batch run of the same config over the events sent."""
from __future__ import annotations

import glob
import json

from pipelines import run as job_run

JOB = "active-users-live"  # configs/streaming/active_users.yaml's job


def published_records(folder, horizon: int, keys) -> list:
    """The records of steps 0 .. horizon - 1 under `folder` (`<output>/<job>`), each step one
    record per public key, in (step, key) order."""
    live = [json.loads(line) for s in range(horizon)
            for line in open(folder / "steps" / f"step-{s:08d}.jsonl")]
    assert [(r["step"], r["key"]) for r in live] == [
        (s, k) for s in range(horizon) for k in sorted(keys)]
    return live


def records(patterns) -> list:
    """The records of the JSON-lines files matching `patterns` (globs)."""
    return [json.loads(line) for pattern in patterns for path in sorted(glob.glob(pattern))
            for line in open(path)]


def dead_letters(operator) -> list:
    return [json.loads(line) for path in sorted(glob.glob(str(operator / "dead_letters-*.jsonl")))
            for line in open(path)]


def batch_records(tmp_path, config_of, sent: list, fields: dict) -> list:
    """The records of one batch run over the events `sent`: `config_of(source)` writes the live
    job's config (output `tmp_path / "batch"`) with the file `source` as its input (no gate:
    a streaming job has none); in (step, key) order."""
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in sent))
    config = config_of({"path": str(data), "format": "jsonl", "timestamp_format": "seconds",
                        "fields": fields, "max_dead_letter_fraction": 1.0})
    assert job_run.main(["--config", config]) == 0
    batch = [json.loads(line) for path in glob.glob(
        str(tmp_path / "batch" / JOB / "records-*.jsonl")) for line in open(path)]
    return sorted(batch, key=lambda r: (r["step"], r["key"]))
