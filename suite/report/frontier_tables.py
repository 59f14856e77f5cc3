"""The time–memory frontier of exact loss+grad, per shape: the tables of a frontier run
(``python -m suite report RUN ... --frontier``, or ``python -m suite frontier RUN ...``).

Each exact provider of a run is a point (x: peak memory beyond the inputs, y: loss+grad time).
The own kernel is a curve: its exact calls swept over ``workspace_mib`` (the ``own_ws*``
providers that suite.frontier registers, named by :func:`sweep_name`), the call at a 0 MiB
budget (``own_ws0``), the recompute path (``own_recompute``), ``low_memory`` and the default
call. The gradient filter is drawn apart: it is not exact.

For every exact peer the table asks: at no more than that peer's memory, is some own point
faster or level (p20–p80 ranges overlapping)? Where none is, it says by how much the best own
point within that memory is slower.

This module reads rows and names; it registers nothing (suite.frontier, the measuring plugin,
imports the sweep from here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from suite.report.envs import env_line
from suite.report.formatting import fmt_err, fmt_mib, fmt_ms, num
from suite.results import read_rows

PHASE = "loss+grad"
# The sweep: from a quarter of the default budget to where the logits of 8192 x 256000 fit.
BUDGETS_MIB = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192)
# Memory within this is "the same memory": allocator rounding, not a design difference.
MEM_SLACK_MIB = 1.0


def sweep_name(mib: int) -> str:
    """The provider of the own kernel's exact call at ``workspace_mib=mib``."""
    return f"own_ws{mib}"


SWEEP = tuple(sweep_name(mib) for mib in BUDGETS_MIB)


@dataclass(frozen=True)
class Point:
    provider: str
    mib: float
    ms: float
    p20: float
    p80: float
    de_err: float

    def faster_or_level(self, other: "Point") -> bool:
        """Not slower than ``other``: its p20–p80 range starts at or below other's p80."""
        return self.p20 <= other.p80


def is_own(provider: str) -> bool:
    return provider.startswith("own") and "portable" not in provider


def is_exact(provider: str) -> bool:
    """The sweep's calls are exact by construction (a budget, no filter); any other provider as
    the registry says (one this checkout does not register: not exact, its name says nothing)."""
    if provider in SWEEP:
        return True
    from suite import catalog

    try:
        return catalog.get(provider).exact
    except ValueError:
        return False


def points_of(rows: list[dict]) -> list[Point]:
    out = []
    for r in rows:
        if r["phase"] != PHASE or r["status"] != "ok":
            continue
        mib, ms = num(r["peak_extra_mib"]), num(r["ms"])
        if math.isnan(mib) or math.isnan(ms):
            continue
        p20, p80 = num(r["ms_p20"]), num(r["ms_p80"])
        out.append(Point(r["provider"], mib, ms, ms if math.isnan(p20) else p20,
                         ms if math.isnan(p80) else p80, num(r["de_rel_err"])))
    return out


def own_front(points: list[Point]) -> list[Point]:
    """The own points no other own point beats in both memory and time, by memory."""
    front = []
    for p in sorted(points, key=lambda p: (p.mib, p.ms)):
        if not front or p.ms < front[-1].ms:
            front.append(p)
    return front


def verdict(peer: Point, own: list[Point]) -> tuple[str, Point | None]:
    """('at or below' | 'above by X %' | 'no own point fits', the best own point within the
    peer's memory)."""
    fits = [o for o in own if o.mib <= peer.mib + MEM_SLACK_MIB]
    if not fits:
        return "no own point within its memory", None
    best = min(fits, key=lambda o: o.ms)
    if best.faster_or_level(peer):
        word = "faster" if best.p80 < peer.p20 else "level"
        return f"at or below ({word})", best
    return f"above by {100 * (best.ms / peer.ms - 1):.1f} %", best


def cell_title(row: dict) -> str:
    softcap = "" if row["softcap"] in ("", "None", None) else f", softcap {num(row['softcap']):g}"
    return (f"N {row['n']}, D {row['d']}, V {row['v']}, {row['dtype']}, {row['dist']} inputs"
            f"{softcap}")


def cell_table(rows: list[dict]) -> str:
    """One cell's markdown table: every exact point by memory, own front marked, verdicts."""
    points = [p for p in points_of(rows) if is_exact(p.provider) or is_own(p.provider)]
    own = [p for p in points if is_own(p.provider) and is_exact(p.provider)]
    front = {p.provider for p in own_front(own)}
    lines = ["| provider | peak MiB | loss+grad ms (p20–p80) | dE err | own within its memory "
             "| verdict |", "|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p.mib, p.ms)):
        span = f"{fmt_ms(p.ms)} ({fmt_ms(p.p20)}–{fmt_ms(p.p80)})"
        if is_own(p.provider):
            kind = ("own, on the front" if p.provider in front else "own") \
                if is_exact(p.provider) else "own, filtered (not exact)"
            lines.append(f"| `{p.provider}` | {fmt_mib(p.mib)} | {span} | {fmt_err(p.de_err)} "
                         f"| {kind} | |")
            continue
        text, best = verdict(p, own)
        best_text = f"`{best.provider}` {fmt_ms(best.ms)} ms" if best else "–"
        lines.append(f"| `{p.provider}` | {fmt_mib(p.mib)} | {span} | {fmt_err(p.de_err)} "
                     f"| {best_text} | {text} |")
    return "\n".join(lines)


def by_cell(run_dirs, phase: str = PHASE) -> dict[str, list[dict]]:
    """The rows of one phase (default loss+grad) per cell_id, over every run folder."""
    cells: dict[str, list[dict]] = {}
    for d in run_dirs:
        for r in read_rows(d):
            if r["phase"] == phase:
                cells.setdefault(r["cell_id"], []).append(r)
    return cells


def run_text(run_dir) -> str:
    """One run folder: where it was measured (GPU, versions, commit, date), then a table per
    cell."""
    path = Path(run_dir).as_posix()
    parts = [f"From [`{path}`]({path}/results.csv): {env_line(run_dir)}"]
    for cell_id, rows in by_cell([run_dir]).items():
        parts.append(f"**{cell_title(rows[0])}** (`{cell_id}`)\n\n{cell_table(rows)}")
    return "\n\n".join(parts)


def report(run_dirs, command: str | None = None) -> str:
    """Every run folder's tables, under the command that prints them again."""
    head = [f"Generated by `{command}`."] if command else []
    return "\n\n".join(head + [run_text(d) for d in run_dirs])
