"""Privacy records and conversions, checked against Google's dp_accounting."""
from __future__ import annotations

import math

import pytest

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402

from transforms.mechanisms import make  # noqa: E402
from transforms.mechanisms.accounting import (LaplaceRelease, PureDp, Zcdp, compose,  # noqa: E402
                                              pure_to_zcdp, split)


def pld_epsilon(event, delta):
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 10.0])
def test_zcdp_of_a_gaussian_matches_dp_accounting_rdp(sigma):
    """rho = 1 / (2 sigma^2) for unit sensitivity: the RDP curve alpha * rho, to 1e-6."""
    accountant = rdp_privacy_accountant.RdpAccountant(orders=[2.0, 8.0, 32.0])
    accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    rho = 1.0 / (2.0 * sigma ** 2)
    for order, rdp in zip([2.0, 8.0, 32.0], accountant._rdp):
        assert rdp == pytest.approx(order * rho, rel=1e-6)


@pytest.mark.parametrize("rho,delta", [(0.05, 1e-6), (0.5, 1e-6), (2.0, 1e-9), (0.5, 1e-3)])
def test_we_never_claim_smaller_epsilon_than_the_exact_pld_for_gaussian_noise(rho, delta):
    sigma = 1.0 / math.sqrt(2.0 * rho)
    exact = pld_epsilon(dp_accounting.GaussianDpEvent(sigma), delta)
    ours = Zcdp(rho).epsilon_at(delta)
    assert ours >= exact - 1e-6


@pytest.mark.parametrize("l1,l2,b", [(1.0, 1.0, 1.0), (10.0, 10.0 ** 0.5, 4.0),
                                     (7.0, 7 ** 0.5, 1.0)])
def test_laplace_release_epsilon_matches_or_exceeds_exact_pld(l1, l2, b):
    """Pure part equals dp_accounting's PLD epsilon (up to its 1e-4 discretisation); Thm 1.3 for
    the multi-coordinate release is never below the PLD of the worst-case l1 = l2 mass."""
    release = LaplaceRelease(l1, l2, b)
    single = LaplaceRelease(1.0, 1.0, b)
    assert single.pure.epsilon == pytest.approx(
        pld_epsilon(dp_accounting.LaplaceDpEvent(b), 1e-12), rel=1e-3, abs=1e-3)
    # dp_accounting composes per-coordinate Laplace releases: l1 mass spread over m coordinates
    # of weight l1/m each, with m = (l1/l2)^2 (so l2 matches); our claim must not be smaller.
    coordinates = round((l1 / l2) ** 2)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.LaplaceDpEvent(b / (l1 / coordinates)), coordinates)
    for delta in (1e-3, 1e-6):
        assert release.epsilon_at(delta) >= accountant.get_epsilon(delta) - 1e-6


def test_mechanism_budget_reports_consistently_with_dp_accounting():
    """A zCDP mechanism's node sigma composed in dp_accounting's RDP equals rho * alpha."""
    mech = make("kary_subtraction", 500, rho=0.25, k=5, seed=0)
    sigma_per_unit = mech.node_scale / mech.sensitivity
    accountant = rdp_privacy_accountant.RdpAccountant(orders=[4.0])
    accountant.compose(dp_accounting.GaussianDpEvent(sigma_per_unit))
    assert accountant._rdp[0] == pytest.approx(4.0 * 0.25, rel=1e-6)


def test_composition_and_split_are_explicit():
    assert compose([Zcdp(0.25), Zcdp(0.25)]) == Zcdp(0.5)
    assert compose([PureDp(0.5)] * 4) == PureDp(2.0)
    assert compose([split(Zcdp(0.5), 2)] * 2) == Zcdp(0.5)
    assert pure_to_zcdp(PureDp(1.0)) == Zcdp(0.5)
    with pytest.raises(ValueError, match=r"^`events` must be all PureDp or all Zcdp"):
        compose([PureDp(1.0), Zcdp(1.0)])
    with pytest.raises(ValueError,
                       match=r"^`l2_sensitivity` must be <= l1_sensitivity; got 2\.0\.$"):
        LaplaceRelease(1.0, 2.0, 1.0)


def test_mechanisms_report_their_privacy_events():
    gauss = make("binary_tree", 100, rho=0.3, seed=0)
    assert gauss.privacy_events() == [Zcdp(0.3)]
    # Discrete Laplace (the default): pure DP only (Thm 1.3 is proved for continuous noise).
    assert make("binary_tree", 100, epsilon=0.7, seed=0).privacy_events() == [PureDp(0.7)]
    laplace = make("kary_subtraction", 1000, epsilon=1.0, k=19, seed=0, max_contributions=4,
                   noise="float")
    pure, release = laplace.privacy_events()
    assert pure == PureDp(1.0) and release.pure.epsilon == pytest.approx(1.0)
    assert release.l2_sensitivity <= release.l1_sensitivity == laplace.sensitivity
    assert release.epsilon_at(1e-6) <= 1.0  # never worse than pure DP
    # Thm 1.3 pays off when l1 / l2 > sqrt(2 ln(1/delta)): input perturbation with k = 100
    # has l1 = 100, l2 = 10, so the same noise is also (0.53, 1e-6)-DP.
    wide = make("input_perturbation", 500, epsilon=1.0, seed=0, max_contributions=100,
                noise="float")
    _, release = wide.privacy_events()
    assert (release.l1_sensitivity, release.l2_sensitivity) == (100.0, 10.0)
    expected = 0.1 * (0.1 / 2 + math.sqrt(2 * math.log(1e6)))
    assert release.epsilon_at(1e-6) == pytest.approx(expected) and expected < 0.54
