"""pipelines.compare: exact comparisons, byte-identical on every run, and the committed
figures are its output."""
from __future__ import annotations

import filecmp
import math
import os

import numpy as np
import pytest

from pipelines import compare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ("maxse_vs_horizon.png", "count_distinct_vs_k.png", "smooth_vs_binary.png",
         "no_horizon.png", "comparison.md")


def test_small_comparison_is_byte_identical_on_a_second_run(tmp_path):
    for name in ("a", "b"):
        assert compare.main(["--out", str(tmp_path / name), "--max-exponent", "8",
                             "--distinct-exponent", "8"]) == 0
    for name in FILES:
        assert filecmp.cmp(tmp_path / "a" / name, tmp_path / "b" / name, shallow=False), name
        assert os.path.getsize(tmp_path / "a" / name) > 500


def test_baselines_match_their_closed_forms():
    exponents = [4, 6, 8]
    table = compare.maxse_by_horizon(exponents)
    for index, e in enumerate(exponents):
        # rho = 1/2: node std = sensitivity; naive: sqrt(T) per step; input perturbation:
        # sqrt(t) growing to sqrt(T)
        assert table["naive_composition"][index] == pytest.approx(math.sqrt(2 ** e), rel=1e-12)
        assert table["input_perturbation"][index] == pytest.approx(math.sqrt(2 ** e),
                                                                   rel=1e-12)


def test_exact_tree_sensitivity_is_never_worse_than_the_per_level_bound():
    ks = [1, 2, 3, 8, 64, 256]
    relative = compare.count_distinct_relative(256, ks)
    assert relative["binary_tree"][0] == pytest.approx(1.0, rel=1e-12)  # k = 1: the same
    assert all(r <= 1.0 + 1e-12 for r in relative["binary_tree"])
    assert min(relative["binary_tree"]) < 1.0  # the exact DP is strictly better somewhere
    assert all(s < 1.0 for s in relative["sqrt_toeplitz"][:3])  # Andersson et al. 2026 Fig. 1


@pytest.mark.slow
def test_committed_figures_are_what_the_command_writes(tmp_path):
    assert compare.main(["--out", str(tmp_path)]) == 0
    for name in FILES:
        assert filecmp.cmp(tmp_path / name, os.path.join(ROOT, "docs", "compare", name),
                           shallow=False), f"docs/compare/{name} is stale"


def test_no_horizon_curves_have_their_closed_forms():
    """The hybrid's std. dev. is sqrt(2 (b + (b+1)^2 popcount(m))) at rho = 1/2 (node std =
    its sensitivity sqrt(2)); the square root for T = t is sum_{j<t} f_j^2; the horizon-free
    factorization is smooth (consecutive std. devs. within 1 % from t = 16) while the doubling
    trick jumps where each block starts; none beats knowing the horizon."""
    from transforms.mechanisms.hybrid import hybrid_terms
    from transforms.mechanisms.toeplitz import sqrt_coefficients
    free = compare.no_horizon_std(1 << 10)
    np.testing.assert_allclose(free["hybrid"], np.sqrt(2.0 * hybrid_terms(1 << 10)), rtol=1e-12)
    known = free["sqrt_toeplitz, T = t known"]
    np.testing.assert_allclose(known, np.cumsum(sqrt_coefficients(1 << 10) ** 2), rtol=1e-12)
    smooth = free["log_sqrt_toeplitz"]
    assert float(np.max(smooth[16:] / smooth[15:-1])) < 1.01
    doubling = free["doubling (sqrt_toeplitz per block)"]
    starts = [(1 << b) - 1 for b in range(1, 11)]
    assert all(doubling[s] / doubling[s - 1] > 1.05 for s in starts)
    for values in (smooth, free["hybrid"], doubling):
        assert np.all(values >= known * (1 - 1e-12))
