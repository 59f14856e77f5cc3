"""The time-memory frontier of exact loss+grad (suite/report/frontier_tables.py), a figure per
cell of each ``frontier-*`` run (``frontier_*``)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

import suite.frontier  # noqa: F401  (registers the budget sweep: its points take its styles)
from suite.plots.style import OKABE_ITO, save, style_of
from suite.report import frontier_tables
from suite.report.frontier_tables import (PHASE, cell_title, is_exact, is_own, own_front,
                                          points_of)

def frontier_figure(rows: list[dict], out_dir: Path, stem: str) -> list[Path]:
    """x: peak MiB (log), y: ms; own's front as a line, peers as points, the filter hollow."""
    points = points_of(rows)
    own = [p for p in points if is_own(p.provider) and is_exact(p.provider)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    front = own_front(own)
    on_front = {p.provider for p in front}
    ax.plot([p.mib for p in front], [p.ms for p in front], color=OKABE_ITO["vermillion"],
            drawstyle="steps-post",
            label="own kernel, exact (front)")
    for p in points:
        exact = is_exact(p.provider)
        if not exact and not is_own(p.provider):
            continue
        st = style_of(p.provider)
        ax.errorbar([p.mib], [p.ms], yerr=[[p.ms - p.p20], [p.p80 - p.ms]], color=st["color"],
                    marker=st["marker"], fillstyle="full" if exact else "none", linestyle="none",
                    markersize=6, capsize=2)
        if exact and is_own(p.provider) and p.provider not in on_front:
            continue  # off the front: drawn, not named (they crowd the front's labels)
        ax.annotate(p.provider, (p.mib, p.ms), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("peak memory beyond the inputs (MiB)")
    ax.set_ylabel(f"{PHASE} time (ms, median; bars p20–p80)")
    ax.set_title(cell_title(rows[0]), fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return save(fig, out_dir, stem, formats=("png",))


def plot_frontiers(run_dirs, out_dir: Path) -> list[Path]:
    """The time-memory frontier of each cell of each ``frontier-*`` run."""
    written = []
    for d in run_dirs:
        name = Path(d).name
        if not name.startswith("frontier-"):
            continue
        for rows in frontier_tables.by_cell([d]).values():
            stem = f"frontier_{name.removeprefix('frontier-')}_{rows[0]['dist']}"
            written += frontier_figure(rows, Path(out_dir), stem)
    return written
