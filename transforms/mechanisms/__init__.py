"""Beam-free numpy core: continual-counting mechanisms as small state machines.

    mech = make("kary_subtraction", horizon=1000, epsilon=1.0, k=19, seed=7)
    state = mech.init_state()
    noisy, state = mech.step(state, 3)       # streaming
    mech.release(x)                           # batch, bit-identical to the steps
    mech.max_se(), mech.noise_std(), mech.confidence_interval(released)

Mechanism names are part of the config format: see NAMES.
"""
from __future__ import annotations

from transforms import validation as check
from .base import ContinualMechanism, CounterState
from .noise import (ConstantNoiseSource, KeyedNoiseSource, NoiseSource, make_noise_source)
from .privacy import GAUSSIAN, LAPLACE, PrivacyBudget, epsilon_from_rho, rho_from_epsilon_delta
from .blt import BufferedToeplitz
from .toeplitz import InputPerturbation, NaiveComposition, SqrtToeplitz
from .smooth import SmoothBinary
from .trees import BinaryTree, KarySubtraction, KaryTree
from .unbounded import LogSqrtToeplitz
from .hybrid import Hybrid

MECHANISMS = {cls.name: cls for cls in (BinaryTree, KaryTree, KarySubtraction, SmoothBinary,
                                         SqrtToeplitz, NaiveComposition, InputPerturbation,
                                         BufferedToeplitz, LogSqrtToeplitz, Hybrid)}
NAMES = tuple(MECHANISMS)

# Parameters each mechanism accepts through make(**params), besides noise_source and stream.
PARAMS = {name: cls.accepts for name, cls in MECHANISMS.items()}


def make(name: str, horizon: int, *, epsilon=None, rho=None, delta=None, max_contributions=1,
         interval_bound=1, seed=None, secret=None, noise_source: NoiseSource = None,
         stream=b"", noise="discrete", **params) -> ContinualMechanism:
    """Build the mechanism `name` for `horizon` steps.

    Privacy: `epsilon` (pure DP, Laplace), `rho` (zCDP, Gaussian), or `epsilon` and `delta`
    (Gaussian at the largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon).
    Noise: `secret` (bytes/str) or an explicit `seed`; neither draws a secret from the OS.
    `noise_source` replaces both (tests: ConstantNoiseSource). `noise`: "discrete" (default;
    integer node noise, integer releases) or "float" (opt-in, not safe against floating-point
    attacks; the only choice for sqrt_toeplitz under pure DP and for blt).
    """
    check.one_of("name", name, NAMES)
    budget = PrivacyBudget.resolve(epsilon=epsilon, rho=rho, delta=delta)
    unknown = sorted(set(params) - set(PARAMS[name]))
    if unknown:
        check.fail("params", f"among {list(PARAMS[name])} for {name!r}", unknown)
    if noise_source is None:
        noise_source = make_noise_source(seed=seed, secret=secret)
    elif seed is not None or secret is not None:
        check.fail("noise_source", "None when `seed` or `secret` is given", noise_source)
    params = {**MECHANISMS[name].default_params(budget.noise), **params}
    return MECHANISMS[name](horizon, budget, noise_source, max_contributions=max_contributions,
                           interval_bound=interval_bound, stream=stream, noise=noise,
                           **params)


__all__ = ["make", "NAMES", "MECHANISMS", "PARAMS", "ContinualMechanism", "CounterState",
           "NoiseSource", "KeyedNoiseSource", "ConstantNoiseSource", "make_noise_source",
           "PrivacyBudget", "LAPLACE", "GAUSSIAN", "rho_from_epsilon_delta", "epsilon_from_rho"]
