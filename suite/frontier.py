"""``python -m suite frontier RUN ...``: the time–memory frontier of exact loss+grad, per shape.

This module is the measuring side: imported as a plugin (``bench --plugin suite.frontier``) it
registers the own kernel's exact call at each workspace budget (``own_ws256`` ... ``own_ws8192``,
suite.report.frontier_tables.SWEEP); its command prints the tables, which
suite/report/frontier_tables.py makes (``python -m suite report RUN ... --frontier`` prints the
same). Measure with::

    python -m suite bench --plugin suite.frontier --phases loss+grad --dist lm \\
        --providers naive,torch_compile,...,own,own_recompute,own_low_memory,own_filter,\\
own_ws256,...,own_ws8192 --n 8192 --d 2304 --v 256000 --softcap 30 --out results/frontier-<gpu>

``python -m suite plots`` draws one figure per cell of every curated ``frontier-*`` run.
"""
from __future__ import annotations

from suite.providers.own import own_at_budget, own_ran
from suite.registry import needs_triton_device, register
from suite.report.frontier_tables import BUDGETS_MIB, PHASE, by_cell, report, sweep_name

VERMILLION = "#D55E00"  # the own kernel's colour (suite/providers/own.py)


# One marker per budget: no two providers may look alike in a figure (tests/test_providers.py).
_MARKERS = ("1", "2", "3", "4", "+", "x", "|", "_")
for _mib, _marker in zip(BUDGETS_MIB, _MARKERS, strict=True):
    register(sweep_name(_mib), summary=f"own Triton CCE, exact, workspace_mib={_mib}",
             features=("bias", "softcap"), requires=needs_triton_device, exact=True, ran=own_ran,
             style=dict(color=VERMILLION, marker=_marker, linestyle="-"),
             order=90)(own_at_budget(_mib))


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", help="run folders of a frontier sweep")
    parser.add_argument("--targets-csv", metavar="CSV",
                        help="also write the exact call's targets against torch.compile, one "
                             "row per cell, to CSV (suite/report/exact_targets.py)")
    parser.add_argument("--forward", nargs="+", default=[], metavar="RUN",
                        help="with --targets-csv: run folders of the forward step (phase fwd: "
                             "own, own_portable), matched to the cells by cell_id")


def main(args) -> int:
    if not by_cell(args.results):
        print(f"no {PHASE} rows in {', '.join(args.results)}")
        return 2
    if args.forward and not args.targets_csv:
        raise SystemExit("--forward: needs --targets-csv (the forward rows feed only that CSV)")
    print(report(args.results))
    if args.targets_csv:
        from suite.report.exact_targets import targets, write_csv

        path = write_csv(targets(args.results, args.forward), args.targets_csv)
        print(f"wrote {path}")
    return 0
