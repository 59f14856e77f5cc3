"""The command line the log parsers share (tune_logs.py, ncu_logs.py): each folder's logs
become one CSV beside them, so a note's table is generated from the logs, not typed."""
from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path
from typing import Callable


def csv_text(rows: list[dict], columns) -> str:
    """rows as CSV text with this header, lines ending in a bare newline (the committed CSVs')."""
    out = io.StringIO()
    writer = csv.DictWriter(out, list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def folders_main(argv, prog: str, description: str, pattern: str, csv_name: str,
                 folder_csv: Callable[[Path], str]) -> int:
    """Write folder_csv(folder) to folder/csv_name for every folder named; a name that is not
    a folder, or a folder with no log matching pattern, is an error naming it."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("folders", nargs="+", help=f"folders of logs ({pattern})")
    args = parser.parse_args(argv)
    for folder in map(Path, args.folders):
        if not folder.is_dir():
            parser.error(f"folders: {folder} is not a folder")
        if not any(folder.glob(pattern)):
            parser.error(f"folders: {folder} holds no {pattern} log")
        (folder / csv_name).write_text(folder_csv(folder))
        print(f"{prog.rsplit('.', 1)[-1]}: {folder / csv_name} written")
    return 0
