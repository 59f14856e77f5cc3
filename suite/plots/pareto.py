"""Memory against time at loss+grad, a panel per shape, with the providers' Pareto front
(``pareto_*``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D

from suite.plots.data import FAMILY_KEYS, family_stem, family_title, lower_bound_mib, vocab_label
from suite.plots.panels import (MEMORY_FLOOR_MIB, figure_legend, legend_handles, legend_rows,
                                log_axis, panel_matrix)
from suite.plots.style import REFERENCE_COLOR, save, style_of

PARETO_PHASE = "loss+grad"


def pareto_front(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points (time, memory, name) no other point beats in both time and memory, by time."""
    front = []
    for t, m, name in sorted(points, key=lambda p: (p[0], p[1], p[2])):
        if not front or m < front[-1][1]:
            front.append((t, m, name))
    return front


def plot_pareto(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Memory vs time at loss+grad: a file per family and inputs, a panel per (N, V)."""
    written = []
    at_phase = df[df["phase"] == PARETO_PHASE]
    keys = FAMILY_KEYS + ["dist"]
    for values, rows in at_phase.groupby(keys, sort=True, dropna=False):
        key = dict(zip(keys, values))
        ns, vs = sorted(rows["n"].unique()), sorted(rows["v"].unique())
        providers = sorted(rows["provider"].unique())
        handles = legend_handles(providers, with_failure=False,
                                  extra=[Line2D([], [], color=REFERENCE_COLOR, label="Pareto front"),
                                         Line2D([], [], color=REFERENCE_COLOR, linestyle=":",
                                                label="lower bound dE + dC")])
        fig, axes = panel_matrix(len(ns), len(vs), width=2.4, height=2.2,
                                  legend_rows=legend_rows(len(handles)))
        for i, n in enumerate(ns):
            for j, v in enumerate(vs):
                ax = axes[i, j]
                shape_rows = rows[(rows["n"] == n) & (rows["v"] == v)]
                if shape_rows.empty:
                    ax.set_visible(False)
                    continue
                _pareto_panel(ax, shape_rows, n, key["d"], v, key["dtype"])
                ax.set_title(f"N={int(n)}, V={vocab_label(v)}")
                if j == 0:
                    ax.set_ylabel("peak extra memory (MiB)")
                if i == len(ns) - 1:
                    ax.set_xlabel(f"{PARETO_PHASE} time (ms)")
        fig.suptitle(f"Memory vs time ({PARETO_PHASE}), lower left is better: "
                     f"{family_title(key)}", fontsize=8)
        figure_legend(fig, handles)
        stem = f"pareto_{key['dtype']}_{key['dist']}_{family_stem(key)}"
        written += save(fig, out_dir, stem)
    return written


def _pareto_panel(ax, shape_rows, n, d, v, dtype) -> None:
    ok = shape_rows[shape_rows["status"] == "ok"].dropna(subset=["ms", "peak_extra_mib"])
    points = [(r["ms"], max(r["peak_extra_mib"], MEMORY_FLOOR_MIB), r["provider"])
              for _, r in ok.iterrows()]
    for t, m, provider in points:
        st = style_of(provider)
        ax.plot([t], [m], marker=st["marker"], color=st["color"], linestyle="none", markersize=5)
    front = pareto_front(points)
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], color=REFERENCE_COLOR,
                drawstyle="steps-post", zorder=0, linewidth=1.0)
    for t, m, _ in front:  # ring the front's members
        ax.plot([t], [m], marker="o", markersize=9, fillstyle="none", color=REFERENCE_COLOR,
                linestyle="none", markeredgewidth=0.8, zorder=0)
    ax.axhline(lower_bound_mib(n, d, v, dtype), color=REFERENCE_COLOR, linestyle=":", zorder=0,
               linewidth=0.8)
    failed = shape_rows[shape_rows["status"] != "ok"]
    if not failed.empty:
        text = "did not run:\n" + "\n".join(f"x {r['provider']} ({r['status']})"
                                            for _, r in failed.iterrows())
        ax.text(0.98, 0.98, text, transform=ax.transAxes, ha="right", va="top", fontsize=5.5,
                color="#444444")
    if not points:
        ran = (shape_rows["status"] == "ok").any()  # then memory is missing: a CPU run has none
        ax.text(0.5, 0.5, "memory not measured" if ran else "nothing ran", transform=ax.transAxes,
                ha="center", fontsize=7)
        return
    ax.set_xscale("log")
    ax.set_yscale("log")
    if not failed.empty:  # room for the note above the points
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * (hi / lo) ** (0.12 * (1 + len(failed))))
    log_axis(ax.xaxis)
    log_axis(ax.yaxis)


