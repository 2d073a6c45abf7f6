"""A privacy budget that lasts: every release of a data source in one ledger
(`transforms.budget_ledger`), and a limit that refuses the release that would exceed it.

    python3 -m pipelines.budget --config configs/budget/web_events.yaml [--json]

lists the source's releases in the current period and their total. A config opts in with

    budget:
      source: web-events          # shared by every config that releases this source's people
      limit: {epsilon: 4}         # or {rho: 2}, or {epsilon: 4, delta: 1.0e-6}
      period: year                # none (the default), day, month or year (UTC calendar)
      ledger: /shared/ledgers     # every config of the source names this one folder

and every release of it (`pipelines.run`, `pipelines.schedule`, a streaming launch) is
`charge`d before anything is claimed or published: the ledger's entries are verified, the
release's budget is composed with theirs, and the release is refused in one line when the
total would exceed the limit; else it records itself as the next entry. A release already in
the ledger (a scheduled or streaming continuation) records nothing new, in the period it
started in. A release also leaves a receipt beside its claims
(`<output.path>/.releases/budget-<source>-<period>-<release>.json`): a ledger deleted (or its
last entries) while the output folder still holds receipts is refused.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import sys
from typing import List, Optional

from pipelines import config as job_config
from transforms.budget_ledger import (BudgetSpec, Ledger, compose, fits, ledger_spend,
                                      text)
from transforms.durable import create_if_absent
from transforms.validation import fail


def summary_line(state: dict) -> str:
    """The ledger's line of a run summary (`charge`'s state)."""
    period = "all time" if state["period"] == "all" else f"period {state['period']}"
    return (f"budget:       source {state['source']!r} ({period}): "
            f"{releases(state['releases'])}, {text(state['total'])} of limit "
            f"{text(state['limit'])}")


def releases(count: int) -> str:
    return f"{count} release" + ("" if count == 1 else "s")


def receipts(output_path: str, source: str) -> List[dict]:
    """The receipts of the source's releases in a local output folder (`charge`), each
    checked to be one; a damaged one is refused in one line."""
    found = []
    for path in sorted(glob.glob(f"{output_path.rstrip('/')}/.releases/budget-*.json")):
        try:
            with open(path, encoding="utf-8") as handle:
                receipt = json.load(handle)
            ok = isinstance(receipt, dict) and all(
                isinstance(receipt.get(k), t) for k, t in (
                    ("source", str), ("period", str), ("release_id", str), ("entry", int),
                    ("sha256", str)))
        except (OSError, ValueError, UnicodeDecodeError):
            ok = False
        if not ok:
            fail("budget receipt", "one a release of the source wrote (damaged)", path)
        if receipt["source"] == source:
            found.append(receipt)
    return found


def check_receipts(spec: BudgetSpec, secret, found: List[dict], now: float) -> None:
    """Every receipt names an entry the ledger holds with the same bytes: a ledger deleted, or
    cut short, under releases that were charged is refused."""
    for receipt in found:
        ledger = Ledger(spec, secret, now, receipt["period"])
        if ledger.entry_hash(receipt["entry"]) != receipt["sha256"]:
            fail("budget ledger", f"holding entry {receipt['entry']} of period "
                                  f"{receipt['period']} (a receipt names it: the ledger was "
                                  f"deleted or cut short)", ledger.folder)


def charge(job, transform, now: float = None) -> Optional[dict]:
    """`Ledger.charge` of the job's release, when its config has a budget, in the period it
    started in (a continuation of a release charged in an earlier period records nothing
    new); its receipt beside its claims. -> the ledger's state after it (public: budgets and
    counts of releases), or None without a budget."""
    spec = job.budget
    if spec is None:
        return None
    now = datetime.datetime.now(datetime.timezone.utc).timestamp() if now is None else now
    secret = job.secret.ref()
    local = "://" not in job.output.path
    found = receipts(job.output.path, spec.source) if local else []
    check_receipts(spec, secret, found, now)
    started = [r["period"] for r in found if r["release_id"] == transform.release_id]
    ledger = Ledger(spec, secret, now, started[0] if started else None)
    spend = ledger_spend(transform.summary()["budget_spent"], transform.selects)
    state = ledger.charge(transform.release_id, job.job, job.transform, spend, now)
    if local and state["new"]:
        path = f"{job.output.path.rstrip('/')}/.releases/budget-{spec.source}-" \
               f"{ledger.period}-{transform.release_id}.json"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        create_if_absent(path, json.dumps({
            "source": spec.source, "period": ledger.period, "release_id": transform.release_id,
            "entry": state["entry"], "sha256": ledger.entry_hash(state["entry"])},
            sort_keys=True).encode("utf-8"))
    return state


def preview(job, spent: dict, selects: bool, now: float = None) -> Optional[dict]:
    """What charging a release of the job (its `budget_spent`, whether it selects keys) would
    do now, without recording it: {source, period, releases, spent, asked, total, limit, fits}
    (`pipelines.plan --config`), or None without a budget."""
    if job.budget is None:
        return None
    now = datetime.datetime.now(datetime.timezone.utc).timestamp() if now is None else now
    ledger = Ledger(job.budget, job.secret.ref(), now)
    entries = ledger.entries()
    asked = ledger_spend(spent, selects)
    limit = job.budget.limit
    total = compose([e["spent"] for e in entries] + [asked], limit)
    return {"source": job.budget.source, "period": ledger.period, "releases": len(entries),
            "spent": compose([e["spent"] for e in entries], limit), "asked": asked,
            "total": total, "limit": dict(limit), "fits": fits(total, limit)}


def preview_text(state: dict) -> str:
    period = "all time" if state["period"] == "all" else f"period {state['period']}"
    where = f"source {state['source']!r} ({period}, {releases(state['releases'])} so far)"
    if not state["fits"]:
        return (f"budget: this release ({text(state['asked'])}) would exceed the limit of "
                f"{where}: {text(state['total'])} > {text(state['limit'])}; it would be refused")
    return (f"budget: this release would bring {where} to {text(state['total'])} of "
            f"{text(state['limit'])}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.budget",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        job = job_config.load(args.config)
        if job.budget is None:
            job_config.fail("budget", "given in the config (a source and a limit)", None)
        now = datetime.datetime.now(datetime.timezone.utc).timestamp()
        ledger = Ledger(job.budget, job.secret.ref(), now)
        entries = ledger.entries()
        if "://" not in job.output.path:
            check_receipts(job.budget, job.secret.ref(), receipts(
                job.output.path, job.budget.source), now)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    total = compose([e["spent"] for e in entries], job.budget.limit)
    if args.json:
        print(json.dumps({"source": job.budget.source, "period": ledger.period,
                          "limit": job.budget.limit, "total": total, "releases": entries},
                         indent=2, sort_keys=True))
        return 0
    print(f"source {job.budget.source!r}, {ledger._period_text()}: {releases(len(entries))}"
          + (f", total {text(total)} of limit {text(job.budget.limit)}" if entries else
             f" charged yet (a release of a config naming it records one); limit "
             f"{text(job.budget.limit)}"))
    for entry in entries:
        print(f"  {entry['n']:>3}  {entry['at']}  {entry['job']:<20} {entry['transform']:<16}"
              f" {entry['release_id']}  {text(entry['spent'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
