"""Continuations are proven and claimed once (`transforms.claims`, `ContinualX.resume`).

The attacks these reproduce (issue "Privacy that survives the operator", break 2): two transforms
given the same `release_id=` under a real secret released data with and without one user; their
records differed by exactly that user's contribution. Replaying `.resume(StepWindow(4, 8), ...)`
twice from the same saved states, with one extra user the second time, did the same.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import tempfile

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from transforms import ContinualCount, SecretRef, TimeSteps
from transforms.claims import ClaimOnce, create_if_absent, read_claim
from transforms.messages import StepWindow

ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 60.0, 8)
RELEASE = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret"
    path.write_text("a private test secret, not a seed")
    return SecretRef(path=str(path))


def events_of(users):
    """Every user in `users` is counted on key "a" at steps 0, 1, ..., 7; "x" only from step 3."""
    out = []
    for user in users:
        for step in range(STEPS.horizon):
            if user != "x" or step >= 3:
                out.append(((user, "a"), ORIGIN + step * 60.0 + 1.0))
    return out


class _Append(beam.DoFn):
    """Appends each element, pickled, to a file (the pipeline's outputs, for the test)."""

    def __init__(self, path):
        self.path = path

    def process(self, element):
        with open(self.path, "ab") as handle:
            pickle.dump(element, handle)


def _read(path):
    out = []
    if os.path.exists(path):
        with open(path, "rb") as handle:
            while True:
                try:
                    out.append(pickle.load(handle))
                except EOFError:
                    return out
    return out


def run_pipeline(transform, events, window=None, units=None, keys=None, claims=None):
    """(records sorted by step, unit states, key states) of one pipeline run."""
    folder = tempfile.mkdtemp(prefix="claims-test-")
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        elements = (pipeline | "Events" >> beam.Create(events)
                    | "Stamp" >> beam.Map(lambda e: TimestampedValue(e[0], e[1])))
        if window is not None:
            transform = transform.resume(
                window, pipeline | "Units" >> beam.Create(units or []),
                pipeline | "Keys" >> beam.Create(keys or []), claims=claims)
        result = elements | transform
        for name, pcoll in (("records", result.records), ("units", result.unit_states),
                            ("keys", result.key_states)):
            if pcoll is not None:
                pcoll | f"Keep{name}" >> beam.ParDo(_Append(os.path.join(folder, name)))
    records = sorted(_read(os.path.join(folder, "records")), key=lambda r: r["step"])
    return records, _read(os.path.join(folder, "units")), _read(os.path.join(folder, "keys"))


def count(secret, **kwargs):
    args = dict(public_keys=["a"], max_contributions=8)
    args.update(kwargs)
    return ContinualCount(steps=STEPS, epsilon=1.0, mechanism="binary_tree", secret=secret,
                          **args)


def test_the_attack_works_where_it_is_allowed_insecure_ids_give_the_exact_difference():
    """The control: with insecure=True (a seed, not private) the same id on two inputs gives
    the same noise, so the difference of the outputs is exactly the extra user's contribution.
    This is what a reused id under a real secret would leak."""
    seeded = dict(secret=SecretRef(seed=1), insecure=True, release_id=RELEASE)
    without, _, _ = run_pipeline(count(**seeded), events_of(["u"]))
    with_x, _, _ = run_pipeline(count(**seeded), events_of(["u", "x"]))
    assert [b["value"] - a["value"] for a, b in zip(without, with_x)] == [0, 0, 0, 1, 2, 3, 4, 5]


def test_a_reused_release_id_under_a_real_secret_is_refused(secret):
    for users in (["u"], ["u", "x"]):
        with pytest.raises(ValueError, match=r"^`release_id` must be given only to continue a "
                                             r"private release through `\.resume"):
            run_pipeline(count(secret, release_id=RELEASE), events_of(users))
    # a resume of a private release without claims is refused the same way
    with pytest.raises(ValueError, match=r"^`release_id` must be given only"):
        run_pipeline(count(secret, release_id=RELEASE), events_of(["u"]),
                     window=StepWindow(0, 4))


def test_a_replayed_window_is_refused_whoever_replays_it(secret, tmp_path):
    """The hand restart: steps 0-4, then 4-8 from the saved states; replaying 4-8 again (with
    one more user) is refused before any record, and the claim names the window."""
    claims = str(tmp_path / "claims")
    first = count(secret, claims=claims)
    records, units, keys = run_pipeline(first, events_of(["u"]), window=StepWindow(0, 4))
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    release = first.release_id
    again, _, _ = run_pipeline(count(secret, release_id=release), events_of(["u"]),
                               window=StepWindow(4, 8), units=units, keys=keys, claims=claims)
    assert [r["step"] for r in again] == [4, 5, 6, 7]
    claim = read_claim(os.path.join(claims, release, "from-00000004.json"))
    assert claim["steps"] == [4, 8] and claim["release_id"] == release
    for users in (["u"], ["u", "x"]):
        with pytest.raises(Exception, match=r"`claim` must be new: steps 4 -> 8 of release "
                                            r"\w+ was claimed before"):
            run_pipeline(count(secret, release_id=release), events_of(users),
                         window=StepWindow(4, 8), units=units, keys=keys, claims=claims)
    os.remove(os.path.join(claims, release, "from-00000004.json"))  # the claim deleted
    with pytest.raises(Exception, match=r"`claim` must be new: steps 4 -> 8 of release "
                                        r"\w+ was released before"):
        run_pipeline(count(secret, release_id=release), events_of(["u", "x"]),
                     window=StepWindow(4, 8), units=units, keys=keys, claims=claims)
    # a replay of the first window is refused too (by a new transform with the same id),
    # even with the claims deleted: steps from 0 are released only by the run that drew the id
    os.remove(os.path.join(claims, release, "from-00000000.json"))
    with pytest.raises(ValueError, match=r"^`window` must be a continuation after step 0"):
        run_pipeline(count(secret, release_id=release), events_of(["u", "x"]),
                     window=StepWindow(0, 4), claims=claims)


def test_states_of_another_step_do_not_prove_a_continuation(secret, tmp_path):
    """The proof is the release's own sealed state at the window's first step: states sealed
    at step 4 cannot continue from step 6."""
    claims = str(tmp_path / "claims")
    first = count(secret, claims=claims)
    _, units, keys = run_pipeline(first, events_of(["u"]), window=StepWindow(0, 4))
    with pytest.raises(Exception, match=r"`unit_states` must be the sealed unit states of "
                                        r"release \w+ at step 6 \(no census"):
        run_pipeline(count(secret, release_id=first.release_id), events_of(["u"]),
                     window=StepWindow(6, 8), units=units, keys=keys, claims=claims)


def test_unit_states_dropped_or_reset_do_not_prove_a_continuation(secret, tmp_path):
    """Resumed without a unit's state, the unit would start afresh and spend its cap again:
    the census sealed by the run before refuses an empty, partial or altered set, before the
    window is claimed (the correct states can still continue)."""
    from transforms.streams.count import UnitState
    claims = str(tmp_path / "claims")
    first = count(secret, claims=claims)
    _, units, keys = run_pipeline(first, events_of(["u", "x"]), window=StepWindow(0, 4))
    assert len(units) == 2
    census = read_claim(os.path.join(claims, first.release_id, "units-at-00000004.json"))
    assert set(census) == {"release_id", "step", "sum", "mac"}  # no count of units
    (unit, state), other = units[0], units[1]
    altered = [(unit, UnitState()) if isinstance(state, UnitState) else (unit, None), other]
    for given in ([], [other], altered, units + [other]):
        with pytest.raises(Exception, match=r"`unit_states` must be every unit state of release"):
            run_pipeline(count(secret, release_id=first.release_id), events_of(["u", "x"]),
                         window=StepWindow(4, 8), units=given, keys=keys, claims=claims)
    assert not os.path.exists(os.path.join(claims, first.release_id, "from-00000004.json"))
    records, _, _ = run_pipeline(count(secret, release_id=first.release_id),
                                 events_of(["u", "x"]), window=StepWindow(4, 8), units=units,
                                 keys=keys, claims=claims)
    assert [r["step"] for r in records] == [4, 5, 6, 7]


def test_a_literal_secret_is_not_private_without_insecure():
    with pytest.raises(ValueError, match=r"^`secret` must be a secret from `env`, `path` or `gcp_secret`.*"
                                         r"got 'literal'\.$"):
        count(SecretRef(literal=b"bytes in the graph"))
    records, _, _ = run_pipeline(count(SecretRef(literal=b"bytes in the graph"), insecure=True),
                                 events_of(["u"]))
    assert records and all(r["private"] is False for r in records)


def test_create_if_absent_carries_its_content_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "sub" / "claim.json")
    assert create_if_absent(path, b'{"a": 1}')
    assert not create_if_absent(path, b'{"a": 2}')
    assert open(path, "rb").read() == b'{"a": 1}'
    assert sorted(os.listdir(tmp_path / "sub")) == ["claim.json"]


def _race(args):
    path, me = args
    return create_if_absent(path, json.dumps({"me": me}).encode())


def test_concurrent_claims_have_exactly_one_winner_whose_content_is_whole(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        for trial in range(20):
            path = str(tmp_path / f"claim-{trial}.json")
            won = pool.map(_race, [(path, i) for i in range(8)])
            assert sum(won) == 1
            assert read_claim(path) == {"me": won.index(True)}


def test_claim_once_refuses_the_second_claim_in_one_line(tmp_path):
    claim = ClaimOnce(str(tmp_path / "c.json"), {"x": 1}, "the thing")
    claim()
    with pytest.raises(ValueError, match=r"^`claim` must be new: the thing was claimed before "
                                         r".*; got '.*c\.json'\.$"):
        ClaimOnce(str(tmp_path / "c.json"), {"x": 2}, "the thing")()


def _two_windows(secret, tmp_path, users=("u",)):
    """Steps 0-4 then 4-8 of one private release on `users`, claimed in tmp_path/claims."""
    claims = str(tmp_path / "claims")
    first = count(secret, claims=claims)
    _, units, keys = run_pipeline(first, events_of(list(users)), window=StepWindow(0, 4))
    run_pipeline(count(secret, release_id=first.release_id), events_of(list(users)),
                 window=StepWindow(4, 8), units=units, keys=keys, claims=claims)
    return claims, first.release_id, units, keys


def test_a_private_release_without_claims_is_refused_and_with_them_runs_once(secret, tmp_path):
    """A job graph executed twice (the same Pipeline run again, a copied transform) would
    publish the same noise on two inputs: a private release needs a claims folder, and its
    second execution is refused before any record."""
    import copy
    with pytest.raises(ValueError, match=r"^`claims` must be a folder \(local or gs://\)"):
        run_pipeline(count(secret), events_of(["u"]))
    claims = str(tmp_path / "claims")
    transform = count(secret, claims=claims)
    twin = copy.deepcopy(transform)
    records, _, _ = run_pipeline(transform, events_of(["u"]))
    assert len(records) == STEPS.horizon
    with pytest.raises(Exception, match=r"`claim` must be new: steps 0 -> 8 of release "
                                        rf"{transform.release_id} was claimed before"):
        run_pipeline(twin, events_of(["u", "x"]))


def test_a_deleted_claim_does_not_reopen_any_part_of_its_window(secret, tmp_path):
    """Attack F1: the claim of 4 -> 8 deleted, a replay of 4 -> 7 or 4 -> 5 (another stop)
    is refused: the census at 8 records that the release went on."""
    claims, release, units, keys = _two_windows(secret, tmp_path)
    os.remove(os.path.join(claims, release, "from-00000004.json"))
    for stop in (5, 7, 8):
        with pytest.raises(Exception, match=r"`claim` must be new: steps 4 -> \d of release "
                                            r"\w+ was released before"):
            run_pipeline(count(secret, release_id=release), events_of(["u", "x"]),
                         window=StepWindow(4, stop), units=units, keys=keys, claims=claims)


def test_a_census_copied_to_another_claims_folder_proves_nothing(secret, tmp_path):
    """Attack F2: the census of step 4 copied into a fresh folder B; resuming 4 -> 8 there is
    refused (the census's MAC names its folder)."""
    claims = str(tmp_path / "claims")
    first = count(secret, claims=claims)
    _, units, keys = run_pipeline(first, events_of(["u"]), window=StepWindow(0, 4))
    other = tmp_path / "b" / first.release_id
    other.mkdir(parents=True)
    name = "units-at-00000004.json"
    (other / name).write_bytes(open(os.path.join(claims, first.release_id, name), "rb").read())
    with pytest.raises(Exception, match=r"`unit census` must be sealed under release"):
        run_pipeline(count(secret, release_id=first.release_id), events_of(["u", "x"]),
                     window=StepWindow(4, 8), units=units, keys=keys,
                     claims=str(tmp_path / "b"))


def test_claims_are_a_folder_not_an_object_that_skips_the_checks(secret, tmp_path):
    """Attack F3: `claims=` took claim objects that skipped the census and the step-0 rule."""
    from transforms.claims import Claimed
    with pytest.raises(ValueError, match=r"^`claims` must be a folder path"):
        count(secret, claims=Claimed(None))
    with pytest.raises(ValueError, match=r"^`claims` must be a folder path"):
        count(secret).resume(StepWindow(0, 4), claims=Claimed(None))


def test_censuses_reveal_nothing_without_the_secret(secret, tmp_path):
    """Attack F8: the census of a step was keyed by the release only, so two steps' censuses
    were equal exactly when no unit's state changed in between, and no units hashed to 0. Now
    keyed by the step and offset: unequal, and never 0."""
    claims = str(tmp_path / "claims")
    first = count(secret, claims=claims)
    events = [((u, "a"), ORIGIN + 1.0) for u in ("u", "v")]  # nothing after step 0
    _, units, keys = run_pipeline(first, events, window=StepWindow(0, 4))
    run_pipeline(count(secret, release_id=first.release_id), [], window=StepWindow(4, 6),
                 units=units, keys=keys, claims=claims)
    folder = os.path.join(claims, first.release_id)
    at4 = read_claim(os.path.join(folder, "units-at-00000004.json"))["sum"]
    at6 = read_claim(os.path.join(folder, "units-at-00000006.json"))["sum"]
    assert at4 != at6
    empty = count(secret, claims=str(tmp_path / "empty"))
    run_pipeline(empty, [], window=StepWindow(0, 4))
    assert int(read_claim(os.path.join(str(tmp_path / "empty"), empty.release_id,
                                       "units-at-00000004.json"))["sum"], 16) != 0


def test_claimed_by_takes_only_a_claims_guard(secret, tmp_path):
    """Attack (round 2) F4: `claimed_by` took any singleton, which skipped the claim and the
    census. Only the singleton of a claim's guard is taken."""
    from transforms.claims import ClaimOnce, guard
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    with pytest.raises(ValueError, match=r"^`claimed_by` must be the singleton of a claim's"):
        count(secret, release_id=RELEASE).claimed_by(pipeline | beam.Create([True]))
    with pytest.raises(ValueError, match=r"^`claimed_by` must be the singleton of a claim's"):
        count(secret).claimed_by(guard(pipeline, lambda: True, "NotAClaim"))
    count(secret).claimed_by(guard(pipeline, ClaimOnce(str(tmp_path / "c"), {}, "it"), "Claim"))


def test_a_copied_transform_cannot_claim_its_first_steps_elsewhere(secret, tmp_path):
    """Attack (round 2) F2: a deepcopy resumed from step 0 with another claims folder published
    the same noise there. A new release's claims are fixed at construction."""
    import copy
    transform = count(secret, claims=str(tmp_path / "a"))
    twin = copy.deepcopy(transform)
    with pytest.raises(ValueError, match=r"^`claims` must be given when the release is "
                                         r"constructed"):
        twin.resume(StepWindow(0, 8), claims=str(tmp_path / "b"))


def test_a_local_claims_folder_is_refused_with_a_remote_runner(secret, tmp_path):
    from transforms.continual import remote_runner

    class DataflowRunner:  # what a remote runner's class is called; nothing runs
        pass

    class Remote:
        runner = DataflowRunner()

    assert remote_runner(Remote())
    transform = count(secret, claims=str(tmp_path / "claims"))
    with pytest.raises(ValueError, match=r"^`claims` must be a gs:// folder with a remote "
                                         r"runner"):
        transform._check_continuation(StepWindow(0, 8), Remote())


def test_a_selecting_release_refuses_resumed_key_states_that_are_not_all_there(secret,
                                                                            tmp_path):
    """Without public keys, a key missing from the given key states would restart as a new key
    (its published total and its selection lost): the census of a selecting release seals the
    key states with the unit states, so a dropped key state is refused like a dropped unit
    state, and the complete set continues."""
    claims = str(tmp_path / "claims")
    selecting = dict(public_keys=None, selection_delta=1e-3, max_contributions=8)
    first = count(secret, claims=claims, **selecting)
    events = events_of(["u", "x"]) + [((f"v{i}", "b"), ORIGIN + 1.0) for i in range(3)]
    _, units, keys = run_pipeline(first, events, window=StepWindow(0, 4))
    assert sorted(k for k, _ in keys) == ["a", "b"]
    for given in ([keys[0]], [keys[1]], []):
        with pytest.raises(Exception, match=r"`unit_states` must be every unit and key state "
                                            r"of release"):
            run_pipeline(count(secret, release_id=first.release_id, **selecting), events,
                         window=StepWindow(4, 8), units=units, keys=given, claims=claims)
    run_pipeline(count(secret, release_id=first.release_id, **selecting), events,
                 window=StepWindow(4, 8), units=units, keys=keys, claims=claims)
    assert os.path.exists(os.path.join(claims, first.release_id, "units-at-00000008.json"))


def test_a_claim_made_by_the_driver_is_made_once_when_claimed_and_guards_nothing(tmp_path):
    """`guard(..., in_driver=True)` (Kafka on Flink): nothing is claimed while the job is
    built; `claim()` creates the claim with the token the job's steps carry; a second
    launch's claim is refused; `guarded` adds no stage (no side input)."""
    from transforms.claims import ClaimedByDriver, claimed_token, guard, guarded
    path = str(tmp_path / "release.json")
    pipeline = beam.Pipeline()
    passed = guard(pipeline, ClaimOnce(path, {"release_id": RELEASE}, "the release"),
                   "Claim", in_driver=True)
    assert isinstance(passed, ClaimedByDriver) and not os.path.exists(path)
    events = pipeline | beam.Create([1, 2])
    assert guarded(events, passed, "Claimed") is events
    assert claimed_token(passed) == passed.token
    passed.claim()
    assert read_claim(path) == {"release_id": RELEASE, "execution": passed.token}
    again = guard(beam.Pipeline(), ClaimOnce(path, {"release_id": RELEASE}, "the release"),
                  "Claim", in_driver=True)
    with pytest.raises(ValueError, match=r"^`claim` must be new: the release was claimed "
                                         r"before"):
        again.claim()
    assert read_claim(path)["execution"] == passed.token
