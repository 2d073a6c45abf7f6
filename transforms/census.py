"""The sealed census of a release's unit states: what proves that a resume got them all.

A unit's truncation state holds what it has contributed so far; resumed without it (an empty or
partial `unit_states` PCollection), the unit starts afresh and its cap is spent again. Key states
are sealed one by one (`RecordMaker.seal`) and a missing public key's state fails the release;
unit ids are private, so nobody can list the units that must be there. Instead a run that
claims its window (`.resume(..., claims=folder)`) writes, at its end, the census of the unit
states it emits: the sum mod 2^256 of HMAC-SHA256(secret, state line) over them (a keyed
multiset hash: any added, dropped, altered or repeated state changes it; it holds no count of
units; keyed by the step too, and offset by a keyed constant), itself MAC'd with the release's
binding, the step and the claims folder, to `<folder>/<release id>/units-at-<stop>.json`. The run that
resumes from that step recomputes the census of the unit states it is given and refuses to
release anything unless both agree.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from typing import Tuple

import apache_beam as beam

from transforms.claims import create_if_absent, read_claim
from transforms.streams import codec
from transforms.validation import fail

_MODULUS = 1 << 256
_DOMAIN = b"dp-continual-release/unit-census\x00"


def census_path(folder: str, release_id: str, step: int) -> str:
    return "/".join([folder.rstrip("/"), release_id, f"units-at-{step:08d}.json"])


def _census_key(config, step: int) -> bytes:
    """The census's HMAC key: the secret, the release and the step (the censuses of two steps
    never compare equal, so they cannot tell whether a unit's state changed in between)."""
    return (_DOMAIN + config.secret.secret_bytes() + config.release_binding
            + step.to_bytes(8, "big"))


class _Census(beam.CombineFn):
    """(unit, state) pairs -> (count, keyed multiset hash); only the hash is ever written. The
    hash starts at a keyed offset (an empty set does not hash to 0)."""

    def __init__(self, config, step: int):
        self.config, self.step = config, step

    def setup(self):
        self._key = _census_key(self.config, self.step)
        self._offset = int.from_bytes(hmac.new(self._key, b"offset", hashlib.sha256).digest(),
                                      "big")
        self._mac = hmac.new(self._key, digestmod=hashlib.sha256)  # keyed once, copied per item

    def _item(self, pair) -> int:
        """HMAC-SHA256(key, the pair's codec line): a copy of the keyed HMAC (the same digest
        as keying a new one, without hashing the long key again per unit)."""
        mac = self._mac.copy()
        mac.update(codec.dumps(pair).encode("utf-8"))
        return int.from_bytes(mac.digest(), "big")

    def create_accumulator(self) -> Tuple[int, int]:
        return 0, 0

    def add_input(self, accumulator, pair):
        if not hasattr(self, "_key"):  # runners that skip CombineFn.setup
            self.setup()
        return accumulator[0] + 1, (accumulator[1] + self._item(pair)) % _MODULUS

    def merge_accumulators(self, accumulators):
        count, total = 0, 0
        for c, t in accumulators:
            count, total = count + c, (total + t) % _MODULUS
        return count, total

    def extract_output(self, accumulator):
        if not hasattr(self, "_key"):
            self.setup()
        return accumulator[0], (accumulator[1] + self._offset) % _MODULUS


def _seal(config, folder: str, step: int, census) -> str:
    """The census's MAC: its release, step and claims folder (a census copied into another
    folder proves nothing there)."""
    message = json.dumps({"release_id": config.release_id, "step": step, "folder": folder,
                          "sum": format(census[1], "064x")},
                         sort_keys=True).encode("utf-8")
    return hmac.new(_DOMAIN + config.secret.secret_bytes(), config.release_binding + message,
                    hashlib.sha256).hexdigest()


def census_of(unit_states, config, step: int, label: str):
    """The singleton (count, keyed hash) of a PCollection of (unit, state) pairs at `step`."""
    return unit_states | label >> beam.CombineGlobally(_Census(config, step))


class WriteCensus:
    """Writes the sealed census of the unit states at `step` (create-if-absent: a window's
    census is written once)."""

    def __init__(self, config, folder: str, step: int):
        self.config, self.folder, self.step = config, folder, step

    def __call__(self, census) -> str:
        path = census_path(self.folder, self.config.release_id, self.step)
        content = {"release_id": self.config.release_id, "step": self.step,
                   "sum": format(census[1], "064x"),
                   "mac": _seal(self.config, self.folder, self.step, census)}
        if not create_if_absent(path, json.dumps(content, sort_keys=True).encode("utf-8")):
            if read_claim(path) != content:
                fail("unit census", "written once per step (another run wrote other unit "
                                    "states for this step)", path)
        return path


class CheckCensus:
    """Refuses the given unit states unless their census equals the sealed one of the run that
    released steps up to `step`."""

    def __init__(self, config, folder: str, step: int, what: str = "unit state"):
        self.config, self.folder, self.step = config, folder, step
        self.what = what  # what the census covers (a release selecting keys: key states too)

    def __call__(self, census) -> bool:
        path = census_path(self.folder, self.config.release_id, self.step)
        try:
            sealed = read_claim(path)
        except (OSError, ValueError):
            sealed = None
        if not isinstance(sealed, dict):
            fail("unit_states", f"the sealed unit states of release {self.config.release_id} "
                                f"at step {self.step} (no census: the run that released the "
                                f"steps before {self.step} must be given the same claims=)",
                 path)
        try:
            mac = _seal(self.config, self.folder, self.step,
                        (None, int(str(sealed.get("sum")), 16)))
        except (TypeError, ValueError):
            mac = ""
        if not mac or not hmac.compare_digest(str(sealed.get("mac", "")), mac):
            fail("unit census", f"sealed under release {self.config.release_id}'s secret",
                 path)
        if format(census[1], "064x") != sealed["sum"]:
            fail("unit_states", f"every {self.what} of release {self.config.release_id} at "
                                f"step {self.step}, unaltered (a dropped or reset state would "
                                f"spend a unit's cap again, or restart a key)",
                 f"other {self.what}s")
        return True
