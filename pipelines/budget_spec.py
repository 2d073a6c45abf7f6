"""A config's `budget:` section (`pipelines.budget` keeps the ledger it names)."""
from __future__ import annotations

import dataclasses
import datetime
from typing import Dict, Optional

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
