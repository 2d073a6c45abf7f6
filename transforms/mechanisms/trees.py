"""Tree mechanisms: binary, k-ary (Andersson & Pagh 2023a Alg. 1), k-ary with subtraction (Andersson
& Pagh 2023a Alg. 2/3,
even k per App. A.3) and the smooth binary mechanism (Andersson & Pagh 2023b).

All four share one structure. Leaves are 0-based positions; the input of time s (1-based) sits in
leaf `data_leaf(s)`. Level l (0 <= l < h; the root level h is never used) holds nodes
[j k^l, (j+1) k^l). The output at time t is the sum of the first `prefix_leaves(t)` leaves,
written with h digits d_l in [low, low + k - 1]: from the top level down, a digit d > 0 adds the
first d children of the current parent, d < 0 subtracts its last |d| children (Andersson & Pagh
2023a Alg. 3
with the corrected line 15 of NOTES.md).

- k-ary tree: digits [0, k-1], prefix_leaves(t) = t, data_leaf(s) = s - 1.
- subtraction: offset digits [-(k-1)/2, (k-1)/2] (odd k) or [-k/2+1, k/2] (even k).
- smooth binary: k = 2, h even, data_leaf(s) = m(s) = the (s-1)-st (0-based) h-bit integer with
  h/2 ones, prefix_leaves(t) = m(t+1) (NOTES.md: 0-based reading).

Options: `sparsify` zeroes the rows of R of nodes no step <= T uses (Andersson et al. 2026 Sec.
9.2.1, R-hat);
`prune` drops the noise of nodes holding no data leaf (publicly zero). Both only lower the error.

One rule, two paths. The noise of step t, (L z)_t, is fixed by one rule, `_step_nodes(t)` (here
for the k-ary trees, in `smooth` for the smooth tree): which nodes, in which order, with which
sign. The batch path `_unit_noise(start, count)` computes it vectorised (`_combine`), the scalar
streaming path `_unit_noise_one(t)` (`step_counter` -> `_step_noise`) from cached per-step node
plans (`tree_plans`); both do the rule's additions in its order, so they agree bit for bit with
the rule and each other (tests/mechanisms/test_tree_paths.py).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from transforms import validation as check
from .base import ContinualMechanism
from .privacy import LAPLACE
from .tree_plans import PREFETCH_STEPS, StepPlans  # noqa: F401  (PREFETCH_STEPS re-exported)

# Above this horizon the sparsified sensitivity is not enumerated; the structural count (every
# data leaf lies in at most `_structural_column_count()` noisy nodes) is used instead.
EXACT_SENSITIVITY_LIMIT = 1 << 22
_CHUNK = 1 << 20
# Steps whose node plan (`StepPlans._node_plan`) a mechanism keeps (and its stream copies).
_NODE_PLAN_STEPS = 1 << 12


def _smallest_height(max_digit: int, k: int, horizon: int) -> int:
    """Smallest h >= 1 whose largest h-digit number max_digit (k^h - 1)/(k - 1) is >= horizon."""
    h = 1
    while max_digit * (k ** h - 1) // (k - 1) < horizon:
        h += 1
    return h


# the arities `auto` compares (plain trees, and trees with subtraction: odd k)
PLAIN_ARITIES = (2, 3, 4, 5, 6, 8)
ODD_ARITIES = tuple(range(3, 42, 2))
TREE_OPTIONS = ("sparsify", "prune")


class TreeMechanism(StepPlans, ContinualMechanism):
    """Shared implementation; subclasses fix arity, digit range, height and the leaf maps."""

    accepts = TREE_OPTIONS
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
        """The child no step ever uses: index of the largest digit (Andersson et al. 2026 Sec.
        9.2.1)."""
        return self.digit_low + self.arity - 1

    def _step_nodes(self, step: int) -> tuple:
        """The reference rule (`tree_plans`): the nodes of step `step` from the top level down.

        The digits d_l of prefix_leaves(t) = t in [low, low + k - 1] (Andersson & Pagh 2023a Alg. 1
        lines
        7-14; Alg. 3 with line 15 as corrected in NOTES.md): d > 0 adds the first d children
        of the current parent, d < 0 subtracts its last |d| children (in the order k-1, k-2,
        ...). Children are indexed compactly, parent (k - 1) + rank among the k - 1 usable
        ones (the largest digit's child is never used, Andersson et al. 2026 Sec. 9.2.1); a
        child starting
        beyond the horizon holds no data leaf and is pruned (`data_free`)."""
        k, low, horizon, prune = self.arity, self.digit_low, self.horizon, self.prune
        groups, rest, size = [], step, 1
        for level in range(self.height):  # the digits from the lowest level up
            digit = (rest - low) % k + low
            rest = (rest - digit) // k  # the parent's index on level + 1
            if digit == 1:  # child 0 alone (the commonest group, built directly)
                groups.append((False, ((level, rest * (k - 1),
                                        prune and rest * k * size >= horizon),)))
            elif digit:
                parent = rest - (digit < 0)
                if digit > 0:
                    first, order = parent * (k - 1), range(digit)
                else:
                    first, order = parent * (k - 1) - 1, range(k - 1, k - 1 + digit, -1)
                groups.append((digit < 0, tuple([
                    (level, first + i, prune and (parent * k + i) * size >= horizon)
                    for i in order])))
            size *= k
        if rest != 0 or not 0 < step <= horizon:
            raise AssertionError("the step is not a prefix of this tree")
        groups.reverse()
        return tuple(groups)

    def _combine(self, start: int, count: int, values, signed: bool) -> np.ndarray:
        """sum over the nodes of each step of sign * node value, for steps start+1..start+count
        (the batch path of `_step_nodes`; `values(level, first, count)` gives node values by
        compact index, unsigned node counts with `signed` False), in O(T k / (k - 1)) work.

        Each level's run of nodes is a prefix (d > 0) or suffix (d < 0) of one parent's
        children. With u_l = (t + shift) // k^l (see `level_runs`), the contribution of level
        l is a function of u_l, and u_{l+1} = u_l // k. Partial totals are therefore
        accumulated on the coarse grids from the top down, acc_l[u] = acc_{l+1}[u // k] +
        picked_l[u]: per step the rule's additions, in its order (a level adding nothing adds
        +0.0, which leaves a total unchanged: it starts at +0.0 and is never -0.0).
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
        grid = np.zeros((groups, k))
        self._fill_grid(grid, columns, signed)
        free = self._first_free_node(level) // k - first_row if self.prune else rows
        if free < rows:  # rows from `free` on hold pruned nodes: their grid rows again, pruned
            tail = max(free - (1 if low < 0 else 0), 0)  # the first grid row reading them
            nodes = np.arange((first_row + tail) * k, (first_row + rows) * k, dtype=np.int64)
            keep = (~self.data_free(level, nodes)).astype(np.float64).reshape(rows - tail, k)
            self._fill_grid(grid[tail:], [None if col is None else col[tail:] * keep[:, c]
                                          for c, col in enumerate(columns)], signed)
        start = lo - (lo // k) * k
        return grid.ravel()[start:start + hi - lo + 1]

    def _fill_grid(self, grid, columns, signed) -> None:
        """grid[g, d - low] = the prefix (d > 0) or suffix (d < 0) sum of parent row g's
        children for digit d, the same sequential additions as a cumsum, computed only for the
        digits that occur (a grid row reads column rows g and g + 1 when digits go negative)."""
        k, low = self.arity, self.digit_low
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

    def _first_free_node(self, level: int) -> int:
        """The first node of `level` holding no data leaf (`data_free`, a suffix of the level's
        nodes: tested), by doubling then bisection, cached. Exists so the batch path prunes
        only the rows that hold such nodes."""
        key = ("first_free_node", level)
        found = self._cache.get(key)
        if found is None:
            def free(node):
                return bool(self.data_free(level, np.array([node], dtype=np.int64))[0])
            low, high = 0, 1
            while not free(high):  # a node past the horizon is free: this ends
                low, high = high + 1, 2 * high
            while low < high:
                middle = (low + high) // 2
                if free(middle):
                    high = middle
                else:
                    low = middle + 1
            found = self._cache[key] = low
        return found

    def _steps(self, start: int, count: int) -> np.ndarray:
        return np.arange(start + 1, start + count + 1, dtype=np.int64)

    def _node_noise(self, level, first, count):
        """Node noise by compact index, as the batch path reads it."""
        return self._draw(level, first, count)

    def _unit_noise(self, start, count):
        if count == 1:
            return np.array([self._unit_noise_one(start + 1)])
        return self._combine(start, count, self._node_noise, signed=True)

    def _step_noise(self, start: int) -> float:
        """(L z)[start] for `step`: `_unit_noise(start, 1)[0]` is this very float."""
        return self._unit_noise_one(start + 1)

    def _unit_noise_one(self, step: int) -> float:
        """The scalar path: the rule's value for `step` (`tree_plans`), from its node plan
        (`_shared_plan`, cached per step: the same for every stream, and a streaming release
        steps all its keys through the same step), each node's noise read as a Python float
        from the block views (`_node_views`): the rule's values, additions and order, so the
        batch path's float, bit for bit.

        A stream keeps its running totals after each group of its last step (top down): when
        it read step - 1 last, the groups this step shares with that one from the top (the
        plan's third field: consecutive steps differ in their low levels) are not read again,
        their total is taken as it was (the same additions of the same values)."""
        if type(step) is not int:  # plans hold Python ints only (every stream shares them)
            step = int(step)
        if not 0 < step <= self.horizon:
            check.fail("step", f"in 1..{self.horizon}", step)
        plans = self._cache.get("node_plans")
        if plans is None:
            plans = self._cache["node_plans"] = {}
        plan = plans.get(step)
        if plan is None:
            if len(plans) >= _NODE_PLAN_STEPS:
                plans.clear()
            plan = plans[step] = self._shared_plan(step, plans.get(step - 1))
        views = self._node_views()
        stream = self.stream
        kind = type(stream)
        memo, kept = self._step_totals(step)
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
    """k-ary tree mechanism (Andersson & Pagh 2023a Alg. 1); k = 2 is the binary tree mechanism."""

    name = "kary_tree"
    accepts = ("k",) + TREE_OPTIONS
    auto_rank = 20

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        return [{"k": k, "sparsify": s} for k in PLAIN_ARITIES[1:] for s in (True, False)]

    def __init__(self, horizon, budget, noise_source, *, k: int = 2, **kwargs):
        self.arity = check.integer_at_least("k", k, 2)
        self.digit_low = 0
        super().__init__(horizon, budget, noise_source, **kwargs)
        self.height = _smallest_height(self.arity - 1, self.arity, self.horizon)


class BinaryTree(KaryTree):
    """Binary tree mechanism: left subtrees only, root unused."""

    name = "binary_tree"
    accepts = TREE_OPTIONS
    auto_rank = 10

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        return [{"sparsify": s} for s in (True, False)]

    def __init__(self, horizon, budget, noise_source, **kwargs):
        super().__init__(horizon, budget, noise_source, k=2, **kwargs)

    def params(self):
        return {"sparsify": self.sparsify, "prune": self.prune}


class KarySubtraction(TreeMechanism):
    """k-ary tree with subtraction (Andersson & Pagh 2023a Alg. 2/3; even k as in App. A.3)."""

    name = "kary_subtraction"
    accepts = ("k",) + TREE_OPTIONS
    auto_rank = 30

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        return [{"k": k, "sparsify": s} for k in ODD_ARITIES for s in (True, False)
                if k <= max(3, 2 * horizon)]

    @classmethod
    def default_params(cls, noise_law):
        """k: the argmin of the leading error constant for the noise (Andersson & Pagh 2023a
        Cor. 12: k = 19 under pure DP; Andersson et al. 2026 Thm 9.15: b = 5 for MaxSE under
        zCDP)."""
        return {"k": 19 if noise_law == LAPLACE else 5}

    def __init__(self, horizon, budget, noise_source, *, k: int = 19, **kwargs):
        self.arity = check.integer_at_least("k", k, 3)
        self.digit_low = -((self.arity - 1) // 2) if self.arity % 2 else -(self.arity // 2) + 1
        super().__init__(horizon, budget, noise_source, **kwargs)
        max_digit = self.digit_low + self.arity - 1
        self.height = _smallest_height(max_digit, self.arity, self.horizon)
