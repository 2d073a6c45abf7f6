"""The smooth binary mechanism (Andersson & Pagh 2023b): a binary tree whose data sit only in the
leaves with
h/2 ones, so every output combines exactly h/2 nodes and every step has the same noise law.

Step t releases the prefix of the first m(t + 1) leaves, m(s) the (s-1)-st (0-based) h-bit
integer with h/2 ones (NOTES.md: 0-based reading of Andersson & Pagh 2023b Alg. 2); its nodes are
the rule
`SmoothBinary._step_nodes` (see `tree_plans`), computed vectorised by `SmoothBinary._combine`.
Nodes are indexed compactly (`compact_index`, node indexing 2).
"""
from __future__ import annotations

import itertools
import math
from typing import List, Tuple

import numpy as np

from transforms import validation as check
from .trees import TreeMechanism

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
    """Smooth binary mechanism (Andersson & Pagh 2023b): data only in leaves with h/2 ones, so
    every output combines exactly h/2 nodes and every step has the same noise distribution."""

    name = "smooth_binary"
    auto_rank = 40
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
        # _combs[n][r] = C(n, r) for r <= h/2 (Python ints: `_balanced_one`)
        self._combs = [[math.comb(n, r) for r in range(h // 2 + 1)] for n in range(h)]

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

    def data_free(self, level, nodes):
        low = self.balanced_rank(nodes << level)
        high = self.balanced_rank((nodes + 1) << level)
        return np.minimum(high, self.horizon) <= np.minimum(low, self.horizon)


    def _balanced_one(self, rank: int) -> int:
        """`balanced` of one Python int rank (bit by bit from the top, as `_balanced_bitwise`)."""
        combs = self._combs
        out, ones = 0, self.height // 2
        for bit in range(self.height - 1, -1, -1):
            if ones > 0 and rank >= combs[bit][ones]:
                out |= 1 << bit
                rank -= combs[bit][ones]
                ones -= 1
        return out

    def _step_nodes(self, step: int) -> tuple:
        """The reference rule (`tree_plans`) of the smooth tree (Andersson & Pagh 2023b Alg. 2 on s
        =
        m(t + 1), NOTES.md): with m = balanced(t), from the top level down, each level l whose
        bit of m is 1 adds the left child of m's parent there, node 2 (m >> (l + 1)), by
        compact index; that child holds no data leaf, and is pruned, iff the l bits of m below
        l are all ones, i.e. h/2 - popcount(m >> l) == l."""
        if not 0 < step <= self.horizon:
            raise AssertionError("the step is not a prefix of this tree")
        m, half, prune = self._balanced_one(step), self.height // 2, self.prune
        terms = self._cache.get("level_terms")
        if terms is None:
            terms = self._cache["level_terms"] = [self._compact_terms(level)
                                                  for level in range(self.height)]
        bits = [level for level in range(self.height - 1, -1, -1) if (m >> level) & 1]
        groups = []
        for ones, level in enumerate(bits, 1):
            table, index = terms[level], 0
            for i in range(ones - 1):  # compact_index(level, m >> (level + 1)), inlined
                index += table[bits[i] - level - 1][i]  # (its set bits are bits[:ones - 1])
            groups.append((False, ((level, index, prune and half - ones == level),)))
        return tuple(groups)
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


    # ----- batch fast path ---------------------------------------------------------------------
    # With m = prefix_leaves(t), level l contributes the value of node 2 (m >> (l + 1)) (the
    # left child of the path's parent) when bit l of m is 1, and everything at level l is a
    # function of q = m >> l. As m increases with t, the distinct q of a run of steps are the
    # distinct values of a sorted array; partial totals are accumulated on them from the top
    # down, acc_l[q] = acc_{l+1}[q >> 1] + contribution_l(q): per step, the same additions in the
    # same order as the streaming path, so the results are identical. The parents p = q >> 1 of
    # the odd q of a run of consecutive balanced m are every usable parent between the first and
    # the last (a usable p between them has a balanced completion between their m), so their
    # compact indices are one contiguous range: one read per level, O(count) memory. Which
    # rows, parents and reads these are depends on the steps only, not on the stream: the
    # plan (`_batch_plan`) is found once per run of steps and kept for the mechanism's streams.
    def _combine(self, start, count, values, signed):
        if count <= 0:
            return np.zeros(0, dtype=np.float64)
        acc = None
        for level, size, parents, rows, first, factor in self._batch_plan(start, count):
            if acc is None:
                acc = np.zeros(size, dtype=np.float64)
            elif parents is not None:
                acc = acc[parents]
            if rows.shape[0]:
                # Adding the 0 of an even q (or of a pruned node) would leave acc unchanged: acc
                # starts at +0.0 and a sum is -0.0 only if both terms are, so it never is.
                picked = values(level, first, rows.shape[0])
                if factor is not None:
                    picked = picked * factor
                acc[rows] += picked
        return acc

    def _batch_plan(self, start: int, count: int) -> list:
        """Per level from the top, for steps start+1 .. start+count: (level, number of distinct
        q = m >> level, each one's parent among the level above's (None: the identity), the
        rows of the odd q, the first compact index of their nodes, the pruning factor or
        None) (`_distinct_prefixes`, `_level_reads`). The last run's plan is kept for the
        mechanism's streams (a batch release of many keys runs the same steps): int64 indices,
        at most two per distinct q, a few per step."""
        kept = self._cache.get("batch_plan")
        if kept is not None and kept[0] == (start, count):
            return kept[1]
        prefixes, parents = self._distinct_prefixes(self._balanced_range(start + 1, count))
        plan = []
        for level in range(self.height - 1, -1, -1):
            q = prefixes[level]
            rows = np.flatnonzero((q & 1).astype(bool))
            first, factor = self._level_reads(level, q[rows]) if rows.shape[0] else (0, None)
            plan.append((level, q.shape[0], parents[level], rows, first, factor))
        self._cache["batch_plan"] = ((start, count), plan)
        return plan

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

    def _level_reads(self, level, odd_prefixes):
        """(first compact index, pruning factor or None) of the nodes 2 (q >> 1) of `level`
        for the (sorted, distinct, odd) q = m >> level of a run of consecutive steps: their
        values are the read of that many nodes from the first, times the factor (0.0 if data
        free and pruning, else 1.0) when pruning."""
        count = odd_prefixes.shape[0]
        first = self.compact_index(level, int(odd_prefixes[0]) >> 1)
        if self.compact_index(level, int(odd_prefixes[-1]) >> 1) != first + count - 1:
            raise AssertionError("the used parents of a run are not contiguous usable parents")
        if not self.prune:
            return first, None
        # The left child of node q >> 1 holds the numbers below m with the same bits above
        # `level`; it holds a data leaf (rank < t <= T) unless it holds no balanced number,
        # i.e. unless the `level` bits of m below `level` are all ones: h/2 - popcount(q)
        # = level. Its value is multiplied by 0.0 (free) or 1.0, as in streaming.
        free = self.height // 2 - popcount(odd_prefixes) == level
        return first, (~free).astype(np.float64)

    def _structural_column_count(self):
        return self.height // 2  # only left children are ever used; a data leaf has h/2 zeros

    def params(self):
        return {"sparsify": self.sparsify, "prune": self.prune}
