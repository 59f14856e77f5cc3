"""Time figures: median time against the vocabulary with the matmul floor (``time_vs_v_*``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D

from suite.plots.data import FAMILY_KEYS, families, family_stem, family_title
from suite.plots.panels import vs_v_figure
from suite.plots.style import REFERENCE_COLOR, save
from suite.schema import PHASE_MATMULS

def plot_time_vs_v(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Median time vs V; the dashed line is the phase's matmul floor: PHASE_MATMULS[phase] x one
    cuBLAS E @ C.T of the same shape, measured in the same run."""
    written = []
    for key, rows, ns in families(df, FAMILY_KEYS + ["dist"]):

        def floor_line(ax, n, phase, at_phase):
            floor = at_phase.dropna(subset=["floor_ms"]).groupby("v")["floor_ms"].median()
            if floor.empty:
                return
            k = PHASE_MATMULS[phase]
            ax.plot(floor.index, k * floor.values, color=REFERENCE_COLOR, linestyle="--", zorder=0)
            ax.annotate(f"{k}x floor", (floor.index[0], k * floor.values[0]), xytext=(2, -9),
                        textcoords="offset points", ha="left", fontsize=6, color=REFERENCE_COLOR)

        fig = vs_v_figure(
            key, rows, ns, value_col="ms", ylabel="median time (ms)",
            title=f"Time vs vocabulary: {family_title(key)}",
            reference_handle=Line2D([], [], color=REFERENCE_COLOR, linestyle="--",
                                    label="matmul floor (k x E@C.T)"),
            draw_reference=floor_line)
        stem = f"time_vs_v_{key['dtype']}_{key['dist']}_{family_stem(key)}"
        written += save(fig, out_dir, stem)
    return written


