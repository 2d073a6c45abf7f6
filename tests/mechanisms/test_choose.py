"""choose(): the lowest exact error of everything compared, and the regimes of Andersson et al. 2026
Sec. 11."""
from __future__ import annotations

import pytest

from transforms.mechanisms import make
from transforms.mechanisms.choose import candidate_specs, choose


def test_choose_returns_the_lowest_error_of_the_table_for_both_metrics():
    for privacy in ({"epsilon": 1.0}, {"rho": 0.5}, {"epsilon": 1.0, "delta": 1e-6}):
        for metric, field in (("max", "max_se"), ("mean", "mean_se")):
            best, rows = choose(300, privacy, max_contributions=3, interval_bound=2,
                                metric=metric)
            assert getattr(best, field) == min(getattr(r, field) for r in rows)
            pure = "rho" not in privacy and "delta" not in privacy
            assert len(rows) == len(candidate_specs(300, pure_dp=pure))
            # the table's numbers are the mechanisms' own analytic errors
            again = make(best.mechanism, 300, **privacy, max_contributions=3, interval_bound=2,
                         seed=0, **best.params)
            assert again.max_se() == pytest.approx(best.max_se)


def test_every_odd_arity_3_to_41_is_compared():
    arities = {p["k"] for name, p in candidate_specs(10 ** 4) if name == "kary_subtraction"}
    assert arities == set(range(3, 42, 2))


@pytest.mark.parametrize("horizon", [1000, 4096])
def test_regimes(horizon):
    """Float noise, zCDP: square root for small k, naive for k close to T. Pure DP: k-ary
    subtraction with a large odd arity for small and moderate k, naive for k close to T. (With
    exact errors, the tree window that Andersson et al. 2026 Sec. 11 derives from asymptotic
    constants does
    not open for T <= 2^20; see docs/planning.md.) The discrete square root wins under zCDP too,
    within 1 % of the float one."""
    for k in (1, 2, 8):
        best, _ = choose(horizon, {"rho": 0.5}, k, noise="float")
        assert best.mechanism == "sqrt_toeplitz", (k, best)
        discrete, _ = choose(horizon, {"rho": 0.5}, k)  # the discrete square root
        assert discrete.mechanism == "sqrt_toeplitz", (k, discrete)
        assert discrete.max_se <= 1.01 * best.max_se  # its grid costs at most ~1 %
        best, _ = choose(horizon, {"epsilon": 1.0}, k)
        assert best.mechanism == "kary_subtraction" and best.params["k"] >= 5, (k, best)
    for privacy in ({"rho": 0.5}, {"epsilon": 1.0}):
        best, _ = choose(horizon, privacy, horizon)
        assert best.mechanism == "naive_composition"


def test_bad_metric():
    with pytest.raises(ValueError, match=r"^`metric` must be one of 'max', 'mean'; got 'p99'\.$"):
        choose(10, {"rho": 1.0}, metric="p99")


def test_a_new_mechanism_class_alone_enters_auto_and_make(monkeypatch):
    """A mechanism describes itself (parameters, candidates, rank, notes): registering its
    class is all `make`, `auto`'s candidates and `plan`'s notes need."""
    import transforms.mechanisms as mechanisms
    from transforms.mechanisms.choose import memory_note
    from transforms.mechanisms.toeplitz import NaiveComposition

    class Throwaway(NaiveComposition):
        name = "throwaway"
        accepts = ("spare",)
        auto_rank = 65  # after the BLT, before naive composition

        def __init__(self, horizon, budget, noise_source, *, spare=0, **kwargs):
            super().__init__(horizon, budget, noise_source, **kwargs)

        @classmethod
        def candidates(cls, horizon, noise, pure_dp):
            return [{"spare": 1}]

        @classmethod
        def memory_note(cls, noise):
            return "nothing spare"

    monkeypatch.setitem(mechanisms.MECHANISMS, "throwaway", Throwaway)
    monkeypatch.setitem(mechanisms.PARAMS, "throwaway", Throwaway.accepts)
    monkeypatch.setattr(mechanisms, "NAMES", tuple(mechanisms.MECHANISMS))
    names = [name for name, _ in candidate_specs(100, "discrete", True)]
    assert names[-3:] == ["throwaway", "naive_composition", "input_perturbation"]
    assert ("throwaway", {"spare": 1}) in candidate_specs(100)
    assert memory_note("throwaway") == "nothing spare"
    _, table = choose(97, {"epsilon": 1.0})  # a horizon no other test caches
    rows = {row.mechanism: row for row in table}
    assert rows["throwaway"].max_se == rows["naive_composition"].max_se
