"""The measurement notes' tables, generated from the CSVs the kernel tools wrote
(``python -m suite report --notes`` rewrites every note under results/notes in place).

A note marks a table copied from a CSV with two comments; what lies between them is generated.
No table of measured numbers in a note is typed by hand (tests/test_notes.py finds any): it is a
block over a committed CSV, the kernel tools' or one that suite/report/tune_logs.py parses from
``suite kernel tune``'s logs, or the note is generated whole (scaling.md):

    <!-- table: ../rl-h200/rl.csv
         columns: model, n=N, ms_median=ms (median)
         where: status=ok
         format: raw
    -->
    (the generated table)
    <!-- end table -->

- the path, first after ``table:``, is relative to the note's folder; then one ``key: value``
  line per option, a line without a key going on with the previous one's value. A path with
  ``*`` is a glob: the rows of every CSV it matches, in sorted path order, as one table (runs
  of one tool, one CSV a shape or round: the CSVs must share their header), with a column
  ``folder``, each row's CSV's folder below the glob's first ``*`` part (``round-1``);
- ``columns`` (optional; default: every column of the CSV): the CSV's columns in the table's
  order, each ``name`` or ``name=header`` (the header the table shows; no ``,`` or ``=`` in it);
- ``where`` (optional): comma-separated ``column=value``; a row is kept when each named cell
  is ``value`` as the CSV wrote it (``column=a|b``: any of them);
- ``format`` (optional): ``sig4`` (the default: ``formatting.fmt_sig``, numbers to 4
  significant digits, integers and words as written) or ``raw`` (cells as the CSV wrote them).

Both markers start a line. An empty cell prints as – in both formats. A block naming a missing CSV, an unknown column or
key, or an opening without its end is an error naming the note and the block.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from suite.report.formatting import fmt_sig, md_table
from suite.report.readme import ROOT

NOTES = ROOT / "results" / "notes"
OPEN = "<!-- table:"
END = "<!-- end table -->"
# markers count only at the start of a line, so prose may name them in backticks; the body may
# not hold another opening: an opening without its end stays unmatched (an error) instead of
# swallowing the next block's table
OPENS = re.compile("^" + re.escape(OPEN), re.M)
ENDS = re.compile("^" + re.escape(END), re.M)
BLOCK = re.compile("^" + re.escape(OPEN) + r"(?P<spec>.*?)-->(?P<body>(?:(?!\n"
                   + re.escape(OPEN) + r").)*?)^" + re.escape(END), re.S | re.M)
FORMATS = ("sig4", "raw")


class NoteTableError(ValueError):
    """A table block that cannot be generated; the message names the note and the block."""


@dataclass(frozen=True)
class TableSpec:
    csv_path: str                         # as written in the block, relative to the note
    columns: tuple[tuple[str, str], ...]  # (CSV column, header); empty: every column
    where: tuple[tuple[str, str], ...]    # (CSV column, value as written)
    format: str


def _pairs(value: str, key: str, label: str) -> tuple[tuple[str, str], ...]:
    """``a, b=B`` as (("a", "a"), ("b", "B")); ``where`` needs the ``=`` in every item."""
    pairs = []
    for item in (part.strip() for part in value.split(",")):
        name, eq, other = (s.strip() for s in item.partition("="))
        if not name or (key == "where" and not eq):
            raise NoteTableError(f"{label}: '{key}' item '{item}' is not "
                                 f"{'column=value' if key == 'where' else 'name or name=header'}")
        pairs.append((name, other if eq else name))
    return tuple(pairs)


def parse_spec(spec: str, label: str) -> TableSpec:
    """The text between ``<!-- table:`` and ``-->``: the CSV path, then ``key: value`` lines."""
    lines = [line.strip() for line in spec.strip().splitlines() if line.strip()]
    if not lines:
        raise NoteTableError(f"{label}: no CSV path after 'table:'")
    options = {"columns": "", "where": "", "format": "sig4"}
    key = None
    for line in lines[1:]:
        name, colon, value = (s.strip() for s in line.partition(":"))
        if colon and name in options:
            key = name
            options[key] = value
        elif key is not None:  # a long list goes on over several lines
            options[key] = f"{options[key]} {line}"
        else:
            raise NoteTableError(f"{label}: unknown line '{line}' (keys: {', '.join(options)})")
    if options["format"] not in FORMATS:
        raise NoteTableError(f"{label}: format '{options['format']}' is not one of "
                             f"{', '.join(FORMATS)}")
    columns = _pairs(options["columns"], "columns", label) if options["columns"] else ()
    where = _pairs(options["where"], "where", label) if options["where"] else ()
    return TableSpec(lines[0], columns, where, options["format"])


def _cell(text: str | None, fmt: str) -> str:
    text = (text or "").replace("\n", " ").replace("|", r"\|")  # a cell stays one table cell
    if fmt == "raw":
        return text if text.strip() else "–"
    return fmt_sig(text)


def _read_rows(spec: TableSpec, note_path: Path, label: str) -> tuple[list[dict], list[str]]:
    """The block's rows and header: its CSV's, or every CSV its glob matches, joined (each row
    then with its CSV's ``folder``)."""
    base, glob = note_path.parent, "*" in spec.csv_path
    if glob:
        paths = sorted(base.glob(spec.csv_path))
        if not paths:
            raise NoteTableError(f"{label}: no CSV matches {base / spec.csv_path}")
        parts = Path(spec.csv_path).parts
        fixed = base.joinpath(*parts[:next(i for i, p in enumerate(parts) if "*" in p)])
    else:
        paths = [base / spec.csv_path]
        if not paths[0].is_file():
            raise NoteTableError(f"{label}: no CSV at {paths[0]}")
    rows, fields = [], None
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            read = list(reader)
            header = reader.fieldnames or []
        if fields is not None and header != fields:
            raise NoteTableError(f"{label}: {path} has another header than {paths[0]}")
        fields = header
        if glob:
            if "folder" in header:
                raise NoteTableError(f"{label}: {path} has a column 'folder', which a glob's "
                                     f"rows are given")
            folder = path.parent.relative_to(fixed).as_posix()
            read = [dict(r, folder=folder) for r in read]
        rows += read
    return rows, [*fields, "folder"] if glob else fields


def table_markdown(spec: TableSpec, note_path: Path, label: str) -> str:
    """The markdown table of a block, read from its CSV(s) now."""
    rows, fields = _read_rows(spec, note_path, label)
    columns = spec.columns or tuple((name, name) for name in fields)
    unknown = [name for name, _ in (*columns, *spec.where) if name not in fields]
    if unknown:
        raise NoteTableError(f"{label}: unknown column(s) {', '.join(unknown)} "
                             f"(the CSV has: {', '.join(fields)})")
    kept = [r for r in rows if all((r.get(c) or "") in v.split("|") for c, v in spec.where)]
    body = [[_cell(r.get(name), spec.format) for name, _ in columns] for r in kept]
    return md_table([header for _, header in columns], body)


def shown(note_path: Path) -> Path:
    """The note as errors name it: relative to the checkout when inside it."""
    path = note_path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else note_path


def render_note(text: str, note_path: Path) -> str:
    """``text`` with every table block's body generated from its CSV (blank lines around the
    table keep it a markdown table between two HTML comments)."""
    note_path = Path(note_path)
    opens, ends = len(OPENS.findall(text)), len(ENDS.findall(text))
    if not opens == ends == len(BLOCK.findall(text)):
        raise NoteTableError(f"{shown(note_path)}: each '{OPEN} ... -->' needs its own '{END}' "
                             f"at the start of a line ({opens} openings, {ends} ends)")
    pieces, done = [], 0
    for index, match in enumerate(BLOCK.finditer(text), 1):
        csv_named = (match["spec"].strip().splitlines() or ["no CSV named"])[0]
        label = f"{shown(note_path)}: table {index} ({csv_named})"
        table = table_markdown(parse_spec(match["spec"], label), note_path, label)
        pieces += [text[done:match.start()], f"{OPEN}{match['spec']}-->\n\n{table}\n\n{END}"]
        done = match.end()
    return "".join(pieces) + text[done:]


def note_paths(folder: Path = NOTES) -> list[Path]:
    """Every markdown file under ``folder`` (the notes and their README), in a stable order."""
    return sorted(Path(folder).rglob("*.md"))


def rewrite_notes(folder: Path = NOTES) -> list[Path]:
    """Regenerates every note's tables in place; the notes whose text changed."""
    changed = []
    for path in note_paths(folder):
        text = path.read_text()
        new = render_note(text, path)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
