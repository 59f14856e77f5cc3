"""ncu's source page per SASS instruction (``ncu -i REP --page source --csv --print-source sass
-k KERNEL > sass-NAME.csv``, gzipped or not) as a CSV by opcode, so a note's table of where a
kernel's warps stall is generated instead of typed.

    python -m suite.report.ncu_source results/notes/portable-path-h200/epilogue/call38a
    # writes <folder>/stalls.csv

Every ``sass-*.csv[.gz]`` in the folder becomes one row per opcode (the mnemonic before its
first dot, predicates dropped): the export's name, the opcode, its share of the kernel's warp
stall samples (``stall_share``), the instructions of it the launch executed, and the stall
reason with the most of its samples (``top_reason``, ncu's ``stall_*`` column without the
prefix). Rows go by share, largest first; opcodes under MIN_SHARE of the samples are summed into
one last row, ``other`` (no reason). An export with no instruction is an error naming it.
"""
from __future__ import annotations

import csv
import gzip
import re
from collections import Counter
from pathlib import Path

from suite.report.log_csv import csv_text, folders_main

CSV_NAME = "stalls.csv"
MIN_SHARE = 0.01
SAMPLES = "Warp Stall Sampling (All Samples)"
OPCODE = re.compile(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def _text(path: Path) -> str:
    return gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()


def parse_export(path) -> list[dict]:
    """The rows by opcode of one source-page export (see the module's docstring)."""
    path = Path(path)
    lines = _text(path).splitlines()
    # ncu's first line names the kernel; the header follows
    rows = list(csv.DictReader(lines[1:]))
    if not rows:
        raise ValueError(f"{path}: no instruction (not an ncu source page export)")
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    samples, executed, by_reason = Counter(), Counter(), {}
    for row in rows:
        op = OPCODE.match(row["Source"]).group(1)
        samples[op] += int(row[SAMPLES])
        executed[op] += int(row["Instructions Executed"])
        counts = by_reason.setdefault(op, Counter())
        for k in reasons:
            counts[k] += int(row[k] or 0)
    total = sum(samples.values()) or 1
    name = path.name.split(".")[0]
    main = [op for op, n in samples.most_common() if n / total >= MIN_SHARE]
    rows = [dict(export=name, opcode=op, stall_share=round(samples[op] / total, 4),
                 executed=executed[op],
                 top_reason=by_reason[op].most_common(1)[0][0].removeprefix("stall_"))
            for op in main]
    rest = [op for op in samples if op not in main]
    if rest:
        rows.append(dict(export=name, opcode="other",
                         stall_share=round(sum(samples[op] for op in rest) / total, 4),
                         executed=sum(executed[op] for op in rest), top_reason=""))
    return rows


def folder_csv(folder) -> str:
    """The CSV text of every ``sass-*.csv[.gz]`` export in ``folder``, by file name."""
    rows = [row for path in sorted(Path(folder).glob("sass-*.csv*"))
            for row in parse_export(path)]
    return csv_text(rows, ("export", "opcode", "stall_share", "executed", "top_reason"))


def main(argv=None) -> int:
    return folders_main(argv, "python -m suite.report.ncu_source", __doc__.splitlines()[0],
                        "sass-*.csv*", CSV_NAME, folder_csv)


if __name__ == "__main__":
    raise SystemExit(main())
