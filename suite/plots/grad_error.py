"""Relative error of dE and dC against the fp32 reference, per provider and inputs
(``grad_error_*``)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from suite.plots import panels
from suite.plots.style import DIST_STYLE, FAIL_MARKER, provider_order, save, style_of

def plot_grad_error(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Relative error of dE and dC vs the fp32 reference: per provider and input distribution,
    every cell as a small dot and the worst cell as a large marker."""
    written = []
    for (device, dtype), rows in df.groupby(["device", "dtype"], sort=True):
        grad_rows = rows[rows["phase"].isin(["grad", "loss+grad"])]
        has_err = grad_rows[["de_rel_err", "dc_rel_err"]].notna().any(axis=1)
        ok = grad_rows[(grad_rows["status"] == "ok") & has_err]
        if ok.empty:
            continue
        failed = grad_rows[grad_rows["status"] != "ok"]
        providers = provider_order(set(ok["provider"]) | set(failed["provider"]))
        dists = [d for d in DIST_STYLE if d in set(grad_rows["dist"])]
        dists += sorted(set(grad_rows["dist"]) - set(dists))
        dist_handles = [Line2D([], [], marker="o", color="#444444", linestyle="none",
                               fillstyle=DIST_STYLE.get(d, {}).get("fillstyle", "full"),
                               label=f"{d} inputs") for d in dists]
        handles = dist_handles + [Line2D([], [], marker=FAIL_MARKER, color="#444444",
                                         linestyle="none", label="did not run (status shown)")]
        fig, axes = plt.subplots(1, 2, figsize=(max(5.0, 0.55 * len(providers) * 2 + 1.5), 2.9),
                                 squeeze=False)
        axes = axes[0]
        fig.subplots_adjust(left=0.08, right=0.98, top=0.86, bottom=0.36, wspace=0.25)
        x_of = {p: i for i, p in enumerate(providers)}
        for ax, col, name in zip(axes, ["de_rel_err", "dc_rel_err"], ["dE", "dC"]):
            for provider in providers:
                for dist in dists:
                    vals = ok[(ok["provider"] == provider) & (ok["dist"] == dist)]
                    vals = vals.groupby("cell_id")[col].max().dropna()
                    if vals.empty:
                        continue
                    st = style_of(provider)
                    ds = DIST_STYLE.get(dist, dict(fillstyle="full", offset=0.3))
                    x = x_of[provider] + ds["offset"]
                    ax.plot([x] * len(vals), vals.values, marker=".", color=st["color"],
                            linestyle="none", markersize=3, alpha=0.6)
                    ax.plot([x], [vals.max()], marker=st["marker"], color=st["color"],
                            fillstyle=ds["fillstyle"], linestyle="none", markersize=6)
            only_failed = failed[~failed["provider"].isin(set(ok["provider"]))]
            panels.mark_failures(ax, [(x_of[r["provider"]], r["provider"], r["status"])
                                for _, r in only_failed.drop_duplicates(["provider", "status"]).iterrows()])
            ax.set_yscale("log")
            panels.log_axis(ax.yaxis)
            ax.set_xticks(range(len(providers)))
            ax.set_xticklabels(providers, rotation=40, ha="right")
            ax.set_xlim(-0.7, len(providers) - 0.3)
            ax.set_ylabel(f"||{name} - {name}_ref|| / ||{name}_ref||")
            ax.set_title(f"{name} relative error vs fp32 reference")
            ax.grid(axis="x", visible=False)
        fig.suptitle(f"Gradient error, {dtype} inputs (large marker: worst cell; dots: each cell)",
                     fontsize=8)
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
        written += save(fig, out_dir, f"grad_error_{dtype}")
    return written


