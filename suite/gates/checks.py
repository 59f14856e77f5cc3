"""The gate's checks of one benchmark against its baseline, its table and its machine line; pure.

Every numeric metric (``spec.LIMITS``: the minimum and median time, the peak extra memory, the
loss's and the gradients' errors) is above its limit past ``center * (1 + threshold) + slack``,
where center is the median of the baseline's per-process values and ``threshold = max(floor, k
* spread)`` (capped for long calls' times), spread being their range over their median: each
benchmark's own noise, process to process. Memory and errors fail there; the time fails only
where its minimum and its median both are above the smaller of their two thresholds (one alone
is ``noise``: a lucky round of the baseline's, or a noisy stretch of this process, moves one
statistic, a slower call both; time_rule). The own
kernel's path fails when it is not the baseline's (``CHANGED``); a benchmark the baseline ran
fails when it is skipped now (``SKIPPED``), unless every baseline process skipped it too
(``optional``). A value that is not finite fails (``FAILED``), as does a failing test.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from suite.gates.baseline import center_and_spread
from suite.gates.spec import ERROR_METRICS, LIMITS, PATH_METRIC, TIME_METRICS

FAILING = ("REGRESSED", "FAILED", "CHANGED", "SKIPPED")
VALUE_METRICS = TIME_METRICS + ("peak_extra_mib",) + ERROR_METRICS


@dataclass(frozen=True)
class Check:
    benchmark: str
    metric: str
    baseline: float | str | None   # the center of the baseline's processes (a path: its text)
    now: float | str | None
    change: float | None           # relative to the baseline: 0.15 is +15 %
    threshold: float | None        # the relative change above which it fails (before slack)
    verdict: str                   # ok | better | noise | new | optional | not run | FAILING ones
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def as_dict(self) -> dict:
        return asdict(self)


def relative_change(base: float | None, now: float | None) -> float | None:
    if base is None or now is None or not (math.isfinite(base) and math.isfinite(now)):
        return None
    if base == 0:
        return 0.0 if now == 0 else math.inf
    return now / base - 1.0


def limit_of(metric: str, base_values: list[float]) -> tuple[float, float, float]:
    """(center, threshold, the value above which ``metric`` fails) from the baseline's
    per-process values."""
    lim = LIMITS[metric]
    center, spread = center_and_spread(base_values)
    threshold = lim.threshold(center, spread)
    return center, threshold, center * (1 + threshold) + lim.slack


def value_check(benchmark: str, metric: str, base_values: list[float] | None,
                now) -> Check | None:
    """One numeric metric; None where this run has no such value."""
    if now is None:
        return None
    now = float(now)
    base_values = [float(v) for v in base_values or [] if v is not None]
    finite = [v for v in base_values if math.isfinite(v)]
    if not math.isfinite(now):
        center = center_and_spread(finite)[0] if finite else None
        return Check(benchmark, metric, center, now, None, None, "FAILED", "not finite")
    if not finite:
        return Check(benchmark, metric, None, now, None, None, "new")
    center, threshold, high = limit_of(metric, finite)
    low = center * (1 - threshold) - LIMITS[metric].slack
    verdict = "REGRESSED" if now > high else ("better" if now < low else "ok")
    return Check(benchmark, metric, center, now, relative_change(center, now), threshold, verdict)


def path_check(benchmark: str, base_paths: list[str], now_path: str | None) -> Check | None:
    """The own kernel's path (own_kernel.plan's): it must be the baseline's."""
    if now_path is None and not base_paths:
        return None
    base = " / ".join(sorted(set(base_paths))) or None
    if base is None:
        return Check(benchmark, PATH_METRIC, None, now_path, None, None, "new")
    if now_path not in base_paths:
        return Check(benchmark, PATH_METRIC, base, now_path, None, None, "CHANGED",
                     f"took the {now_path} path, the baseline's took {base}")
    return Check(benchmark, PATH_METRIC, base, now_path, None, None, "ok")


def benchmark_checks(benchmark: str, base_processes: list[dict] | None, now: dict) -> list[Check]:
    """Every check of one measured benchmark: ``now`` holds this run's ``min_ms`` and its
    extra_info values; ``base_processes`` the baseline's per-process values (None: new)."""
    base_processes = base_processes or []
    out = []
    for metric in VALUE_METRICS:
        base = [p[metric] for p in base_processes if p.get(metric) is not None]
        check = value_check(benchmark, metric, base, now.get(metric))
        if check:
            out.append(check)
    base_paths = [p[PATH_METRIC] for p in base_processes if p.get(PATH_METRIC)]
    path = path_check(benchmark, base_paths, now.get(PATH_METRIC))
    return time_rule(out) + ([path] if path else [])


def time_rule(checks: list[Check]) -> list[Check]:
    """The time's verdict from both statistics. Each has a threshold from its own spread; the
    time fails where both changes are above the smaller of the two: a slower call moves both,
    while noise moves one (a lucky baseline round the minimum, a noisy stretch the median), so
    the quieter statistic's limit can hold both. One above it alone is ``noise`` (passes)."""
    times = [c for c in checks if c.metric in TIME_METRICS and c.verdict != "FAILED"
             and c.threshold is not None and c.change is not None]
    if len(times) < 2:
        return checks
    limit = min(c.threshold for c in times)
    above = [c for c in times if c.change > limit]

    def judged(c: Check) -> Check:
        if c not in times:
            return c
        if len(above) == len(times):
            return replace(c, threshold=limit, verdict="REGRESSED", note="")
        if c in above:
            within = ", ".join(f"{o.metric} {fmt_change(o.change)}" for o in times if o not in above)
            return replace(c, threshold=limit, verdict="noise",
                           note=f"above the limit alone ({within} within it)")
        return replace(c, threshold=limit,
                       verdict="better" if c.change < -limit else "ok", note="")

    return [judged(c) for c in checks]


def skipped_check(benchmark: str, reason: str, base_processes: list[dict] | None,
                  optional_reason: str | None) -> Check:
    """A benchmark skipped now: fails when the baseline ran it."""
    if base_processes:
        return Check(benchmark, "run", "ran", "skipped", None, None, "SKIPPED",
                     f"{reason} (the baseline ran it)")
    if optional_reason is not None:
        why = "" if optional_reason == reason else f": {optional_reason}"
        return Check(benchmark, "run", "not run", "skipped", None, None, "optional",
                     f"{reason} (the baseline did not run it either{why})")
    return Check(benchmark, "run", None, "skipped", None, None, "not run", reason)


def failed_check(benchmark: str, what: str) -> Check:
    return Check(benchmark, "run", None, "failed", None, None, "FAILED", what)


def failure_text(checks: list[Check]) -> str:
    """Why a benchmark fails: its failing checks, one a line (the test's failure report)."""
    lines = []
    for c in checks:
        if not c.failed:
            continue
        if c.threshold is not None:
            what = (f"{fmt_value(c.metric, c.now)} vs baseline {fmt_value(c.metric, c.baseline)} "
                    f"({fmt_change(c.change)}; fails above {fmt_change(c.threshold)}"
                    f"{_slack(c.metric)})")
        else:
            what = c.note or f"{c.now} (baseline {c.baseline})"
        lines.append(f"gate: {c.benchmark} {c.metric} {c.verdict}: {what}")
    return "\n".join(lines)


def _slack(metric: str) -> str:
    slack = LIMITS[metric].slack
    return f" + {slack:g} {LIMITS[metric].unit}".rstrip() if slack else ""


# ---- the table, the machine line -------------------------------------------------------

def fmt_value(metric: str, x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return str(x)
    if metric.endswith("_ms"):
        return f"{x:.3f}"
    if metric == "peak_extra_mib":
        return f"{x:.1f}"
    return f"{x:.2e}"


def fmt_change(change: float | None) -> str:
    if change is None:
        return "-"
    return "+inf" if math.isinf(change) else f"{change * 100:+.1f}%"


def format_table(rows: list[Check]) -> str:
    header = ["benchmark", "metric", "baseline", "now", "change", "fails above", "verdict"]
    body = [[r.benchmark, r.metric, fmt_value(r.metric, r.baseline), fmt_value(r.metric, r.now),
             fmt_change(r.change), fmt_change(r.threshold), r.verdict] for r in rows]
    notes = [f"  {r.benchmark}: {r.verdict}: {r.note}" for r in rows if r.note]
    return "\n".join(_aligned(header, body, {2, 3, 4, 5}) + notes)


def limits_line() -> str:
    t, m, e = LIMITS["min_ms"], LIMITS["peak_extra_mib"], LIMITS["loss_rel_err"]
    g = LIMITS["de_rel_err"]
    return (f"fails on: min_ms and median_ms both > the smaller of their +max({t.floor:.0%}, "
            f"{t.k:g} x spread) (at most +{t.cap:.0%} from {t.cap_from:g} ms); peak_extra_mib > "
            f"+max({m.floor:.0%}, {m.k:g} x spread) + {m.slack:g} MiB; errors > "
            f"+max({e.floor:.0%}, {e.k:g} x spread) + {e.slack:g} (loss) or {g.slack:g} "
            f"(gradients); a changed own-kernel path; a skip of a benchmark the baseline ran; "
            f"a non-finite value. Spread: range / median of the baseline's processes")


# What the machine line compares: (label, machine_info's versions key or a function of it).
MACHINE_FIELDS = (
    ("GPU", lambda info: (info.get("gpu") or {}).get("name")),
    ("driver", lambda info: _version(info, "driver")),
    ("torch", lambda info: _version(info, "torch")),
    ("triton", lambda info: _version(info, "triton")),
    ("CUDA", lambda info: _version(info, "cuda")),
    ("cut-cross-entropy", lambda info: _version(info, "cut_cross_entropy")),
    ("liger-kernel", lambda info: _version(info, "liger_kernel")),
    ("CCE_OWN_CONFIG", lambda info: _version(info, "own_config_overrides")),
    ("own_kernel from", lambda info: info.get("own_kernel_from")),
    ("commit", lambda info: _short_commit(_version(info, "git_commit"))),
)


def _version(info: dict, key: str):
    return (info.get("versions") or {}).get(key)


def _short_commit(commit):
    return commit[:10] if isinstance(commit, str) and len(commit) > 12 else commit


def machine_line(base_info: dict, now_info: dict) -> str:
    """One line: this machine against the baseline's (GPU, driver, versions, commit), each
    field as ``value`` where equal, ``baseline -> now`` where not; unset fields left out."""
    same, changed = [], []
    for label, get in MACHINE_FIELDS:
        base, now = get(base_info or {}), get(now_info or {})
        if base is None and now is None:
            continue
        if base == now:
            same.append(f"{label} {now}")
        else:
            changed.append(f"{label} {base if base is not None else 'none'} -> "
                           f"{now if now is not None else 'none'}")
    if not changed:
        return "machine: as the baseline's: " + ", ".join(same)
    return "machine: changed since the baseline: " + ", ".join(changed) + \
        ("; same: " + ", ".join(same) if same else "")


def _aligned(header: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), "  ".join("-" * w for w in widths)] + [line(b) for b in body]


def limits_table(baseline) -> str:
    """A saved baseline's limits: per benchmark and metric, the median of its processes, their
    spread and the change that fails; then the benchmarks not run (optional)."""
    body = []
    for bid in baseline.benchmarks:
        processes = baseline.values(bid)
        for metric in VALUE_METRICS:
            values = [float(p[metric]) for p in processes if p.get(metric) is not None]
            if not values or not all(math.isfinite(v) for v in values):
                continue
            center, spread = center_and_spread(values)
            _, threshold, _ = limit_of(metric, values)
            body.append([bid, metric, fmt_value(metric, center), f"{spread * 100:.1f}%",
                         fmt_change(threshold)])
        paths = sorted({p[PATH_METRIC] for p in processes if p.get(PATH_METRIC)})
        if paths:
            body.append([bid, PATH_METRIC, " / ".join(paths), "-", "changed"])
    lines = _aligned(["benchmark", "metric", "median", "spread", "fails above"], body, {2, 3, 4})
    lines += [f"  {bid}: not run (optional): {why}" for bid, why in baseline.not_run.items()]
    return "\n".join(lines)
