"""Every mechanism and option set runs the shared contract of contract.py."""
import pytest

from tests.support.contract import MechanismContract


class TestBinaryTree(MechanismContract):
    NAME = "binary_tree"


class TestBinaryTreePaperFactors(MechanismContract):
    NAME, PARAMS = "binary_tree", {"sparsify": False, "prune": False}


class TestKaryTree3(MechanismContract):
    NAME, PARAMS = "kary_tree", {"k": 3}


class TestKaryTree8(MechanismContract):
    NAME, PARAMS = "kary_tree", {"k": 8, "sparsify": False}


class TestKarySubtraction3(MechanismContract):
    NAME, PARAMS = "kary_subtraction", {"k": 3}


class TestKarySubtraction19(MechanismContract):
    NAME, PARAMS = "kary_subtraction", {"k": 19}


class TestKarySubtractionEven4(MechanismContract):
    NAME, PARAMS = "kary_subtraction", {"k": 4}


class TestKarySubtractionPaperFactors(MechanismContract):
    NAME, PARAMS = "kary_subtraction", {"k": 5, "sparsify": False, "prune": False}


class TestSmoothBinary(MechanismContract):
    NAME = "smooth_binary"
    # dense factors of the smooth tree span every h-bit leaf (2^h columns for T = C(h, h/2)):
    # 1..128 covers every height up to 10 and its edges; the larger horizons stay
    HORIZONS = list(range(1, 129)) + [511, 512, 513, 1000, 2187]


class TestSmoothBinaryPruned(MechanismContract):
    NAME, PARAMS = "smooth_binary", {"prune": True}
    # Pruning changes which leaves hold data, not the tree or its noise: the structural checks
    # run in CI on fewer horizons than the unpruned variant (which covers 1..300); the noise
    # statistics, identical code to the unpruned variant's, run with `-m slow` (CI time). The
    # unpruned variant keeps T = 2187 (height 14: 9 s of dense factors).
    HORIZONS = list(range(1, 65)) + [511, 512, 513, 1000]

    @pytest.mark.slow
    def test_empirical_variance_matches_analytic_variance(self):
        super().test_empirical_variance_matches_analytic_variance()

    @pytest.mark.slow
    def test_discrete_noise_follows_the_exact_law_and_releases_integers(self):
        super().test_discrete_noise_follows_the_exact_law_and_releases_integers()

    @pytest.mark.slow
    def test_confidence_intervals_reach_nominal_coverage(self):
        super().test_confidence_intervals_reach_nominal_coverage()


class TestSqrtToeplitz(MechanismContract):
    NAME, NOISE = "sqrt_toeplitz", "float"
    EXACT_FACTORS = False


class TestNaiveComposition(MechanismContract):
    NAME = "naive_composition"


class TestInputPerturbation(MechanismContract):
    NAME = "input_perturbation"


# Continuous float noise (the opt-in `noise="float"`): the same contract (the factors do not
# depend on the noise, so fewer horizons). The float path differs from the discrete one only in
# the node draw and the final scaling, shared by all mechanisms: the binary tree (trees), input
# perturbation (long equal-weight sums) and the square root above cover it.
class FloatContract(MechanismContract):
    NOISE = "float"
    HORIZONS = [1, 2, 7, 100, 513]


class TestBinaryTreeFloat(FloatContract):
    NAME = "binary_tree"


class TestInputPerturbationFloat(FloatContract):
    NAME = "input_perturbation"


class TestBlt(MechanismContract):
    """Buffered linear Toeplitz (float noise only): factors agree with A to rounding, and the
    Laplace interval of its weighted sum is exact (`tails`: inversion)."""
    NAME, NOISE = "blt", "float"
    HORIZONS = [1, 2, 3, 7, 100, 513]
    EXACT_FACTORS = False


class TestBltMean(TestBlt):
    PARAMS = {"buffers": 3, "metric": "mean"}
