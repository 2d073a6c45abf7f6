"""How much better than doing it yourself: the papers' comparisons, from exact errors.

    python3 -m pipelines.compare [--out docs/compare] [--max-exponent 24]

Writes four PNGs and `comparison.md` (the tables behind them) into --out:
1. `maxse_vs_horizon.png`: MaxSE against T = 2^4 .. 2^24 for every mechanism at the same
   budget (rho = 1/2 zCDP, S_{1,1}), next to the two do-it-yourself baselines: a private
   running total per window with the budget split over the T releases (naive composition,
   L = I, R = A: what a one-shot DP library gives per window) and noisy per-step counts summed
   (input perturbation, L = A, R = I).
2. `count_distinct_vs_k.png`: CountDistinct (item level, maximum flippancy k, S_{1,k}) MaxSE
   relative to the binary tree with the per-level bound of Jain et al. (each of the tree's
   levels changes in at most min(k, nodes) nodes by at most 1), across k, at T = 2^16: seed
   004 Fig. 1's comparison, here with exact sensitivities at a computable T instead of
   theorem bounds at T = 2^50.
3. `smooth_vs_binary.png`: the per-step standard deviation of the smooth binary mechanism
   (Andersson & Pagh 2023b: the same at every step) against the binary tree's (popcount(t) nodes).
4. `no_horizon.png`: with no horizon, the per-step standard deviation against t = 1 .. 2^16 of
   the horizon-free factorization (`log_sqrt_toeplitz`: smooth), the hybrid mechanism (Chan,
   Shi and Song 2011) and the doubling trick (the square root for each block [2^b, 2^(b+1)),
   budget rho_b = 6 rho / (pi^2 (b+1)^2), so that the blocks add up to rho; jumps at every
   power of two), beside the square root for a horizon T = t known in advance.
Every figure is computed, not sampled: the same command writes byte-identical files.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Dict, List

import numpy as np

from transforms.mechanisms import MECHANISMS, NAMES, make
from transforms.mechanisms.noise import ConstantNoiseSource
from transforms.mechanisms.toeplitz import sqrt_coefficients
from pipelines import logs

BUDGET = {"rho": 0.5}
BASELINES = {"naive_composition": "per-window release, budget split over T (DIY)",
             "input_perturbation": "noisy per-step counts, summed (DIY)"}
DISTINCT_HORIZON = 1 << 16
DISTINCT_K = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)
SMOOTH_HORIZON = 1 << 10
NO_HORIZON = 1 << 16
PNG_METADATA = {"Software": None}   # no version string: byte-identical across runs


def mechanism(name: str, horizon: int, contributions: int = 1, **params):
    return make(name, horizon, **BUDGET, noise="float", max_contributions=contributions,
                interval_bound=1,
                noise_source=ConstantNoiseSource(0.0), **params)


def maxse_by_horizon(exponents) -> Dict[str, List[float]]:
    """name -> MaxSE at T = 2^e (the mechanism's defaults; k-ary tree with k = 4), of the
    mechanisms calibrated for a horizon (the horizon-free ones: `no_horizon_std`)."""
    table = {}
    for name in NAMES:
        if MECHANISMS[name].horizon_free:
            continue
        params = {"k": 4} if name == "kary_tree" else {}
        table[name] = [mechanism(name, 1 << e, **params).max_se() for e in exponents]
    return table


def per_level_bound_maxse(horizon: int, k: int) -> float:
    """Binary tree calibrated with the per-level bound: sensitivity^2 = sum over levels of
    min(k, nodes used at that level) (each node's value changes by at most 1 on S_{1,k})."""
    tree = mechanism("binary_tree", horizon)
    squared = sum(min(k, int(np.count_nonzero(used))) for used in tree.used_nodes())
    return tree.max_se() / tree.sensitivity * math.sqrt(squared)


def count_distinct_relative(horizon: int = DISTINCT_HORIZON, ks=DISTINCT_K
                            ) -> Dict[str, List[float]]:
    """name -> MaxSE / the per-level-bound binary tree's MaxSE, for each k (exact)."""
    out = {"binary_tree": [], "kary_subtraction": [], "sqrt_toeplitz": [],
           "naive_composition": []}
    for k in ks:
        baseline = per_level_bound_maxse(horizon, k)
        out["binary_tree"].append(mechanism("binary_tree", horizon, k).max_se() / baseline)
        best = min(mechanism("kary_subtraction", horizon, k, k=arity).max_se()
                   for arity in (3, 5, 7))
        out["kary_subtraction"].append(best / baseline)
        out["sqrt_toeplitz"].append(mechanism("sqrt_toeplitz", horizon, k).max_se() / baseline)
        out["naive_composition"].append(
            mechanism("naive_composition", horizon, k).max_se() / baseline)
    return out


def per_step_std(horizon: int = SMOOTH_HORIZON) -> Dict[str, np.ndarray]:
    return {name: np.asarray(mechanism(name, horizon).noise_std())
            for name in ("binary_tree", "smooth_binary")}


def no_horizon_std(horizon: int = NO_HORIZON) -> Dict[str, np.ndarray]:
    """name -> std. dev. at steps t = 1..horizon at rho = 1/2: the horizon-free mechanisms,
    the doubling trick, and the square root calibrated for T = t (its last step's)."""
    out = {name: np.asarray(mechanism(name, horizon).noise_std())
           for name in ("log_sqrt_toeplitz", "hybrid")}
    # doubling: block b (t in [2^b, 2^(b+1))) runs the square root for its 2^b steps with
    # rho_b = 6 rho / (pi^2 (b+1)^2); step t adds the completed blocks' last releases
    doubling, done = np.zeros(horizon), 0.0
    b = 0
    while (1 << b) <= horizon:
        size = 1 << b
        share = 6.0 / (math.pi ** 2 * (b + 1) ** 2)
        block = make("sqrt_toeplitz", size, rho=BUDGET["rho"] * share, noise="float",
                     noise_source=ConstantNoiseSource(0.0))
        variance = block.noise_variance()
        lo, hi = size - 1, min(2 * size - 1, horizon)
        doubling[lo:hi] = done + variance[:hi - lo]
        done += float(variance[-1])
        b += 1
    out["doubling (sqrt_toeplitz per block)"] = np.sqrt(doubling)
    f = np.cumsum(sqrt_coefficients(horizon) ** 2)
    # the square root for T = t at its last step: node variance (its column norm^2 over
    # 2 rho) times its last row's norm^2, both sum_{j<t} f_j^2
    out["sqrt_toeplitz, T = t known"] = f / math.sqrt(2.0 * BUDGET["rho"])
    return out


def _figure():
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "dp-continual-release"
    import matplotlib.pyplot as plt
    return plt


def _finish(plt, figure, axis, xlabel, ylabel, title, path, legend_size=8):
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=legend_size)
    figure.tight_layout()
    figure.savefig(path, metadata=PNG_METADATA)
    plt.close(figure)


def plot_horizon(table, exponents, path):
    plt = _figure()
    figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
    horizons = [1 << e for e in exponents]
    for name, values in table.items():
        style = {"ls": "--", "lw": 2.0} if name in BASELINES else {"lw": 1.4}
        label = f"{name}: {BASELINES[name]}" if name in BASELINES else name
        axis.plot(horizons, values, marker="o", ms=3, label=label, **style)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    _finish(plt, figure, axis, "horizon T (steps)", "MaxSE (largest per-step std. dev.)",
            "Continual counting at rho = 1/2 (zCDP), one contribution per unit", path, 7)


def plot_distinct(relative, ks, horizon, path):
    plt = _figure()
    figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, values in relative.items():
        axis.plot(ks, values, marker="o", ms=3, label=name)
    axis.axhline(1.0, color="black", lw=0.8, ls=":", label="binary tree, per-level bound "
                                                           "(Jain et al.)")
    axis.set_xscale("log", base=2)
    axis.set_ylim(0, 1.6)
    _finish(plt, figure, axis, "maximum flippancy k", "MaxSE relative to the baseline",
            f"CountDistinct on S(1,k), T = 2^{int(math.log2(horizon))}, exact sensitivities",
            path)


def plot_smooth(stds, path):
    plt = _figure()
    figure, axis = plt.subplots(figsize=(8, 4), dpi=100)
    for name, values in stds.items():
        axis.plot(np.arange(1, values.shape[0] + 1), values, lw=1.0, label=name)
    _finish(plt, figure, axis, "step t", "per-step std. dev.",
            f"Smooth binary (Andersson & Pagh 2023b) vs binary tree, T = {SMOOTH_HORIZON}, "
            f"rho = 1/2", path)


def plot_no_horizon(stds, path):
    plt = _figure()
    figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, values in stds.items():
        style = {"ls": "--", "lw": 1.2} if "known" in name else {"lw": 1.0}
        axis.plot(np.arange(1, values.shape[0] + 1), values, label=name, **style)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    _finish(plt, figure, axis, "step t", "per-step std. dev.",
            "With no horizon, rho = 1/2 (zCDP), one contribution per unit", path)


def markdown(table, exponents, relative, ks, stds, free=None) -> str:
    names = list(table)
    lines = ["### MaxSE by horizon (rho = 1/2, S_{1,1})", "",
             "| T | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for index, e in enumerate(exponents):
        lines.append(f"| 2^{e} | " + " | ".join(f"{table[n][index]:.2f}" for n in names) + " |")
    lines += ["", f"### CountDistinct MaxSE relative to the per-level-bound binary tree "
                  f"(T = 2^{int(math.log2(DISTINCT_HORIZON))})", "",
              "| k | " + " | ".join(relative) + " |", "|---|" + "---|" * len(relative)]
    for index, k in enumerate(ks):
        lines.append(f"| {k} | " + " | ".join(f"{relative[n][index]:.3f}" for n in relative)
                     + " |")
    lines += ["", f"### Per-step std. dev. at T = {SMOOTH_HORIZON} (rho = 1/2)", "",
              "| mechanism | min | max | max / min |", "|---|---|---|---|"]
    for name, values in stds.items():
        lines.append(f"| {name} | {values.min():.3f} | {values.max():.3f} | "
                     f"{values.max() / values.min():.2f} |")
    if free is not None:
        steps = [1 << e for e in range(0, int(math.log2(len(next(iter(free.values()))))) + 1,
                                       2)]
        lines += ["", "### Std. dev. at step t with no horizon (rho = 1/2, S_{1,1})", "",
                  "| t | " + " | ".join(free) + " |", "|---|" + "---|" * len(free)]
        for t in steps:
            lines.append(f"| {t} | " + " | ".join(f"{free[n][t - 1]:.3f}" for n in free)
                         + " |")
        jumps = {n: float(np.max(v[1:] / v[:-1])) for n, v in free.items()}
        lines += ["", "Largest ratio of consecutive steps' std. dev.: " + ", ".join(
            f"{n} {j:.3f}" for n, j in jumps.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join("docs", "compare"),
                        help="folder for the PNGs and comparison.md (default docs/compare)")
    parser.add_argument("--max-exponent", type=int, default=24, choices=range(6, 25),
                        metavar="E", help="largest horizon 2^E of the first figure (6..24, "
                                          "default 24)")
    parser.add_argument("--distinct-exponent", type=int, default=16, choices=range(6, 21),
                        metavar="E", help="horizon 2^E of the CountDistinct figure (default 16)")
    args = parser.parse_args(argv)
    exponents = list(range(4, args.max_exponent + 1, 2))
    horizon = 1 << args.distinct_exponent
    ks = [k for k in DISTINCT_K if k <= horizon]
    table = maxse_by_horizon(exponents)
    relative = count_distinct_relative(horizon, ks)
    stds = per_step_std()
    free = no_horizon_std()
    os.makedirs(args.out, exist_ok=True)
    plot_horizon(table, exponents, os.path.join(args.out, "maxse_vs_horizon.png"))
    plot_distinct(relative, ks, horizon, os.path.join(args.out, "count_distinct_vs_k.png"))
    plot_smooth(stds, os.path.join(args.out, "smooth_vs_binary.png"))
    plot_no_horizon(free, os.path.join(args.out, "no_horizon.png"))
    with open(os.path.join(args.out, "comparison.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown(table, exponents, relative, ks, stds, free))
    print(f"wrote 4 charts and comparison.md to {args.out}")
    return 0


if __name__ == "__main__":
    logs.exit_now(main())
