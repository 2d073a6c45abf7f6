"""The contract every continual-counting mechanism implements.

A mechanism is a factorization A = L R of the T x T all-ones lower-triangular matrix A (Andersson et
al. 2026,
Sec. 5). It releases L (R x + z) = A x + L z with i.i.d. node noise z calibrated to the
sensitivity of R. Because L z does not depend on the data, this implementation adds the exact
running total of x to L z, which it derives from the keyed noise seam. Hence:

- with `noise="discrete"` (the default) z is discrete Laplace / discrete Gaussian integers and
  R, L are integer matrices for every mechanism that allows it: the release is an integer vector,
  private in exact arithmetic (no floating-point leak, CKS20); `noise="float"` is the opt-in
  continuous float64 noise (not safe against floating-point attacks);

- the streaming state is only (steps released, exact running total): 17 bytes for every
  mechanism, trees and the float square root alike (the discrete square root also keeps its
  input history, 16 B per step: `state_size`); no noise is stored, none is ever re-drawn;
- exact totals: with discrete noise the data is integer and its running total is summed in
  float64, which adds integers exactly only below 2^53 (`EXACT_LIMIT`): `advance` and `step`
  refuse a value or running total of magnitude >= 2^53 rather than round it (a rounded total
  could move by 0 or 2 for a declared change of 1: the sensitivity would not hold). A
  released value (total + integer noise) is exact below 2^53 too; beyond, it would be the
  nearest float64 (post-processing: privacy unaffected), and the Beam release halts the key
  there instead (`RecordMaker.step_sealed`). Float noise sums float64 as it is (opt-in). The
  data never enters L z: the trees' batch and streaming paths combine node noise only;
- `step` and `release` run the same arithmetic in the same order, so they agree bit for bit.
"""
from __future__ import annotations

import abc
import math
from typing import ClassVar, List, Optional, Tuple

import numpy as np

from transforms import validation as check
from . import sensitivity as sensitivity_seam
from . import discrete, tails
from .noise import NoiseSource, StreamKey, prefix_length, stream_bytes
from .privacy import GAUSSIAN, PrivacyBudget
# the state classes and the exact-totals limit: re-exported (imported from here too)
from .state import (  # noqa: F401
    EXACT_INTEGER, EXACT_FLOAT, OVER_LIMIT, EXACT_LIMIT, EXACT_LIMIT_TEXT, CounterState,
    HistoryState, counter_state, first_inexact, state_from_bytes)

NOISE_KINDS = ("discrete", "float")
# Relative margin by which a discrete sampler's parameter is rounded up, so that float rounding
# in the sensitivity or the budget can never make the noise smaller than the calibration needs.
_PARAMETER_MARGIN = 2.0 ** -40
# Streaming reads node noise in aligned blocks of DRAW_BLOCK nodes (or their first 64, 128,
# ... nodes: `noise.prefix_length`), keeping blocks of at most _DRAW_CACHE_NODES nodes in all
# per mechanism (and its for_stream copies): <= 32 MiB of float64, oldest first out (the
# scalar paths' views of blocks, `_node_views`, go with their blocks). A worker's keys step
# together at a step end, each reading one block per tree level (mostly short prefixes of the
# upper levels): while keys x their blocks fit, no step re-derives a block; beyond, a key-step
# re-derives its blocks (about 0.5-1 ms).
DRAW_BLOCK = 1024
_DRAW_CACHE_BLOCKS = 4096
_DRAW_CACHE_NODES = _DRAW_CACHE_BLOCKS * DRAW_BLOCK


class ContinualMechanism(abc.ABC):
    """Base class: subclasses define L, R and the noise sum L z; this class does the rest."""

    name: ClassVar[str]
    # which node of the factorization a noise index names; bump when it changes (with the
    # noise domain version, it is the release's `noise_derivation`: a release is only ever
    # continued by code deriving every node's noise exactly as before)
    node_indexing: ClassVar[int] = 1
    # what `make(**params)` accepts besides the budget, noise and bounds (others are refused)
    accepts: ClassVar[Tuple[str, ...]] = ()
    # where `auto` lists it among its candidates (`choose.candidate_specs`), lowest first
    auto_rank: ClassVar[int] = 0
    # whether it has a pure-DP (epsilon alone, Laplace) calibration
    pure_dp: ClassVar[bool] = True
    # whether its first t outputs and their calibration are the same for every horizon
    horizon_free: ClassVar[bool] = False

    @classmethod
    def candidates(cls, horizon: int, noise: str, pure_dp: bool) -> List[dict]:
        """The parameters `auto` compares this mechanism with at `horizon` (none: it is not
        a candidate there)."""
        return [{}]

    @classmethod
    def default_params(cls, noise_law: str) -> dict:
        """What `make` fills in when it is not given, for the noise law (Laplace, Gaussian)."""
        return {}

    @classmethod
    def state_note(cls, noise: str) -> str:
        """What one key's state holds (`plan`'s table): a CounterState, 17 B."""
        return "17 B"

    @classmethod
    def memory_note(cls, noise: str) -> str:
        """What it holds in worker memory besides its per-key state (`plan`), or ""."""
        return ""

    def __init__(self, horizon: int, budget: PrivacyBudget, noise_source: NoiseSource, *,
                 max_contributions: int = 1, interval_bound: int = 1, stream: StreamKey = b"",
                 noise: str = "discrete"):
        self.horizon = check.integer_at_least("horizon", horizon, 1)
        check.one_of("noise", noise, NOISE_KINDS)
        self.noise = noise
        if not isinstance(budget, PrivacyBudget):
            check.fail("budget", "a PrivacyBudget", budget)
        if not isinstance(noise_source, NoiseSource):
            check.fail("noise_source", "a NoiseSource", noise_source)
        self.budget = budget
        self.noise_source = noise_source
        self.max_contributions = check.integer_at_least("max_contributions",
                                                        max_contributions, 1)
        self.interval_bound = check.integer_at_least("interval_bound", interval_bound, 1)
        stream_bytes(stream)
        self.stream = stream
        self._cache = {}

    @property
    def noise_derivation(self) -> str:
        """How this mechanism derives every node's noise (`derivation_name` of its noise
        source's version)."""
        return self.derivation_name(self.noise_source.version)

    def derivation_name(self, version: str) -> str:
        """How node noise is derived under the seam's `version` (`noise.NOISE_VERSIONS`): the
        version and this mechanism's node indexing (part of a release's descriptor)."""
        return f"{version}/{self.name}/{self.node_indexing}"

    # ----- what subclasses define ------------------------------------------------------------
    @abc.abstractmethod
    def column_norm(self, p: int) -> float:
        """Largest column l_p norm of R: the sensitivity on S_{1,1}."""

    @abc.abstractmethod
    def set_sensitivity(self, p: int, k: int, d: int) -> float:
        """l_p sensitivity of R on S_{d,k} for k >= 2, d <= k (see sensitivity.py)."""

    @abc.abstractmethod
    def _unit_noise(self, start: int, count: int) -> np.ndarray:
        """(L z)[start:start+count] for unit node noise z (Laplace(0,1) or N(0,1))."""

    @abc.abstractmethod
    def _squared_weights(self) -> np.ndarray:
        """Per step t: sum_i L[t, i]^2 over the nodes that carry noise (length T)."""

    @abc.abstractmethod
    def _equal_weight_terms(self) -> Optional[np.ndarray]:
        """Per step, the number of noise terms if all |L[t, i]| are 1, else None."""

    @abc.abstractmethod
    def dense_factors(self) -> Tuple[np.ndarray, np.ndarray]:
        """(L, R) as dense arrays, for small T (inspection and tests)."""

    def params(self) -> dict:
        """Mechanism parameters (for display and configs)."""
        return {}

    # ----- calibration -----------------------------------------------------------------------
    @property
    def distribution(self) -> str:
        return self.budget.noise

    @property
    def discrete(self) -> bool:
        return self.noise == "discrete"

    @property
    def integer_release(self) -> bool:
        """True when every released value is an exact integer (discrete noise, integer L)."""
        return self.discrete

    @property
    def noise_name(self) -> str:
        """'discrete_laplace', 'discrete_gaussian', 'laplace' or 'gaussian'."""
        return ("discrete_" if self.discrete else "") + self.distribution

    @property
    def sampler(self) -> "discrete.DiscreteSampler":
        """The node noise law for discrete noise: scale t >= Delta_1 / epsilon (discrete
        Laplace) or sigma^2 >= Delta_2^2 / (2 rho) (discrete Gaussian), rounded up."""
        if "sampler" not in self._cache:
            if self.distribution == GAUSSIAN:
                kind, budget = discrete.DISCRETE_GAUSSIAN, ("rho", self.budget.rho)
                parameter = self.sensitivity ** 2 / (2.0 * self.budget.rho)
            else:
                kind, budget = discrete.DISCRETE_LAPLACE, ("epsilon", self.budget.epsilon)
                parameter = self.sensitivity / self.budget.epsilon
            parameter = parameter * (1.0 + _PARAMETER_MARGIN)
            limit = discrete.MAX_PARAMETER[kind]
            if not parameter <= limit:  # refused here, with what makes it large
                raise discrete.NoiseTooLarge(check.message(
                    "noise parameter", f"<= {limit:g} for {kind} noise (sensitivity "
                    f"{self.sensitivity:.4g}, {budget[0]} {budget[1]:.4g}: raise {budget[0]}, "
                    f"lower the bounds or use noise='float')", parameter),
                    kind, parameter, limit)
            self._cache["sampler"] = discrete.sampler(kind, parameter)
        return self._cache["sampler"]

    def check_noise(self) -> None:
        """Refuse (`discrete.NoiseTooLarge`) discrete noise whose sampler cannot be built (its
        parameter over `discrete.MAX_PARAMETER`): at construction, not at a worker's first
        draw. Float noise has no such limit."""
        if self.discrete:
            self.sampler  # noqa: B018 (builds the law, not its table)

    def _draw(self, level: int, start: int, count: int) -> np.ndarray:
        """Node noise z of nodes start .. start+count-1 on `level`: integers (discrete) or unit
        floats (scaled by node_scale after combining).

        Small reads inside one aligned block of DRAW_BLOCK nodes (every streaming step) are
        served from a bounded per-mechanism cache of blocks, read once through the same noise
        source call as any other read: a node's noise depends only on its (stream, level,
        index), so the values are the same, without the source's generic per-call path. A read
        of a block's first nodes (a short horizon's upper levels) derives only a prefix of the
        block (`noise.prefix_length`), the same values."""
        if 0 < count <= DRAW_BLOCK and start >= 0:
            block = start // DRAW_BLOCK
            offset = start - block * DRAW_BLOCK
            end = offset + count
            if end <= DRAW_BLOCK:
                cache = self._cache.get("draw_blocks")
                if cache is not None and cache[0] is self.noise_source:  # inlined cache hit
                    stream = self.stream
                    values = cache[1].get((type(stream), stream, level, block))
                    if values is not None and values.shape[0] >= end:
                        return values[offset:end]
                return self._draw_block(level, block, end)[offset:end]
        return self._draw_nodes(level, start, count)

    def _draw_one(self, level: int, index: int) -> float:
        """Node noise z of node `index` on `level` as a Python float (as `_draw`)."""
        block = index // DRAW_BLOCK
        cache = self._cache.get("draw_blocks")
        if cache is not None and cache[0] is self.noise_source:  # the cached block, inlined
            stream = self.stream
            values = cache[1].get((type(stream), stream, level, block))
            if values is not None and index - block * DRAW_BLOCK < values.shape[0]:
                return values.item(index - block * DRAW_BLOCK)
        if index < 0:
            return float(self._draw_nodes(level, index, 1)[0])  # the source refuses it
        at = index - block * DRAW_BLOCK
        return self._draw_block(level, block, at + 1).item(at)

    def _draw_block(self, level: int, block: int, need: int = DRAW_BLOCK) -> np.ndarray:
        """Nodes [block, block + 1) x DRAW_BLOCK of `level` in this stream, cached: all of
        them, or at least the first `need` (`noise.prefix_length` of them; a cached prefix
        too short for a read is derived again, longer)."""
        blocks = self._draw_blocks()
        stream = self.stream
        values = blocks.get((type(stream), stream, level, block))
        if values is None or values.shape[0] < need:
            values = self._keep_block(level, block, self._draw_nodes(
                level, block * DRAW_BLOCK, prefix_length(need, DRAW_BLOCK)))
        return values

    def _draw_cache(self) -> tuple:
        """(noise source, {(type(stream), stream, level, block): node noise}, [nodes held])
        for this mechanism's noise source (keyed by the source object: a mechanism given
        another source starts over)."""
        cache = self._cache.get("draw_blocks")
        if cache is None or cache[0] is not self.noise_source:
            cache = self._cache["draw_blocks"] = (self.noise_source, {}, [0])
        return cache

    def _draw_blocks(self) -> dict:
        return self._draw_cache()[1]

    def _keep_block(self, level: int, block: int, values: np.ndarray,
                    view: bool = False) -> np.ndarray:
        """Cache `values` as (a prefix of) block `block` of `level` in this stream, as the
        newest; the oldest blocks (and their views) go while more than _DRAW_CACHE_NODES
        nodes would be held. Its view (`_node_views`) is kept too if `view` or if one was
        kept before."""
        _, blocks, held = self._draw_cache()
        views = self._node_views()
        stream = self.stream
        key = (type(stream), stream, level, block)
        replaced = blocks.pop(key, None)
        if replaced is not None:
            held[0] -= replaced.shape[0]
        while blocks and held[0] + values.shape[0] > _DRAW_CACHE_NODES:
            oldest = next(iter(blocks))
            held[0] -= blocks.pop(oldest).shape[0]
            views.pop(oldest, None)
        blocks[key] = values
        held[0] += values.shape[0]
        if view or key in views:
            self._keep_view(key, values)
        return values

    def _derive_blocks(self, wanted) -> None:
        """Derive at least the first `need` nodes of each (level, block, need) of `wanted` in
        this stream that the block cache does not hold (this far), in one noise source call
        (`noise.prefix_length` nodes each; a keyed source samples them in one pass), and
        keep them with their views: the same values as deriving them one by one."""
        blocks = self._draw_blocks()
        stream = self.stream
        kind = type(stream)
        todo = []
        for level, block, need in wanted:
            values = blocks.get((kind, stream, level, block))
            if values is None or values.shape[0] < need:
                todo.append((level, block, prefix_length(need, DRAW_BLOCK)))
        if not todo:
            return
        reads = [(level, block * DRAW_BLOCK, length) for level, block, length in todo]
        if self.discrete:
            derived = self.noise_source.discrete_noise_reads(self.sampler, stream, reads)
        else:
            derived = self.noise_source.unit_noise_reads(self.distribution, stream, reads)
        for (level, block, _), values in zip(todo, derived):
            self._keep_block(level, block, values, view=True)

    def _node_views(self) -> dict:
        """{(type(stream), stream, level, block): the block's node noise indexable as Python
        floats} for this mechanism's noise source (the scalar streaming paths read a few nodes
        per step; `_node_view` fills it). A view of a cached block of `_draw_block` (a
        memoryview of its float64 buffer, or its `tolist()`): the same values, bit for bit,
        as the `tolist()` of any read of those nodes."""
        views = self._cache.get("draw_views")
        if views is None or views[0] is not self.noise_source:
            views = self._cache["draw_views"] = (self.noise_source, {})
        return views[1]

    def _node_view(self, level: int, block: int, need: int = DRAW_BLOCK):
        """Block `block` of `level` in this stream as `_node_views` holds it, at least its
        first `need` nodes (`_draw_block`: a stream's first steps derive only the prefixes of
        blocks they read, and its later steps derive them again, longer; callers check the
        view's length). Views are only kept of cached blocks, and go with them."""
        stream = self.stream
        key = (type(stream), stream, level, block)
        values = self._draw_block(level, block, need)
        view = self._node_views().get(key)
        if view is None or len(view) != values.shape[0]:
            view = self._keep_view(key, values)
        return view

    def _keep_view(self, key: tuple, values):
        """Keep the view of block `key` (`_node_views`) made from its cached `values`."""
        views = self._node_views()
        if (type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1
                and values.flags.c_contiguous):
            view = memoryview(values)
        else:
            view = np.asarray(values).tolist()
        views[key] = view
        return view

    def _draw_nodes(self, level: int, start: int, count: int) -> np.ndarray:
        """`_draw` through the noise source's generic path (no block cache)."""
        if self.discrete:
            return self.noise_source.discrete_noise(self.sampler, self.stream, level, start,
                                                    count)
        return self.noise_source.unit_noise(self.distribution, self.stream, level, start, count)

    @property
    def sensitivity(self) -> float:
        """l_p sensitivity of R on S_{D,k} (p = 1 for Laplace, 2 for Gaussian)."""
        if "sensitivity" not in self._cache:
            self._cache["sensitivity"] = sensitivity_seam.sensitivity(
                self, self.budget.sensitivity_norm, self.max_contributions,
                self.interval_bound)
        return self._cache["sensitivity"]

    @property
    def node_scale(self) -> float:
        """Laplace scale b or Gaussian sigma of every node's noise (discrete: the sampler's t
        or sigma)."""
        if self.discrete:
            p = self.sampler.parameter
            return p if self.distribution != GAUSSIAN else math.sqrt(p)
        return self.budget.node_scale(self.sensitivity)

    @property
    def node_variance(self) -> float:
        """Exact variance of one node's noise (the discrete laws' own, not the continuous)."""
        if self.discrete:
            return self.sampler.variance
        return self.budget.node_variance(self.sensitivity)

    # ----- release ---------------------------------------------------------------------------
    def for_stream(self, stream: StreamKey) -> "ContinualMechanism":
        """The same mechanism drawing its noise for another stream (e.g. a public key)."""
        stream_bytes(stream)
        # copy.copy without its generic reduce protocol (a plain instance: its __dict__)
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.stream = stream
        # shares the per-stream noise cache (keyed by stream) and the calibration
        self._cache.setdefault("stream_noise", {})
        other._cache = self._cache
        return other

    def init_state(self) -> CounterState:
        return CounterState()

    @classmethod
    def state_size(cls, horizon: int, noise: str = "discrete", steps: Optional[int] = None
                   ) -> int:
        """Bytes of `state.to_bytes()` after `steps` releases (default: all `horizon` steps,
        the largest) for this mechanism class and noise kind, without building it. Every
        mechanism keeps a `CounterState` (17 B, whatever T); subclasses whose state grows with
        the steps (the discrete square root) override this. Tested against the real state."""
        return CounterState._FORMAT.size

    def state_bytes(self, steps: Optional[int] = None) -> int:
        """Bytes of this mechanism's serialized state after `steps` releases (default: the
        horizon): `state_size` for its horizon and noise."""
        return type(self).state_size(self.horizon, self.noise, steps)

    def advance(self, state: CounterState, values) -> Tuple[np.ndarray, CounterState]:
        """Release the next len(values) steps from `state`, vectorised. With discrete noise
        the values must be integers and every value and running total below 2^53 in
        magnitude (`EXACT_LIMIT`: float64 sums them exactly); the released values (total +
        integer noise) are exact integers while below 2^53 too."""
        if not isinstance(state, CounterState):
            check.fail("state", "a CounterState", state)
        xs = np.asarray(values, dtype=np.float64).reshape(-1)
        # (the refusals show no finite value: the values are private data)
        if not np.all(np.isfinite(xs)):
            check.fail("values", "finite numbers", xs[~np.isfinite(xs)][:3].tolist())
        if self.discrete and not np.all(xs == np.round(xs)):
            check.fail("values", "integers with discrete noise (use a value grid, or "
                                 "noise='float')", "non-integers")
        if state.steps + xs.shape[0] > self.horizon:
            check.fail("steps released", f"<= horizon ({self.horizon})",
                       state.steps + xs.shape[0])
        totals = np.cumsum(np.concatenate(([state.running_total], xs)))[1:]
        if self.discrete and first_inexact(state.running_total, xs, totals) is not None:
            # fail closed, without the values in the message (they are private)
            check.fail("values", OVER_LIMIT, "a larger total")
        noise = self._unit_noise(state.steps, xs.shape[0])
        if not self.discrete:
            noise = self.node_scale * noise
        new_state = CounterState(state.steps + xs.shape[0],
                                 float(totals[-1]) if xs.shape[0] else state.running_total)
        return totals + noise, new_state

    def step(self, state: CounterState, value) -> Tuple[float, CounterState]:
        """Release one step: (noisy running total, new state) (`step_counter` where it
        applies, else `advance` on one value)."""
        if type(state) is CounterState:
            found = self.step_counter(state.steps, state.running_total, value)
            if found is not None:
                return found[0], counter_state(state.steps + 1, found[1])
        out, new_state = self.advance(state, [value])
        return float(out[0]), new_state

    def last_output(self, state) -> float:
        """The value released at the state's last step (`state.steps` - 1; 0.0 before the
        first), re-derived from the noise seam with `advance`'s own operations (running total
        + noise, or + node_scale * noise): the same float, so a step's own value (this
        release minus the last) needs no stored value.

        >>> from transforms.mechanisms import make
        >>> m = make("binary_tree", 8, epsilon=1.0, seed=3)
        >>> out, state = m.advance(m.init_state(), [2.0, 0.0, 5.0])
        >>> bool(m.last_output(state) == out[-1])
        True
        """
        if state.steps == 0:
            return 0.0
        noise = self._unit_noise(state.steps - 1, 1)[0]
        if not self.discrete:
            noise = self.node_scale * noise
        return float(state.running_total + noise)

    def step_counter(self, steps, running_total, value) -> Optional[Tuple[float, float]]:
        """`step` of CounterState(steps, running_total) on Python floats: (noisy running
        total, the new running total), or None where `step` goes through `advance` instead.

        The same checks, in the same order, and the same IEEE operations as `advance` on one
        value (running_total + x, then + noise or + node_scale * noise): a scalar fast path
        for an int step count, a float total and a float / numpy float64 / exactly
        convertible int value. A discrete step past the exact limit (`first_inexact` for one
        step) returns None: `advance` refuses it, with its message."""
        plan = self._cache.get("step_plan")
        if plan is None:
            plan = self._step_plan()
        if plan is False:
            return None
        kind = type(value)
        if not ((kind is float or kind is np.float64
                 or (kind is int and -EXACT_INTEGER <= value <= EXACT_INTEGER))
                and type(steps) is int and type(running_total) is float):
            return None
        x = float(value)
        if x - x != 0.0:  # nan or +-inf
            check.fail("values", "finite numbers", [value])
        discrete, scale = plan
        if discrete and not x.is_integer():
            check.fail("values", "integers with discrete noise (use a value grid, or "
                                 "noise='float')", "non-integers")
        if steps + 1 > self.horizon:
            check.fail("steps released", f"<= horizon ({self.horizon})", steps + 1)
        total = running_total + x
        if discrete and not (-EXACT_FLOAT < total < EXACT_FLOAT and -EXACT_FLOAT < x < EXACT_FLOAT
                             and -EXACT_FLOAT < running_total < EXACT_FLOAT):
            return None  # = first_inexact on one step, inlined
        noise = self._step_noise(steps)
        if not discrete:
            noise = scale * noise
        return total + noise, total

    def _step_plan(self):
        """(discrete, node_scale or None) for the scalar step, or False when this mechanism's
        `advance` is not the CounterState one below (cached per mechanism)."""
        if not self._counter_advance():
            plan = False
        else:
            plan = (self.discrete, None if self.discrete else float(self.node_scale))
        self._cache["step_plan"] = plan
        return plan

    def _counter_advance(self) -> bool:
        """True when `advance` is ContinualMechanism.advance (then `step` may bypass it)."""
        return type(self).advance is ContinualMechanism.advance

    def _step_noise(self, start: int) -> float:
        """(L z)[start] as a Python float: the unit noise of step start + 1 (as `_unit_noise`)."""
        return float(self._unit_noise(start, 1)[0])

    def release(self, x) -> np.ndarray:
        """Noisy prefix sums of x (len(x) <= T steps), identical to len(x) calls of `step`."""
        return self.advance(self.init_state(), x)[0]

    # ----- error -----------------------------------------------------------------------------
    def noise_variance(self) -> np.ndarray:
        return self.node_variance * self._squared_weights()

    def noise_std(self) -> np.ndarray:
        """Exact standard deviation of the noise at steps t = 1..T."""
        return np.sqrt(self.noise_variance())

    def max_se(self) -> float:
        """Root of the largest per-step variance."""
        return math.sqrt(float(np.max(self.noise_variance())))

    def mean_se(self) -> float:
        """Root of the mean per-step variance."""
        return math.sqrt(float(np.mean(self.noise_variance())))

    def confidence_half_width(self, level: float = 0.95, simultaneous: bool = False
                              ) -> np.ndarray:
        """Half-width c_t with P(|noise_t| > c_t) <= 1 - level at every step t: the exact
        quantile of the step's noise law (`tails.step_quantiles`: Gil-Pelaez inversion, its
        numerical error bounds added to the tail, so coverage is in [level, level + 2e-10];
        integer sums: the smallest integer that covers; the discrete square root: at most two
        grid units wider, plus its rounding's bound, `rounding_bound`). Cached per (level,
        simultaneous); returns a copy.

        With `simultaneous`, all T steps are covered at once with probability >= level
        (Bonferroni over the T steps).
        """
        level = check.open_unit_interval("level", level)
        check.boolean("simultaneous", simultaneous)
        key = ("half_width", level, simultaneous)
        if key not in self._cache:
            alpha = (1.0 - level) / (self.horizon if simultaneous else 1)
            node, factor = self._noise_node()
            half = factor * tails.step_quantiles(node, alpha, **self._noise_rows())
            half[self.noise_variance() == 0] = 0.0
            self._cache[key] = half + self.rounding_bound()
        return self._cache[key].copy()

    def rounding_bound(self, increments: bool = False) -> np.ndarray:
        """Per step, a bound on |release - (A x + L z)| that is not noise: 0 for every
        mechanism whose release is exactly the total plus L z (the discrete square root
        rounds R~ x / g: it overrides this). The intervals add it to the noise's quantile;
        `increments`: the bound for the step's own value."""
        return np.zeros(self.horizon)

    def _noise_node(self) -> Tuple["tails.NodeLaw", float]:
        """The law of one node's noise z and the factor the release applies to L z: the
        discrete sampler's law (factor 1), or the continuous Laplace / Gaussian of scale
        `node_scale` (factor 1)."""
        if self.discrete:
            return tails.node_law(self.sampler.kind, self.sampler.parameter), 1.0
        return tails.node_law(self.distribution, self.node_scale), 1.0

    def _noise_rows(self) -> dict:
        """How step t's noise combines the nodes (`tails.step_quantiles`): {"counts": n_t}
        when every |L[t, i]| is 1 (`_equal_weight_terms`), else {"coefficients": l} for a
        Toeplitz L whose row t is l_{t-1}, ..., l_0 (`left_coefficients`)."""
        terms = self._equal_weight_terms()
        if terms is not None:
            return {"counts": terms}
        left = getattr(self, "left_coefficients", None)
        if left is None:
            raise AssertionError("a left factor with unequal weights must be Toeplitz "
                                 "(`left_coefficients`)")
        return {"coefficients": left()}

    def confidence_interval(self, released, level: float = 0.95, simultaneous: bool = False
                            ) -> Tuple[np.ndarray, np.ndarray]:
        """(low, high) around released values of steps 1..len(released)."""
        released = np.asarray(released, dtype=np.float64)
        half = self.confidence_half_width(level, simultaneous)[:released.shape[0]]
        return released - half, released + half

    def privacy_events(self):
        """What one release of this mechanism spends, as accounting records: Zcdp(rho) for
        Gaussian noise; for Laplace noise PureDp(epsilon) and the LaplaceRelease whose
        (epsilon, delta) also uses the l2 sensitivity (Andersson et al. 2024 Thm 1.3)."""
        from .accounting import LaplaceRelease, PureDp, Zcdp
        if self.distribution == GAUSSIAN:
            return [Zcdp(self.budget.rho)]
        if self.discrete:
            return [PureDp(self.budget.epsilon)]
        l2 = sensitivity_seam.sensitivity(self, 2, self.max_contributions, self.interval_bound)
        return [PureDp(self.budget.epsilon),
                LaplaceRelease(self.sensitivity, min(l2, self.sensitivity), self.node_scale)]

    def describe(self) -> dict:
        """Everything a user needs to see before spending budget (also Beam display data)."""
        return {"mechanism": self.name, "params": self.params(), "horizon": self.horizon,
                **self.budget.as_dict(), "noise": self.noise_name,
                "max_contributions": self.max_contributions,
                "interval_bound": self.interval_bound,
                "sensitivity": self.sensitivity, "node_scale": self.node_scale,
                "max_se": self.max_se(), "mean_se": self.mean_se()}

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return (f"{type(self).__name__}(horizon={self.horizon}, {params + ', ' if params else ''}"
                f"{self.budget})")
