"""The one units layer: parsing with one id rule and `advance` / `advance_unit` per problem."""
from __future__ import annotations

import pytest

from transforms.streams import ContributionBounds, count_distinct
from transforms.streams.records import Declaration
from transforms.streams.units import (CountProblem, DeclaredProblem, DegreeProblem,
                                      EntityProblem, Halt, Parsed, TriangleProblem,
                                      advance_unit)

PROBLEMS = {
    "count": CountProblem(ContributionBounds(2)),
    "count_distinct": EntityProblem(count_distinct(1), max_keys_per_unit=1),
    "degree": DegreeProblem(3),
    "triangles": TriangleProblem(max_degree=2, max_contribution=5),
    "declared": DeclaredProblem(Declaration(1, 1, 1, "declared")),
}


@pytest.mark.parametrize("name,element,expected", [
    ("count", ("u", "k"), Parsed("u", ("k", 1.0))),
    ("count", ("", "k"), "unit id must be a non-empty str or int"),
    ("count", (True, "k"), "unit id must be a non-empty str or int"),
    ("count", ("u", 1.5), "key must be a non-empty str or int"),
    ("count_distinct", ("+", "i", "k"), Parsed("i", ("+", "k"))),
    ("count_distinct", ("+", ["i"], "k"), "item id must be a non-empty str or int"),
    ("degree", ("-", ("b", "a")), Parsed(("a", "b"), ("-", None))),
    ("degree", ("+", ("a", "a")), "self-loop ('a', 'a') is not an edge"),
    ("triangles", ("+", (1, None)), "edge endpoints must be non-empty str or int ids"),
    ("declared", ("k", 2.0), Parsed("k", 2.0)),
    ("declared", ("k", 2.5), "value must be an integer with discrete noise (the declared set "
                             "S_(D,k) is integer); got 2.5"),
    ("declared", (None, 1.0), "key must be a non-empty str or int"),
    ("declared", ("k", True), "value must be a finite number with |value| <= 2^53; got True"),
    ("declared", ("k", 1e308), "value must be a finite number with |value| <= 2^53; got 1e+308"),
])
def test_parse_uses_one_id_rule(name, element, expected):
    parsed, reason = PROBLEMS[name].parse(element)
    assert (parsed if parsed is not None else reason) == expected


def test_degree_emits_the_change_to_both_endpoints_itself():
    problem = PROBLEMS["degree"]
    result = problem.advance(("a", "b"), problem.init_state(), 0, [("+", None)])
    assert result.contributions == (("a", 1.0), ("b", 1.0)) and result.violation is None


def test_triangle_violation_is_returned_and_the_loop_stops_there():
    problem = PROBLEMS["triangles"]  # max degree 2: a star of 3 edges violates it at step 1
    by_step = {0: [("+", ("a", "b")), ("+", ("a", "c"))], 1: [("+", ("a", "d"))],
               2: [("+", ("b", "c"))]}
    run = advance_unit(problem, "triangles", problem.init_state(), by_step, range(3))
    assert isinstance(run.halt, Halt) and run.halt.step == 1
    assert "degree" in run.halt.reason
    assert all(step < 1 for _, step, _ in run.contributions)


def test_count_reports_what_truncation_dropped_by_reason():
    problem = PROBLEMS["count"]  # at most 2 contributions over the horizon
    by_step = {0: [("k", 1.0)] * 3, 1: [("k", 1.0)]}
    run = advance_unit(problem, "u", problem.init_state(), by_step, [0, 1])
    assert [(k, s, v) for k, s, v in run.contributions] == [("k", 0, 2.0)]
    assert dict(run.dropped) == {"max_contributions": 2}


def test_count_names_the_bound_that_cut_each_event():
    problem = CountProblem(ContributionBounds(3, 1, 1))  # 3 in all, 1 per step, 1 key
    by_step = {0: [("k", 1.0), ("k", 1.0), ("other", 1.0)], 1: [("k", 1.0)], 2: [("k", 1.0)],
               3: [("k", 1.0)]}
    run = advance_unit(problem, "u", problem.init_state(), by_step, range(4))
    assert dict(run.dropped) == {"max_contributions_per_step": 1, "max_keys_per_unit": 1,
                                 "max_contributions": 1}


def test_entity_key_cap_is_reported():
    problem = PROBLEMS["count_distinct"]
    result = problem.advance("i", problem.init_state(), 0, [("+", "a"), ("+", "b")])
    assert result.contributions == (("a", 1.0),) and dict(result.dropped) == {"max_keys_per_unit": 1}


def test_declared_values_are_summed_per_key_and_step():
    problem = PROBLEMS["declared"]
    result = problem.advance("k", None, 4, [1.0, 2.0])
    assert result.contributions == (("k", 3.0),)
