"""A privacy budget per data source across releases, Beam-free: the ledger and the
composition (`pipelines.budget` is its command and its config's glue).

A ledger of one source and period is `<ledger>/<source>/<period>/entry-NNNNNN.json`, entries
numbered from 1, each created with the claims' create-if-absent (`transforms.durable`), so of
two releases racing for entry n exactly one gets it; the other re-reads the ledger and is
composed again (and refused if both do not fit). Each entry holds the SHA-256 of the one
before it and a MAC keyed by the release secret (HMAC-SHA256 of the secret and the source):
an entry edited, forged without the secret, deleted in the middle or renumbered is refused,
and so is a ledger written under another secret. The source's first release fixes its terms
(limit and period, `terms.json`, MAC'd): a release under other terms is refused.

Composition, of the budgets the ledger holds (`ledger_spend` of `ReleasePlan.budget_spent`:
the whole release, key selection's delta and the input gate's share included):
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

>>> compose([{"epsilon": 1.0}, {"rho": 0.5}], {"rho": 2.0})
{'rho': 1.0}
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import hmac
import json
import math
from typing import Dict, List, Optional

from transforms.durable import create_if_absent
from transforms.validation import fail

PERIODS = ("none", "day", "month", "year")
LIMIT_KINDS = ({"epsilon"}, {"rho"}, {"epsilon", "delta"})


@dataclasses.dataclass(frozen=True)
class BudgetSpec:
    """A config's `budget:` section, checked (`spec_of`)."""
    source: str
    limit: Dict[str, float]
    period: str = "none"
    ledger: str = ""

    def period_id(self, now: float) -> str:
        """The calendar period (UTC) that holds time `now`: all, YYYY, YYYY-MM or YYYY-MM-DD."""
        day = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).date().isoformat()
        return {"none": "all", "year": day[:4], "month": day[:7], "day": day}[self.period]


def spec_of(raw) -> Optional[BudgetSpec]:
    """The `budget:` section of a config (None when absent), each error naming its field."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"source", "limit", "period", "ledger"}:
        fail("budget", "a mapping of source, limit and optionally period and ledger", raw)
    source = raw.get("source")
    if not isinstance(source, str) or not 0 < len(source) <= 40 or not all(
            c.isalnum() or c in "._-" for c in source):
        fail("budget.source", "a name of up to 40 letters, digits, '.', '_' and '-'", source)
    limit = raw.get("limit")
    if not isinstance(limit, dict) or set(limit) not in LIMIT_KINDS or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6
            for v in limit.values()) or limit.get("delta", 0.5) >= 1:
        fail("budget.limit", "{epsilon: E}, {rho: R} or {epsilon: E, delta: D} with positive "
                             "numbers below 1e6 (D < 1)", limit)
    period = raw.get("period", "none")
    if period not in PERIODS:
        fail("budget.period", "one of " + ", ".join(repr(p) for p in PERIODS), period)
    ledger = raw.get("ledger")
    if not isinstance(ledger, str) or not ledger:  # (a default per output folder would let a
        # new output.path start a new ledger)
        fail("budget.ledger", "a folder (local or gs://) every config of the source names",
             ledger)
    return BudgetSpec(source, {k: float(v) for k, v in limit.items()}, period, ledger)


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
                               f"({self._period_text()}: {len(entries)} release(s) spent "
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
