"""One rule for "faster", "slower" and "level", used by every table, count and claim check.

A row's time is a distribution over its timed calls; results.csv keeps its 20th and 80th
percentiles (``ms_p20``, ``ms_p80``). Provider A is faster than B only where A's whole p20–p80
range lies below B's (A's p80 < B's p20), slower only where it lies above; where the ranges
overlap the two are level: the difference is within the run's own noise.
"""
from __future__ import annotations

import math

from suite.report.formatting import num

FASTER, LEVEL, SLOWER = "faster", "level", "slower"
VERDICTS = (FASTER, LEVEL, SLOWER)
RULE_TEXT = ("faster / slower only where the two p20–p80 ranges of the timed calls do not "
             "overlap, else level")


def time_range(row) -> tuple[float, float] | None:
    """(p20, p80) of an ok row's timed calls; None when the row did not run or lacks them."""
    if row is None or row.get("status") != "ok":
        return None
    lo, hi = num(row.get("ms_p20")), num(row.get("ms_p80"))
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        return None
    return lo, hi


def time_verdict(mine, other) -> str | None:
    """``mine`` against ``other`` (results.csv rows): FASTER, SLOWER or LEVEL; None when either
    has no p20–p80 range to compare."""
    a, b = time_range(mine), time_range(other)
    if a is None or b is None:
        return None
    if a[1] < b[0]:
        return FASTER
    if a[0] > b[1]:
        return SLOWER
    return LEVEL


def at_most(mine, other) -> bool | None:
    """``mine`` no slower than ``other`` (faster or level); None when not comparable."""
    verdict = time_verdict(mine, other)
    return None if verdict is None else verdict != SLOWER


class Tally:
    """Counts of verdicts, for the line under a table."""

    def __init__(self):
        self.counts = {v: 0 for v in VERDICTS}

    def add(self, verdict: str | None) -> None:
        if verdict is not None:
            self.counts[verdict] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def text(self) -> str:
        """'faster in 3, level in 2, slower in 1 of 6 cells'."""
        return (", ".join(f"{v} in {self.counts[v]}" for v in VERDICTS)
                + f" of {self.total} cells")
