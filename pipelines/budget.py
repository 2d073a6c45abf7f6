"""A privacy budget that lasts: every release of a data source in one ledger, and a limit that
refuses the release that would exceed it.

    python3 -m pipelines.budget --config configs/my_job.yaml [--json]

lists the source's releases in the current period and their total. A config opts in with

    budget:
      source: web-events          # shared by every config that releases this source's people
      limit: {epsilon: 4}         # or {rho: 2}, or {epsilon: 4, delta: 1.0e-6}
      period: year                # none (the default), day, month or year (UTC calendar)
      ledger: /shared/ledgers     # default: <output.path>/.budget (one folder per host!)

and every release of it (`pipelines.run`, `pipelines.schedule`, a streaming launch) is
`charge`d before anything is claimed or published: the ledger's entries are verified, the
release's budget is composed with theirs (`compose`), and the release is refused in one line
when the total would exceed the limit; else it records itself as the next entry. A release
already in the ledger (a scheduled or streaming continuation) records nothing new.

The ledger of a source and period is `<ledger>/<source>/<period>/entry-NNNNNN.json`, entries
numbered from 1, each created with the claims' create-if-absent (`transforms.durable`), so of
two releases racing for entry n exactly one gets it; the other re-reads the ledger and is
composed again (and refused if both do not fit). Each entry holds the SHA-256 of the one
before it and a MAC keyed by the release secret (HMAC-SHA256 of the secret and the source):
an entry edited, forged without the secret, deleted in the middle or renumbered is refused,
and so is a ledger written under another secret. A release also leaves a receipt beside its
claims (`<output.path>/.releases/budget-<source>-<period>-<release>.json`): a ledger deleted
(or its last entries) while the output folder still holds receipts is refused. Two hosts with
two ledger folders keep two ledgers: configs of one source must name one shared `ledger`
(local or gs://).

Composition, of the budgets the ledger holds (`ReleasePlan.budget_spent`: the whole release,
key selection's delta and the input gate's share included):
- a limit in epsilon: the releases' epsilons add (pure DP; a release with rho or delta cannot
  be held by a pure limit and is refused);
- a limit in rho: rhos add, a pure release counting epsilon^2 / 2 (Bun and Steinke,
  "Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds", Prop.
  1.4 and Lemma 2.3); a delta cannot be held;
- a limit (epsilon, delta): the tightest of basic composition (epsilons add, deltas add; zCDP
  releases cannot take part), zCDP composition (rhos add; the deltas the releases carry
  besides rho add; epsilon = rho + 2 sqrt(rho ln(1 / delta_left)), Prop. 1.3 there) and,
  when `dp_accounting` is installed, its privacy loss distributions of the releases'
  (epsilon, delta) pairs (`_pld_epsilon`); the total says which (`by`).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import glob
import hashlib
import hmac
import json
import math
import os
import sys
from typing import Dict, List, Optional

from pipelines import config as job_config
from pipelines.budget_spec import BudgetSpec
from transforms.durable import create_if_absent
from transforms.validation import fail

ENTRY = "entry-{:06d}.json"


# ----- composition ------------------------------------------------------------------------------
def ledger_spend(spent: dict, selects: bool) -> dict:
    """What a release's ledger entry holds of its `budget_spent`: {"epsilon"} (pure DP),
    {"rho"} (zCDP), {"epsilon", "delta", "rho"} (rho-zCDP stated as (epsilon, delta)); a release
    that selects its keys adds its selection's delta as "extra_delta" to a pure or zCDP budget,
    and one whose (epsilon, delta) was split with the selection keeps (epsilon, delta) only."""
    spent = {k: float(v) for k, v in spent.items() if v is not None}
    if not selects or not spent.get("delta"):
        return {k: v for k, v in spent.items() if k != "delta" or v}
    if "rho" in spent and "epsilon" in spent:
        return {"epsilon": spent["epsilon"], "delta": spent["delta"]}
    main = {k: v for k, v in spent.items() if k != "delta"}
    return dict(main, extra_delta=spent["delta"])


def _rho(spend: dict) -> Optional[float]:
    """A spend's zCDP rho (pure: epsilon^2 / 2), or None (approximate DP with no rho)."""
    if "rho" in spend:
        return spend["rho"]
    if "delta" not in spend:
        return spend["epsilon"] ** 2 / 2
    return None


def _approximate(spend: dict):
    """A spend's (epsilon, delta), or None (zCDP stated by rho alone)."""
    if "epsilon" not in spend:
        return None
    return spend["epsilon"], spend.get("delta", 0.0) + spend.get("extra_delta", 0.0)


def compose(spends: List[dict], limit: Dict[str, float]) -> dict:
    """The total of `spends` (`ledger_spend`s) in the limit's terms: {"epsilon": E} (pure),
    {"rho": R}, or {"epsilon": E, "delta": D} (the tighter of basic and zCDP composition at the
    limit's delta); a total that cannot be stated in those terms is math.inf."""
    inf = math.inf
    if set(limit) == {"epsilon"}:
        pure = all(set(s) == {"epsilon"} for s in spends)
        return {"epsilon": sum(s["epsilon"] for s in spends) if pure else inf}
    rhos = [_rho(s) for s in spends]
    if set(limit) == {"rho"}:
        held = None not in rhos and not any(s.get("extra_delta") for s in spends)
        return {"rho": sum(rhos) if held else inf}
    pairs = [_approximate(s) for s in spends]
    basic = (sum(e for e, _ in pairs), sum(d for _, d in pairs)) if None not in pairs \
        else (inf, 0.0)
    if basic[1] > limit["delta"]:
        basic = (inf, basic[1])
    left = limit["delta"] - sum(s.get("extra_delta", 0.0) for s in spends)
    concentrated = inf
    if None not in rhos and left > 0:
        rho = sum(rhos)
        concentrated = rho + 2 * math.sqrt(rho * math.log(1 / left))
    loss = _pld_epsilon(pairs, limit["delta"]) if None not in pairs else inf
    best = min(basic[0], concentrated, loss)
    if best == basic[0]:
        return {"epsilon": basic[0], "delta": basic[1], "by": "basic composition"}
    if best == concentrated:
        return {"epsilon": concentrated, "delta": limit["delta"], "by": "zCDP"}
    return {"epsilon": loss, "delta": limit["delta"], "by": "privacy loss distributions"}


def _pld_epsilon(pairs: list, delta: float) -> float:
    """The epsilon at `delta` of the releases' (epsilon, delta) pairs composed by the privacy
    loss distributions of `dp_accounting` (each pair's dominating PLD, pessimistic: Doroshenko
    et al., "Connect the Dots: Tighter Discrete Approximations of Privacy Loss Distributions"),
    or inf when `dp_accounting` is not installed."""
    try:
        from dp_accounting.pld import common, privacy_loss_distribution as pld
    except ImportError:  # optional (the [test] extra has it): the other routes hold alone
        return math.inf
    total = None
    for (epsilon, own), count in sorted(collections.Counter(pairs).items()):
        one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(epsilon, own),
                                          value_discretization_interval=1e-4)
        part = one.self_compose(count) if count > 1 else one
        total = part if total is None else total.compose(part)
    found = total.get_epsilon_for_delta(delta) if total is not None else 0.0
    return float(found) if math.isfinite(found) else math.inf


def fits(total: dict, limit: Dict[str, float]) -> bool:
    """Whether `compose`'s total is within `limit` (up to float rounding)."""
    tolerance = 1e-9  # four releases of 1.0 fit a limit of 4.0 whatever the float sum
    return all(total[k] <= limit[k] * (1 + tolerance) for k in limit)


def text(budget: dict) -> str:
    return ", ".join(f"{k}={budget[k]:.4g}" for k in ("epsilon", "rho", "delta", "extra_delta")
                     if k in budget)


def summary_line(state: dict) -> str:
    """The ledger's line of a run summary (`charge`'s state)."""
    period = "all time" if state["period"] == "all" else f"period {state['period']}"
    return (f"budget:       source {state['source']!r} ({period}): {state['releases']} "
            f"releases, {text(state['total'])} of limit {text(state['limit'])}")


# ----- the ledger ------------------------------------------------------------------------------
RETRIES = 100  # entries lost to concurrent releases before a charge gives up (one line)


class Ledger:
    """The entries of one source and period under `spec.ledger`, verified with `secret`
    (`period`: a period id, e.g. the one a continued release started in; default: `now`'s)."""

    def __init__(self, spec: BudgetSpec, secret, now: float, period: str = None):
        self.spec, self.period = spec, period or spec.period_id(now)
        self.root = f"{spec.ledger.rstrip('/')}/{spec.source}"
        self.folder = f"{self.root}/{self.period}"
        self.key = hmac.new(secret.secret_bytes(), b"dp-continual-release/budget-ledger/"
                            + spec.source.encode("utf-8"), hashlib.sha256).digest()
        self.head = ""

    def _mac(self, body: dict) -> str:
        return hmac.new(self.key, json.dumps(body, sort_keys=True).encode("utf-8"),
                        hashlib.sha256).hexdigest()

    def _read(self, path: str) -> Optional[bytes]:
        from apache_beam.io.filesystems import FileSystems
        if not FileSystems.exists(path):
            return None
        with FileSystems.open(path) as handle:
            return handle.read()

    def terms(self, create: bool) -> None:
        """The source's terms (its limit and period), fixed by its first release
        (`<ledger>/<source>/terms.json`, MAC'd): a config of the source with other terms is
        refused (its own limit or period would escape the others')."""
        terms = {"limit": dict(sorted(self.spec.limit.items())), "period": self.spec.period}
        path = f"{self.root}/terms.json"
        data = self._read(path)
        if data is None and create:
            body = json.dumps(dict(terms, mac=self._mac(terms)), sort_keys=True)
            if create_if_absent(path, body.encode("utf-8")):
                return
            data = self._read(path)
        if data is None:
            return
        try:
            found = json.loads(data.decode("utf-8"))
            mac = found.pop("mac")
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
            found, mac = None, None
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac(found)):
            fail("budget ledger", "terms written under this secret (edited, forged or of "
                                  "another secret)", path)
        if found != terms:
            fail("budget", f"the terms source {self.spec.source!r} was started with (limit "
                           f"{text(found['limit'])}, period {found['period']})",
                 f"limit {text(terms['limit'])}, period {terms['period']}")

    def entries(self) -> List[dict]:
        """Every entry, verified: numbered 1..n, each MAC'd and chained to the one before."""
        from apache_beam.io.filesystems import FileSystems
        self.terms(create=False)
        found = sorted(m.path for m in FileSystems.match(
            [f"{self.folder}/entry-*.json"])[0].metadata_list)  # (errors are not "empty")
        entries, previous = [], ""
        for n, path in enumerate(found, start=1):
            if path.rsplit("/", 1)[-1] != ENTRY.format(n):
                fail("budget ledger", f"entries numbered 1..{len(found)} (entry {n} is missing: "
                                      f"a deleted entry is never forgotten)", path)
            data = self._read(path) or b""
            try:
                entry = json.loads(data.decode("utf-8"))
                mac = entry.pop("mac")
            except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
                entry, mac = None, None
            if not isinstance(entry, dict) or not isinstance(mac, str) or \
                    not hmac.compare_digest(mac, self._mac(entry)) or entry.get("n") != n or \
                    entry.get("previous") != previous:
                fail("budget ledger", "entries written by this source's releases under this "
                                      "secret (this one is edited, forged or of another "
                                      "secret)", path)
            entries.append(entry)
            previous = hashlib.sha256(data).hexdigest()
        self.head = previous
        return entries

    def entry_hash(self, n: int) -> Optional[str]:
        data = self._read(f"{self.folder}/{ENTRY.format(n)}")
        return None if data is None else hashlib.sha256(data).hexdigest()

    def charge(self, release_id: str, job: str, transform: str, spent: dict,
               now: float) -> dict:
        """Records the release (unless it is in the ledger already) once its budget fits the
        limit with every entry's; -> {entry, total, limit, new}. Refused in one line when it
        does not fit."""
        limit = self.spec.limit
        if math.inf in compose([spent], limit).values():
            fail("budget.limit", f"of a kind that holds this release ({text(spent)}; an "
                                 f"epsilon limit holds pure releases, rho no delta)",
                 text(limit))
        self.terms(create=True)
        for _ in range(RETRIES):
            entries = self.entries()
            for entry in entries:
                if entry["release_id"] == release_id:  # a continuation: recorded before
                    return self._state(entry["n"], entries, False)
            total = compose([e["spent"] for e in entries] + [spent], limit)
            if not fits(total, limit):
                before = compose([e["spent"] for e in entries], limit) if entries else \
                    {k: 0.0 for k in limit}
                fail("budget", f"within the limit of {self.spec.source!r} "
                               f"({self._period_text()}: {len(entries)} releases spent "
                               f"{text(before)}, this asks {text(spent)}, limit "
                               f"{text(limit)})", text(total))
            body = {"n": len(entries) + 1, "release_id": release_id, "job": job,
                    "transform": transform, "spent": spent, "previous": self.head,
                    "at": datetime.datetime.fromtimestamp(
                        now, datetime.timezone.utc).isoformat(timespec="seconds")}
            data = json.dumps(dict(body, mac=self._mac(body)), sort_keys=True).encode("utf-8")
            if create_if_absent(f"{self.folder}/{ENTRY.format(body['n'])}", data):
                return self._state(body["n"], entries + [body], True)
            # another release took entry n first: read the ledger again
        fail("budget ledger", f"an entry won within {RETRIES} tries (other releases of the "
                              f"source took every one; run again)", self.folder)

    def _period_text(self) -> str:
        return "all time" if self.period == "all" else f"period {self.period}"

    def _state(self, n: int, entries: List[dict], new: bool) -> dict:
        return {"source": self.spec.source, "period": self.period, "entry": n, "new": new,
                "releases": len(entries), "limit": dict(self.spec.limit),
                "total": compose([e["spent"] for e in entries], self.spec.limit)}


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
    where = f"source {state['source']!r} ({period}, {state['releases']} releases so far)"
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
    print(f"source {job.budget.source!r}, {ledger._period_text()}: {len(entries)} releases, "
          f"total {text(total) if entries else 'nothing'} of limit {text(job.budget.limit)}")
    for entry in entries:
        print(f"  {entry['n']:>3}  {entry['at']}  {entry['job']:<20} {entry['transform']:<16}"
              f" {entry['release_id']}  {text(entry['spent'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
