"""Claims: what makes a publication or a continuation happen once, in durable storage.

A release's steps may be published only once: publishing them again on other data with the same
noise would reveal the difference exactly. Nothing in a job graph can know whether the same graph
runs elsewhere (a classic template launched twice) or whether saved states were resumed before
(a hand restart), so every path that publishes or continues a release first *claims* a name with
an atomic create-if-absent, and only the execution that created it goes on:

    passed = guard(pipeline, ClaimOnce(path, what), "Claim")   # in the job, once, at its start
    records = guarded(records, passed, "Claimed")              # nothing flows before the claim

`ClaimOnce` fails the job (one line, nothing written) when the name already exists, whoever
created it. A claim is never released: a job that claimed and then failed leaves its claim, and
what it claimed stays refused (fail closed; for `pipelines.run` a new run is a new release, for
the scheduler a new run claims its own checkpoint folder; see `pipelines.commit`).

`create_if_absent` carries its content: a reader never sees an empty or partial claim. Local
paths: the content is written and synced under a temporary name, then hard-linked to the claimed
name (link(2) fails if the name exists). gs://: an object write with if_generation_match=0.
Other filesystems offer no atomic create-if-absent through Beam and are refused.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Callable, Optional

from transforms.durable import create_if_absent  # noqa: F401 (the claims' primitive)
from transforms.validation import fail


def read_claim(path: str) -> Optional[dict]:
    """The content of a claim (a JSON object), or None when absent."""
    from apache_beam.io.filesystems import FileSystems
    if not FileSystems.exists(path):
        return None
    try:
        with FileSystems.open(path) as handle:
            found = json.loads(handle.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        found = error
    if not isinstance(found, dict):
        fail("claim", f"a JSON object this release wrote (the file is damaged: "
                      f"{type(found).__name__})", path)
    return found


class ClaimOnce:
    """A guard's check (`guard`): creates the claim `path` holding `content` and a fresh
    execution token, and fails the job when it exists already. `what` says what is claimed,
    in the error. Returns the token: the guard's singleton carries it to the commit, whose
    marker names it (a retried commit of this execution finds its own token; another
    execution of the same graph, which has the same paths, does not)."""

    claims_once = True  # what `guard` marks its singleton with (`ContinualX.claimed_by`)

    def __init__(self, path: str, content: dict, what: str, precondition=None):
        self.path, self.content, self.what = path, dict(content), what
        self.precondition = precondition  # called with `what` before an absent claim is made

    def __call__(self, token: str = None) -> str:
        from apache_beam.io.filesystems import FileSystems
        if self.precondition is not None and not FileSystems.exists(self.path):
            self.precondition(self.what)
        token = token or uuid.uuid4().hex
        data = json.dumps(dict(self.content, execution=token), sort_keys=True).encode("utf-8")
        if not create_if_absent(self.path, data):
            fail("claim", f"new: {self.what} was claimed before (by an earlier or concurrent "
                          f"execution; a release's steps are published once: publishing "
                          f"them again would reveal the difference of the two inputs)",
                 self.path)
        return token


class WindowClaims:
    """A private release's durable claims (`ContinualX(claims=folder)` or `.resume(...,
    claims=folder)`): `<folder>/<release id>/from-<first step>.json`, created once when a job
    releases the window from that step, beside the sealed census of its unit states
    (`units-at-<stop>.json`, `transforms.census`). A window is refused when it was claimed, or
    when anything at a later step exists (its claim was deleted, what followed it was not),
    whoever asks. The folder is named canonically (a local path resolved) and bound into the
    census seal, so a census copied to another folder proves nothing."""

    def __init__(self, folder: str):
        if not isinstance(folder, str) or not folder:
            fail("claims", "a folder path (local or gs://) holding the release's claims",
                 folder)
        self.folder = folder.rstrip("/") if "://" in folder else os.path.realpath(folder)

    def release_folder(self, release_id: str) -> str:
        return "/".join([self.folder, release_id])

    def path(self, release_id: str, first: int) -> str:
        return "/".join([self.release_folder(release_id), f"from-{first:08d}.json"])

    def steps_recorded(self, release_id: str):
        """The steps named by the release's claims and censuses (from-N, units-at-N)."""
        from apache_beam.io.filesystems import FileSystems
        pattern = "/".join([self.release_folder(release_id), "*.json"])
        steps = []
        for meta in FileSystems.match([pattern])[0].metadata_list:
            name = meta.path.rsplit("/", 1)[-1][:-len(".json")]
            for prefix in ("from-", "units-at-"):
                if name.startswith(prefix) and name[len(prefix):].isdigit():
                    steps.append((int(name[len(prefix):]), meta.path))
        return steps


class NothingLater:
    """A claim's precondition: nothing of the release is recorded at a step after `first`."""

    def __init__(self, claims: WindowClaims, release_id: str, first: int):
        self.claims, self.release_id, self.first = claims, release_id, first

    def __call__(self, what: str) -> None:
        later = sorted(p for step, p in self.claims.steps_recorded(self.release_id)
                       if step > self.first)
        if later:
            fail("claim", f"new: {what} was released before (its claim is gone, what came "
                          f"after it is not)", later[0])


class Claimed:
    """A claim the caller already made in this job graph: `passed`, the singleton of its
    `guard`. Only the drivers that claim and commit themselves use it (`pipelines.run`,
    `pipelines.schedule`, through `ContinualX.claimed_by`)."""

    def __init__(self, passed):
        self.passed = passed


class ClaimedByDriver:
    """`guard(..., in_driver=True)`: the claim `check`, made by the driver with the execution
    token `token` (`claim()`) after the job is built and right before it is submitted (a
    failure building it claims nothing). For a driver that submits the job itself and whose
    runner may restart the job from scratch under that claim (Flink's failover: an in-job
    claim would refuse the job's own restart), where side inputs cannot be checkpointed
    (Beam 2.62's portable Flink streaming): `guarded` passes elements through (nothing of the
    job runs before its claim)."""

    def __init__(self, check: Callable[..., object]):
        self.dp_claim, self.token = check, uuid.uuid4().hex

    def claim(self) -> None:
        self.dp_claim(self.token)


def guard(pipeline, check: Callable[[], object], label: str, in_driver: bool = False):
    """A singleton that exists only once `check()` passed, in the job. It carries `check`
    (`claim_of`): only a claim's guard proves a claim. `in_driver`: a `ClaimedByDriver`
    instead, whose `claim()` the driver calls right before it submits the job."""
    import apache_beam as beam
    if in_driver:
        return ClaimedByDriver(check)
    passed = pipeline | f"{label}Once" >> beam.Create([None]) | label >> beam.Map(
        lambda _: check() or True)
    passed.dp_claim = check
    return passed


def claim_of(passed):
    """The claim a guard's singleton was made by, or None (any other PCollection)."""
    check = getattr(passed, "dp_claim", None)
    return check if getattr(check, "claims_once", False) else None


def claimed_token(passed):
    """The claim's execution token as a DoFn argument: the guard's singleton as a side input,
    or the token a driver's claim returned."""
    import apache_beam as beam
    return passed.token if isinstance(passed, ClaimedByDriver) else \
        beam.pvalue.AsSingleton(passed)


def guarded(pcoll, passed, label: str):
    """`pcoll`, released only after the guard `passed` (a side input waits for it; a claim
    the driver made precedes the whole job)."""
    import apache_beam as beam
    if isinstance(passed, ClaimedByDriver):
        return pcoll
    return pcoll | label >> beam.Map(lambda element, _: element,
                                      beam.pvalue.AsSingleton(passed))
