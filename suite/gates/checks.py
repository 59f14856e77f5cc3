"""The gate's checks on ``extra_info`` (memory, gradient errors) and its one table; pure.

The time check is pytest-benchmark's own (``--benchmark-compare-fail``); its verdict is passed
in and shown in the same table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from suite.gates.spec import (ERR_FAIL_FACTOR, ERR_SLACK, GATED_ERRORS, MEM_FAIL_FRACTION,
                              MEM_SLACK_MIB, TIME_FAIL_PERCENT)

FAILING = ("REGRESSED", "FAILED")


@dataclass(frozen=True)
class Check:
    benchmark: str
    metric: str
    baseline: float | str | None
    now: float | str | None
    change: float | None  # relative: 0.15 is +15 %
    verdict: str          # ok | better | new | not run | REGRESSED | FAILED

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


def _number(x) -> float | None:
    return None if x is None else float(x)


def relative_change(base: float | None, now: float | None) -> float | None:
    if base is None or now is None or not (math.isfinite(base) and math.isfinite(now)):
        return None
    if base == 0:
        return 0.0 if now == 0 else math.inf
    return now / base - 1.0


def time_check(name: str, base_s: float | None, now_s: float, regressed: bool) -> Check:
    """The median, in ms; ``regressed``: pytest-benchmark's verdict on it."""
    base_ms = None if base_s is None else base_s * 1e3
    change = relative_change(base_ms, now_s * 1e3)
    if base_ms is None:
        verdict = "new"
    elif regressed:
        verdict = "REGRESSED"
    else:
        verdict = "better" if change is not None and change < 0 else "ok"
    return Check(name, "median_ms", base_ms, now_s * 1e3, change, verdict)


def memory_check(name: str, base: dict, now: dict) -> Check | None:
    """peak_extra_mib: fails above baseline * (1 + MEM_FAIL_FRACTION) + MEM_SLACK_MIB."""
    now_mib = _number(now.get("peak_extra_mib"))
    if now_mib is None:
        return None
    base_mib = _number(base.get("peak_extra_mib"))
    change = relative_change(base_mib, now_mib)
    if not math.isfinite(now_mib):
        return Check(name, "peak_extra_mib", base_mib, now_mib, change, "FAILED")
    if base_mib is None or not math.isfinite(base_mib):
        return Check(name, "peak_extra_mib", base_mib, now_mib, None, "new")
    high = base_mib * (1 + MEM_FAIL_FRACTION) + MEM_SLACK_MIB
    low = base_mib * (1 - MEM_FAIL_FRACTION) - MEM_SLACK_MIB
    verdict = "REGRESSED" if now_mib > high else ("better" if now_mib < low else "ok")
    return Check(name, "peak_extra_mib", base_mib, now_mib, change, verdict)


def error_checks(name: str, base: dict, now: dict) -> list[Check]:
    """Each gradient error of ``now``: fails when not finite, or above baseline *
    ERR_FAIL_FACTOR + ERR_SLACK."""
    out = []
    for metric in GATED_ERRORS:
        if metric not in now:
            continue
        now_err, base_err = _number(now[metric]), _number(base.get(metric))
        change = relative_change(base_err, now_err)
        if now_err is None or not math.isfinite(now_err):
            verdict = "FAILED"
        elif base_err is None or not math.isfinite(base_err):
            verdict = "new"
        else:
            verdict = "REGRESSED" if now_err > base_err * ERR_FAIL_FACTOR + ERR_SLACK else "ok"
        out.append(Check(name, metric, base_err, now_err, change, verdict))
    return out


def extra_checks(name: str, base: dict | None, now: dict) -> list[Check]:
    """Memory and accuracy checks of one benchmark's ``extra_info`` against its baseline's
    (None: the baseline has no such benchmark; non-finite values still fail)."""
    base = base or {}
    mem = memory_check(name, base, now)
    return ([mem] if mem else []) + error_checks(name, base, now)


# ---- the table ------------------------------------------------------------------------

def _fmt(metric: str, x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return str(x)
    if metric == "median_ms":
        return f"{x:.3f}"
    if metric == "peak_extra_mib":
        return f"{x:.1f}"
    return f"{x:.2e}"


def _fmt_change(change: float | None) -> str:
    if change is None:
        return "-"
    return "+inf" if math.isinf(change) else f"{change * 100:+.1f}%"


def format_table(rows: list[Check]) -> str:
    header = ["benchmark", "metric", "baseline", "now", "change", "verdict"]
    body = [[r.benchmark, r.metric, _fmt(r.metric, r.baseline), _fmt(r.metric, r.now),
             _fmt_change(r.change), r.verdict] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    right = {2, 3, 4}  # numbers right-aligned

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(b) for b in body])


def thresholds_line() -> str:
    return (f"fails on: median > +{TIME_FAIL_PERCENT}% (pytest-benchmark), peak_extra_mib > "
            f"+{MEM_FAIL_FRACTION * 100:g}% + {MEM_SLACK_MIB:g} MiB, gradient error > "
            f"x{ERR_FAIL_FACTOR:g} or not finite")
