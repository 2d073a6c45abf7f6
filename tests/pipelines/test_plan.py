"""python -m pipelines.plan: readable table, valid JSON, one clear error line and exit code 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipelines import plan


def run(capsys, *args):
    code = plan.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_lists_every_mechanism_and_a_recommendation(capsys):
    code, out, err = run(capsys, "--horizon", "500", "--epsilon", "1", "--max-contributions",
                         "3", "--noise", "float")  # float noise also lists the square root
    assert code == 0 and err == ""
    for name in ("binary_tree", "kary_tree", "kary_subtraction", "smooth_binary",
                 "sqrt_toeplitz", "naive_composition", "input_perturbation"):
        assert name in out
    assert "MaxSE" in out and "Recommended (max error): kary_subtraction" in out


def test_json_output(capsys):
    code, out, _ = run(capsys, "--horizon", "200", "--epsilon", "1", "--delta", "1e-6",
                       "--interval-bound", "2", "--max-contributions", "2", "--metric", "mean",
                       "--json")
    data = json.loads(out)
    assert code == 0 and set(data) >= {"rows", "recommended"}
    for row in data["rows"]:
        assert {"mechanism", "params", "max_se", "mean_se"} <= set(row)
    assert data["recommended"]["mean_se"] == min(r["mean_se"] for r in data["rows"])


@pytest.mark.parametrize("args,message", [
    ([], "the following arguments are required: --horizon"),
    (["--horizon", "0", "--rho", "1"], "`horizon` must be an integer >= 1; got 0."),
    (["--horizon", "x", "--rho", "1"], "`horizon` must be an integer >= 1; got 'x'."),
    (["--horizon", "10"], "`privacy` must be --epsilon E, --rho R or --epsilon E --delta d"),
    (["--horizon", "10", "--rho", "1", "--epsilon", "1"], "`rho` must be given alone"),
    (["--horizon", "10", "--delta", "0.1"], "`delta` must come with --epsilon; got --delta 0.1"),
    (["--horizon", "10", "--epsilon", "1", "--delta", "2"],
     "`delta` must be a number in (0, 1); got '2'."),
    (["--horizon", "10", "--rho", "-1"], "`rho` must be a positive finite number; got '-1'."),
    (["--horizon", "10", "--epsilon", "nan"],
     "`epsilon` must be a positive finite number; got 'nan'."),
    (["--horizon", "10", "--rho", "1", "--metric", "median"], "invalid choice: 'median'"),
    (["--horizon", "10", "--rho", "1", "--max-contributions", "0"],
     "`max-contributions` must be an integer >= 1; got 0."),
    (["--horizon", "10", "--rho", "1", "--interval-bound", "-3"],
     "`interval-bound` must be an integer >= 1; got -3."),
    (["--horizon", "10", "--rho", "1", "--bogus"], "unrecognized arguments: --bogus"),
    (["--horizon", str(2 ** 25), "--rho", "1"], "`horizon` must be <= 16777216 for planning"),
    (["--horizon", "10", "--rho", "1", "--max-state-bytes-per-key", "32"],
     "`max-state-bytes-per-key` must be an integer >= 33; got 32."),
])
def test_bad_arguments_give_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_module_entry_point_exit_code():
    result = subprocess.run([sys.executable, "-m", "pipelines.plan", "--horizon", "5"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_rows_are_distinct_and_merge_only_options_without_effect(capsys):
    from transforms.mechanisms.choose import choose
    _, rows = choose(1000, {"epsilon": 1.0}, 4, 1)
    shown = plan.distinct_rows(rows, "max_se")
    cores = [(r.mechanism, tuple(sorted((k, v) for k, v in r.params.items()
                                        if k not in ("sparsify", "prune")))) for r in shown]
    assert len(cores) == len(set(cores)) and len(shown) < len(rows)
    for row in shown:
        core = {k: v for k, v in row.params.items() if k not in ("sparsify", "prune")}
        group = [r for r in rows if r.mechanism == row.mechanism and
                 {k: v for k, v in r.params.items() if k not in ("sparsify", "prune")} == core]
        assert row.max_se == min(r.max_se for r in group)      # the better option is kept
        if row.params.get("sparsify") == plan.NO_EFFECT:      # merged: truly equal rows
            assert len({(r.max_se, r.mean_se, r.sensitivity) for r in group}) == 1
    assert any(r.params.get("sparsify") == plan.NO_EFFECT for r in shown)
    assert any(r.params.get("sparsify") is True for r in shown)  # some option does matter


def test_top_prints_only_the_best_rows(capsys):
    code, out, _ = run(capsys, "--horizon", "1000", "--rho", "0.5", "--top", "3", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["rows"]) == 3
    assert data["rows"][0]["max_se"] == data["recommended"]["max_se"]
    code, out, _ = run(capsys, "--horizon", "1000", "--rho", "0.5", "--top", "3")
    table = out.split("state\n", 1)[1].split("\n\n")[0].strip().splitlines()
    assert code == 0 and len(table) == 3


def test_a_mean_plan_is_what_the_mean_job_runs(capsys):
    """The plan command a ContinualMean job prints gives the job's budget split and both
    parts' mechanisms (auto picked each from its part's table at its share)."""
    import os
    import shlex

    from pipelines import config as job_config
    from pipelines import run as job_run
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    job = job_config.load(os.path.join(root, "configs", "mean_seconds.yaml"))
    for changes in ({}, {"privacy": job_config.PrivacySpec(rho=0.5)},
                    {"bounds": dict(job.bounds, sum_share=0.3, max_keys_per_unit=2)}):
        variant = job.replace(secret=job_config.SecretSpec(seed=1, insecure=True), **changes)
        transform = job_run.build_transform(variant)
        command = job_run.plan_commands(transform)
        code, out, _ = run(capsys, *shlex.split(command)[3:], "--json")
        data = json.loads(out)
        assert code == 0 and data["sum_share"] == transform.descriptor["sum_share"]
        names, params = transform.resolved_mechanism
        for part in ("sum", "count"):
            recommended = data["parts"][part]["recommended"]
            assert recommended["mechanism"] == names[part]
            assert {k: v for k, v in recommended["params"].items()} == params[part]
    code, _, err = run(capsys, "--horizon", "8", "--epsilon", "1", "--sum-share", "0.5")
    assert code == 2 and "must come with --mean-max-value" in err
