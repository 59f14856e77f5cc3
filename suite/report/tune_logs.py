"""The logs of ``python -m suite kernel tune`` as a CSV, so a measurement note's table is
generated from them (suite/report/notes.py) instead of being typed.

    python -m suite.report.tune_logs results/notes/forward-l2 [...]   # writes <folder>/tune.csv

A tune log starts with the shape (``<GPU> N=.. D=.. V=.. softcap=.. commit ..``) and prints one
line per timed variant, ``<what> <config override>: <median> ms = <x> floors``. Every such line of
every ``*.txt`` log in the folder becomes a row: the log, the GPU and shape, what was timed (its
parenthesised remarks dropped and commas made semicolons: ``fwd``, ``fwd+bwd exact``,
``fwd+bwd filter auto; lm inputs``),
the config override as printed, the median and the floors. Those logs hold one median per
variant and no p20–p80 spread: by the suite's rule no variant in them is faster than another,
and the notes say so.
"""
from __future__ import annotations

import re
from pathlib import Path

from suite.report.log_csv import csv_text, folders_main

CSV_NAME = "tune.csv"
COLUMNS = ("log", "gpu", "n", "d", "v", "softcap", "measured", "config", "ms", "floors")
HEADER = re.compile(r"^(?P<gpu>.+?) N=(?P<n>\d+) D=(?P<d>\d+) V=(?P<v>\d+) softcap=(?P<softcap>\S+)")
TIMED = re.compile(r"^(?P<measured>[^{}\n]+?) (?P<config>\{.*\}): (?P<ms>[\d.]+) ms = "
                   r"(?P<floors>[\d.]+) floors$")


def parse_log(path) -> list[dict]:
    """The timed lines of one tune log, as rows of COLUMNS; ValueError when its first line does
    not name the shape."""
    path = Path(path)
    lines = path.read_text().splitlines()
    shape = HEADER.match(lines[0]) if lines else None
    if shape is None:
        raise ValueError(f"{path}: not a tune log (its first line names no N=, D=, V=, softcap=)")
    rows = []
    for line in lines[1:]:
        timed = TIMED.match(line)
        if timed is None:
            continue
        # remarks in parentheses dropped, and no comma: a note's `where:` splits on commas
        measured = re.sub(r"\s*\([^)]*\)", "", timed["measured"]).strip().replace(", ", "; ")
        rows.append(dict(log=path.name, **shape.groupdict(), measured=measured,
                         config=timed["config"], ms=timed["ms"], floors=timed["floors"]))
    return rows


def folder_csv(folder) -> str:
    """The CSV text of every tune log (``*.txt`` whose first line names a shape) in ``folder``,
    by file name."""
    rows = []
    for log in sorted(Path(folder).glob("*.txt")):
        try:
            rows += parse_log(log)
        except ValueError:
            continue  # another kind of log (ncu, a profile): not a tune log
    return csv_text(rows, COLUMNS)


def main(argv=None) -> int:
    return folders_main(argv, "python -m suite.report.tune_logs", __doc__.splitlines()[0],
                        "*.txt", CSV_NAME, folder_csv)


if __name__ == "__main__":
    raise SystemExit(main())
