"""python -m pipelines.plan --unbounded --at ...: the horizon-free mechanism's stddev at the
steps asked for, beside the recommendation for a horizon known in advance."""
from __future__ import annotations

import json
import math

import pytest

from pipelines import plan
from transforms.mechanisms import make


def run(capsys, *args):
    code = plan.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def rows(capsys, *args):
    code, out, err = run(capsys, "--unbounded", "--json", *args)
    assert code == 0 and err == "", err
    return json.loads(out)["unbounded"]


@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_each_step_is_the_mechanism_at_that_step_and_the_plan_for_that_horizon(capsys, noise):
    """stddev at t = the mechanism's own at step t (one key per unit: the full budget), the
    same whatever other steps are asked for; the known-T column = `plan --horizon t`'s
    recommendation; the state is the sealed state at t."""
    found = rows(capsys, "--at", "24,168,3000", "--rho", "0.5", "--max-contributions", "3",
                 "--noise", noise)
    assert [r["step"] for r in found] == [24, 168, 3000]
    mechanism = make("log_sqrt_toeplitz", 3000, rho=0.5, max_contributions=3,
                     interval_bound=3, noise=noise, seed=0)
    for row in found:
        t = row["step"]
        assert row["stddev"] == pytest.approx(math.sqrt(mechanism.noise_variance()[t - 1]),
                                              rel=1e-12)
        code, out, _ = run(capsys, "--horizon", str(t), "--rho", "0.5", "--max-contributions",
                           "3", "--noise", noise, "--json")
        recommended = json.loads(out)["recommended"]
        assert (row["known"]["mechanism"], row["known"]["max_se"]) == (
            recommended["mechanism"], pytest.approx(recommended["max_se"], rel=1e-12))
        assert row["ratio"] == pytest.approx(row["stddev"] / row["known"]["max_se"])
        assert row["state_bytes"] == (33 if noise == "float" else 25 + 16 * t)  # tag 16 B, 9 B
    alone = rows(capsys, "--at", "168", "--rho", "0.5", "--max-contributions", "3", "--noise",
                 noise)
    assert alone[0]["stddev"] == found[1]["stddev"]


def test_table_and_refusals(capsys):
    code, out, err = run(capsys, "--unbounded", "--at", "24,8760", "--rho", "0.5")
    assert code == 0 and "With no horizon (log_sqrt_toeplitz, rho=0.5)" in out
    assert "      8760" in out and "140,185 B" in out
    for args, message in (
            (("--unbounded", "--at", "24", "--epsilon", "1"),
             "`unbounded` must come with --rho, or --epsilon and --delta"),
            (("--at", "24", "--rho", "1"), "`unbounded` must come with --at (and --at with "
                                           "--unbounded); got --at alone."),
            (("--unbounded", "--rho", "1"), "got --unbounded alone."),
            (("--unbounded", "--at", "0,5", "--rho", "1"), "`at` must be steps t"),
            (("--unbounded", "--at", "x", "--rho", "1"), "`at` must be steps t"),
            (("--unbounded", "--at", "5", "--rho", "1", "--mean-max-value", "3"),
             "`unbounded` must be left out with --mean-max-value")):
        code, out, err = run(capsys, *args)
        assert code == 2 and out == "" and message in err and len(err) < 200, (args, err)


def test_the_hybrid_baseline_is_its_own_stddev_under_float_noise_only(capsys):
    """Under float noise each row also holds the hybrid mechanism's stddev at t (as `make`
    computes it, at any horizon); under discrete noise (it has none) the column is left out."""
    found = rows(capsys, "--at", "1,24,3000", "--rho", "0.5", "--max-contributions", "3",
                 "--noise", "float")
    hybrid = make("hybrid", 5000, rho=0.5, max_contributions=3, interval_bound=3,
                  noise="float", seed=0)
    for row in found:
        assert row["hybrid"] == pytest.approx(
            math.sqrt(hybrid.noise_variance()[row["step"] - 1]), rel=1e-12)
    assert found[0]["hybrid"] < found[0]["stddev"] and found[1]["hybrid"] > found[1]["stddev"]
    assert all("hybrid" not in row for row in rows(capsys, "--at", "24", "--rho", "0.5"))
    code, out, _ = run(capsys, "--unbounded", "--at", "24", "--rho", "0.5", "--noise", "float")
    assert code == 0 and "hybrid" in out.splitlines()[2] and "Chan, Shi and Song" in out
