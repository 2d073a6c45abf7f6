"""Graph problems under edge-level privacy (Andersson et al. 2026 Def. 5.7).

DegreeCount (Def. 6.9, Thm 6.3/6.10, Cor. 6.15): per-edge state; the edge's degree contribution
is its number of updates; after `max_updates` (k) updates its further updates are dropped, taken
in the order given within a step (the Beam layer sorts them canonically). A presence change of
the edge adds +-1 to the difference streams of both endpoints, so one edge changes exactly two
node streams, each by an alternating vector with at most k non-zeros (S_{1,k}); the release
splits the budget over the two (2 rho when each node gets rho).

TriangleCount (Def. 6.11, Thm 6.4/6.12, Cor. 6.16): exact triangle count with any number of
updates per step. Privacy holds only for streams whose maximum degree is <= D and whose maximum
triangle contribution is <= k (public bounds): both are validated online, and at the first
violation `BoundViolation` names the bound and the step; the counter then refuses every later
step (fail closed), so nothing is released for that step or after.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Hashable, Iterable, List, Sequence, Set, Tuple

from transforms import validation as check

from .entity import apply_ops
from .records import canonical_edge

Edge = Tuple[Hashable, Hashable]


@dataclasses.dataclass(frozen=True)
class EdgeState:
    count: int = 0
    updates: int = 0

    @property
    def present(self) -> bool:
        return self.count > 0


class EdgeDegreeContribution:
    """Per-edge state machine: step(state, ops) -> (presence change -1/0/+1, state, dropped)."""

    def __init__(self, max_updates: int, semantics: str = "count"):
        self.max_updates = check.integer_at_least("max_updates", max_updates, 1)
        self.semantics = semantics

    def init_state(self) -> EdgeState:
        return EdgeState()

    def step(self, state: EdgeState, ops: Sequence[str]) -> Tuple[int, EdgeState, int]:
        room = max(self.max_updates - state.updates, 0)
        kept, dropped = list(ops[:room]), len(ops) - min(len(ops), room)
        count = apply_ops(state.count, kept, self.semantics)
        new = EdgeState(count, state.updates + len(kept))
        return int(new.present) - int(state.present), new, dropped


class BoundViolation(ValueError):
    """A public bound that the privacy guarantee relies on does not hold for the input."""


class TriangleCounter:
    """Exact incremental triangle count with online validation of degree and contribution.

    Memory: adjacency sets (two entries per present edge) plus one integer per edge ever seen
    (its triangle contribution so far). Time per toggled edge: O(D) set work (D = degree bound).
    """

    def __init__(self, max_degree: int, max_contribution: int, semantics: str = "count"):
        self.max_degree = check.integer_at_least("max_degree", max_degree, 1)
        self.max_contribution = check.integer_at_least("max_contribution", max_contribution, 1)
        self.semantics = semantics
        self.adjacency: Dict[Hashable, Set[Hashable]] = {}
        self.counts: Dict[Edge, int] = {}
        self.contribution: Dict[Edge, int] = {}
        self.triangles = 0
        self.steps_done = 0
        self.failed = None

    def _neighbours(self, node) -> Set[Hashable]:
        return self.adjacency.get(node, set())

    def _present(self, edge: Edge) -> bool:
        return edge[1] in self._neighbours(edge[0])

    def edge_triangles(self, edge: Edge) -> int:
        """Triangles containing `edge` in the current graph (0 if the edge is absent)."""
        if not self._present(edge):
            return 0
        small, large = sorted((self._neighbours(edge[0]), self._neighbours(edge[1])), key=len)
        return sum(1 for node in small if node in large)

    def step(self, step: int, updates: Iterable[Tuple[str, Edge]]) -> int:
        """Apply one step's updates (edges canonical, see records.canonical_edge); return the
        change of the triangle count, d[step]."""
        if self.failed is not None:
            raise BoundViolation(f"`stream` must stay within the public bounds; got a violation "
                                 f"at step {self.failed[0]} ({self.failed[1]}), so step {step} "
                                 f"is not released.")
        if step != self.steps_done:
            check.fail("step", f"the next step ({self.steps_done})", step)
        ops_by_edge: Dict[Edge, List[str]] = {}
        for op, edge in updates:
            ops_by_edge.setdefault(edge, []).append(op)
        new_counts, toggled = {}, []
        for edge, ops in ops_by_edge.items():
            old = self.counts.get(edge, 0)
            new_counts[edge] = apply_ops(old, ops, self.semantics)
            if (new_counts[edge] > 0) != (old > 0):
                toggled.append(edge)
        # tri(u, x) changes only if (u, x) toggles, or u is an endpoint of a toggled (u, w) and x
        # is adjacent to both u and w before or after the step (else tri(u, x) is 0 or keeps w
        # out of the common neighbourhood).
        touched: Dict[Hashable, Set[Hashable]] = {}
        for a, b in toggled:
            touched.setdefault(a, set()).add(b)
            touched.setdefault(b, set()).add(a)
        candidates = set(toggled)
        for a, b in toggled:
            around_a = self._neighbours(a) | touched[a]
            around_b = self._neighbours(b) | touched[b]
            for x in (around_a & around_b) - {a, b}:
                candidates.add(canonical_edge(a, x))
                candidates.add(canonical_edge(b, x))
        before = {edge: self.edge_triangles(edge) for edge in candidates}
        delta = 0
        for a, b in toggled:  # sequential toggles: each changes the count by its common neighbours
            common = len(self._neighbours(a) & self._neighbours(b))
            if self._present((a, b)):
                self.adjacency[a].discard(b)
                self.adjacency[b].discard(a)
                delta -= common
            else:
                self.adjacency.setdefault(a, set()).add(b)
                self.adjacency.setdefault(b, set()).add(a)
                delta += common
        self.counts.update(new_counts)
        self.steps_done += 1
        violation = self._violation(step, toggled, before)
        if violation is not None:
            self.failed = (step, violation)
            raise BoundViolation(violation)
        self.triangles += delta
        return delta

    def _violation(self, step, toggled, before):
        """The first violated bound (in a fixed order, for a reproducible message), or None."""
        too_high = [node for node in {n for edge in toggled for n in edge}
                    if len(self._neighbours(node)) > self.max_degree]
        if too_high:
            node = min(too_high, key=repr)
            return (f"`max_degree` must bound every node's degree; got degree "
                    f"{len(self._neighbours(node))} at node {node!r} in step {step}.")
        over = []
        for edge, old in before.items():
            change = abs(self.edge_triangles(edge) - old)
            if change:
                total = self.contribution.get(edge, 0) + change
                self.contribution[edge] = total
                if total > self.max_contribution:
                    over.append(edge)
        if over:
            edge = min(over, key=repr)
            return (f"`max_contribution` must bound every edge's triangle contribution; got "
                    f"{self.contribution[edge]} for edge {edge!r} in step {step}.")
        return None
