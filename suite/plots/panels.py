"""Drawing pieces the kernel figures share: panels in a grid with a legend below, log axes
with plain labels, and cells that did not run drawn as an ``x`` with their status."""
from __future__ import annotations

import math
from collections import defaultdict

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from suite.plots.data import vocab_label
from suite.plots.style import FAIL_MARKER, label_of, provider_order, style_of
from suite.schema import PHASES

MEMORY_FLOOR_MIB = 1e-3  # log axes: smaller values (a CCE forward keeps ~0) are drawn here


def mark_failures(ax, failures) -> None:
    """``failures``: (x, provider, status). Each gets an ``x`` in its provider's colour at the
    top of the panel, stacked downwards when several fail at the same x."""
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    by_x = defaultdict(list)
    for x, provider, status in failures:
        by_x[x].append((provider, status))
    rightmost = max(by_x, default=None)
    for x in sorted(by_x):
        order = provider_order(p for p, _ in by_x[x])
        items = sorted(set(by_x[x]), key=lambda it: (order.index(it[0]), it[1]))
        # the label goes left of the last x, so it stays inside the panel
        side = dict(xytext=(-4, 0), ha="right") if x == rightmost and len(by_x) > 1 else \
            dict(xytext=(3, 0), ha="left")
        for i, (provider, status) in enumerate(items):
            y = 0.95 - 0.07 * i
            color = style_of(provider)["color"]
            ax.plot([x], [y], marker=FAIL_MARKER, color=color, markersize=5, markeredgewidth=1.4,
                    linestyle="none", transform=trans, clip_on=False, zorder=5)
            ax.annotate(status, (x, y), xycoords=trans, textcoords="offset points",
                        fontsize=5.5, va="center", color=color, **side)


def legend_handles(providers, *, with_failure: bool, extra=()) -> list:
    handles = [Line2D([], [], label=label_of(p), **style_of(p)) for p in provider_order(providers)]
    handles.extend(extra)
    if with_failure:
        handles.append(Line2D([], [], marker=FAIL_MARKER, color="#444444", linestyle="none",
                              markeredgewidth=1.4, label="did not run (status shown)"))
    return handles


def figure_legend(fig, handles) -> None:
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), frameon=False,
               bbox_to_anchor=(0.5, 0.0))


def failures_of(rows: pd.DataFrame, x_col: str) -> list:
    bad = rows[rows["status"] != "ok"]
    return [(r[x_col], r["provider"], r["status"]) for _, r in bad.iterrows()]


def panel_matrix(nrows: int, ncols: int, *, width: float = 2.3, height: float = 2.0,
                  legend_rows: int = 2):
    """A figure of nrows x ncols panels with room for a legend below; axes as a 2-D array."""
    legend_h = 0.22 * legend_rows + 0.2
    fig_h = height * nrows + legend_h + 0.45
    # at least 6.5 in wide, so the title and the legend fit above and below a single panel
    fig_w = max(width * ncols + 0.5, 6.5)
    side = (fig_w - width * ncols) / 2 / fig_w  # centre narrow grids
    fig, axes = plt.subplots(nrows, ncols, figsize=(fig_w, fig_h), squeeze=False)
    # 0.75 in on the left: room for the y label beside six-digit tick labels (MiB at N 32768)
    fig.subplots_adjust(left=max(0.75 / fig_w, side), right=min(0.98, 1 - side + 0.6 / fig_w),
                        top=1 - 0.45 / fig_h, bottom=(legend_h + 0.4) / fig_h,
                        wspace=0.35, hspace=0.55)
    return fig, axes


def log_axis(axis) -> None:
    """Plain labels on a log axis whose limits are final: 1, 2, 5 per decade over short ranges,
    powers of ten over long ones; no minor labels."""
    lo, hi = sorted(axis.get_view_interval())
    decades = math.log10(hi / lo) if lo > 0 else 99
    if decades < 1.2:  # too short for 1-2-5 ticks: a few evenly spaced round numbers
        axis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(NullFormatter())


def headroom(ax, failures) -> None:
    """Leave the top of a log-y panel to the failure markers, so they do not sit on data."""
    if not failures:
        return
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** (0.08 * (1 + len({f[1:] for f in failures}))))


def vocab_axis(ax, vocabs) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(vocabs))
    ax.set_xticklabels([vocab_label(v) for v in sorted(vocabs)],
                       rotation=45 if len(vocabs) > 4 else 0)
    ax.minorticks_off()
    ax.set_xlabel("vocabulary size V")


def legend_rows(n_handles: int) -> int:
    return math.ceil(n_handles / 5)


def vs_v_figure(key, rows, ns, *, value_col, ylabel, title, reference_handle, draw_reference,
                 clip_below=None):
    """Rows of panels (one per N) by columns (one per phase): ``value_col`` vs V per provider,
    failed cells marked; returns the figure."""
    phases = [p for p in PHASES if p in set(rows["phase"])]
    providers = sorted(rows["provider"].unique())
    handles = legend_handles(providers, with_failure=(rows["status"] != "ok").any(),
                              extra=[reference_handle])
    fig, axes = panel_matrix(len(ns), len(phases), legend_rows=legend_rows(len(handles)))
    clipped = False
    for i, n in enumerate(ns):
        at_n = rows[rows["n"] == n]
        for j, phase in enumerate(phases):
            ax = axes[i, j]
            at_phase = at_n[at_n["phase"] == phase]
            draw_reference(ax, n, phase, at_phase)
            for provider in provider_order(providers):
                ok = at_phase[(at_phase["provider"] == provider) & (at_phase["status"] == "ok")]
                ok = ok.dropna(subset=[value_col]).sort_values("v")
                if ok.empty:
                    continue
                y = ok[value_col]
                if clip_below is not None:
                    clipped |= bool((y < clip_below).any())
                    y = y.clip(lower=clip_below)
                ax.plot(ok["v"], y, **style_of(provider))
            failures = failures_of(at_phase, "v")
            ax.set_yscale("log")
            headroom(ax, failures)
            log_axis(ax.yaxis)
            mark_failures(ax, failures)
            vocab_axis(ax, at_n["v"].unique())
            ax.set_title(f"{phase}, N={int(n)}")
        axes[i, 0].set_ylabel(ylabel)
    note = f" (values < {clip_below:g} drawn at {clip_below:g})" if clipped else ""
    fig.suptitle(title + note, fontsize=8)
    figure_legend(fig, handles)
    return fig


