"""The forward's grid as the plan chooses it, and the wave model's view of it, without a GPU:
`python -m suite kernel grid --heads 4096x3584x152064,2048x8192x152064 [--variants
'old={"forward": {"makespan_order": "split"}}'] [--sms 132] [--target hopper-16bit]
[--out grid.csv]`.

Per head and variant (the base config and each NAME=JSON override on top of it): the split
count, the row blocks per launch group, whether the last split runs after the groups
(plan.split_plan), the programs and waves of resident programs, and ``span_over_mean``: the
makespan of list scheduling in the kernels' launch order (plan.launch_lengths,
plan.makespan) over the programs' mean work per resident slot, 1 when every slot is busy to
the end. ncu's ``gpc__cycles_elapsed.max`` over ``sm__cycles_active.avg`` measures the same
ratio on a GPU (suite/report/ncu_logs.py). Prints the rows; --out also writes them as CSV.
"""
from __future__ import annotations

import csv
import sys

from suite.kernel.interleave import parse_head, parse_variants

COLUMNS = ("head", "entry", "splits", "group_rows", "short_last", "programs", "waves",
           "span_over_mean")


def add_arguments(ap) -> None:
    ap.add_argument("--heads", required=True, help="comma-separated NxDxV (a softcap is ignored)")
    ap.add_argument("--variants", nargs="*", default=[],
                    help="NAME=JSON config overrides, each planned beside the base ({})")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SMs (default %(default)s)")
    ap.add_argument("--target", default="hopper-16bit", choices=("hopper-16bit", "portable"),
                    help="the config the variants override (default %(default)s)")
    ap.add_argument("--out", default="", help="also write the rows to this CSV")


def grid_row(head: str, entry: str, n: int, d: int, v: int, cfg, sms: int) -> dict:
    """One COLUMNS row: the plan's grid for a bf16 head and its simulated span."""
    from own_kernel.policy.plan import cdiv, launch_lengths, makespan, split_plan

    grid = split_plan(n, v, d, 2, cfg, sms)
    slots = sms * cfg.forward.programs_per_sm
    tiles = cfg.forward.tiles
    num_nb, num_tiles = cdiv(n, tiles.block_n), max(1, cdiv(v, tiles.block_v))
    lengths = launch_lengths(num_nb, num_tiles, grid.splits, grid.group_rows,
                             cfg.forward.program_overhead_tiles, grid.short_last)
    return dict(head=head, entry=entry, splits=grid.splits, group_rows=grid.group_rows,
                short_last=grid.short_last, programs=len(lengths),
                waves=round(len(lengths) / slots, 3),
                span_over_mean=round(makespan(lengths, slots) * slots / sum(lengths), 4))


def main(args) -> int:
    from own_kernel.policy.config import HOPPER_16BIT, PORTABLE, with_overrides

    if args.sms < 1:
        raise SystemExit(f"--sms: expected >= 1, got {args.sms}")
    base = HOPPER_16BIT if args.target == "hopper-16bit" else PORTABLE
    try:
        configs = [(name, with_overrides(base, ov) if ov else base)
                   for name, ov in parse_variants(args.variants)]
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"--variants: {exc}") from None
    rows = []
    for head in args.heads.split(","):
        n, d, v, _ = parse_head(head)
        rows += [grid_row(head.strip(), name, n, d, v, cfg, args.sms) for name, cfg in configs]
    writer = csv.DictWriter(sys.stdout, COLUMNS, delimiter=" ", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    if args.out:
        with open(args.out, "w", newline="") as f:
            out = csv.DictWriter(f, COLUMNS, lineterminator="\n")
            out.writeheader()
            out.writerows(rows)
    return 0
