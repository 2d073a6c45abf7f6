"""A statistic added the documented way, for tests/test_registry.py: one registry row (here
naming a sum's truncation) and one class naming the row, nothing else."""
from __future__ import annotations

from transforms.statistics import ContinualSum


class ContinualTotal(ContinualSum):
    """A running total of clamped values per key (a sum under another name)."""

    statistic = "total"
