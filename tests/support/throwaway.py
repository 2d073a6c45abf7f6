"""A statistic added the documented way, for tests/test_registry.py: one class (here a running
total with a sum's truncation) and one registry row, nothing else."""
from __future__ import annotations

from transforms.statistics import ContinualSum


class ContinualTotal(ContinualSum):
    """A running total of clamped values per key (a sum under another name)."""
