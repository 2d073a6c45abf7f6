"""Tree mechanisms: binary, k-ary (seed 000 Alg. 1), k-ary with subtraction (seed 000 Alg. 2/3,
even k per App. A.3) and the smooth binary mechanism (seed 002).

All four share one structure. Leaves are 0-based positions; the input of time s (1-based) sits in
leaf `data_leaf(s)`. Level l (0 <= l < h; the root level h is never used) holds nodes
[j k^l, (j+1) k^l). The output at time t is the sum of the first `prefix_leaves(t)` leaves,
written with h digits d_l in [low, low + k - 1]: from the top level down, a digit d > 0 adds the
first d children of the current parent, d < 0 subtracts its last |d| children (seed 000 Alg. 3
with the corrected line 15 of NOTES.md).

- k-ary tree: digits [0, k-1], prefix_leaves(t) = t, data_leaf(s) = s - 1.
- subtraction: offset digits [-(k-1)/2, (k-1)/2] (odd k) or [-k/2+1, k/2] (even k).
- smooth binary: k = 2, h even, data_leaf(s) = m(s) = the (s-1)-st (0-based) h-bit integer with
  h/2 ones, prefix_leaves(t) = m(t+1) (NOTES.md: 0-based reading).

Options: `sparsify` zeroes the rows of R of nodes no step <= T uses (seed 004 Sec. 9.2.1, R-hat);
`prune` drops the noise of nodes holding no data leaf (publicly zero). Both only lower the error.
"""
from __future__ import annotations

import itertools
import math
from typing import List, Optional, Tuple

import numpy as np

from transforms import validation as check
from .base import DRAW_BLOCK, ContinualMechanism

# Above this horizon the sparsified sensitivity is not enumerated; the structural count (every
# data leaf lies in at most `_structural_column_count()` noisy nodes) is used instead.
EXACT_SENSITIVITY_LIMIT = 1 << 22
_CHUNK = 1 << 20
# Steps whose node plan (`TreeMechanism._node_plan`) a mechanism keeps (and its stream copies).
_NODE_PLAN_STEPS = 1 << 12
# A stream's step that reads a node not derived yet derives the nodes its next PREFETCH_STEPS
# steps read, on every level, in one noise source call (`TreeMechanism._prefetch`).
PREFETCH_STEPS = DRAW_BLOCK
_SEEN_ONCE = 1  # a step asked for once, read directly: no plan yet (plans are tuples or False)


def _smallest_height(max_digit: int, k: int, horizon: int) -> int:
    """Smallest h >= 1 whose largest h-digit number max_digit (k^h - 1)/(k - 1) is >= horizon."""
    h = 1
    while max_digit * (k ** h - 1) // (k - 1) < horizon:
        h += 1
    return h


class TreeMechanism(ContinualMechanism):
    """Shared implementation; subclasses fix arity, digit range, height and the leaf maps."""

    arity: int
    digit_low: int
    height: int
    prefix_is_step = True  # prefix_leaves(t) == t: level runs are computed per distinct digit

    def __init__(self, horizon, budget, noise_source, *, sparsify: bool = True,
                 prune: bool = True, **kwargs):
        super().__init__(horizon, budget, noise_source, **kwargs)
        self.sparsify = check.boolean("sparsify", sparsify)
        self.prune = check.boolean("prune", prune)

    # ----- leaf maps (overridden by the smooth mechanism) -------------------------------------
    def prefix_leaves(self, steps: np.ndarray) -> np.ndarray:
        return steps.astype(np.int64)

    def data_leaf(self, steps: np.ndarray) -> np.ndarray:
        return steps.astype(np.int64) - 1

    def data_free(self, level: int, nodes: np.ndarray) -> np.ndarray:
        """True for nodes holding no data leaf (entirely beyond the horizon)."""
        return nodes * self.arity ** level >= self.horizon

    def _structural_column_count(self) -> int:
        return self.height

    # ----- decomposition -----------------------------------------------------------------------
    def digits(self, steps: np.ndarray) -> List[np.ndarray]:
        """Digits d_0 .. d_{h-1} of prefix_leaves(steps) in this tree's digit range."""
        rest = self.prefix_leaves(np.asarray(steps, dtype=np.int64))
        k, low = self.arity, self.digit_low
        out = []
        for _ in range(self.height):
            digit = (rest - low) % k + low
            rest = (rest - digit) // k
            out.append(digit)
        if np.any(rest != 0):
            raise AssertionError("prefix does not fit the tree height")
        return out

    def decompose(self, steps: np.ndarray):
        """Per level from the top: (level, digit, parent index whose children the digit uses)."""
        k = self.arity
        digits = self.digits(steps)
        position = np.zeros(len(steps), dtype=np.int64)
        for level in range(self.height - 1, -1, -1):
            digit = digits[level]
            parent = position // k ** (level + 1) - (digit < 0)
            yield level, digit, parent
            position = position + digit * k ** level

    def level_runs(self, start: int, count: int):
        """Per level from the top: (level, digit, parent, repeats) for steps start+1..start+count.

        np.repeat(values, repeats) expands per-run values to per-step values; repeats is None when
        runs are steps. The generic version makes one run per step; trees whose prefix is the
        step itself override it with one run per distinct (digit, parent) at the level.
        """
        if not self.prefix_is_step:
            for level, digit, parent in self.decompose(self._steps(start, count)):
                yield level, digit, parent, None
            return
        # The digits of t in [low, low + k - 1] are the standard digits of t + shift, minus
        # |low|, with shift = -low (k^h - 1)/(k - 1). Everything at level l depends only on
        # u = (t + shift) // k^l, so each level is computed once per distinct u and repeated.
        k, low, h = self.arity, self.digit_low, self.height
        shift = -low * (k ** h - 1) // (k - 1)
        first, last = start + 1 + shift, start + count + shift
        for level in range(h - 1, -1, -1):
            size = k ** level
            u = np.arange(first // size, last // size + 1, dtype=np.int64)
            digit = u % k + low
            parent = u // k + low * (k ** (h - level - 1) - 1) // (k - 1) - (digit < 0)
            repeats = np.full(u.shape[0], size, dtype=np.int64)
            repeats[0] -= first - u[0] * size
            repeats[-1] -= (u[-1] + 1) * size - 1 - last
            yield level, digit, parent, repeats

    @property
    def unused_child(self) -> int:
        """The child no step ever uses: index of the largest digit (seed 004 Sec. 9.2.1)."""
        return self.digit_low + self.arity - 1

    def _children(self, level: int, first_parent: int, parents: int, values) -> np.ndarray:
        """(parents, k) node values of consecutive parents' children; the never-used child is 0.

        `values(level, start, count)` is indexed by the compact child index
        parent * (k - 1) + rank among the k - 1 usable children, so no noise is derived for nodes
        that can never be used. Data-free children are zeroed when pruning.
        """
        k = self.arity
        usable = values(level, first_parent * (k - 1), parents * (k - 1)).reshape(parents, k - 1)
        children = np.insert(usable, self.unused_child, 0.0, axis=1)
        if self.prune:
            nodes = np.arange(first_parent * k, (first_parent + parents) * k, dtype=np.int64)
            keep = (~self.data_free(level, nodes)).astype(np.float64).reshape(parents, k)
            children = children * keep
        return children

    def _pick(self, level, digit, parent, values, signed) -> np.ndarray:
        """Per run: sum of the digit's children of `parent` (prefix if d > 0, suffix if d < 0)."""
        used = digit != 0
        if not used.any():
            return np.zeros(len(digit), dtype=np.float64)
        first = int(parent[used].min())
        last = int(parent[used].max())
        children = self._children(level, first, last - first + 1, values)
        prefix = np.cumsum(children, axis=1)
        suffix = np.cumsum(children[:, ::-1], axis=1)
        rows = np.where(used, parent - first, 0)
        size = np.maximum(np.abs(digit) - 1, 0)
        picked = np.where(digit > 0, prefix[rows, size], suffix[rows, size])
        if signed:
            picked = np.where(digit < 0, -picked, picked)
        return np.where(used, picked, 0.0)

    def _combine(self, start: int, count: int, values, signed: bool) -> np.ndarray:
        """sum over the nodes of each step of sign * node value, for steps start+1..start+count.

        Each level's run of nodes is a prefix (d > 0) or suffix (d < 0) of one parent's children,
        so it is read from within-parent cumulative sums; levels are added from the top down.
        The streaming path `_unit_noise_one` does the same additions in the same order, so batch
        and streaming agree bit for bit.
        """
        if self.prefix_is_step:
            return self._combine_contiguous(start, count, values, signed)
        total = np.zeros(count, dtype=np.float64)
        for level, digit, parent, repeats in self.level_runs(start, count):
            contribution = self._pick(level, digit, parent, values, signed)
            if repeats is not None:
                contribution = np.repeat(contribution, repeats)
            total = total + contribution
        return total

    def _combine_contiguous(self, start, count, values, signed) -> np.ndarray:
        """`_combine` for trees whose prefix is the step, in O(T k / (k - 1)) work.

        With u_l = (t + shift) // k^l (see `level_runs`), the contribution of level l is a
        function of u_l, and u_{l+1} = u_l // k. Partial totals are therefore accumulated on the
        coarse grids from the top down, acc_l[u] = acc_{l+1}[u // k] + picked_l[u]: the same
        additions, in the same order, as the per-step and streaming paths.
        """
        k, low, h = self.arity, self.digit_low, self.height
        shift = -low * (k ** h - 1) // (k - 1)
        first, last = start + 1 + shift, start + count + shift
        acc, acc_first = None, 0
        for level in range(h - 1, -1, -1):
            size = k ** level
            lo, hi = first // size, last // size
            picked = self._picked_grid(level, lo, hi, values, signed)
            if acc is None:
                acc = np.zeros(hi - lo + 1) + picked
            else:
                offset = lo - acc_first * k
                acc = np.repeat(acc, k)[offset:offset + hi - lo + 1] + picked
            acc_first = lo
        return acc

    def _picked_grid(self, level, lo, hi, values, signed) -> np.ndarray:
        """Level-l contribution for every u in [lo, hi] (contiguous), built from column slices.

        Prefix (suffix) sums over children are built column by column: the same sequential
        additions as a cumsum, computed only for the digits that occur.
        """
        k, low, h = self.arity, self.digit_low, self.height
        offset = low * (k ** (h - level - 1) - 1) // (k - 1)  # parent = u // k + offset
        groups = hi // k - lo // k + 1
        first_row = lo // k + offset - (1 if low < 0 else 0)  # row of the earliest parent used
        rows = groups + (1 if low < 0 else 0)
        generated_first = max(first_row, 0)
        generated = first_row + rows - generated_first
        usable = values(level, generated_first * (k - 1), generated * (k - 1))
        usable = usable.reshape(generated, k - 1)
        if first_row < 0:  # such a parent is never used; keep the row alignment with zeros
            usable = np.vstack([np.zeros((generated_first - first_row, k - 1)), usable])
        unused = self.unused_child
        columns = [None if c == unused else usable[:, c - (c > unused)] for c in range(k)]
        if self.prune and ((first_row + rows) * k - 1) * k ** level >= self.horizon:
            nodes = np.arange(first_row * k, (first_row + rows) * k, dtype=np.int64)
            keep = (~self.data_free(level, nodes)).astype(np.float64).reshape(rows, k)
            columns = [None if col is None else col * keep[:, c]
                       for c, col in enumerate(columns)]
        grid = np.zeros((groups, k))
        running = None
        for digit in range(1, low + k):  # d > 0: first d children of the parent
            column = columns[digit - 1][1:] if low < 0 else columns[digit - 1]
            running = column if running is None else running + column
            grid[:, digit - low] = running
        running = None
        for digit in range(-1, low - 1, -1):  # d < 0: last |d| children of the previous parent
            column = columns[k + digit][:-1]
            running = column if running is None else running + column
            grid[:, digit - low] = -running if signed else running
        start = lo - (lo // k) * k
        return grid.ravel()[start:start + hi - lo + 1]

    def _steps(self, start: int, count: int) -> np.ndarray:
        return np.arange(start + 1, start + count + 1, dtype=np.int64)

    def _node_noise(self, level, first, count):
        return self._draw(level, first, count)

    def _unit_noise(self, start, count):
        if count == 1:
            return np.array([self._unit_noise_one(start + 1)])
        return self._combine(start, count, self._node_noise, signed=True)

    # Streaming fast path: the same IEEE operations as `_combine`, in the same order, on Python
    # floats (cumsum is sequential addition), so it is bit-identical.
    def _prefix_leaves_one(self, step: int) -> int:
        return step

    def _data_free_one(self, level: int, node: int) -> bool:
        return node * self.arity ** level >= self.horizon

    def _step_noise(self, start: int) -> float:
        """(L z)[start] for `step`: `_unit_noise(start, 1)[0]` is this very float."""
        return self._unit_noise_one(start + 1)

    # a stream's kept totals of its last scalar step (`_step_totals`); None: none yet
    _totals: Optional[list] = None

    def _one_plan(self):
        """(k, low, height, powers, unused child, prune, horizon) for `_node_plan`, or False
        when a subclass changes how a node's noise is read (cached)."""
        plan = False
        if type(self)._node_noise is TreeMechanism._node_noise and \
                type(self)._data_free_one is TreeMechanism._data_free_one:
            k = self.arity
            plan = (k, self.digit_low, self.height,
                    [k ** level for level in range(self.height + 1)], self.unused_child,
                    self.prune, self.horizon)
        self._cache["one_plan"] = plan
        return plan

    def _unit_noise_one(self, step: int) -> float:
        """`_unit_noise_one_generic` by the step's node plan (`_node_plan`, the same for every
        stream, so cached per step: a streaming release steps all its keys through the same
        step), reading each node's noise as a Python float from the block views
        (`_node_views`): the same values, additions and order, so the same float bit for bit
        (tests/test_streaming_perf_paths.py).

        A step's first stream reads its nodes as it finds them (`_unit_noise_direct`: no plan
        is built for one stream stepping alone) unless the step before was planned (streams
        stepping together); its second stream builds the plan.

        A stream keeps its running totals after each of its last step's levels (top down):
        when it read step - 1 last, the levels this step shares with that one from the top
        (the plan's third field: consecutive steps differ in their low levels) are not read
        again, their total is taken as it was (the same additions of the same values)."""
        if type(step) is not int or not 0 < step <= self.horizon:
            # plans and kept totals hold the steps 1..T as Python ints only (a numpy step
            # would put numpy fields in the plan every stream shares)
            if not 0 < step <= self.horizon:
                check.fail("step", f"in 1..{self.horizon}", step)
            return self._unit_noise_one_generic(step)
        plans = self._cache.get("node_plans")
        if plans is None:
            plans = self._cache["node_plans"] = {}
        plan = plans.get(step)
        if plan is None:
            if len(plans) >= _NODE_PLAN_STEPS:
                plans.clear()
            before = plans.get(step - 1)
            if type(before) is not tuple:  # one stream stepping: its nodes read as found
                plans[step] = _SEEN_ONCE
                return self._unit_noise_direct(step)
            plan = plans[step] = self._shared_plan(step, before)  # streams stepping together
        elif type(plan) is int:  # a second stream at this step
            plan = plans[step] = self._shared_plan(step, plans.get(step - 1))
        if plan is False:
            return self._unit_noise_one_generic(step)
        views = self._node_views()
        stream = self.stream
        kind = type(stream)
        memo, kept, _ = self._step_totals(step)
        totals = memo[3]
        if kept:
            at = plan[2]
            total = self._total_after(totals, at)
            groups = plan[1][at:] if at else plan[1]
        else:
            total, groups = 0.0, plan[1]
        if plan[0]:  # one node per used level, added as it is
            for level, block, offset in groups:
                view = views.get((kind, stream, level, block))
                if view is None or len(view) <= offset:  # not derived (this far) yet
                    view = self._missed_view(step, level, block, offset)
                total = total + view[offset]
                totals.append(total)
        else:
            for negative, nodes in groups:
                picked = None
                for level, block, offset, factor in nodes:
                    view = views.get((kind, stream, level, block))
                    if view is None or len(view) <= offset:
                        view = self._missed_view(step, level, block, offset)
                    value = view[offset]
                    if factor is not None:
                        value = value * factor
                    picked = value if picked is None else picked + value
                total = total + (-picked if negative else picked)
                totals.append(total)
        memo[2] = step
        return total

    def _step_totals(self, step: int):
        """(this stream's kept totals, whether they are those of step - 1, the digits the
        direct path noted for them or None): [noise source, stream, step, running totals after
        each used level from the top, digits]. Kept only for the same source and stream
        object (`is`: the same immutable stream, so the same node values); marked as no
        step's, without digits, until the caller sets them (a step that raises leaves nothing
        to reuse)."""
        memo = self._totals
        stream, source = self.stream, self.noise_source
        kept = memo is not None and memo[2] == step - 1 and memo[1] is stream \
            and memo[0] is source
        if not kept:
            memo = self._totals = [source, stream, None, [], None]
        marks = memo[4] if kept else None
        memo[2] = memo[4] = None
        return memo, kept, marks

    @staticmethod
    def _total_after(totals: list, shared: int) -> float:
        """The running total after the first `shared` used levels of the kept `totals` (+0.0
        for none, where every step's total starts), the later ones dropped."""
        del totals[shared:]
        return totals[shared - 1] if shared else 0.0

    def _shared_plan(self, step: int, before):
        """`_node_plan(step)` and how many of its levels (from the top) are those of
        `before`, the plan of step - 1 (or None): (simple, groups, shared), or False."""
        plan = self._node_plan(step)
        if plan is False:
            return False
        groups, shared = plan[1], 0
        # groups of one form only: (level, block, offset) or (negative, nodes)
        if type(before) is tuple and before[0] == plan[0]:
            previous = before[1]
            limit = min(len(groups), len(previous))
            while shared < limit and groups[shared] == previous[shared]:
                shared += 1
        return plan[0], groups, shared

    def _missed_view(self, step: int, level: int, block: int, at: int):
        """The view of block `block` of `level` holding node `at` of it, which this stream's
        `step` reads and has not derived (this far): first the nodes of every level that its
        next PREFETCH_STEPS steps read are derived together (`_prefetch`), then the view."""
        self._prefetch(step)
        stream = self.stream
        view = self._node_views().get((type(stream), stream, level, block))
        if view is None or len(view) <= at:  # not in the prefetched set: this node alone
            view = self._node_view(level, block, at + 1)
        return view

    def _prefetch(self, step: int) -> None:
        """Derive, in one noise source call (`_derive_blocks`), the block prefixes of every
        level that steps step .. step + PREFETCH_STEPS - 1 read. Which nodes those are is
        the same for every stream, found once per step by running the batch path `_combine`
        over those steps with a noise function that records what it reads (cached: a
        worker's keys miss at the same steps). Only when nodes are derived changes: each
        node's value is the same (a function of its stream, level and index)."""
        prefetch = self._cache.get("prefetch")
        if prefetch is None:
            prefetch = self._cache["prefetch"] = {}
        wanted = prefetch.get(step)
        if wanted is None:
            needs = {}

            def record(level, first, count):
                if count <= 0:
                    return np.zeros(max(count, 0), dtype=np.float64)
                for block in range(first // DRAW_BLOCK, (first + count - 1) // DRAW_BLOCK + 1):
                    need = min(DRAW_BLOCK, first + count - block * DRAW_BLOCK)
                    if need > needs.get((level, block), 0):
                        needs[(level, block)] = need
                return np.zeros(count, dtype=np.float64)

            self._combine(step - 1, min(PREFETCH_STEPS, self.horizon - step + 1), record,
                          signed=True)
            if len(prefetch) >= _NODE_PLAN_STEPS:
                prefetch.clear()
            wanted = prefetch[step] = tuple((level, block, need)
                                            for (level, block), need in needs.items())
        self._derive_blocks(wanted)

    def _plan_digits(self, step: int):
        """(the k-ary plan, the balanced digits of `step`'s prefix leaves, lowest level
        first); None without a plan."""
        plan = self._cache.get("one_plan")
        if plan is None:
            plan = self._one_plan()
        if plan is False:
            return None
        k, low, height = plan[0], plan[1], plan[2]
        rest, digits = self._prefix_leaves_one(step), []
        for _ in range(height):
            digit = (rest - low) % k + low
            rest = (rest - digit) // k
            digits.append(digit)
        return plan, digits

    def _unit_noise_direct(self, step: int) -> float:
        """`_unit_noise_one` without a plan: `_node_plan`'s nodes read and added as they are
        found (a step only one stream asks for)."""
        found = self._plan_digits(step)
        if found is None:
            return self._unit_noise_one_generic(step)
        (k, low, height, powers, unused, prune, horizon), digits = found
        views = self._node_views()
        stream = self.stream
        kind, block_size = type(stream), DRAW_BLOCK
        total, position, top = 0.0, 0, height - 1
        memo, kept, before = self._step_totals(step)
        totals = memo[3]
        if before is not None:  # the levels above the highest changed digit
            shared = 0
            while top >= 0 and digits[top] == before[top]:
                if digits[top]:
                    shared += 1
                    position = position + digits[top] * powers[top]
                top -= 1
            total = self._total_after(totals, shared)
        else:
            del totals[:]
        for level in range(top, -1, -1):
            digit = digits[level]
            if digit == 0:
                continue
            size = powers[level]
            parent = position // powers[level + 1] - (digit < 0)
            if parent < 0:
                return self._unit_noise_one_generic(step)  # the source refuses it
            if digit > 0:
                first, order = parent * (k - 1), range(digit)
            else:
                first, order = parent * (k - 1) - 1, range(k - 1, k - 1 + digit, -1)
            masked = prune and (parent * k + k - 1) * size >= horizon
            picked = None
            for i in order:
                index = first + i
                block = index // block_size
                at = index - block * block_size
                view = views.get((kind, stream, level, block))
                if view is None or len(view) <= at:
                    view = self._missed_view(step, level, block, at)
                value = view[at]
                if masked and (parent * k + i) * size >= horizon:
                    value = value * 0.0
                picked = value if picked is None else picked + value
            total = total + (picked if digit > 0 else -picked)
            totals.append(total)
            position = position + digit * size
        memo[2], memo[4] = step, digits
        return total

    def _node_plan(self, step: int):
        """The nodes `_unit_noise_one_generic` adds for `step`, in its order: (True, ((level,
        block, offset), ...)) when every used level adds one node's value as it is, else
        (False, ((negative, ((level, block, offset, factor or None), ...)), ...)): per used
        level, its children's values (times factor 0.0 if pruned: x * 1.0 == x, so the other
        factors are left out) summed in order, then added (or subtracted) to the total. A
        level whose digit is 0 is left out: total + 0.0 == total, as the total starts at +0.0
        and is never -0.0 (a sum is -0.0 only when both terms are). False: no plan (the
        generic path)."""
        plan = self._cache.get("one_plan")
        if plan is None:
            plan = self._one_plan()
        if plan is False:
            return False
        k, low, height, powers, unused, prune, horizon = plan
        block_size = DRAW_BLOCK
        groups, simple = [], True
        # the balanced digits from the lowest level up: after taking level l's digit, `rest`
        # is the parent's index on level l + 1 (the generic path's position // k^(l+1))
        rest = self._prefix_leaves_one(step)
        for level in range(height):
            digit = (rest - low) % k + low
            rest = (rest - digit) // k
            if digit == 0:
                continue
            parent = rest - (digit < 0)
            if parent < 0:
                return False  # the source refuses it (the generic path raises)
            size = powers[level]
            masked = prune and (parent * k + k - 1) * size >= horizon
            if digit == 1 and not (masked and parent * k * size >= horizon):
                index = parent * (k - 1)  # child 0 alone, as it is: (level, block, offset)
                groups.append((level, index // block_size, index % block_size))
                continue
            simple = False
            # children 0 .. d-1 (d > 0) or k-1 down to k+d (d < 0) never include the unused
            # child low + k - 1: compact index parent (k - 1) + i, minus 1 above the unused one
            if digit > 0:
                first, order = parent * (k - 1), range(digit)
            else:
                first, order = parent * (k - 1) - 1, range(k - 1, k - 1 + digit, -1)
            nodes = []
            for i in order:
                index = first + i
                factor = 0.0 if masked and (parent * k + i) * size >= horizon else None
                nodes.append((level, index // block_size, index % block_size, factor))
            groups.append((digit < 0, tuple(nodes)))
        if rest != 0:
            return False  # the prefix does not fit the tree (the generic path)
        groups.reverse()  # added from the top level down, as the generic path adds
        if simple:
            return True, tuple(groups)
        return False, tuple(group if len(group) == 2 else (False, (group + (None,),))
                            for group in groups)

    def _unit_noise_one_generic(self, step: int) -> float:
        k, low = self.arity, self.digit_low
        powers = self._cache.get("powers")
        if powers is None:
            powers = self._cache["powers"] = [k ** level for level in range(self.height + 1)]
        rest, digits = self._prefix_leaves_one(step), []
        for _ in range(self.height):
            digit = (rest - low) % k + low
            rest = (rest - digit) // k
            digits.append(digit)
        total, position = 0.0, 0
        for level in range(self.height - 1, -1, -1):
            digit = digits[level]
            contribution = 0.0
            if digit != 0:
                parent = position // powers[level + 1] - (digit < 0)
                children = self._node_noise(level, parent * (k - 1), k - 1).tolist()
                children.insert(self.unused_child, 0.0)
                # a child is data free iff it starts beyond the horizon; below the last child's
                # start every factor is 1.0 and v * 1.0 == v, so the mask is skipped exactly
                if self.prune and (parent * k + k - 1) * powers[level] >= self.horizon:
                    children = [value * (0.0 if self._data_free_one(level, parent * k + i)
                                         else 1.0) for i, value in enumerate(children)]
                order = range(digit) if digit > 0 else range(k - 1, k - 1 + digit, -1)
                picked = None
                for i in order:
                    picked = children[i] if picked is None else picked + children[i]
                contribution = picked if digit > 0 else -picked
            total = total + contribution
            position = position + digit * powers[level]
        return total

    def node_counts(self, start: int = 0, count: Optional[int] = None) -> np.ndarray:
        """Number of noisy nodes combined at steps start+1 .. start+count."""
        count = self.horizon - start if count is None else count
        ones = lambda level, first, n: np.ones(n, dtype=np.float64)  # noqa: E731
        return self._combine(start, count, ones, signed=False)

    def _squared_weights(self):
        if "squared_weights" not in self._cache:
            parts = [self.node_counts(s, min(_CHUNK, self.horizon - s))
                     for s in range(0, self.horizon, _CHUNK)]
            self._cache["squared_weights"] = np.concatenate(parts)
        return self._cache["squared_weights"]

    def _equal_weight_terms(self):
        return np.rint(self._squared_weights()).astype(np.int64)

    # ----- sensitivity -------------------------------------------------------------------------
    def used_nodes(self) -> List[np.ndarray]:
        """Per level (from 0), a boolean array over node indices: used by some step 1..T.

        Cached: calibration, the sensitivity DP and dense_factors all read it."""
        if "used_nodes" not in self._cache:
            self._cache["used_nodes"] = self._used_nodes()
        return self._cache["used_nodes"]

    def _used_nodes(self) -> List[np.ndarray]:
        used = [None] * self.height
        for level, digit, parent, _ in self.level_runs(0, self.horizon):
            start = np.where(digit > 0, parent * self.arity, (parent + 1) * self.arity + digit)
            stop = start + np.abs(digit)
            size = int(stop.max()) + 1
            marks = np.cumsum(np.bincount(start, minlength=size + 1)[:size + 1]
                              - np.bincount(stop, minlength=size + 1)[:size + 1])
            used[level] = marks[:size] > 0
        return used

    def column_counts(self) -> np.ndarray:
        """Per time s = 1..T: number of nodes of R (R-hat if sparsify) containing its leaf."""
        leaves = self.data_leaf(self._steps(0, self.horizon))
        if not self.sparsify:
            return np.full(self.horizon, self.height, dtype=np.int64)
        counts = np.zeros(self.horizon, dtype=np.int64)
        for level, used in enumerate(self.used_nodes()):
            node = leaves // self.arity ** level
            inside = node < used.shape[0]
            counts += inside & used[np.minimum(node, used.shape[0] - 1)]
        return counts

    def set_sensitivity(self, p, k, d):
        from . import sensitivity as seam
        return seam.tree_set_sensitivity(self, p, k, d)

    def column_norm(self, p):
        key = ("column_norm", p)
        if key not in self._cache:
            if self.sparsify and self.horizon <= EXACT_SENSITIVITY_LIMIT:
                largest = int(self.column_counts().max())
            else:
                largest = self._structural_column_count() if self.sparsify else self.height
            self._cache[key] = float(largest) ** (1.0 / p)
        return self._cache[key]

    # ----- dense factors -----------------------------------------------------------------------
    def dense_factors(self, max_horizon: int = 4096) -> Tuple[np.ndarray, np.ndarray]:
        """(L, R) over the nodes (level, index) listed by `dense_nodes()`."""
        if self.horizon > max_horizon:
            check.fail("horizon", f"<= {max_horizon} for dense factors", self.horizon)
        steps = self._steps(0, self.horizon)
        nodes = self.dense_nodes()
        offsets = {}
        for i, (level, j) in enumerate(nodes):
            offsets.setdefault(level, i)
        left = np.zeros((self.horizon, len(nodes)))
        for level, digit, parent in self.decompose(steps):
            for i in range(int(np.abs(digit).max())):
                rows = np.nonzero(np.abs(digit) > i)[0]
                positive = digit[rows] > 0
                j = parent[rows] * self.arity + np.where(positive, i, self.arity - 1 - i)
                keep = ~self.data_free(level, j) if self.prune else np.ones(len(j), bool)
                left[rows[keep], offsets[level] + j[keep]] = np.where(positive[keep], 1.0, -1.0)
        used = self.used_nodes()
        leaves = self.data_leaf(steps)
        right = np.zeros((len(nodes), self.horizon))
        for i, (level, j) in enumerate(nodes):
            if self.sparsify and not (j < used[level].shape[0] and used[level][j]):
                continue
            right[i] = leaves // self.arity ** level == j
        return left, right

    def dense_nodes(self) -> List[Tuple[int, int]]:
        """Nodes holding a data leaf or used by some step, level by level."""
        used = self.used_nodes()
        last_leaf = int(self.data_leaf(np.array([self.horizon]))[0])
        nodes = []
        for level in range(self.height):
            count = max(last_leaf // self.arity ** level + 1, used[level].shape[0])
            nodes.extend((level, j) for j in range(count))
        return nodes

    def params(self):
        return {"k": self.arity, "sparsify": self.sparsify, "prune": self.prune}


class KaryTree(TreeMechanism):
    """k-ary tree mechanism (seed 000 Alg. 1); k = 2 is the binary tree mechanism."""

    name = "kary_tree"

    def __init__(self, horizon, budget, noise_source, *, k: int = 2, **kwargs):
        self.arity = check.integer_at_least("k", k, 2)
        self.digit_low = 0
        super().__init__(horizon, budget, noise_source, **kwargs)
        self.height = _smallest_height(self.arity - 1, self.arity, self.horizon)


class BinaryTree(KaryTree):
    """Binary tree mechanism: left subtrees only, root unused."""

    name = "binary_tree"

    def __init__(self, horizon, budget, noise_source, **kwargs):
        super().__init__(horizon, budget, noise_source, k=2, **kwargs)

    def params(self):
        return {"sparsify": self.sparsify, "prune": self.prune}


class KarySubtraction(TreeMechanism):
    """k-ary tree with subtraction (seed 000 Alg. 2/3; even k as in App. A.3)."""

    name = "kary_subtraction"

    def __init__(self, horizon, budget, noise_source, *, k: int = 19, **kwargs):
        self.arity = check.integer_at_least("k", k, 3)
        self.digit_low = -((self.arity - 1) // 2) if self.arity % 2 else -(self.arity // 2) + 1
        super().__init__(horizon, budget, noise_source, **kwargs)
        max_digit = self.digit_low + self.arity - 1
        self.height = _smallest_height(max_digit, self.arity, self.horizon)


def popcount(values: np.ndarray) -> np.ndarray:
    """Number of ones of non-negative int64 values, as int64."""
    values = np.asarray(values, dtype=np.int64)
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(values).astype(np.int64)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
    out = np.zeros(values.shape, dtype=np.int64)
    for shift in range(0, 64, 8):
        out += table[(values >> shift) & 255]
    return out


def _binomial_table(n: int) -> np.ndarray:
    table = np.zeros((n + 1, n + 2), dtype=np.int64)
    for a in range(n + 1):
        for b in range(a + 1):
            table[a, b] = math.comb(a, b)
    return table


class SmoothBinary(TreeMechanism):
    """Smooth binary mechanism (seed 002): data only in leaves with h/2 ones, so every output
    combines exactly h/2 nodes and every step has the same noise distribution."""

    name = "smooth_binary"
    prefix_is_step = False
    # 2: compact node indexing (`compact_index`): the noise index of a node is its rank among
    # the level's usable nodes, so derived noise blocks are dense (1 indexed by parent).
    node_indexing = 2

    def __init__(self, horizon, budget, noise_source, *, prune: bool = False, **kwargs):
        self.arity = 2
        self.digit_low = 0
        super().__init__(horizon, budget, noise_source, prune=prune, **kwargs)
        h = 2
        while math.comb(h, h // 2) < self.horizon + 1:
            h += 2
        if h > 60:
            check.fail("horizon", "small enough for a 60-level smooth tree", self.horizon)
        self.height = h
        self._binom = _binomial_table(h)
        # _binom_cum[n][c + 1] = sum_{j <= c} C(n, j) for -1 <= c <= n (Python ints)
        self._binom_cum = [[0] + list(itertools.accumulate(math.comb(n, j)
                                                           for j in range(n + 1)))
                           for n in range(h + 1)]

    def balanced(self, rank: np.ndarray) -> np.ndarray:
        """The rank-th (0-based) h-bit integer with h/2 ones."""
        rank = np.asarray(rank, dtype=np.int64)
        tables = self._split_tables()
        if tables is None or rank.size == 0 or rank.min() < 0 or rank.max() >= tables[0][-1]:
            return self._balanced_bitwise(rank)
        cum, high, fill, low_sorted, low_start = tables
        group = np.searchsorted(cum, rank, side="right") - 1
        low = low_sorted[low_start[fill[group]] + (rank - cum[group])]
        out = (high[group] << (self.height - self._split_low_bits)) | low
        return np.asarray(out, dtype=np.int64).reshape(rank.shape)

    def _balanced_bitwise(self, rank: np.ndarray) -> np.ndarray:
        """`balanced` bit by bit from the top (any rank; the reference for the table version)."""
        rank = np.asarray(rank, dtype=np.int64).copy()
        ones = np.full(rank.shape, self.height // 2, dtype=np.int64)
        out = np.zeros(rank.shape, dtype=np.int64)
        for bit in range(self.height - 1, -1, -1):
            below = self._binom[bit, ones]  # numbers with this bit 0 and `ones` ones below it
            take = (ones > 0) & (rank >= below)
            out = out | (take.astype(np.int64) << bit)
            rank = rank - np.where(take, below, 0)
            ones = ones - take
        return out

    # Balanced numbers sorted by value are sorted by (high part, low part). With the h bits split
    # into H = h - L high and L low bits, the numbers with high part v are v << L | w for the L-bit
    # w with h/2 - popcount(v) ones, in increasing order: one table over v and one over w.
    _SPLIT_MAX_HEIGHT = 36  # tables of at most 2^18 entries

    @property
    def _split_low_bits(self) -> int:
        return self.height // 2

    def _split_tables(self):
        """(cum, high, fill, low_sorted, low_start) or None above _SPLIT_MAX_HEIGHT.

        cum[g] = rank of the first balanced number of group g (the g-th high part v = high[g]
        with a non-empty group; cum[-1] = total), fill[g] = ones its low part needs; low_sorted =
        all L-bit numbers sorted by (popcount, value), low_start[r] = where popcount r starts."""
        if self.height > self._SPLIT_MAX_HEIGHT:
            return None
        if "balanced_tables" not in self._cache:
            h, low_bits = self.height, self._split_low_bits
            high_bits, half = h - low_bits, h // 2
            high = np.arange(1 << high_bits, dtype=np.int64)
            fill = half - popcount(high)
            ok = (fill >= 0) & (fill <= low_bits)
            high, fill = high[ok], fill[ok]
            sizes = np.array([math.comb(low_bits, int(r)) for r in range(low_bits + 1)],
                             dtype=np.int64)[fill]
            cum = np.concatenate(([0], np.cumsum(sizes)))
            low = np.arange(1 << low_bits, dtype=np.int64)
            low_pop = popcount(low)
            low_sorted = low[np.lexsort((low, low_pop))]
            low_start = np.concatenate(([0], np.cumsum(np.bincount(low_pop,
                                                                   minlength=low_bits + 1))))
            self._cache["balanced_tables"] = (cum, high, fill, low_sorted, low_start)
        return self._cache["balanced_tables"]

    def _balanced_range(self, first: int, count: int) -> np.ndarray:
        """balanced(first .. first+count-1) for contiguous ranks, in O(count)."""
        tables = self._split_tables()
        if tables is None or count <= 0 or first < 0 or first + count > tables[0][-1]:
            return self.balanced(np.arange(first, first + count, dtype=np.int64))
        cum, high, fill, low_sorted, low_start = tables
        g0 = int(np.searchsorted(cum, first, side="right")) - 1
        g1 = int(np.searchsorted(cum, first + count - 1, side="right")) - 1
        sizes = np.diff(cum[g0:g1 + 2])
        sizes[0] -= first - cum[g0]
        sizes[-1] -= cum[g1 + 1] - (first + count)
        # position in low_sorted: low_start[fill] + rank - cum, i.e. a per-group offset plus rank
        offset = np.repeat(low_start[fill[g0:g1 + 1]] - cum[g0:g1 + 1], sizes)
        low = low_sorted[offset + np.arange(first, first + count, dtype=np.int64)]
        return (np.repeat(high[g0:g1 + 1], sizes) << (self.height - self._split_low_bits)) | low

    def balanced_rank(self, value: np.ndarray) -> np.ndarray:
        """Number of h-bit integers with h/2 ones that are < value (0 <= value <= 2^h)."""
        value = np.asarray(value, dtype=np.int64)
        total = math.comb(self.height, self.height // 2)
        ones = np.full(value.shape, self.height // 2, dtype=np.int64)
        count = np.zeros(value.shape, dtype=np.int64)
        for bit in range(self.height - 1, -1, -1):
            set_ = ((value >> bit) & 1).astype(bool) & (ones >= 0)
            count = count + np.where(set_ & (ones >= 0), self._binom[bit, np.maximum(ones, 0)], 0)
            ones = ones - set_
        return np.where(value >= (1 << self.height), total, count)

    def prefix_leaves(self, steps):
        return self.balanced(np.asarray(steps, dtype=np.int64))

    def data_leaf(self, steps):
        return self.balanced(np.asarray(steps, dtype=np.int64) - 1)

    def _data_free_one(self, level, node):
        low = min(self._balanced_rank_one(node << level), self.horizon)
        return min(self._balanced_rank_one((node + 1) << level), self.horizon) <= low

    def data_free(self, level, nodes):
        low = self.balanced_rank(nodes << level)
        high = self.balanced_rank((nodes + 1) << level)
        return np.minimum(high, self.horizon) <= np.minimum(low, self.horizon)

    def _balanced_one(self, rank: int) -> int:
        out, ones = 0, self.height // 2
        for bit in range(self.height - 1, -1, -1):
            below = math.comb(bit, ones)
            if ones > 0 and rank >= below:
                out |= 1 << bit
                rank -= below
                ones -= 1
        return out

    def _balanced_rank_one(self, value: int) -> int:
        if value >= 1 << self.height:
            return math.comb(self.height, self.height // 2)
        count, ones = 0, self.height // 2
        for bit in range(self.height - 1, -1, -1):
            if ones < 0:
                break
            if (value >> bit) & 1:
                count += math.comb(bit, ones)
                ones -= 1
        return count

    def _prefix_leaves_one(self, step):
        return self._balanced_one(step)

    # ----- compact node indexing (node_indexing = 2) -----------------------------------------
    # Level l uses node 2p (the left child of parent p = m >> (l + 1)) exactly when bit l of a
    # balanced m is 1, so p is an (h - l - 1)-bit number whose popcount lies in
    # [h/2 - 1 - l, h/2 - 1] (the l bits below l must hold the remaining ones). The noise index
    # of that node is the rank of p among those numbers: every usable node has its own index and
    # the indices of any run of steps are consecutive (below), so the derived noise blocks hold
    # no unusable nodes (with parent indexing, 1, they were about 1/3 used at T = 2^20).
    def _compact_bounds(self, level: int) -> Tuple[int, int, int]:
        """(bits of p, least popcount, largest popcount) of the usable parents at `level`."""
        half = self.height // 2
        return self.height - level - 1, max(half - 1 - level, 0), half - 1

    def _compact_terms(self, level: int) -> List[List[int]]:
        """terms[bit][ones]: the usable parents that agree with a parent above `bit`, have 0 at
        `bit` (where the parent has 1) and `ones` ones above it, i.e. the (bit)-bit tails whose
        popcount completes to [least, most]."""
        terms = self._cache.setdefault("compact_terms", {}).get(level)
        if terms is None:
            bits, least, most = self._compact_bounds(level)
            cum = self._binom_cum
            terms = [[cum[bit][min(max(most - ones, -1), bit) + 1]
                      - cum[bit][min(max(least - ones - 1, -1), bit) + 1]
                      for ones in range(bits + 1)] for bit in range(bits)]
            self._cache["compact_terms"][level] = terms
        return terms

    def compact_index(self, level: int, parent: int) -> int:
        """Noise index of node 2 * parent of `level`: the number of usable parents below it."""
        terms = self._compact_terms(level)
        rank, ones = 0, 0
        while parent:  # set bits from the top
            bit = parent.bit_length() - 1
            rank += terms[bit][ones]
            ones += 1
            parent ^= 1 << bit
        return rank

    def compact_indices(self, level: int, parents: np.ndarray) -> np.ndarray:
        """`compact_index` of many parents (vectorised; the reference for tests)."""
        bits, least, most = self._compact_bounds(level)
        parents = np.asarray(parents, dtype=np.int64)
        table = np.array([row + [row[-1]] * (self.height + 2 - len(row))
                          for row in self._binom_cum], dtype=np.int64)
        rank = np.zeros(parents.shape, dtype=np.int64)
        ones = np.zeros(parents.shape, dtype=np.int64)
        for bit in range(bits - 1, -1, -1):
            set_ = ((parents >> bit) & 1).astype(bool)
            hi = np.clip(most - ones, -1, bit) + 1
            lo = np.clip(least - ones - 1, -1, bit) + 1
            rank = rank + np.where(set_, table[bit, hi] - table[bit, lo], 0)
            ones = ones + set_
        return rank

    def _node_noise(self, level, first, count):
        """Noise of the nodes with compact indices first .. first+count-1 of `level`."""
        return self._draw(level, first, count)

    def _smooth_plan(self):
        """(height, comb table [n][r] for r <= h/2, per level `_compact_terms`, prune) for
        `_node_plan`, or False when a subclass changes how a node's noise is
        read or indexed (cached)."""
        plan = False
        kind = type(self)
        if (kind._node_noise is SmoothBinary._node_noise
                and kind.compact_index is SmoothBinary.compact_index
                and kind._balanced_one is SmoothBinary._balanced_one):
            h = self.height
            plan = (h, [[math.comb(n, r) for r in range(h // 2 + 1)] for n in range(h)],
                    [self._compact_terms(level) for level in range(h)], self.prune)
        self._cache["smooth_plan"] = plan
        return plan

    def _set_bits(self, step: int):
        """(the smooth plan, height // 2, the levels whose bit of m = balanced(step) is 1,
        from the top), as `_balanced_one` computes m; None without a plan."""
        plan = self._cache.get("smooth_plan")
        if plan is None:
            plan = self._smooth_plan()
        if plan is False:
            return None
        height, combs = plan[0], plan[1]
        half = height // 2
        ones, rank = half, step
        bits = []
        for bit in range(height - 1, -1, -1):  # `_balanced_one`, noting the set bits
            if ones > 0:
                below = combs[bit][ones]
                if rank >= below:
                    rank -= below
                    ones -= 1
                    bits.append(bit)
        return plan, half, bits

    def _unit_noise_direct(self, step: int) -> float:
        """`TreeMechanism._unit_noise_direct` for the smooth tree: `_node_plan`'s nodes read
        and added as they are found."""
        found = self._set_bits(step)
        if found is None:
            return self._unit_noise_one_generic(step)
        (height, combs, terms, prune), half, bits = found
        views = self._node_views()
        stream = self.stream
        kind, block_size = type(stream), DRAW_BLOCK
        total, shared = 0.0, 0
        memo, kept, before = self._step_totals(step)
        totals = memo[3]
        if before is not None:  # the set bits from the top this step shares with the last
            limit = min(len(bits), len(before))
            while shared < limit and bits[shared] == before[shared]:
                shared += 1
            total = self._total_after(totals, shared)
        else:
            del totals[:]
        for j in range(shared, len(bits)):  # the levels whose bit is 1, from the top
            level = bits[j]
            table = terms[level]
            index = 0  # compact_index(level, m >> (level + 1)): the set bits above, top down
            for i in range(j):
                index += table[bits[i] - level - 1][i]
            block = index // block_size
            at = index - block * block_size
            view = views.get((kind, stream, level, block))
            if view is None or len(view) <= at:
                view = self._missed_view(step, level, block, at)
            value = view[at]
            if prune:  # data free iff the bits of m below `level` are all ones
                value = value * (0.0 if half - (j + 1) == level else 1.0)
            total = total + value
            totals.append(total)
        memo[2], memo[4] = step, bits
        return total

    def _node_plan(self, step: int):
        """`TreeMechanism._node_plan` for `_unit_noise_one_generic` below: per level whose bit of
        m = balanced(step) is 1 (from the top), the left child of m's parent there, by compact
        index (times 0.0 if pruned and data free); the balanced number, the compact indices
        and the mask as `_balanced_one`, `compact_index` and the generic path compute them."""
        found = self._set_bits(step)
        if found is None:
            return False
        (height, combs, terms, prune), half, bits = found
        block_size = DRAW_BLOCK
        nodes, free = [], []
        for j, level in enumerate(bits):  # the levels whose bit is 1, from the top
            table = terms[level]
            index = 0  # compact_index(level, m >> (level + 1)): the set bits above, top down
            for i in range(j):
                index += table[bits[i] - level - 1][i]
            nodes.append((level, index // block_size, index % block_size))
            if prune and half - (j + 1) == level:  # data free: the bits below are all ones
                free.append(j)
        if not free:
            return True, tuple(nodes)
        return False, tuple((False, (node + (0.0 if j in free else None,),))
                            for j, node in enumerate(nodes))

    def _unit_noise_one_generic(self, step: int) -> float:
        """Streaming: the additions of `_combine` for one step, in the same order (top level
        first; 0.0 for a level whose bit is 0; a pruned node's value times 0.0)."""
        m, half = self._balanced_one(step), self.height // 2
        total = 0.0
        for level in range(self.height - 1, -1, -1):
            contribution = 0.0
            if (m >> level) & 1:
                parent = m >> (level + 1)
                value = float(self._node_noise(level, self.compact_index(level, parent), 1)[0])
                if self.prune:  # data free iff the bits of m below `level` are all ones
                    value = value * (0.0 if half - bin(m >> level).count("1") == level
                                     else 1.0)
                contribution = value
            total = total + contribution
        return total

    # ----- batch fast path ---------------------------------------------------------------------
    # With m = prefix_leaves(t), level l contributes the value of node 2 (m >> (l + 1)) (the
    # left child of the path's parent) when bit l of m is 1, and everything at level l is a
    # function of q = m >> l. As m increases with t, the distinct q of a run of steps are the
    # distinct values of a sorted array; partial totals are accumulated on them from the top
    # down, acc_l[q] = acc_{l+1}[q >> 1] + contribution_l(q): per step, the same additions in the
    # same order as the streaming path, so the results are identical. The parents p = q >> 1 of
    # the odd q of a run of consecutive balanced m are every usable parent between the first and
    # the last (a usable p between them has a balanced completion between their m), so their
    # compact indices are one contiguous range: one read per level, O(count) memory.
    def _unit_noise(self, start, count):
        if count == 1:
            return np.array([self._unit_noise_one(start + 1)])
        return self._combine(start, count, self._node_noise, signed=True)

    def _combine(self, start, count, values, signed):
        if count <= 0:
            return np.zeros(0, dtype=np.float64)
        prefixes, parents = self._distinct_prefixes(self._balanced_range(start + 1, count))
        acc = None
        for level in range(self.height - 1, -1, -1):
            q = prefixes[level]
            if acc is None:
                acc = np.zeros(q.shape[0], dtype=np.float64)
            elif parents[level] is not None:
                acc = acc[parents[level]]
            rows = np.flatnonzero((q & 1).astype(bool))
            if rows.shape[0]:
                # Adding the 0 of an even q (or of a pruned node) would leave acc unchanged: acc
                # starts at +0.0 and a sum is -0.0 only if both terms are, so it never is.
                acc[rows] += self._level_values(level, q[rows], values)
        return acc

    def _distinct_prefixes(self, prefix_leaves: np.ndarray):
        """Per level l: the sorted distinct values of prefix_leaves >> l, and for each the index
        of its parent (value >> 1) among level l + 1's (None when that is the identity)."""
        prefixes, parents = [prefix_leaves], []
        current = prefix_leaves
        for _ in range(1, self.height):
            shifted = current >> 1
            new = np.empty(shifted.shape[0], dtype=bool)
            new[0] = True
            np.not_equal(shifted[1:], shifted[:-1], out=new[1:])
            if new.all():
                parents.append(None)
                current = shifted
            else:
                parents.append(np.cumsum(new, dtype=np.int64) - 1)
                current = shifted[new]
            prefixes.append(current)
        parents.append(None)
        return prefixes, parents

    def _used_nodes(self):
        """As TreeMechanism._used_nodes (the same arrays): node q - 1 of level l is used for every
        odd q = m >> l; the length is 1 + the largest run end (q if q is odd, else q + 2)."""
        prefixes, _ = self._distinct_prefixes(self._balanced_range(1, self.horizon))
        used = []
        for q in prefixes:
            ends = q[-2:]
            marks = np.zeros(int(np.where(ends & 1, ends, ends + 2).max()) + 1, dtype=bool)
            marks[q[(q & 1) == 1] - 1] = True
            used.append(marks)
        return used

    def _level_values(self, level, odd_prefixes, values) -> np.ndarray:
        """Value of node 2 (q >> 1) of `level` for each (sorted, distinct, odd) q = m >> level
        of a run of consecutive steps, times 0 if it is data free and pruning; `values` is
        indexed by compact index."""
        count = odd_prefixes.shape[0]
        first = self.compact_index(level, int(odd_prefixes[0]) >> 1)
        if self.compact_index(level, int(odd_prefixes[-1]) >> 1) != first + count - 1:
            raise AssertionError("the used parents of a run are not contiguous usable parents")
        picked = values(level, first, count)
        if self.prune:
            # The left child of node q >> 1 holds the numbers below m with the same bits above
            # `level`; it holds a data leaf (rank < t <= T) unless it holds no balanced number,
            # i.e. unless the `level` bits of m below `level` are all ones: h/2 - popcount(q)
            # = level. Its value is multiplied by 0.0 (free) or 1.0, as in streaming.
            free = self.height // 2 - popcount(odd_prefixes) == level
            picked = picked * (~free).astype(np.float64)
        return picked

    def _structural_column_count(self):
        return self.height // 2  # only left children are ever used; a data leaf has h/2 zeros

    def params(self):
        return {"sparsify": self.sparsify, "prune": self.prune}
