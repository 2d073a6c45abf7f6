"""Node plans: the tree mechanisms' scalar streaming step, as data.

The noise of step t is fixed by one rule per tree, `_step_nodes(t)` (`TreeMechanism` for the
k-ary trees, Andersson & Pagh 2023a Alg. 1 / Alg. 3; `SmoothBinary`, Andersson & Pagh 2023b Alg. 2):
the nodes of the
left factor's row t (Andersson et al. 2026 Sec. 5: (L z)_t), grouped by level from the top down,
with the
sign of their level and whether pruning zeroes them. Its value is

    total = 0.0
    for each group, from the top level down:
        picked = its nodes' values (times 0.0 if pruned) added in order
        total = total + picked   (or + (-picked) for a subtracted group)

The batch path (`TreeMechanism._combine`, `SmoothBinary._combine`) does these additions
vectorised; the scalar path (`TreeMechanism._unit_noise_one`) does them on Python floats from
a plan of the rule's nodes (`_node_plan`): block and offset of each node in the block cache of
`base.ContinualMechanism._draw`, cached per step and shared by every stream stepping through
it. The same values, additions and order: the same float, bit for bit
(tests/mechanisms/test_tree_paths.py checks both paths against the rule).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .base import DRAW_BLOCK

# A stream's step that reads a node not derived yet derives the nodes its next PREFETCH_STEPS
# steps read, on every level, in one noise source call (`StepPlans._prefetch`).
PREFETCH_STEPS = DRAW_BLOCK
# Steps whose prefetched node set (`StepPlans._prefetch`) a mechanism keeps.
_PREFETCH_KEPT = 1 << 12


class StepPlans:
    """The scalar step's plans, kept totals and block reads (mixed into `TreeMechanism`)."""

    # a stream's kept totals of its last scalar step (`_step_totals`); None: none yet
    _totals: Optional[list] = None

    def _step_nodes(self, step: int) -> tuple:
        """The reference rule: ((negative, ((level, index, pruned), ...)), ...), the groups
        of nodes whose noise makes step `step`'s (L z), from the top level down (levels
        adding nothing left out); `index` is the node's noise index on `level`."""
        raise NotImplementedError

    def _node_plan(self, step: int) -> tuple:
        """`_step_nodes(step)` as the scalar path reads it: (True, ((level, block, offset),
        ...)) when every group is one node added as it is, else (False, ((negative, ((level,
        block, offset, factor or None), ...)), ...)) with factor 0.0 for a pruned node (x *
        1.0 == x: the other factors are left out). A level adding nothing is left out of the
        rule: total + 0.0 == total, as the total starts at +0.0 and is never -0.0 (a sum is
        -0.0 only when both terms are)."""
        groups, block = self._step_nodes(step), DRAW_BLOCK
        simple = [(nodes[0][0], nodes[0][1] // block, nodes[0][1] % block)
                  for negative, nodes in groups
                  if not negative and len(nodes) == 1 and not nodes[0][2]]
        if len(simple) == len(groups):
            return True, tuple(simple)
        return False, tuple([(negative, tuple([(level, index // block, index % block,
                                                0.0 if pruned else None)
                                               for level, index, pruned in nodes]))
                             for negative, nodes in groups])

    def _shared_plan(self, step: int, before) -> tuple:
        """`_node_plan(step)` and how many of its groups (from the top) are those of
        `before`, the plan of step - 1 (or None): (simple, groups, shared). Consecutive steps
        differ in their low levels: a stream that read step - 1 last reuses its totals after
        the shared groups (`_step_totals`)."""
        simple, groups = self._node_plan(step)
        shared = 0
        if type(before) is tuple and before[0] == simple:  # groups of one form only
            previous = before[1]
            limit = min(len(groups), len(previous))
            while shared < limit and groups[shared] == previous[shared]:
                shared += 1
        return simple, groups, shared

    def _step_totals(self, step: int):
        """(this stream's kept totals, whether they are those of step - 1): [noise source,
        stream, step, running totals after each group from the top]. Kept only for the same
        source and stream object (`is`: the same immutable stream, so the same node values);
        marked as no step's until the caller sets it (a step that raises leaves nothing to
        reuse)."""
        memo = self._totals
        stream, source = self.stream, self.noise_source
        kept = memo is not None and memo[2] == step - 1 and memo[1] is stream \
            and memo[0] is source
        if not kept:
            memo = self._totals = [source, stream, None, []]
        memo[2] = None
        return memo, kept

    @staticmethod
    def _total_after(totals: list, shared: int) -> float:
        """The running total after the first `shared` groups of the kept `totals` (+0.0 for
        none, where every step's total starts), the later ones dropped."""
        del totals[shared:]
        return totals[shared - 1] if shared else 0.0

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
            if len(prefetch) >= _PREFETCH_KEPT:
                prefetch.clear()
            wanted = prefetch[step] = tuple((level, block, need)
                                            for (level, block), need in needs.items())
        self._derive_blocks(wanted)
