"""The autocast target, one row per shape, read from ``python -m suite kernel autocast``'s CSVs
(bf16 autocast with an fp32 weight, each own point beside torch.compile's naive loss in the
same process): the notes' table of it is a block over this CSV, not typed.

    python -m suite.report.autocast_targets OUT.csv results/autocast-h200/autocast.csv [...]

The target: an own point of the default config (``own``, or ``own_ws<K>``: a K MiB budget; not
the tool's logits-format variants) within torch.compile's peak memory (1 MiB of allocator slack)
at ≤ 0.95× its time by the medians, and faster by the p20–p80 rule (suite/report/verdict.py).
Each row also has the default call (``own``) against torch.compile, and its run: the CSV's
folder, with the GPU and commit of the ``env.json`` beside it.
"""
from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

from suite.report.envs import read_envs
from suite.report.exact_targets import best_within, write_csv
from suite.report.formatting import num
from suite.report.verdict import time_verdict

MAX_RATIO = 0.95
DEFAULT_CONFIG = re.compile(r"own(_ws\d+)?$")
COLUMNS = ("run", "shape", "n", "d", "v", "default_over_compile", "default_vs_compile",
           "best_provider", "best_over_compile", "best_vs_compile", "best_mib_over_compile",
           "best_met", "gpu", "commit")


def shape_targets(rows: list[dict]) -> dict:
    """One shape's row from its ok rows (torch_compile's among them)."""
    out = {k: rows[0][k] for k in ("shape", "n", "d", "v")}
    compiled = next((r for r in rows if r["provider"] == "torch_compile"), None)
    if compiled is None:
        return out
    own = next((r for r in rows if r["provider"] == "own"), None)
    if own is not None:
        out.update(default_over_compile=num(own["ms"]) / num(compiled["ms"]),
                   default_vs_compile=time_verdict(own, compiled))
    out.update(best_within([r for r in rows if DEFAULT_CONFIG.match(r["provider"])], compiled,
                           "peak_mib", MAX_RATIO))
    return out


def targets(csv_paths) -> list[dict]:
    """A row per shape of each CSV, in the CSVs' order."""
    out = []
    for path in map(Path, csv_paths):
        with path.open() as f:
            rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
        envs = read_envs(path.parent)
        env = envs[0] if envs else {}
        for shape in dict.fromkeys(r["shape"] for r in rows):
            row = shape_targets([r for r in rows if r["shape"] == shape])
            row.update(run=path.parent.name, gpu=env.get("gpu_name", ""),
                       commit=(env.get("git_commit") or "")[:10])
            out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suite.report.autocast_targets",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the targets' CSV to write")
    ap.add_argument("csvs", nargs="+", help="autocast.csv files of suite kernel autocast")
    args = ap.parse_args(argv)
    for path in args.csvs:
        if not Path(path).is_file():
            ap.error(f"csvs: {path} is not a file")
    write_csv(targets(args.csvs), args.out, COLUMNS)
    print(f"autocast_targets: {args.out} written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
