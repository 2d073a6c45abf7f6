"""The local streaming runner keeps the project's DoFns between bundles (installed by
`local_pubsub.install`, for the local streaming jobs of `pipelines.run`).

Beam's local runner (BundleBasedDirectRunner) treats every bundle as a new worker: it pickles
each DoFn again, inspects its signature, and calls its `setup` and `teardown`
(`transform_evaluator._ParDoEvaluator.start_bundle` / `finish_bundle`), and it inspects the
signatures of a stateful DoFn's methods again to find its state and timers
(`userstate.get_dofn_specs`: 41 % of a 100 events/s job's CPU in a profile). A streaming job's
bundles are small and many (every pull, every timer firing), so at a trickle that work is most
of the job's CPU, and whatever a DoFn builds in `setup` (a release's mechanism and its noise
caches) is rebuilt at every bundle. Distributed runners keep a DoFn instance for many bundles;
here the project's own DoFns (`OURS`) are kept too: one unpickled copy per transform and
thread, set up once, its signature inspected once, torn down with the process; their state and
timer specs are found once per class (they are the class's methods' defaults). Beam's and
other DoFns keep the runner's behaviour. A kept DoFn still gets `start_bundle` and
`finish_bundle` at every bundle, so what a bundle holds starts afresh.
"""
from __future__ import annotations

import threading
import types
import weakref

OURS = ("transforms.", "pipelines.")  # the modules whose DoFns are kept between bundles
_KEPT = "_dp_kept"  # marks a kept copy (an attribute of the copy, never of the original)
_REMEMBERED_OBJECTS = 4096  # DoFn objects whose specs are remembered at once (then forgotten)


def _kept(do_fn) -> bool:
    return bool(getattr(do_fn, "__dict__", {}).get(_KEPT))


def _nothing() -> None:
    """A kept DoFn's `setup` and `teardown` at every bundle (it was set up once)."""


def install() -> None:
    """Idempotent: patches the local runner of this process."""
    from apache_beam.internal import pickler
    from apache_beam.runners import common
    from apache_beam.runners.direct import transform_evaluator as te
    if getattr(te, "_dp_kept_dofns", False):
        return
    copies = {}  # (id of the original, thread) -> (the original, its kept copy)

    class KeepingPickler:
        """`pickler` for the evaluator: `roundtrip` of a project DoFn returns its kept copy.

        What is unpickled here is only what Beam's evaluator itself round-trips: a DoFn object
        of this process's pipeline graph, pickled by `pickler.roundtrip` a moment before in the
        same call. No state, checkpoint, claim or other stored bytes are ever unpickled (a
        bucket's files are read by their own coders and JSON)."""

        def __getattr__(self, name):
            return getattr(pickler, name)

        @staticmethod
        def roundtrip(value):
            if not type(value).__module__.startswith(OURS):
                return pickler.roundtrip(value)
            slot = (id(value), threading.get_ident())
            found = copies.get(slot)
            if found is None or found[0] is not value:
                copy = pickler.roundtrip(value)
                copy.setup()  # once; the runner's calls at every bundle then do nothing
                copy.__dict__.update({_KEPT: True, "setup": _nothing, "teardown": _nothing})
                found = copies[slot] = (value, copy)
            return found[1]

    signature_class = common.DoFnSignature

    def signature(do_fn):  # DoFnRunner looks `DoFnSignature` up at every bundle
        if not _kept(do_fn):
            return signature_class(do_fn)
        found = do_fn.__dict__.get("_dp_signature")
        if found is None:
            found = do_fn.__dict__["_dp_signature"] = signature_class(do_fn)
        return found

    te.pickler = KeepingPickler()
    common.DoFnSignature = signature
    remember_specs()
    te._dp_kept_dofns = True


def remember_specs() -> None:
    """Idempotent: Beam finds a DoFn's state and timer specs (`userstate.get_dofn_specs`) by
    inspecting the signature of every method it has, again at each of about 8 calls per DoFn
    while a pipeline is built, translated and run (a measurable share of a small scheduled
    run's CPU). Here they are found once per DoFn object, and once per
    class for the project's DoFns (their specs are their class's methods' defaults; Beam's
    local streaming runner unpickles a fresh copy at every bundle); a DoFn holding methods of
    its own is looked up each time. Same answer as Beam's for DoFns whose methods are not
    replaced after their first lookup (no DoFn here is patched; `tests/pipelines/
    test_local_dofns.py` compares the answers for every DoFn of three bundled jobs)."""
    from apache_beam.runners.direct import transform_evaluator as te
    from apache_beam.transforms import userstate
    if getattr(userstate, "_dp_remembered", False):
        return
    specs_of, by_class, by_object = userstate.get_dofn_specs, {}, {}

    def get_dofn_specs(do_fn):  # (state specs, timer specs), new sets each call as Beam's
        own = getattr(do_fn, "__dict__", {})
        if any(type(value) is types.MethodType for value in own.values()):
            return specs_of(do_fn)  # methods of its own (Beam inspects those too): not kept
        if type(do_fn).__module__.startswith(OURS):
            found = by_class.get(type(do_fn))
            if found is None:
                found = by_class[type(do_fn)] = specs_of(do_fn)
            return set(found[0]), set(found[1])
        try:
            alive = weakref.ref(do_fn)
        except TypeError:  # (not weakly referable: Beam's lookup each time)
            alive = None
        if alive is None:
            return specs_of(do_fn)
        found = by_object.get(id(do_fn))
        if found is None or found[0]() is not do_fn:  # (an id reused by a newer object)
            if len(by_object) >= _REMEMBERED_OBJECTS:
                by_object.clear()
            found = by_object[id(do_fn)] = (alive, specs_of(do_fn))
        return set(found[1][0]), set(found[1][1])

    get_dofn_specs.beams = specs_of  # Beam's own, for the tests
    userstate.get_dofn_specs = te.get_dofn_specs = get_dofn_specs
    userstate._dp_remembered = True
