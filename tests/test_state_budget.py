"""The per-key state budget (issue 14, item 3): every mechanism states its per-key state size as
a function of T and the noise (checked against the real sealed state and checkpoint line), a
configured mechanism over `max_state_bytes_per_key` is refused with one line, `auto` skips
candidates over it, `pipelines.plan` shows and marks it, and configs accept it without changing
any release, descriptor or existing state directory."""
from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from pipelines import checkpoints, config as job_config, plan
from pipelines import run as job_run
from transforms import ContinualCount, TimeSteps
from transforms.calibration import choose_calibrated
from transforms.mechanisms import MECHANISMS, NAMES
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY,
                                          MIN_STATE_BYTES_PER_KEY, RELEASE_TAG_BYTES, choose,
                                          state_bytes_per_key)
from transforms.mechanisms.privacy import PrivacyBudget
from transforms.release import NoNoise, RecordMaker
from transforms.streams import codec

ORIGIN = 1_767_571_200.0
SEEDED = dict(seed=3, insecure=True)
BUDGET = "max_state_bytes_per_key"


def count(horizon, **kwargs):
    kwargs.setdefault("rho", 0.5)
    return ContinualCount(steps=TimeSteps(ORIGIN, 3600.0, horizon), public_keys=["a", "b"],
                          **SEEDED, **kwargs)


def kinds():
    """(mechanism, noise, horizon) that exist: blt has float noise only (and its parameter
    optimisation costs seconds at T = 300)."""
    return [(name, noise, horizon) for name in NAMES for noise in ("discrete", "float")
            for horizon in (1, 48, 300)
            if not (name == "blt" and (noise == "discrete" or horizon > 48))
            and not (name == "hybrid" and noise == "discrete")]


# the mechanisms whose discrete state is the input history (`HistoryState`, O(T))
HISTORY = {"sqrt_toeplitz", "log_sqrt_toeplitz"}


# ----- the formula against the real serialized state -------------------------------------------
@pytest.mark.parametrize("name,noise,horizon", kinds())
def test_state_size_formula_is_the_sealed_state_and_the_checkpoint_line(name, noise, horizon):
    """Release a key through all T steps in three chunks with the release's own mechanism and
    seal its state as Beam state and the scheduler's `keys-*` files do: the sealed bytes equal
    `state_bytes_per_key(name, T, noise, steps)` after every chunk, the mechanism's own
    `state_bytes` equals its `to_bytes()`, and a checkpoint line is the sealed bytes as hex."""
    transform = count(horizon, mechanism=name, noise=noise, max_state_bytes_per_key=1 << 30)
    maker = RecordMaker(transform.config)
    mechanism = maker.for_key("a")
    values = np.random.default_rng(horizon).poisson(2, horizon).astype(float)
    state = mechanism.init_state()
    cuts = sorted({0, horizon // 3, horizon})
    for start, stop in zip(cuts, cuts[1:]):
        _, state = mechanism.advance(state, values[start:stop])
        sealed = maker.seal("a", state)
        assert len(state.to_bytes()) == mechanism.state_bytes(stop)
        assert len(sealed) == state_bytes_per_key(name, horizon, noise, stop) == (
            RELEASE_TAG_BYTES + mechanism.state_bytes(stop))
        assert maker.restore("a", sealed) == state
        line = codec.dumps(("a", (sealed, None)))   # what `write_states` stores per key
        assert len(line) == len(codec.dumps(("a", (b"", None)))) + 2 * len(sealed)
    assert transform.state_bytes_per_key == len(sealed) == state_bytes_per_key(
        name, horizon, noise)
    if name in HISTORY and noise == "discrete":
        assert len(sealed) == RELEASE_TAG_BYTES + 9 + 16 * horizon   # O(T)
    else:
        assert len(sealed) == MIN_STATE_BYTES_PER_KEY == 33          # O(1)


def test_the_formula_needs_no_mechanism_and_matches_the_measured_size_at_8760():
    """140 KB per key at T = 8760 (the streaming benchmark's measurement) for the discrete
    square root (and the horizon-free one); 33 B for everything else, at every horizon."""
    assert state_bytes_per_key("sqrt_toeplitz", 8760) == 140_185
    assert state_bytes_per_key("sqrt_toeplitz", 8760, "float") == 33
    for name in NAMES:
        for horizon in (1, 8760, 1 << 20):
            assert state_bytes_per_key(name, horizon, "float") == 33
            if name not in HISTORY:
                assert MECHANISMS[name].state_size(horizon, "discrete") == 17
    with pytest.raises(ValueError, match=r"^`name` must be one of 'binary_tree'"):
        state_bytes_per_key("magic", 10)


def test_the_default_budget_admits_the_square_root_up_to_4094_steps():
    assert DEFAULT_MAX_STATE_BYTES_PER_KEY == 65536
    assert state_bytes_per_key("sqrt_toeplitz", 4094) <= DEFAULT_MAX_STATE_BYTES_PER_KEY
    assert state_bytes_per_key("sqrt_toeplitz", 4095) > DEFAULT_MAX_STATE_BYTES_PER_KEY


# ----- refusals: one line, the project's error shape --------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    ({BUDGET: 32}, r"^`max_state_bytes_per_key` must be an integer >= 33; got 32\.$"),
    ({BUDGET: 0}, r"^`max_state_bytes_per_key` must be an integer >= 33; got 0\.$"),
    ({BUDGET: True}, r"^`max_state_bytes_per_key` must be an integer >= 33; got True\.$"),
    ({BUDGET: 4096.0}, r"^`max_state_bytes_per_key` must be an integer >= 33; got 4096\.0\.$"),
    ({BUDGET: "64k"}, r"^`max_state_bytes_per_key` must be an integer >= 33; got '64k'\.$"),
    ({BUDGET: None}, r"^`max_state_bytes_per_key` must be an integer >= 33; got None\.$"),
    ({"horizon": 8760, "mechanism": "sqrt_toeplitz"},
     r"^`mechanism` must be a mechanism whose per-key state fits max_state_bytes_per_key "
     r"\(65,536 B\): sqrt_toeplitz with discrete noise keeps 140,185 B per key at horizon "
     r"8760; use blt with noise='float' or a tree mechanism \(kary_subtraction, smooth_binary, "
     r"binary_tree, kary_tree: 33 B per key\), or raise max_state_bytes_per_key; "
     r"got 'sqrt_toeplitz'\.$"),
    ({"horizon": 300, "mechanism": "sqrt_toeplitz", BUDGET: 4096},
     r"^`mechanism` must be a mechanism whose per-key state fits max_state_bytes_per_key "
     r"\(4,096 B\): sqrt_toeplitz with discrete noise keeps 4,825 B per key at horizon 300;"),
    ({"horizon": 4095, "mechanism": "sqrt_toeplitz", "epsilon": 1.0, "delta": 1e-6},
     r"keeps 65,545 B per key at horizon 4095; .*got 'sqrt_toeplitz'\.$"),
])
def test_invalid_budgets_and_configured_mechanisms_over_it_are_one_line(kwargs, message):
    kwargs = dict(kwargs)
    horizon = kwargs.pop("horizon", 48)
    if "epsilon" in kwargs:
        kwargs["rho"] = None
    with pytest.raises(ValueError, match=message) as refused:
        count(horizon, **kwargs)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kwargs", [
    {"mechanism": "sqrt_toeplitz", "noise": "float"},          # 33 B: its noise is re-derived
    {"mechanism": "blt", "noise": "float"},
    {"mechanism": "smooth_binary"},
    {"mechanism": "kary_subtraction", "mechanism_params": {"k": 5}, BUDGET: 33},
    {"mechanism": "sqrt_toeplitz", BUDGET: 140_185},            # exactly the budget
])
def test_mechanisms_within_the_budget_are_accepted_at_8760(kwargs):
    transform = count(8760, **kwargs)
    assert transform.config.mechanism == kwargs["mechanism"]
    assert transform.state_bytes_per_key <= transform.max_state_bytes_per_key
    assert transform.display_data()["state_bytes_per_key"] == transform.state_bytes_per_key


def test_a_started_release_continues_over_the_budget_with_a_warning(caplog):
    """`release_id` continues an existing release (the scheduler's ledger): its mechanism and
    states exist, so the budget cannot change them; refusing would strand the release. E.g. a
    release `auto` started on sqrt_toeplitz at T = 8760 before the budget existed."""
    with caplog.at_level(logging.WARNING, logger="transforms.release_plan"):
        transform = count(8760, mechanism="sqrt_toeplitz", release_id="ab" * 16)
    assert transform.config.mechanism == "sqrt_toeplitz"
    assert any("140185 B per key exceeds max_state_bytes_per_key (65536 B)" in r.getMessage()
               for r in caplog.records)


# ----- auto --------------------------------------------------------------------------------------
@pytest.mark.parametrize("horizon,kwargs,chosen", [
    (48, {}, "sqrt_toeplitz"),                                   # 793 B per key: fits
    (4094, {}, "sqrt_toeplitz"),                                 # 65,529 B: fits
    (8760, {}, "smooth_binary"),                                 # 140,185 B: skipped
    (300, {"max_keys_per_unit": 2, "max_contributions": 2, BUDGET: 4096},  # joint path:
     "smooth_binary"),                                           # 4,825 B > 4,096 B
    (8760, {BUDGET: 1 << 18}, "sqrt_toeplitz"),                  # a larger budget admits it
    (8760, {"noise": "float"}, "sqrt_toeplitz"),                 # float: 33 B per key
    (48, {BUDGET: 500}, "smooth_binary"),                        # a tiny budget
])
def test_auto_skips_candidates_over_the_budget(horizon, kwargs, chosen):
    transform = count(horizon, **kwargs)
    assert transform.config.mechanism == chosen
    assert transform.state_bytes_per_key <= transform.max_state_bytes_per_key


def test_auto_at_8760_picks_the_best_candidate_within_the_budget():
    budget = PrivacyBudget.resolve(rho=0.5)
    declaration = count(8760).problem.declaration
    best, rows = choose_calibrated(8760, budget, declaration)
    unlimited, same_rows = choose_calibrated(8760, budget, declaration, max_state_bytes=None)
    assert unlimited.mechanism == "sqrt_toeplitz" and rows == same_rows   # the whole table
    assert best == min((r for r in rows if r.state_bytes <= DEFAULT_MAX_STATE_BYTES_PER_KEY),
                       key=lambda r: (r.max_se, r.mean_se))
    assert best.max_se < 2.05 * unlimited.max_se   # what the cap costs here: 8.0 vs 3.98
    # the Beam-free chooser: no cap unless asked for
    assert choose(8760, {"rho": 0.5})[0].mechanism == "sqrt_toeplitz"
    assert choose(8760, {"rho": 0.5}, max_state_bytes=65536)[0].mechanism == "smooth_binary"


def test_the_budget_never_changes_a_bundled_configs_mechanism():
    """Every candidate of every bundled config fits the default budget, so neither auto's
    choice nor a configured mechanism changes."""
    for name in job_config.bundled_configs():
        job = job_config.load(f"demo:{name}")
        if job.steps.unbounded:  # its state grows with the steps, uncapped (by design)
            continue
        sizes = [state_bytes_per_key(m, job.steps.horizon, job.privacy.noise) for m in NAMES]
        assert max(sizes) <= DEFAULT_MAX_STATE_BYTES_PER_KEY, name
        assert job.mechanism.max_state_bytes_per_key == DEFAULT_MAX_STATE_BYTES_PER_KEY


def test_the_descriptor_does_not_carry_the_budget():
    """The budget only limits the choice; the chosen mechanism is in the descriptor. Same
    mechanism, same descriptor (and noise) whatever the budget."""
    default = count(48)
    assert BUDGET not in json.dumps(default.descriptor)
    for budget in (793, 1 << 20):
        other = count(48, max_state_bytes_per_key=budget)
        assert other.descriptor == default.descriptor
        assert other.config.descriptor_digest == default.config.descriptor_digest
    assert count(48, max_state_bytes_per_key=792).descriptor["mechanism"] != "sqrt_toeplitz"


# ----- pipelines.plan ----------------------------------------------------------------------------
def run_plan(capsys, *args):
    code = plan.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_shows_state_bytes_and_marks_rows_over_the_budget(capsys):
    code, out, err = run_plan(capsys, "--horizon", "8760", "--rho", "0.5", "--top", "3")
    assert code == 0 and err == ""
    lines = out.splitlines()
    sqrt = next(line for line in lines if line.startswith("sqrt_toeplitz"))
    assert "140,185 B" in sqrt and sqrt.endswith("OVER the 65,536 B budget")
    tree = next(line for line in lines if line.startswith("smooth_binary"))
    assert tree.endswith("  33 B")
    assert "Recommended (max error): smooth_binary" in out
    assert lines[-1] == ("Not recommended, over the per-key state budget of 65,536 B "
                         "(--max-state-bytes-per-key): sqrt_toeplitz")
    code, out, _ = run_plan(capsys, "--horizon", "8760", "--rho", "0.5", "--top", "3",
                            "--max-state-bytes-per-key", "262144")
    assert code == 0 and "OVER" not in out and "Not recommended" not in out
    assert "Recommended (max error): sqrt_toeplitz" in out
    code, out, _ = run_plan(capsys, "--horizon", "48", "--rho", "0.5", "--top", "1")
    assert "Recommended (max error): sqrt_toeplitz" in out and "793 B" in out


def test_plan_json_rows_carry_state_bytes_and_the_mark(capsys):
    code, out, _ = run_plan(capsys, "--horizon", "8760", "--rho", "0.5", "--json",
                            "--max-keys-per-unit", "2")
    data = json.loads(out)
    assert code == 0 and data["max_state_bytes_per_key"] == 65536
    for row in data["rows"]:
        assert row["over_budget"] == (row["state_bytes"] > 65536)
        assert row["state_bytes"] == state_bytes_per_key(row["mechanism"], 8760)
    assert [r["mechanism"] for r in data["rows"] if r["over_budget"]] == ["sqrt_toeplitz"]
    assert data["recommended"]["mechanism"] == "smooth_binary"


@pytest.mark.parametrize("value,message", [
    ("32", "`max-state-bytes-per-key` must be an integer >= 33; got 32."),
    ("64k", "`max-state-bytes-per-key` must be an integer >= 33; got '64k'."),
])
def test_plan_refuses_a_bad_budget_in_one_line(capsys, value, message):
    code, out, err = run_plan(capsys, "--horizon", "10", "--rho", "1",
                              "--max-state-bytes-per-key", value)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


# ----- config and the scheduler's ledger ---------------------------------------------------------
BASE = {
    "job": "t", "transform": "count",
    "input": {"path": "demo:active_users.jsonl", "fields": {"timestamp": "ts", "unit": "user",
                                                            "key": "region"}},
    "steps": {"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600, "horizon": 8760},
    "privacy": {"rho": 0.5}, "public_keys": ["a", "b"], "secret": {"seed": 1, "insecure": True},
    "output": {"path": "out"},
}


def config_with(**mechanism):
    return job_config.validate(dict(BASE, mechanism=mechanism) if mechanism else dict(BASE))


@pytest.mark.parametrize("value", [32, 0, -5, True, 4096.5, "64KiB", None])
def test_config_refuses_a_bad_budget(value):
    with pytest.raises(job_config.ConfigError,
                       match=r"^`mechanism.max_state_bytes_per_key` must be an integer >= 33 "
                             r"\(bytes of state per key; every tree mechanism keeps 33\); "
                             r"got .*\.$"):
        config_with(max_state_bytes_per_key=value)


def test_config_accepts_the_budget_with_auto_and_a_named_mechanism():
    assert config_with().mechanism.max_state_bytes_per_key == 65536
    job = config_with(max_state_bytes_per_key=262144)
    assert job.mechanism == job_config.MechanismSpec("auto", {}, 262144)
    named = config_with(name="kary_subtraction", params={"k": 5}, max_state_bytes_per_key=100)
    assert named.mechanism.max_state_bytes_per_key == 100


def test_config_budget_reaches_the_transform():
    """pipelines.run's `build_transform` passes the config's budget to the transform."""
    default = job_run.build_transform(config_with(), noise_source=NoNoise())
    raised = job_run.build_transform(config_with(max_state_bytes_per_key=262144),
                                     noise_source=NoNoise())
    assert default.config.mechanism == "smooth_binary"
    assert raised.max_state_bytes_per_key == 262144, (
        "pipelines/run.py build_transform must pass "
        "max_state_bytes_per_key=job.mechanism.max_state_bytes_per_key")
    assert raised.config.mechanism == "sqrt_toeplitz"
    with pytest.raises(ValueError, match=r"^`mechanism` must be a mechanism whose per-key "
                                         r"state fits max_state_bytes_per_key \(65,536 B\)"):
        job_run.build_transform(config_with(name="sqrt_toeplitz"), noise_source=NoNoise())


def test_the_ledger_fingerprint_ignores_the_budget():
    """State directories started before the budget existed (their ledger's fingerprint has no
    such field) resume, with or without it set; changing it mid-release changes nothing
    released (the ledger's resolved mechanism is used), so it is not compared."""
    default, raised = config_with(), config_with(max_state_bytes_per_key=262144)
    assert checkpoints.fingerprint(default) == checkpoints.fingerprint(raised)
    assert {k for k in checkpoints.fingerprint(default) if k.startswith("mechanism")} == {
        "mechanism.name", "mechanism.params"}
    ledger = {"secret_fingerprint": "f" * 64,
              "config": json.loads(json.dumps(checkpoints.fingerprint(default), default=str))}
    for job in (default, raised):
        checkpoints.check_ledger(ledger, job, "f" * 64)   # no error
    changed = dataclasses.replace(default, mechanism=job_config.MechanismSpec("binary_tree"))
    with pytest.raises(ValueError, match=r"^`mechanism.name` must be what this release"):
        checkpoints.check_ledger(ledger, changed, "f" * 64)


@pytest.mark.slow  # two scheduled Beam runs (~20 s); the fingerprint test above is the fast check
def test_a_scheduled_release_resumes_when_the_budget_changes(tmp_path, caplog):
    """End to end: a release auto started on the discrete square root (T = 12: 217 B per key)
    continues after the budget is lowered below its state (same release, same mechanism, a
    warning), and its ledger holds no budget field (as ledgers written before it existed)."""
    import os
    import yaml
    from pipelines import schedule
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    raw = yaml.safe_load(open(os.path.join(root, "configs", "active_users.yaml")))
    raw.update(privacy={"rho": 0.5}, secret={"seed": 2026, "insecure": True},
               output={"path": str(tmp_path / "out"), "formats": ["jsonl"]})
    raw["steps"]["horizon"] = 12
    first_config, second_config = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first_config.write_text(yaml.safe_dump(raw))
    raw["mechanism"] = {"name": "auto", BUDGET: 100}
    second_config.write_text(yaml.safe_dump(raw))
    state = str(tmp_path / "state")
    hour, origin = 3600.0, 1767571200.0
    first = schedule.run_once(str(first_config), state, origin + 4 * hour)
    ledger = json.load(open(os.path.join(checkpoints.committed_checkpoints(state)[-1][1],
                                         checkpoints.LEDGER)))
    assert ledger["mechanism"] == "sqrt_toeplitz"
    assert not any(BUDGET in name for name in ledger["config"])
    with caplog.at_level(logging.WARNING, logger="transforms.release_plan"):
        second = schedule.run_once(str(second_config), state, origin + 8 * hour)
    assert second["release_id"] == first["release_id"] and second["new_steps"] == 4
    assert any("217 B per key exceeds max_state_bytes_per_key (100 B)" in r.getMessage()
               for r in caplog.records)   # the budget reached the transform (pipelines.run)
