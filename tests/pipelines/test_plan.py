"""python -m pipelines.plan: readable table, valid JSON, one clear error line and exit code 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipelines import plan, planning


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
    ([], "`horizon` must be given (or --config job.yaml); got none."),
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
    shown = planning.distinct_rows(rows, "max_se")
    cores = [(r.mechanism, tuple(sorted((k, v) for k, v in r.params.items()
                                        if k not in ("sparsify", "prune")))) for r in shown]
    assert len(cores) == len(set(cores)) and len(shown) < len(rows)
    for row in shown:
        core = {k: v for k, v in row.params.items() if k not in ("sparsify", "prune")}
        group = [r for r in rows if r.mechanism == row.mechanism and
                 {k: v for k, v in r.params.items() if k not in ("sparsify", "prune")} == core]
        assert row.max_se == min(r.max_se for r in group)      # the better option is kept
        if row.params.get("sparsify") == planning.NO_EFFECT:      # merged: truly equal rows
            assert len({(r.max_se, r.mean_se, r.sensitivity) for r in group}) == 1
    assert any(r.params.get("sparsify") == planning.NO_EFFECT for r in shown)
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
                    {"bounds": dict(job.bounds, sum_share=0.3, max_keys_per_unit=2)},
                    {"bounds": dict(job.bounds, min_value=-600)}):  # signed: --mean-min-value
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
    code, _, err = run(capsys, "--horizon", "8", "--epsilon", "1", "--mean-min-value", "-5")
    assert code == 2 and "`mean-min-value` must come with --mean-max-value; got -5" in err
    code, out, _ = run(capsys, "--horizon", "8", "--epsilon", "1", "--mean-max-value", "5",
                       "--mean-min-value", "-400")
    assert code == 0 and "values clamped to [-400, 5]" in out
    assert "at the worst-case mean 400:" in out  # max(|L|, V)


# ----- --config: the job's own plan ----------------------------------------------------------
import dataclasses  # noqa: E402
import glob  # noqa: E402
import os  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLED = sorted(os.path.basename(p)[:-len(".yaml")]  # (with a horizon: no horizon below)
                 for p in glob.glob(os.path.join(ROOT, "configs", "*.yaml"))
                 if not p.endswith("_unbounded.yaml"))


def planned(capsys, config, *extra):
    code, out, err = run(capsys, "--config", config, "--json", *extra)
    assert code == 0 and err == "", err
    return json.loads(out)


def seeded_transform(job):
    """The job's transform as `pipelines.run` builds it for a run (a fixed insecure seed
    instead of a fresh secret: the same calibration and mechanism)."""
    from pipelines import config as job_config
    from pipelines import run as job_run
    return job_run.build_transform(job.replace(
        secret=job_config.SecretSpec(seed=7, insecure=True)))


def job_max_se(transform) -> dict:
    """What the job prints as its errors, without running Beam: a mean's summary (its parts'
    MaxSE, the sum's in value units, and se_times_count); otherwise the records' largest
    `stddev`, which `RecordMaker` writes as the mechanism's per-step noise_std times the
    value scale (a sum's grid)."""
    summary = transform.summary()
    if "part_max_se" in summary:
        return {"parts": summary["part_max_se"], "se_times_count": summary["se_times_count"]}
    from transforms.mechanisms import ConstantNoiseSource
    mechanism = transform.config.build(noise_source=ConstantNoiseSource(0.0))
    return {"max_se": float(max(mechanism.noise_std())) * transform.config.value_scale}


def assert_plan_is_the_job(data, transform):
    """`plan --config --json`'s row of the mechanism the job runs has the job's MaxSE (and for
    a mean both parts' and the mean's error), and that mechanism."""
    assert len(data["streams"]) == 1
    runs, expected = data["streams"][0]["runs"], job_max_se(transform)
    names, params = transform.resolved_mechanism
    if "parts" in expected:
        for part in ("sum", "count"):
            row = runs["parts"][part]
            assert (row["mechanism"], row["params"]) == (names[part], params[part])
            assert row["max_se"] == pytest.approx(expected["parts"][part], rel=1e-12)
        assert runs["se_times_count"] == pytest.approx(expected["se_times_count"], rel=1e-12)
    else:
        assert (runs["mechanism"], runs["params"]) == (names, params)
        assert runs["max_se"] == pytest.approx(expected["max_se"], rel=1e-12)
        assert runs["state_bytes"] == transform.state_bytes_per_key
    return runs


@pytest.mark.parametrize("name", BUNDLED)
def test_plan_config_gives_the_maxse_every_bundled_job_prints(name, capsys):
    from pipelines import config as job_config
    from pipelines import run as job_run
    assert set(BUNDLED) >= {"active_users", "cart_items", "friend_degrees", "friend_triangles",
                            "mean_seconds", "seconds_on_page", "signups"}
    path = os.path.join(ROOT, "configs", f"{name}.yaml")
    data = planned(capsys, path)
    job = job_config.load(path)
    transform = seeded_transform(job)
    runs = assert_plan_is_the_job(data, transform)
    stream = data["streams"][0]
    # one rule: the command plan --config planned with is the one the job prints
    assert stream["command"] == job_run.plan_commands(transform,
                                                      job.mechanism.max_state_bytes_per_key)
    assert data["mechanism"] == "auto" and runs["chosen"] == "auto"
    if "parts" not in runs:  # auto runs the recommendation
        assert runs == dict(stream["recommended"], chosen="auto")
        assert stream["rows"][0]["max_se"] == stream["recommended"]["max_se"]
    code, text, _ = run(capsys, "--config", path)
    assert code == 0 and "The job runs" in text
    if "parts" not in runs:
        assert f"MaxSE {runs['max_se']:.3f}" in text.split("The job runs", 1)[1]


def _variant(tmp_path, name, **changes):
    import yaml
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", f"{name}.yaml")))
    for section, value in changes.items():
        config[section] = value
    path = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("name,changes", [
    ("active_users", {"mechanism": {"name": "binary_tree"}}),         # a table candidate
    ("active_users", {"mechanism": {"name": "kary_tree", "params": {"k": 37}}}),  # not one
    ("seconds_on_page", {"mechanism": {"name": "smooth_binary"}}),
    ("mean_seconds", {"mechanism": {"name": "binary_tree"}}),
    ("signups", {"mechanism": {"name": "auto", "max_state_bytes_per_key": 500}}),
    ("cart_items", {"privacy": {"rho": 0.123456789}}),   # a budget %g would round
    ("seconds_on_page", {"bounds": {"max_value": 300, "max_contributions": 600,
                                    "value_resolution": 7, "max_keys_per_unit": 2}}),
    ("seconds_on_page", {"privacy": {"rho": 0.5, "noise": "float"}}),
])
def test_plan_config_shows_the_configured_row_and_what_auto_would_pick(tmp_path, capsys, name,
                                                                        changes):
    from pipelines import config as job_config
    path = _variant(tmp_path, name, **changes)
    data = planned(capsys, path)
    job = job_config.load(path)
    runs = assert_plan_is_the_job(data, seeded_transform(job))
    stream = data["streams"][0]
    configured = job.mechanism.name != "auto"
    assert runs["chosen"] == ("configured" if configured else "auto")
    code, text, _ = run(capsys, "--config", path, "--top", "2")
    assert code == 0
    if configured and "parts" not in runs:
        assert data["mechanism"]["name"] == job.mechanism.name
        assert runs["max_se"] > stream["recommended"]["max_se"]  # auto would do better here
        assert (f"auto would pick {stream['recommended']['mechanism']}" in text
                and f"({'configured'}): MaxSE {runs['max_se']:.3f}" in text)
    if "value_resolution" in job.bounds and "parts" not in runs and \
            job.privacy.noise == "discrete":
        grid = job.bounds["value_resolution"]
        assert stream["value_resolution"] == grid and f"--value-resolution {grid:g}" in \
            stream["command"] and f"grid g = {grid:g}" in text


def test_a_sum_plan_is_in_value_units_times_its_grid(capsys):
    """The declaration of a sum with discrete noise is in grid units; --value-resolution g
    prints the errors in value units (the job's), the sensitivity and the choice unchanged."""
    base = ["--horizon", "48", "--rho", "0.5", "--max-contributions", "200",
            "--interval-bound", "200", "--json"]
    _, out, _ = run(capsys, *base)
    grid_units = json.loads(out)
    _, out, _ = run(capsys, *base, "--value-resolution", "3")
    values = json.loads(out)
    assert values["value_resolution"] == 3.0 and grid_units["value_resolution"] is None
    for plain, scaled in zip(grid_units["rows"], values["rows"]):
        assert scaled["mechanism"] == plain["mechanism"]
        assert scaled["max_se"] == pytest.approx(3 * plain["max_se"], rel=1e-15)
        assert scaled["mean_se"] == pytest.approx(3 * plain["mean_se"], rel=1e-15)
        assert scaled["sensitivity"] == plain["sensitivity"]
    code, _, err = run(capsys, *base, "--value-resolution", "3", "--noise", "float")
    assert code == 2 and "`value-resolution` must be left out with --noise float" in err


@pytest.mark.parametrize("extra", [["--horizon", "48"], ["--epsilon", "1"], ["--split"],
                                   ["--metric", "mean"], ["--noise", "float"],
                                   ["--max-contributions", "3", "--rho", "1"]])
def test_config_mixed_with_planning_options_is_one_line(capsys, extra):
    code, out, err = run(capsys, "--config", os.path.join(ROOT, "configs", "signups.yaml"),
                         *extra)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: `config` must be given without --") and extra[0] in err


def test_a_bad_config_is_one_line(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("job: x\ntransform: nope\n")
    code, out, err = run(capsys, "--config", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: `")


def test_the_newcomers_count_plan_is_the_jobs_maxse(capsys):
    """plan --horizon 14 --epsilon 1 --max-contributions 10 (the interval bound defaults to k)
    recommends what a count job with those bounds and no per-step cap runs, at its MaxSE."""
    from pipelines import config as job_config
    code, out, _ = run(capsys, "--horizon", "14", "--epsilon", "1", "--max-contributions",
                       "10", "--json")
    recommended = json.loads(out)["recommended"]
    assert code == 0 and json.loads(out)["interval_bound"] == 10
    job = job_config.load(os.path.join(ROOT, "configs", "active_users.yaml"))
    job = job.replace(steps=dataclasses.replace(job.steps, horizon=14),
                      privacy=job_config.PrivacySpec(epsilon=1.0),
                      input=dataclasses.replace(job.input, max_dead_letter_fraction=1.0),
                      bounds=dict(job.bounds, max_contributions=10,
                                  max_contributions_per_step=None))
    transform = seeded_transform(job)
    assert (recommended["mechanism"], recommended["params"]) == transform.resolved_mechanism
    job_se = job_max_se(transform)["max_se"]
    assert recommended["max_se"] == pytest.approx(job_se, rel=1e-12)
    assert f"{job_se:.1f}" == "52.9"
    code, out, _ = run(capsys, "--horizon", "14", "--epsilon", "1", "--max-contributions", "10")
    assert f"(MaxSE {job_se:.3f}," in out


def test_json_state_is_the_tables_one_number(capsys):
    """`state_bytes` and `state` say the same number as the table's state column: the sealed
    state, a 16-byte tag and the mechanism's state (33 B for the trees, whose own state is 17
    B; the discrete square root's grows with T), what the job keeps per key."""
    from transforms.mechanisms import ConstantNoiseSource, make
    args = ("--horizon", "48", "--rho", "0.5")
    code, out, _ = run(capsys, *args, "--json")
    rows = json.loads(out)["rows"]
    _, table, _ = run(capsys, *args)
    lines = table.splitlines()
    for row in rows:
        mechanism = make(row["mechanism"], 48, rho=0.5, noise_source=ConstantNoiseSource(0.0),
                         **{k: v for k, v in row["params"].items() if v != planning.NO_EFFECT})
        assert row["state_bytes"] == 16 + mechanism.state_bytes()
        assert row["state"].split(" B", 1)[0].replace(",", "") == str(row["state_bytes"])
        line = next(line for line in lines if line.startswith(row["mechanism"])
                    and f"{row['max_se']:.3f}" in line)
        assert line.split("  ")[-1].strip() == row["state"] or row["state"] in line
    trees = [r for r in rows if r["mechanism"] in ("binary_tree", "smooth_binary")]
    assert trees and all(r["state"] == "33 B" and r["state_bytes"] == 33 for r in trees)
    sqrt = next(r for r in rows if r["mechanism"] == "sqrt_toeplitz")
    assert sqrt["state"] == "793 B (16 B per step: the input history)"
    recommended = json.loads(out)["recommended"]
    assert recommended["state"].startswith(f"{recommended['state_bytes']:,} B")
    # the sealed state is what the job keeps per key
    data = planned(capsys, os.path.join(ROOT, "configs", "active_users.yaml"))
    from pipelines import config as job_config
    transform = seeded_transform(job_config.load(os.path.join(ROOT, "configs",
                                                              "active_users.yaml")))
    assert data["streams"][0]["runs"]["state_bytes"] == transform.state_bytes_per_key == 33
    assert data["streams"][0]["runs"]["state"] == "33 B"


def test_plan_config_is_the_maxse_a_real_sum_run_prints(tmp_path, capsys):
    """A run of the sum job (Beam, the demo data) prints the MaxSE `plan --config` gives, in
    value units, not the grid units of its declaration."""
    from pipelines import run as job_run
    path = _variant(tmp_path, "seconds_on_page",
                    steps={"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600,
                           "horizon": 12},
                    input={"path": "demo:active_users.jsonl",
                           "fields": {"timestamp": "ts", "unit": "user", "key": "region",
                                      "value": "seconds"}},
                    output={"path": str(tmp_path / "out"), "formats": ["jsonl"]},
                    secret={"seed": 5, "insecure": True})
    data = planned(capsys, path)
    assert job_run.main(["--config", path]) == 0
    printed = capsys.readouterr().out
    expected = data["streams"][0]["runs"]["max_se"]
    assert f"MaxSE {expected:.2f} (largest per-step standard deviation)" in printed
    assert job_run.main(["--config", path, "--json"]) == 0
    public = json.loads(capsys.readouterr().out)["public"]
    assert public["max_se"] == pytest.approx(expected, rel=1e-12)
    assert "--value-resolution 3" in public["why"]


def test_plan_config_of_a_job_that_selects_keys_shows_its_threshold(capsys):
    """page_visitors has no public keys: plan --config prints the job's own threshold (the one
    its descriptor holds), the job's plan command plans the same threshold, and the steps by
    which keys of the shown rates are selected are `expected_selection_step`'s."""
    from pipelines import config as job_config
    from transforms.mechanisms import ConstantNoiseSource
    from transforms.mechanisms.selection import expected_selection_step
    path = os.path.join(ROOT, "configs", "page_visitors.yaml")
    data = planned(capsys, path)
    transform = seeded_transform(job_config.load(path))
    stream = data["streams"][0]
    rule = transform.descriptor["selection"]
    assert stream["selection"]["threshold"] == rule["threshold"]
    assert stream["selection"]["delta"] == rule["delta"] == 1e-6
    assert "--selection-delta 1e-06" in stream["command"]
    code, text, _ = run(capsys, *stream["command"].split()[3:], "--json")
    assert code == 0 and json.loads(text)["selection"]["threshold"] == rule["threshold"]
    mechanism = transform.config.build(noise_source=ConstantNoiseSource(0.0))
    for row in stream["selection"]["selected_by"]:
        assert row["step"] == expected_selection_step(mechanism, rule["threshold"], row["rate"])
    assert [r["step"] is None for r in stream["selection"]["selected_by"]] != [True] * 4
    code, text, _ = run(capsys, "--config", path)
    assert code == 0 and f"threshold {rule['threshold']:g}:" in text


def test_plan_selection_rates_and_refusals(capsys):
    code, text, _ = run(capsys, "--horizon", "48", "--epsilon", "1", "--selection-delta",
                        "1e-6", "--rate", "50", "--rate", "1", "--json")
    assert code == 0
    rows = json.loads(text)["selection"]["selected_by"]
    assert [r["rate"] for r in rows] == [50.0, 1.0] and rows[1]["step"] is None
    assert rows[0]["step"] is not None
    code, _, err = run(capsys, "--horizon", "48", "--epsilon", "1", "--rate", "5")
    assert code == 2 and "`rate` must come with --selection-delta" in err
    code, _, err = run(capsys, "--horizon", "48", "--epsilon", "1", "--selection-delta",
                       "1e-6", "--mean-max-value", "10")
    assert code == 2 and "`selection-delta` must be left out with --mean-max-value" in err


def test_plan_config_of_a_job_with_no_horizon_gives_its_stddev_a_day_a_week_a_year_in(capsys):
    """The horizon-free plan at the steps ending a day, a week and a year after the origin
    (hourly steps: 24, 168, 8760), each the stddev the job's records carry at that step."""
    from pipelines import config as job_config
    from transforms.mechanisms import ConstantNoiseSource
    path = os.path.join(ROOT, "configs", "active_users_unbounded.yaml")
    rows = planned(capsys, path)["unbounded"]
    transform = seeded_transform(job_config.load(path))
    mechanism = transform.config.build(noise_source=ConstantNoiseSource(0.0), horizon=8760)
    assert [row["step"] for row in rows] == [24, 168, 8760]
    assert [row["stddev"] for row in rows] == pytest.approx(
        [mechanism.noise_std()[t - 1] * transform.config.value_scale for t in (24, 168, 8760)],
        rel=1e-12)
