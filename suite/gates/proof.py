"""The proof's summary (suite/gates/prove.sh), from the gate's ``--report`` files; pure but for
reading them.

    python -m suite.gates.proof baseline FILE                 # which baseline, in one line
    python -m suite.gates.proof spread [--csv FILE] REPORT... # each check over unchanged runs
    python -m suite.gates.proof expect REPORT BENCH:METRIC... # each must fail (exit 1 if not)
    python -m suite.gates.proof recheck REPORT...             # verdicts under this gate's rule
    python -m suite.gates.proof commits REPORT...             # the commit every report names
    python -m suite.gates.proof required FILE BENCH           # 'required' or 'optional'
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

from suite.gates.baseline import Baseline
from suite.gates.checks import FAILING, fmt_value, fmt_change


def load_reports(paths) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def baseline_line(path) -> str:
    """The baseline file a proof used: path, sha256, processes, commit and date."""
    path = Path(path)
    b = Baseline.load(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    commit = (b.machine_info.get("versions") or {}).get("git_commit")
    return (f"`{path}` (sha256 {digest}..., {b.processes} processes, saved at commit {commit}, "
            f"{b.doc.get('datetime')}; {len(b.benchmarks)} benchmarks, "
            f"{len(b.not_run)} not run: {', '.join(b.not_run) or 'none'})")


def spread_rows(reports: list[dict]) -> list[dict]:
    """Per (benchmark, metric), over the runs: the threshold, the smallest and largest change,
    how close the largest came to the threshold, and how many runs failed it."""
    rows: dict[tuple, dict] = {}
    for report in reports:
        for c in report["checks"]:
            row = rows.setdefault((c["benchmark"], c["metric"]), {
                "benchmark": c["benchmark"], "metric": c["metric"], "threshold": c["threshold"],
                "changes": [], "verdicts": []})
            if c["change"] is not None and math.isfinite(c["change"]):
                row["changes"].append(c["change"])
            row["verdicts"].append(c["verdict"])
    return list(rows.values())


def _spread_stats(r: dict) -> dict:
    """One spread row's numbers: smallest and largest change, the largest over the threshold,
    runs above alone (checks.time_rule's noise) and runs failed."""
    hi = max(r["changes"]) if r["changes"] else None
    return {"min_change": min(r["changes"]) if r["changes"] else None, "max_change": hi,
            "max_over_limit": hi / r["threshold"] if hi is not None and r["threshold"] else None,
            "above_alone": sum(v == "noise" for v in r["verdicts"]),
            "failed": sum(v in FAILING for v in r["verdicts"]), "runs": len(r["verdicts"])}


def spread_table(reports: list[dict]) -> str:
    """Markdown: each check's spread over the unchanged runs; ``above alone``: runs where one
    time statistic was above its limit and the other not (checks.time_rule's noise)."""
    lines = [f"| benchmark | metric | fails above | min change | max change | max / limit | "
             f"above alone | failed ({len(reports)} runs) |", "|---|---|---|---|---|---|---|---|"]
    for r in spread_rows(reports):
        s = _spread_stats(r)
        used = f"{s['max_over_limit']:.2f}" if s["max_over_limit"] is not None else "-"
        what = fmt_change(r["threshold"]) if r["threshold"] is not None else \
            ("changed" if r["metric"] == "own_path" else "skipped")
        lines.append(f"| {r['benchmark']} | {r['metric']} | {what} | "
                     f"{fmt_change(s['min_change'])} | {fmt_change(s['max_change'])} | {used} | "
                     f"{s['above_alone']} | {s['failed']} |")
    return "\n".join(lines)


SPREAD_FIELDS = ("benchmark", "metric", "threshold", "min_change", "max_change",
                 "max_over_limit", "above_alone", "failed", "runs")


def spread_csv(reports: list[dict], path) -> None:
    """spread_table's rows as a CSV (a note's table reads it; suite/report/notes.py)."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SPREAD_FIELDS)
        w.writeheader()
        for r in spread_rows(reports):
            w.writerow({"benchmark": r["benchmark"], "metric": r["metric"],
                        "threshold": r["threshold"], **_spread_stats(r)})


def expectations(report: dict, expected: list[str]) -> tuple[bool, list[str]]:
    """Whether every ``benchmark:metric`` in ``expected`` failed in ``report``; one markdown
    line per expectation, then one per other failing check."""
    failing = {(c["benchmark"], c["metric"]): c for c in report["checks"]
               if c["verdict"] in FAILING}
    checks = {(c["benchmark"], c["metric"]): c for c in report["checks"]}
    ok, lines = True, []
    for item in expected:
        bench, _, metric = item.rpartition(":")
        c = checks.get((bench, metric))
        caught = (bench, metric) in failing
        ok &= caught
        lines.append(f"- {'caught' if caught else '**MISSED**'}: {bench} {metric}: "
                     f"{_describe(c) if c else 'not measured'}")
    others = [c for key, c in failing.items() if f"{key[0]}:{key[1]}" not in expected]
    lines += [f"- also failing: {c['benchmark']} {c['metric']}: {_describe(c)}" for c in others]
    return ok, lines


def recheck(report: dict) -> dict:
    """A stored report's checks judged again by this gate's time rule (checks.time_rule) from
    their stored changes and each statistic's own threshold: what a gate of this commit says
    of the same measurements."""
    from collections import defaultdict

    from suite.gates.checks import Check, time_rule

    by_benchmark = defaultdict(list)
    for c in report["checks"]:  # time_rule judges the time checks from change and threshold
        by_benchmark[c["benchmark"]].append(Check(**c))
    checks = [x for cs in by_benchmark.values() for x in time_rule(cs)]
    return {**report, "checks": [c.as_dict() for c in checks],
            "passed": not any(c.failed for c in checks)}


def _describe(c: dict) -> str:
    if c["threshold"] is None:
        return f"{c['verdict']} ({c['note'] or c['now']})"
    return (f"{c['verdict']}, {fmt_value(c['metric'], c['baseline'])} -> {fmt_value(c['metric'], c['now'])}"
            f" ({fmt_change(c['change'])}; fails above {fmt_change(c['threshold'])})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.gates.proof")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("baseline").add_argument("file")
    spread = sub.add_parser("spread")
    spread.add_argument("--csv", default=None, help="also write the rows to this CSV")
    spread.add_argument("reports", nargs="+")
    expect = sub.add_parser("expect")
    expect.add_argument("report")
    expect.add_argument("expected", nargs="+", metavar="BENCH:METRIC")
    sub.add_parser("commits").add_argument("reports", nargs="+")
    sub.add_parser("recheck").add_argument("reports", nargs="+")
    required = sub.add_parser("required")
    required.add_argument("file")
    required.add_argument("benchmark")
    args = parser.parse_args(argv)
    if args.command == "baseline":
        print(baseline_line(args.file))
    elif args.command == "spread":
        reports = load_reports(args.reports)
        print(spread_table(reports))
        if args.csv:
            spread_csv(reports, args.csv)
    elif args.command == "expect":
        ok, lines = expectations(load_reports([args.report])[0], args.expected)
        print("\n".join(lines))
        return 0 if ok else 1
    elif args.command == "recheck":
        for path in args.reports:
            again = recheck(load_reports([path])[0])
            failing = [f"{c['benchmark']} {c['metric']}" for c in again["checks"]
                       if c["verdict"] in FAILING]
            print(f"{path}: {'PASS' if again['passed'] else 'FAIL'}"
                  + (f" ({len(failing)}: {', '.join(failing)})" if failing else ""))
    elif args.command == "commits":
        print(" ".join(sorted({str(r.get("commit")) for r in load_reports(args.reports)})))
    else:
        print("optional" if args.benchmark in Baseline.load(args.file).not_run else "required")
    return 0


if __name__ == "__main__":
    sys.exit(main())
