"""The budget ledger's core (transforms/budget_ledger.py): racing releases record one entry;
a deleted, edited, forged or renumbered entry is refused; a continuation records nothing new;
a period starts afresh; the composition's closed forms and dp_accounting's."""
from __future__ import annotations

import math
import multiprocessing
import os
import json
import secrets

import pytest

from transforms import SecretRef
from transforms import budget_ledger as budget
from transforms.validation import ValidationError


def _charge(args):
    """One process's charge of its release (`Ledger.charge`): True if recorded."""
    folder, release_id, key = args
    spec = budget.BudgetSpec("race", {"epsilon": 1.5}, "none", folder)
    try:
        budget.Ledger(spec, SecretRef(literal=key), 0.0).charge(
            release_id, "job", "count", {"epsilon": 1.0}, 0.0)
        return True
    except ValidationError:
        return False


def test_two_releases_racing_for_a_limit_that_holds_one_record_exactly_one(tmp_path):
    """20 trials of two processes charging at once (epsilon 1 each, limit 1.5): each trial
    records exactly one; the other is refused."""
    key = secrets.token_bytes(32)
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        for trial in range(20):
            folder = str(tmp_path / f"trial{trial}")
            won = pool.map(_charge, [(folder, f"{trial}a" * 4, key),
                                     (folder, f"{trial}b" * 4, key)])
            assert sorted(won) == [False, True], (trial, won)
            assert len(os.listdir(os.path.join(folder, "race", "all"))) == 1


def _ledger(tmp_path, n: int = 3, key: bytes = b"k" * 32):
    spec = budget.BudgetSpec("src", {"epsilon": 10.0}, "none", str(tmp_path / "ledger"))
    ledger = budget.Ledger(spec, SecretRef(literal=key), 0.0)
    for i in range(n):
        ledger.charge(f"release{i}", "job", "count", {"epsilon": 1.0}, 0.0)
    return ledger


@pytest.mark.parametrize("attack,message", [
    ("delete_middle", r"entries numbered 1..2 \(entry 2 is missing"),
    ("edit", r"edited, forged or of another secret"),
    ("forge", r"edited, forged or of another secret"),
    ("renumber", r"edited, forged or of another secret"),
])
def test_a_deleted_edited_or_forged_entry_is_refused(tmp_path, attack, message):
    ledger = _ledger(tmp_path)
    entry = lambda n: os.path.join(ledger.folder, budget.ENTRY.format(n))  # noqa: E731
    if attack == "delete_middle":
        os.remove(entry(2))
    elif attack == "edit":  # a release's spend made smaller
        body = json.loads(open(entry(2)).read())
        body["spent"] = {"epsilon": 0.1}
        open(entry(2), "w").write(json.dumps(body, sort_keys=True))
    elif attack == "forge":  # a valid entry under another secret
        other = _ledger(tmp_path / "other", 3, key=b"x" * 32)
        open(entry(3), "wb").write(open(os.path.join(other.folder, budget.ENTRY.format(3)),
                                        "rb").read())
    else:  # the last entry dropped and entry 2 replaced by it
        os.replace(entry(3), entry(2))
    with pytest.raises(ValidationError, match=message):
        ledger.charge("new", "job", "count", {"epsilon": 1.0}, 0.0)


def test_a_continuation_records_nothing_new_and_a_period_starts_afresh(tmp_path):
    spec = budget.BudgetSpec("src", {"rho": 1.0}, "year", str(tmp_path / "ledger"))
    key = SecretRef(literal=b"k" * 32)
    now, next_year = 1_790_000_000.0, 1_790_000_000.0 + 366 * 86400
    first = budget.Ledger(spec, key, now).charge("r1", "job", "count", {"rho": 0.75}, now)
    again = budget.Ledger(spec, key, now).charge("r1", "job", "count", {"rho": 0.75}, now)
    assert (first["entry"], first["new"], again["entry"], again["new"]) == (1, True, 1, False)
    with pytest.raises(ValidationError, match=r"1 release\(s\) spent rho=0.75, this asks "
                                              r"rho=0.5, limit rho=1\)"):
        budget.Ledger(spec, key, now).charge("r2", "job", "count", {"rho": 0.5}, now)
    later = budget.Ledger(spec, key, next_year).charge("r2", "job", "count", {"rho": 0.5},
                                                       next_year)
    assert (first["period"], later["period"], later["entry"]) == ("2026", "2027", 1)


def _zcdp_epsilon(rho: float, delta: float) -> float:
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def _dp_accounting_epsilon(pairs, delta: float) -> float:
    """dp_accounting's own composition of (epsilon, delta)-DP releases at `delta` (each one's
    dominating privacy loss distribution, composed), computed here from its API."""
    from dp_accounting.pld import common, privacy_loss_distribution as pld
    total = None
    for epsilon, own in pairs:
        one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(epsilon, own),
                                          value_discretization_interval=1e-4)
        total = one if total is None else total.compose(one)
    return total.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("spends,limit,expected", [
    # pure: epsilons add
    ([{"epsilon": 1.0}] * 3, {"epsilon": 4.0}, {"epsilon": 3.0}),
    # zCDP: rhos add, a pure release counting epsilon^2 / 2
    ([{"rho": 0.5}, {"epsilon": 1.0}], {"rho": 2.0}, {"rho": 1.0}),
    # what a limit cannot hold
    ([{"epsilon": 1.0, "delta": 1e-6}], {"epsilon": 4.0}, {"epsilon": math.inf}),
    ([{"rho": 0.5, "extra_delta": 1e-7}], {"rho": 2.0}, {"rho": math.inf}),
])
def test_pure_and_zcdp_limits_add(spends, limit, expected):
    assert budget.compose(spends, limit) == expected


MIXED = [  # (spends, delta of the limit)
    ([{"epsilon": 0.1}] * 40, 1e-6),  # many small pure releases
    ([{"epsilon": 1.0}] * 4, 1e-6),
    ([{"epsilon": 1.0, "delta": 1e-6, "rho": 0.0175}] * 3 + [{"epsilon": 0.5}], 1e-5),
    ([{"epsilon": 1.0, "extra_delta": 1e-7}, {"epsilon": 2.0, "delta": 1e-6}], 1e-5),  # keys
    ([{"rho": 0.05}] * 10 + [{"rho": 0.5, "extra_delta": 1e-7}], 1e-5),  # zCDP only
]


@pytest.mark.parametrize("spends,delta", MIXED)
def test_approximate_composition_is_the_tightest_of_basic_zcdp_and_dp_accounting(spends,
                                                                                 delta):
    """The total at the limit's delta is the smallest of basic composition, zCDP composition
    and dp_accounting's privacy loss distributions of the releases' (epsilon, delta) (zCDP
    releases stated by rho alone take no part in the first and the last)."""
    found = budget.compose(spends, {"epsilon": 100.0, "delta": delta})
    pairs = [(s["epsilon"], s.get("delta", 0.0) + s.get("extra_delta", 0.0))
             for s in spends if "epsilon" in s]
    rhos = [s.get("rho", s.get("epsilon", 0.0) ** 2 / 2) for s in spends]
    extra = sum(s.get("extra_delta", 0.0) for s in spends)
    candidates = {"zCDP": _zcdp_epsilon(sum(rhos), delta - extra)}
    if len(pairs) == len(spends):
        candidates["privacy loss distributions"] = _dp_accounting_epsilon(pairs, delta)
        if sum(d for _, d in pairs) <= delta:
            candidates["basic composition"] = sum(e for e, _ in pairs)
    best = min(candidates, key=candidates.get)
    assert found["by"] == best and found["epsilon"] == pytest.approx(candidates[best],
                                                                      rel=1e-9)
    assert found["epsilon"] <= min(candidates.values()) * (1 + 1e-9)


@pytest.mark.parametrize("spent,selects,entry", [
    ({"epsilon": 1.0}, False, {"epsilon": 1.0}),
    ({"rho": 0.5}, False, {"rho": 0.5}),
    ({"epsilon": 1.0, "rho": 0.0175, "delta": 1e-6}, False,
     {"epsilon": 1.0, "rho": 0.0175, "delta": 1e-6}),
    ({"epsilon": 1.0, "delta": 1e-6}, True, {"epsilon": 1.0, "extra_delta": 1e-6}),
    ({"rho": 0.5, "delta": 1e-6}, True, {"rho": 0.5, "extra_delta": 1e-6}),
    ({"epsilon": 1.0, "rho": 0.0175, "delta": 1e-6}, True, {"epsilon": 1.0, "delta": 1e-6}),
])
def test_what_a_release_records(spent, selects, entry):
    assert budget.ledger_spend(spent, selects) == entry


def test_a_ledger_that_cannot_be_listed_is_an_error_not_an_empty_ledger(tmp_path, monkeypatch):
    from apache_beam.io.filesystems import FileSystems
    ledger = _ledger(tmp_path, 1)

    def refused(patterns):
        raise OSError("403 Forbidden")
    monkeypatch.setattr(FileSystems, "match", refused)
    with pytest.raises(OSError, match="403"):
        ledger.charge("new", "job", "count", {"epsilon": 1.0}, 0.0)


def test_the_transforms_are_charged_when_applied_with_a_budget(tmp_path):
    """`ContinualCount(..., claims=, budget=)`: applying a private release charges it before
    its claim; a second release that would exceed the limit is refused when applied, nothing
    claimed (a continuation, the same release id, records nothing new: `Ledger.charge`)."""
    import apache_beam as beam
    from apache_beam.transforms.window import TimestampedValue
    from transforms import ContinualCount, TimeSteps
    key_file = tmp_path / "secret"
    key_file.write_text(secrets.token_hex(32))
    spec = budget.BudgetSpec("api", {"epsilon": 1.5}, "none", str(tmp_path / "ledger"))
    steps = TimeSteps(1_700_000_000.0, 60.0, 4)

    def count(**more):
        return ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0, max_contributions=2,
                              secret=SecretRef(path=str(key_file)),
                              claims=str(tmp_path / "claims"), ledger=spec, **more)

    def apply(transform):
        with beam.Pipeline() as pipeline:
            _ = (pipeline | beam.Create([TimestampedValue(("u", "a"), 1_700_000_001.0)])
                 | transform)

    first = count()
    apply(first)
    assert first.ledger_state["entry"] == 1 and first.ledger_state["new"]
    with pytest.raises(ValidationError, match=r"^`budget` must be within the limit of 'api'"):
        apply(count())
    assert sorted(os.listdir(tmp_path / "claims")) == [first.release_id]
    with pytest.raises(ValidationError, match=r"^`ledger` must be a BudgetSpec, with `claims`"):
        ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0, max_contributions=2,
                       secret=SecretRef(path=str(key_file)), ledger=spec)
    assert len(budget.Ledger(spec, SecretRef(path=str(key_file)), 0.0).entries()) == 1
