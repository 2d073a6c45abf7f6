"""Beam-free difference streams with bounded-contribution truncation (Andersson et al. 2026 Sec.
5-6).

Per-unit state machines (what a Beam stateful DoFn keyed by the privacy unit runs):
- `EntityCardinality` / `count_distinct` (items; the generic cardinality hook),
- `EdgeDegreeContribution` (edges, DegreeCount), `TriangleCounter` (graphs, TriangleCount),
- `ContributionBounds` (users, count / sum).
Batch drivers from raw records: `count_streams`, `count_distinct_streams`,
`entity_difference_streams`, `degree_streams`, `triangle_streams`.
"""
from .count import ContributionBounds, UnitState
from .difference import (DifferenceStreams, count_distinct_streams, count_streams,
                         degree_streams, entity_difference_streams, triangle_streams)
from .entity import EntityCardinality, EntityState, count_distinct
from .graph import BoundViolation, EdgeDegreeContribution, EdgeState, TriangleCounter
from .records import DeadLetter, Declaration, canonical_edge

__all__ = ["ContributionBounds", "UnitState", "DifferenceStreams", "count_distinct_streams",
           "count_streams", "degree_streams", "entity_difference_streams", "triangle_streams",
           "EntityCardinality", "EntityState", "count_distinct", "BoundViolation",
           "EdgeDegreeContribution", "EdgeState", "TriangleCounter", "DeadLetter",
           "Declaration", "canonical_edge"]
