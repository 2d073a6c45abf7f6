"""Choosing a mechanism: the exact analytic error of every mechanism and parameter, before any
budget is spent (Andersson et al. 2026 Sec. 11 describes the regimes this reproduces)."""
from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional, Tuple

from transforms import validation as check
from .base import ContinualMechanism
from .discrete import NoiseTooLarge
from .noise import ConstantNoiseSource

from .blt import ERROR_METRICS as METRICS  # noqa: E402 (the error metrics: MaxSE, MeanSE)

# Per-key state: a release stores each key's mechanism state sealed with a 16-byte tag (its
# release, secret and key: `transforms.release.RecordMaker.seal`), in Beam state (streaming) and
# in the scheduler's `keys-*` checkpoints (there as hex in a JSON line: about twice the bytes).
RELEASE_TAG_BYTES = 16
# The budget on it. Every mechanism but the discrete square root keeps 17 B (33 B sealed) at any
# horizon; the discrete square root keeps 16 B per step (25 + 16 T sealed), so 64 KiB admits it
# up to T = 4094 (every bundled config and test horizon: T <= a few hundred) and refuses it at
# T = 8760 (hourly for a year: 140,185 B per key, 13 GiB for 1e5 keys).
DEFAULT_MAX_STATE_BYTES_PER_KEY = 1 << 16
STATE_BUDGET = "max_state_bytes_per_key"


def state_bytes_per_key(name: str, horizon: int, noise: str = "discrete",
                        steps: Optional[int] = None) -> int:
    """Bytes of one key's sealed mechanism state after `steps` releases (default: the whole
    horizon, the largest), for mechanism `name` and the noise kind: the release tag plus the
    mechanism's serialized state (`ContinualMechanism.state_size`). Needs no mechanism built."""
    from . import MECHANISMS  # late: the factory imports this module's package
    check.one_of("name", name, tuple(MECHANISMS))
    return RELEASE_TAG_BYTES + MECHANISMS[name].state_size(horizon, noise, steps)


# what every mechanism but the discrete square root keeps (a CounterState, sealed): 33 B
MIN_STATE_BYTES_PER_KEY = RELEASE_TAG_BYTES + ContinualMechanism.state_size(1)


def check_state_budget(value, name: str = STATE_BUDGET) -> int:
    """A per-key state budget in bytes: an integer >= 33 (what every constant-state mechanism
    keeps, so that some mechanism always fits)."""
    return check.integer_at_least(name, value, MIN_STATE_BYTES_PER_KEY)


def over_budget_condition(name: str, horizon: int, noise: str, state_bytes: int,
                          budget: int) -> str:
    """The condition of the one-line error refusing a mechanism whose state exceeds the
    budget: its size, the budget and the alternatives."""
    return (f"a mechanism whose per-key state fits {STATE_BUDGET} ({budget:,} B): {name} with "
            f"{noise} noise keeps {state_bytes:,} B per key at horizon {horizon}; use blt with "
            f"noise='float' or a tree mechanism (kary_subtraction, smooth_binary, binary_tree, "
            f"kary_tree: {MIN_STATE_BYTES_PER_KEY} B per key), or raise {STATE_BUDGET}")


@dataclasses.dataclass(frozen=True)
class Candidate:
    mechanism: str
    params: dict
    max_se: float
    mean_se: float
    sensitivity: float
    state: str
    calibration: str = "split"   # over the keys a unit touches: "split" or "joint"
    state_bytes: Optional[int] = None  # one key's sealed state at the horizon (bytes)

    def row(self) -> dict:
        return dataclasses.asdict(self)


def candidate_specs(horizon: int, noise: str = "discrete", pure_dp: bool = False
                    ) -> List[Tuple[str, dict]]:
    """(name, params) of every candidate `auto` compares: each mechanism's own list
    (`candidates`), in the order of their `auto_rank`."""
    from . import MECHANISMS  # late: the factory imports this module's package
    return [(cls.name, params)
            for cls in sorted(MECHANISMS.values(), key=lambda cls: cls.auto_rank)
            for params in cls.candidates(horizon, noise, pure_dp)]


def _state_description(name: str, noise: str = "float") -> str:
    from . import MECHANISMS  # late: the factory imports this module's package
    return MECHANISMS[name].state_note(noise)


def memory_note(name: str, noise: str = "discrete") -> str:
    """What a mechanism holds in worker memory besides its per-key state (or why the state
    grows), for `pipelines.plan`."""
    from . import MECHANISMS  # late: the factory imports this module's package
    return MECHANISMS[name].memory_note(noise)


def evaluate(horizon: int, privacy: dict, max_contributions: int = 1, interval_bound: int = 1,
             specs: Optional[List[Tuple[str, dict]]] = None, noise: str = "discrete"
             ) -> List[Candidate]:
    from . import make  # late: the factory imports this module's package
    rows, too_large = [], None
    pure_dp = "rho" not in privacy and "delta" not in privacy
    for name, params in specs or candidate_specs(horizon, noise, pure_dp):
        try:
            mechanism = make(name, horizon, **privacy, max_contributions=max_contributions,
                             interval_bound=interval_bound,
                             noise_source=ConstantNoiseSource(0.0), noise=noise, **params)
            mechanism.check_noise()
        except NoiseTooLarge as error:  # its discrete noise could not be sampled
            if too_large is None or error.parameter < too_large.parameter:
                too_large = error
            continue
        except ValueError:
            if name == "sqrt_toeplitz" and noise == "discrete":
                continue  # its noise would not fit its sampling table: not a candidate
            raise
        rows.append(Candidate(name, mechanism.params(), mechanism.max_se(), mechanism.mean_se(),
                              mechanism.sensitivity, _state_description(name, noise),
                              state_bytes=RELEASE_TAG_BYTES + mechanism.state_bytes()))
    if not rows and too_large is not None:
        raise too_large  # every candidate's noise is too large: the smallest one's refusal
    return rows


def within_budget(rows, max_state_bytes: Optional[int]) -> list:
    """The rows whose per-key state fits the budget (all rows when it is None); refused when
    none does."""
    if max_state_bytes is None:
        return list(rows)
    kept = [r for r in rows if r.state_bytes <= max_state_bytes]
    if not kept:
        check.fail(STATE_BUDGET, f">= {min(r.state_bytes for r in rows)} (the smallest "
                                 f"candidate's state per key)", max_state_bytes)
    return kept


@functools.lru_cache(maxsize=128)
def _evaluated(horizon, privacy_items, max_contributions, interval_bound, noise):
    """`evaluate` with the default candidates, once per process and arguments (deterministic:
    every transform built for the same release resolves the same mechanism)."""
    return tuple(evaluate(horizon, dict(privacy_items), max_contributions, interval_bound,
                          noise=noise))


def choose(horizon: int, privacy: dict, max_contributions: int = 1, interval_bound: int = 1,
           metric: str = "max", noise: str = "discrete", max_state_bytes: Optional[int] = None
           ) -> Tuple[Candidate, List[Candidate]]:
    """The candidate with the lowest MaxSE (or MeanSE) for the noise kind among those whose
    per-key state fits `max_state_bytes` (None: no cap), and the whole table."""
    check.one_of("metric", metric, METRICS)
    if max_state_bytes is not None:
        check_state_budget(max_state_bytes)
    rows = list(_evaluated(horizon, tuple(sorted(privacy.items())), max_contributions,
                           interval_bound, noise))
    key = (lambda c: (c.max_se, c.mean_se)) if metric == "max" else (
        lambda c: (c.mean_se, c.max_se))
    return min(within_budget(rows, max_state_bytes), key=key), rows
