"""``python -m suite frontier RUN ...``: the time–memory frontier of exact loss+grad, per shape.

Each exact provider of a run is a point (x: peak memory beyond the inputs, y: loss+grad time).
The own kernel is a curve: its exact calls swept over ``workspace_mib`` (the ``own_ws*``
providers this module registers), the recompute path (``own_recompute``), ``low_memory`` and the
default call. The gradient filter is drawn apart: it is not exact.

For every exact peer the report asks: at no more than that peer's memory, is some own point
faster or level (p20–p80 ranges overlapping)? Where none is, it says by how much the best own
point within that memory is slower. Measure with::

    python -m suite bench --plugin suite.frontier --phases loss+grad --dist lm \\
        --providers naive,torch_compile,...,own,own_recompute,own_low_memory,own_filter,\\
own_ws256,...,own_ws8192 --n 8192 --d 2304 --v 256000 --softcap 30 --out results/frontier-<gpu>

then ``python -m suite frontier results/frontier-<gpu>`` (the tables; ``python -m suite plots``
draws one figure per cell of every curated ``frontier-*`` run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from suite.registry import needs_triton_device, register
from suite.report.formatting import fmt_err, fmt_mib, fmt_ms, num
from suite.results import read_rows

PHASE = "loss+grad"
# The sweep: from a quarter of the default budget to where the logits of 8192 x 256000 fit.
BUDGETS_MIB = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192)
# Memory within this is "the same memory": allocator rounding, not a design difference.
MEM_SLACK_MIB = 1.0
VERMILLION = "#D55E00"


def _at_budget(mib: int):
    def provider(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
        from own_kernel import linear_cross_entropy

        return linear_cross_entropy(e, c, targets, bias=bias, softcap=softcap,
                                    ignore_index=ignore_index, workspace_mib=mib)
    return provider


# One marker per budget: no two providers may look alike in a figure (tests/test_providers.py).
_MARKERS = ("1", "2", "3", "4", "+", "x", "|", "_")
for _mib, _marker in zip(BUDGETS_MIB, _MARKERS, strict=True):
    register(f"own_ws{_mib}", summary=f"own Triton CCE, exact, workspace_mib={_mib}",
             features=("bias", "softcap"), requires=needs_triton_device,
             style=dict(color=VERMILLION, marker=_marker, linestyle="-"),
             order=90)(_at_budget(_mib))


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


def is_exact(provider: str) -> bool:
    from suite import catalog

    try:
        return catalog.get(provider).exact
    except ValueError:  # a provider of a plugin not loaded here: its name says nothing
        return False


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


def by_cell(run_dirs) -> dict[str, list[dict]]:
    cells: dict[str, list[dict]] = {}
    for d in run_dirs:
        for r in read_rows(d):
            if r["phase"] == PHASE:
                cells.setdefault(r["cell_id"], []).append(r)
    return cells


def report(run_dirs) -> str:
    parts = []
    for cell_id, rows in by_cell(run_dirs).items():
        parts.append(f"**{cell_title(rows[0])}** (`{cell_id}`)\n\n{cell_table(rows)}")
    return "\n\n".join(parts)


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", help="run folders of a frontier sweep")


def main(args) -> int:
    cells = by_cell(args.results)
    if not cells:
        print(f"no {PHASE} rows in {', '.join(args.results)}")
        return 2
    print(report(args.results))
    return 0
