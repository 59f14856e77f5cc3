"""The logs of ``ncu --metrics ...`` (its plain-text report, one kernel launch per log) as a
CSV, so a measurement note's table of hardware counters is generated from them
(suite/report/notes.py) instead of being typed.

    python -m suite.report.ncu_logs results/notes/forward-grid-h200/ncu-ov2/call36a [...]
    # writes <folder>/ncu.csv

Every ``ncu-*.txt`` in the folder becomes a row per profiled launch: the log's name, the
kernel, its grid, and each metric the report prints (``Metric Name  Unit  Value``), in ncu's
unit with thousands separators dropped (a `ms` metric stays in ms); where the log has
``gpc__cycles_elapsed.max`` and ``sm__cycles_active.avg``, ``span_over_mean``: the launch's span
over the SMs' mean active cycles, 1 when every SM is busy to the end (`python -m suite kernel
grid` simulates the same ratio from the plan); where it has ``gpc__cycles_elapsed.max`` and
``gpu__time_duration.sum``, ``clock_ghz``: the launch's mean clock, its cycles over its time.
With the clocks left alone (the device README) two kernels' cycles and times can rank them
differently: a kernel that keeps the tensor cores busier draws more power and may run slower
clocks. A log with no launch
(ncu failed, or matched no kernel) is an error naming it: a table over it would be silently
short.
"""
from __future__ import annotations

import re
from pathlib import Path

from suite.report.log_csv import csv_text, folders_main

CSV_NAME = "ncu.csv"
LAUNCH = re.compile(r"^\s+(?P<kernel>\w+) \((?P<grid>\d+, \d+, \d+)\)x\(\d+, \d+, \d+\)")
METRIC = re.compile(r"^\s+(?P<name>[a-z][\w.]+)\s+(?:(?P<unit>[A-Za-z%/]+)\s+)?"
                    r"(?P<value>[\d,]+(?:\.\d+)?)$")


def parse_log(path) -> list[dict]:
    """One row per profiled launch of an ncu text report: log, kernel, grid and every metric
    (name -> value, and name_unit -> its unit where ncu prints one); ValueError when the log
    holds no launch."""
    path = Path(path)
    rows: list[dict] = []
    for line in path.read_text().splitlines():
        launch = LAUNCH.match(line)
        if launch:
            rows.append(dict(log=path.stem, kernel=launch["kernel"],
                             grid=launch["grid"].split(",")[0]))
            continue
        metric = METRIC.match(line)
        if metric and rows:
            rows[-1][metric["name"]] = metric["value"].replace(",", "")
            if metric["unit"]:
                rows[-1][f"{metric['name']}_unit"] = metric["unit"]
    if not rows:
        raise ValueError(f"{path}: no profiled launch (ncu failed or matched no kernel)")
    for row in rows:
        _add_derived(row)
    return rows


SECONDS_PER_UNIT = {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
                    "s": 1.0, "second": 1.0, "nsecond": 1e-9}


def _add_derived(row: dict) -> None:
    """span_over_mean and clock_ghz, where the row has the metrics they are made of."""
    cycles = row.get("gpc__cycles_elapsed.max")
    if cycles is not None and "sm__cycles_active.avg" in row:
        row["span_over_mean"] = str(round(float(cycles) / float(row["sm__cycles_active.avg"]), 4))
    duration, unit = row.get("gpu__time_duration.sum"), row.get("gpu__time_duration.sum_unit")
    if cycles is not None and duration is not None:
        if unit not in SECONDS_PER_UNIT:
            raise ValueError(f"{row['log']}: gpu__time_duration.sum in {unit!r}, not a unit "
                             f"of time this parser knows ({', '.join(SECONDS_PER_UNIT)})")
        seconds = float(duration) * SECONDS_PER_UNIT[unit]
        row["clock_ghz"] = str(round(float(cycles) / seconds / 1e9, 3))


def folder_csv(folder) -> str:
    """The CSV text of every ``ncu-*.txt`` log in ``folder``, by file name; the columns are
    every metric any log printed, in first-seen order."""
    rows = [row for log in sorted(Path(folder).glob("ncu-*.txt")) for row in parse_log(log)]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return csv_text(rows, columns)


def main(argv=None) -> int:
    return folders_main(argv, "python -m suite.report.ncu_logs", __doc__.splitlines()[0],
                        "ncu-*.txt", CSV_NAME, folder_csv)


if __name__ == "__main__":
    raise SystemExit(main())
