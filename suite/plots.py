"""Every figure of cce-bench, drawn from the curated runs (suite/report/curated.py): their
``results.csv`` (columns: suite.schema) and training-step CSVs (suite.train).

    python -m suite plots [--results DIR] [--out plots/]

Writes only under ``--out``, with MANIFEST.json: the hashes of the inputs and of this generator,
which a test compares with the committed runs (a stale figure fails it).

Writes PNG and PDF into ``--out``; no GPU needed. Output is deterministic: fixed rcParams and
fonts (DejaVu, shipped with matplotlib), the Agg backend, no timestamps in the files.

Figures:
1. ``memory_vs_v_*``: peak extra memory vs vocabulary size, one line per provider, a panel per
   phase, a file per dtype and shape family.
2. ``time_vs_v_*``: median time vs vocabulary size with the matmul floor (k x one E @ C.T).
3. ``pareto_*``: memory vs time at loss+grad, one panel per shape, Pareto front of the providers.
4. ``grad_error_*``: relative error of dE and dC vs an fp32 reference, per provider and inputs.
5. ``memory_breakdown``: training memory of five LMs, paper Figure 1 style (suite.model_configs).
6. ``train_bench``: the training-step benchmark (suite.train) of the curated training folders: whole-step peak memory by component and tokens/s per backend, a row per vocabulary.
7. ``train_convergence``: loss curves per backend and their deviation from naive CE's.

A cell that did not run (status != ok) is drawn as an ``x`` at the top of its panel, labelled
with its status, never silently dropped.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, same rasteriser everywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from suite import model_configs, results  # noqa: E402
from suite.report import curated  # noqa: E402
from suite.schema import PHASE_MATMULS, PHASES, ROW_FIELD_DEFAULTS, ROW_FIELDS  # noqa: E402

# ---- one style ------------------------------------------------------------------------------

PAPER_RC = {
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "savefig.bbox": "standard",  # "tight" re-measures text; keep layouts fixed
    "pdf.fonttype": 42,          # embed TrueType, editable text
    "svg.hashsalt": "cce-bench",
    "path.simplify": False,
}

# Okabe & Ito (2008) colour-blind-safe palette. One colour per provider family; variants of a
# family share its colour and differ by line style and marker. A provider's colour, marker, line
# style, label and place in legends are arguments of its registration (suite/providers/): every
# figure looks them up in the registry, through PROVIDER_STYLE below.
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7",
    "grey": "#999999",
}


def _built_in_providers():
    """The providers of suite/providers/, whatever plugin (suite.frontier's budget sweep, a
    user's --plugin) was imported first: the figures' fixed styles and the manifest's generator
    hash must not depend on import order (style_of still finds a plugin's style live)."""
    from suite import catalog

    return [p for p in catalog.in_figure_order() if p.fn.__module__.startswith("suite.providers.")]


def _registered_styles() -> dict:
    return {p.name: dict(p.style) for p in _built_in_providers()}


def _registered_labels() -> dict:
    return {p.name: p.label for p in _built_in_providers()}


PROVIDER_STYLE = _registered_styles()  # in the registry's figure order
PROVIDER_LABEL = _registered_labels()
_FALLBACK_MARKERS = "*H8>"
REFERENCE_COLOR = OKABE_ITO["grey"]  # matmul floor, lower bound, Pareto front
FAIL_MARKER = "x"

# Breakdown components get Paul Tol's "muted" colours, so they are never read as providers.
COMPONENT_COLOR = {
    "weights": "#332288", "gradients": "#88CCEE", "Adam states": "#44AA99",
    "activations": "#DDCC77", "loss logits": "#CC6677",
}

# Inputs get a fill style in the gradient-error figure (colour is the provider's).
DIST_STYLE = {"uniform": dict(fillstyle="full", offset=-0.2),
              "lm": dict(fillstyle="none", offset=0.0),
              "file": dict(fillstyle="bottom", offset=0.2)}

MEMORY_FLOOR_MIB = 1e-3  # log axes: smaller values (a CCE forward keeps ~0) are drawn here
NUMERIC = ["n", "d", "v", "softcap", "ignore_frac", "bias", "seed", "mean_loss", "entropy",
           "peak_extra_mib", "peak_abs_mib", "ms", "ms_p20", "ms_p80", "ms_min", "reps",
           "tokens_per_s", "tflops", "floor_ms", "floor_ratio", "loss_rel_err", "de_rel_err",
           "dc_rel_err", "dbias_rel_err"]


def style_of(provider: str) -> dict:
    """Colour, marker and line style of ``provider`` (unknown providers: grey, stable marker)."""
    from suite import registry

    if provider in registry.PROVIDERS:  # live: a --plugin provider registered after this import
        return dict(registry.PROVIDERS[provider].style)
    if provider in PROVIDER_STYLE:
        return dict(PROVIDER_STYLE[provider])
    base = provider.removeprefix("selective+")
    if base != provider and base in PROVIDER_STYLE:  # selective rows, then X: X's colour
        return dict(color=PROVIDER_STYLE[base]["color"], marker="v", linestyle=":")
    marker = _FALLBACK_MARKERS[sum(map(ord, provider)) % len(_FALLBACK_MARKERS)]
    return dict(color=REFERENCE_COLOR, marker=marker, linestyle="-.")


def label_of(provider: str) -> str:
    """A provider's legend label: its registered label, else its name."""
    from suite import registry

    found = registry.PROVIDERS.get(provider)
    return found.label if found is not None else PROVIDER_LABEL.get(provider, provider)


def provider_order(names) -> list[str]:
    """Providers in the registry's figure order (PROVIDER_STYLE), unknown ones after,
    alphabetically."""
    names = set(names)
    known = []
    for p in PROVIDER_STYLE:  # suite.train's "selective+X" rows follow X's
        known += [q for q in (p, f"selective+{p}") if q in names]
    return known + sorted(names - set(known))


# ---- reading results ------------------------------------------------------------------------

def kernel_run_dirs(results_dir=None) -> list[Path]:
    """The run folders (holding a results.csv) the figures read: the curated runs
    (suite/report/curated.py) by default, else every one under ``results_dir``."""
    if results_dir is None:
        return [d for d in curated.curated_dirs() if (d / results.CSV_NAME).is_file()]
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--results: {root} is not a directory")
    found = sorted(p.parent for p in root.glob(f"**/{results.CSV_NAME}"))
    if not found:
        raise FileNotFoundError(f"--results: no results.csv under {root}")
    return found


def train_dirs(results_dir=None) -> list[Path]:
    """The training-step folders the figures read: the curated ones by default."""
    if results_dir is None:
        return [d for d in curated.curated_dirs()
                if (d / results.TRAIN_BENCH_CSV).exists()
                or (d / results.TRAIN_CONVERGENCE_CSV).exists()]
    return results.train_run_dirs(results_dir) if Path(results_dir).is_dir() else []


def load_results(results_dir=None) -> pd.DataFrame:
    """All rows of the run folders (kernel_run_dirs: torn lines dropped, last row per
    (cell, provider, phase) of a run, a curated run's provider renames applied); a (device, cell,
    provider, phase) measured by several runs keeps the latest row."""
    frames = []
    for run_dir in kernel_run_dirs(results_dir):
        path = run_dir / results.CSV_NAME
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        missing = [c for c in ROW_FIELDS if c not in header and c not in ROW_FIELD_DEFAULTS]
        if missing:
            raise ValueError(f"{path}: not in the suite.schema layout, missing columns {missing}")
        frame = pd.DataFrame(curated.read_run_rows(run_dir), columns=ROW_FIELDS)
        frame["run"] = run_dir.name if results_dir is None else \
            run_dir.relative_to(results_dir).as_posix()
        frames.append(frame)
    df = pd.concat(frames, ignore_index=True)
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["softcap_label"] = [_softcap_label(x) for x in df["softcap"]]
    df = df.sort_values(["timestamp", "run"], kind="stable")
    df = df.drop_duplicates(["device", "cell_id", "provider", "phase"], keep="last")
    return df.reset_index(drop=True)


def _softcap_label(x) -> str:
    return "none" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:g}"


def _family_stem(key: dict) -> str:
    """File-name part naming a family: D and the options that are not the default."""
    parts = [f"d{int(key['d'])}"]
    if key["softcap_label"] != "none":
        parts.append(f"softcap{key['softcap_label']}")
    if key["ignore_frac"]:
        parts.append(f"ignore{key['ignore_frac']:g}")
    if key["bias"]:
        parts.append("bias")
    return "_".join(parts)


def _family_title(key: dict) -> str:
    bits = [f"D={int(key['d'])}", key["dtype"]]
    if key["softcap_label"] != "none":
        bits.append(f"softcap {key['softcap_label']}")
    if key["ignore_frac"]:
        bits.append(f"{key['ignore_frac']:g} ignored")
    if key["bias"]:
        bits.append("bias")
    if "dist" in key:
        bits.append(f"{key['dist']} inputs")
    return ", ".join(bits)


def _vocab_label(v: float) -> str:
    return f"{v / 1000:.0f}k" if v >= 10000 else f"{v:g}"


# ---- drawing helpers ------------------------------------------------------------------------

def save(fig, out_dir: Path, stem: str) -> list[Path]:
    """Write ``stem``.png and ``stem``.pdf without timestamps (byte-identical on rebuild)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    fig.savefig(paths[0], format="png", metadata={"Software": None})
    fig.savefig(paths[1], format="pdf", metadata={"CreationDate": None, "ModDate": None})
    plt.close(fig)
    return paths


def _mark_failures(ax, failures) -> None:
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


def _legend_handles(providers, *, with_failure: bool, extra=()) -> list:
    handles = [Line2D([], [], label=label_of(p), **style_of(p)) for p in provider_order(providers)]
    handles.extend(extra)
    if with_failure:
        handles.append(Line2D([], [], marker=FAIL_MARKER, color="#444444", linestyle="none",
                              markeredgewidth=1.4, label="did not run (status shown)"))
    return handles


def _figure_legend(fig, handles) -> None:
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), frameon=False,
               bbox_to_anchor=(0.5, 0.0))


def _failures_of(rows: pd.DataFrame, x_col: str) -> list:
    bad = rows[rows["status"] != "ok"]
    return [(r[x_col], r["provider"], r["status"]) for _, r in bad.iterrows()]


def _panel_matrix(nrows: int, ncols: int, *, width: float = 2.3, height: float = 2.0,
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


def _log_axis(axis) -> None:
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


def _headroom(ax, failures) -> None:
    """Leave the top of a log-y panel to the failure markers, so they do not sit on data."""
    if not failures:
        return
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** (0.08 * (1 + len({f[1:] for f in failures}))))


def _vocab_axis(ax, vocabs) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(vocabs))
    ax.set_xticklabels([_vocab_label(v) for v in sorted(vocabs)],
                       rotation=45 if len(vocabs) > 4 else 0)
    ax.minorticks_off()
    ax.set_xlabel("vocabulary size V")


def _legend_rows(n_handles: int) -> int:
    return math.ceil(n_handles / 5)


# ---- 1 and 2: memory and time vs V ----------------------------------------------------------

# A family: rows of one device, dtype, D and options; a file per family, a row of panels per N.
FAMILY_KEYS = ["device", "dtype", "d", "softcap_label", "ignore_frac", "bias"]


def _families(df: pd.DataFrame, keys) -> list[tuple[dict, pd.DataFrame, list]]:
    """(key, rows, Ns): groups of rows sharing ``keys``, with the token counts N that have at
    least two vocabulary sizes (a line needs two points)."""
    out = []
    for values, rows in df.groupby(keys, sort=True, dropna=False):
        ns = sorted(n for n, at_n in rows.groupby("n") if at_n["v"].nunique() >= 2)
        if ns:
            out.append((dict(zip(keys, values)), rows[rows["n"].isin(ns)], ns))
    return out


def _vs_v_figure(key, rows, ns, *, value_col, ylabel, title, reference_handle, draw_reference,
                 clip_below=None):
    """Rows of panels (one per N) by columns (one per phase): ``value_col`` vs V per provider,
    failed cells marked; returns the figure."""
    phases = [p for p in PHASES if p in set(rows["phase"])]
    providers = sorted(rows["provider"].unique())
    handles = _legend_handles(providers, with_failure=(rows["status"] != "ok").any(),
                              extra=[reference_handle])
    fig, axes = _panel_matrix(len(ns), len(phases), legend_rows=_legend_rows(len(handles)))
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
            failures = _failures_of(at_phase, "v")
            ax.set_yscale("log")
            _headroom(ax, failures)
            _log_axis(ax.yaxis)
            _mark_failures(ax, failures)
            _vocab_axis(ax, at_n["v"].unique())
            ax.set_title(f"{phase}, N={int(n)}")
        axes[i, 0].set_ylabel(ylabel)
    note = f" (values < {clip_below:g} drawn at {clip_below:g})" if clipped else ""
    fig.suptitle(title + note, fontsize=8)
    _figure_legend(fig, handles)
    return fig


def plot_memory_vs_v(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Peak extra memory vs V, the lower bound dE + dC dotted in the gradient phases. Memory does
    not depend on the input distribution, so each family is drawn from one (uniform if there)."""
    written = []
    for key, rows, ns in _families(df, FAMILY_KEYS):
        dist = sorted(rows["dist"].unique(), key=lambda d: (d != "uniform", d))[0]
        rows = rows[rows["dist"] == dist]

        def lower_bound(ax, n, phase, at_phase):
            if "grad" in phase and not at_phase.empty:
                vs = np.array(sorted(at_phase["v"].unique()))
                ax.plot(vs, _lower_bound_mib(n, key["d"], vs, key["dtype"]),
                        color=REFERENCE_COLOR, linestyle=":", zorder=0)

        fig = _vs_v_figure(
            key, rows, [n for n in ns if n in set(rows["n"])], value_col="peak_extra_mib",
            ylabel="peak extra memory (MiB)", clip_below=MEMORY_FLOOR_MIB,
            title=f"Peak extra memory vs vocabulary: {_family_title(key)}, {dist} inputs",
            reference_handle=Line2D([], [], color=REFERENCE_COLOR, linestyle=":",
                                    label="lower bound dE + dC"),
            draw_reference=lower_bound)
        stem = f"memory_vs_v_{key['dtype']}_{_family_stem(key)}"
        written += save(fig, out_dir, stem)
    return written


def plot_time_vs_v(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Median time vs V; the dashed line is the phase's matmul floor: PHASE_MATMULS[phase] x one
    cuBLAS E @ C.T of the same shape, measured in the same run."""
    written = []
    for key, rows, ns in _families(df, FAMILY_KEYS + ["dist"]):

        def floor_line(ax, n, phase, at_phase):
            floor = at_phase.dropna(subset=["floor_ms"]).groupby("v")["floor_ms"].median()
            if floor.empty:
                return
            k = PHASE_MATMULS[phase]
            ax.plot(floor.index, k * floor.values, color=REFERENCE_COLOR, linestyle="--", zorder=0)
            ax.annotate(f"{k}x floor", (floor.index[0], k * floor.values[0]), xytext=(2, -9),
                        textcoords="offset points", ha="left", fontsize=6, color=REFERENCE_COLOR)

        fig = _vs_v_figure(
            key, rows, ns, value_col="ms", ylabel="median time (ms)",
            title=f"Time vs vocabulary: {_family_title(key)}",
            reference_handle=Line2D([], [], color=REFERENCE_COLOR, linestyle="--",
                                    label="matmul floor (k x E@C.T)"),
            draw_reference=floor_line)
        stem = f"time_vs_v_{key['dtype']}_{key['dist']}_{_family_stem(key)}"
        written += save(fig, out_dir, stem)
    return written


# ---- 3: memory-time Pareto front ------------------------------------------------------------

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
        handles = _legend_handles(providers, with_failure=False,
                                  extra=[Line2D([], [], color=REFERENCE_COLOR, label="Pareto front"),
                                         Line2D([], [], color=REFERENCE_COLOR, linestyle=":",
                                                label="lower bound dE + dC")])
        fig, axes = _panel_matrix(len(ns), len(vs), width=2.4, height=2.2,
                                  legend_rows=_legend_rows(len(handles)))
        for i, n in enumerate(ns):
            for j, v in enumerate(vs):
                ax = axes[i, j]
                shape_rows = rows[(rows["n"] == n) & (rows["v"] == v)]
                if shape_rows.empty:
                    ax.set_visible(False)
                    continue
                _pareto_panel(ax, shape_rows, n, key["d"], v, key["dtype"])
                ax.set_title(f"N={int(n)}, V={_vocab_label(v)}")
                if j == 0:
                    ax.set_ylabel("peak extra memory (MiB)")
                if i == len(ns) - 1:
                    ax.set_xlabel(f"{PARETO_PHASE} time (ms)")
        fig.suptitle(f"Memory vs time ({PARETO_PHASE}), lower left is better: "
                     f"{_family_title(key)}", fontsize=8)
        _figure_legend(fig, handles)
        stem = f"pareto_{key['dtype']}_{key['dist']}_{_family_stem(key)}"
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
    ax.axhline(_lower_bound_mib(n, d, v, dtype), color=REFERENCE_COLOR, linestyle=":", zorder=0,
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
    _log_axis(ax.xaxis)
    _log_axis(ax.yaxis)


# ---- 4: gradient error ----------------------------------------------------------------------

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
            _mark_failures(ax, [(x_of[r["provider"]], r["provider"], r["status"])
                                for _, r in only_failed.drop_duplicates(["provider", "status"]).iterrows()])
            ax.set_yscale("log")
            _log_axis(ax.yaxis)
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


# ---- 5: memory breakdown (paper Figure 1 style) ---------------------------------------------

GPU_MEMORY_GIB = 80e9 / 2**30  # an 80 GB A100 / H100, drawn as a reference


def plot_memory_breakdown(out_dir: Path, *, tokens: int = model_configs.TOKENS,
                          gpu_counts=(1, 16)) -> list[Path]:
    """Per-GPU training memory of each model without and with CCE (assumptions:
    suite.model_configs). One panel per GPU count: sharding shrinks weights, gradients and Adam
    states, but not the logits, so the logits' share grows."""
    models = model_configs.MODELS
    fig, axes = plt.subplots(1, len(gpu_counts), figsize=(3.6 * len(gpu_counts) + 0.6, 3.4),
                             squeeze=False, sharey=True)
    axes = axes[0]
    fig.subplots_adjust(left=0.2, right=0.98, top=0.82, bottom=0.22, wspace=0.12)
    labels, ys = [], []
    for i, model in enumerate(models):
        for j, cce in enumerate((False, True)):
            ys.append(-(i * 2.6 + j))
            labels.append(f"{model.name}, {'CCE' if cce else 'baseline'}")
    for ax, gpus in zip(axes, gpu_counts):
        y_iter = iter(ys)
        for model in models:
            for cce in (False, True):
                y = next(y_iter)
                parts = model_configs.memory_breakdown(model, tokens=tokens, gpus=gpus, cce=cce)
                left = 0.0
                for comp in model_configs.COMPONENTS:
                    gib = parts[comp] / 2**30
                    ax.barh(y, gib, left=left, height=0.85, color=COMPONENT_COLOR[comp],
                            edgecolor="white", linewidth=0.4)
                    left += gib
                share = parts["loss logits"] / sum(parts.values())
                share_text = f"{share:.0%}" if share >= 0.005 else "<1%"
                ax.annotate(f"{left:.1f} GiB, logits {share_text}", (left, y), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=5.5, color="#333333")
        ax.axvline(GPU_MEMORY_GIB, color=REFERENCE_COLOR, linestyle="--", linewidth=0.8)
        ax.annotate("80 GB GPU", (GPU_MEMORY_GIB, 1), xycoords=("data", "axes fraction"),
                    xytext=(2, -2), textcoords="offset points", va="top", fontsize=6,
                    color=REFERENCE_COLOR)
        ax.set_title(f"{gpus} GPU{'s (weights, grads, Adam sharded)' if gpus > 1 else ''}")
        ax.set_xlabel("memory per GPU (GiB)")
        ax.set_xlim(0, ax.get_xlim()[1] * 1.25)
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels(labels)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COMPONENT_COLOR[c], label=c)
               for c in model_configs.COMPONENTS]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(f"Training memory per GPU at {tokens} tokens per GPU: bf16 weights and grads, "
                 f"fp32 Adam (m, v, master), per-layer checkpointing.\nBaseline keeps 14 B per "
                 f"logit; CCE keeps 4 B per token. Estimates from published configs.", fontsize=7)
    return save(fig, out_dir, "memory_breakdown")


def _lower_bound_mib(n, d, v, dtype):
    from suite.report.claims import gradient_lower_bound_mib
    return gradient_lower_bound_mib(n, d, v, dtype)


# ---- 6 and 7: the training step (suite.train) ----------------------------------------------

TRAIN_COMPONENTS = [("weights_mib", "weights"), ("grads_mib", "gradients"),
                    ("optim_mib", "Adam states"), ("act_mib", "activations"),
                    ("loss_mib", "loss logits")]
TRAIN_SETTING = [k for k in results.TRAIN_BENCH_KEY if k != "backend"]


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _max_batch_label(row: dict) -> str:
    if not row.get("max_batch"):
        return "-"
    return f">={row['max_batch']}" if row.get("max_batch_capped") == "1" else row["max_batch"]


def _train_settings(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped by setting (device, shape, dtype, vocab), by device then vocabulary."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in TRAIN_SETTING), []).append(r)
    order = sorted(groups, key=lambda k: (k[0], _float(k[1]), k[2:]))
    return [groups[k] for k in order]


def plot_train_bench(rows: list[dict], out_dir: Path) -> list[Path]:
    """Per setting (a row of panels per vocabulary): stacked whole-step peak memory at the common
    batch (weights, gradients, Adam, activations, loss) and tokens/s, each backend's largest
    batch written on its bar. ``rows``: train_bench.csv rows, one per setting and backend."""
    settings = _train_settings(rows)
    if not settings:
        return []
    several_devices = len({r["device"] for r in rows}) > 1
    fig, axes = plt.subplots(len(settings), 2, figsize=(7.2, 2.9 * len(settings) + 1.0),
                             squeeze=False)
    for (ax_m, ax_t), group in zip(axes, settings):
        by_backend = {r["backend"]: r for r in group}
        names = provider_order(by_backend)
        for i, name in enumerate(names):
            r = by_backend[name]
            style = style_of(name)
            if r["status"] != "ok":
                for ax in (ax_m, ax_t):
                    ax.text(i, 0, f" {r['status']}", rotation=90, ha="center", va="bottom",
                            fontsize=6, color=style["color"])
                continue
            if r["peak_mib"]:
                bottom = 0.0
                for col, comp in TRAIN_COMPONENTS:
                    gib = _float(r[col]) / 1024
                    ax_m.bar(i, gib, bottom=bottom, color=COMPONENT_COLOR[comp], width=0.7)
                    bottom += gib
                ax_m.text(i, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=6)
            else:
                ax_m.text(i, 0, " no CUDA memory stats", rotation=90, ha="center", va="bottom",
                          fontsize=6, color=REFERENCE_COLOR)
            if r["tokens_per_s"]:
                k_tps = _float(r["tokens_per_s"]) / 1e3
                ax_t.bar(i, k_tps, color=style["color"], width=0.7, edgecolor="white",
                         hatch=None if style["linestyle"] == "-" else "//")
                ax_t.text(i, k_tps, f" max B {_max_batch_label(r)}", ha="center", va="bottom",
                          fontsize=5.5, rotation=90)
        for ax in (ax_m, ax_t):
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=30, ha="right")
            ax.set_xlim(-0.6, len(names) - 0.4)
            ax.grid(axis="x", visible=False)
        first = group[0]
        batches = sorted({r["batch"] for r in group if r["status"] == "ok" and r["batch"]},
                         key=_float)
        batch = batches[0] if len(batches) == 1 else "/".join(batches) or "?"
        where = f"{first['device']}, " if several_devices else ""
        model = first.get("model") or "gpt"
        ax_m.set_ylabel("GiB")
        ax_m.set_ylim(0, ax_m.get_ylim()[1] * 1.12)
        # The setting once, over both panels of its row; each panel says what it shows.
        ax_m.annotate(f"{where}{model}, V={first['vocab']}, batch {batch} x {first['seq_len']}",
                      (0, 1), xycoords="axes fraction", xytext=(0, 16),
                      textcoords="offset points", ha="left", va="bottom", fontsize=7,
                      fontweight="bold")
        ax_m.set_title("whole-step peak", loc="left")
        ax_t.set_ylabel("k tokens/s")
        ax_t.set_ylim(0, ax_t.get_ylim()[1] * 1.6)  # room for the rotated batch labels
        ax_t.set_title("throughput (text: largest batch)", loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COMPONENT_COLOR[c], label=c)
               for _, c in TRAIN_COMPONENTS]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False,
               bbox_to_anchor=(0.5, 0.02))
    devices = ", ".join(sorted({r["device"] for r in rows}))
    dtypes = sorted({r["dtype"] for r in rows})
    dtype = "bf16 autocast" if dtypes == ["bf16"] else ", ".join(dtypes)
    fig.suptitle(f"Training step per loss backend ({devices}; {dtype}, AdamW)\nloss measured, "
                 f"activations = the rest; per backend the latest complete row", fontsize=7)
    fig_h = fig.get_figheight()
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.9 / fig_h, bottom=1.3 / fig_h,
                        hspace=1.25, wspace=0.25)
    return save(fig, out_dir, "train_bench")


def plot_train_convergence(summary: list[dict], curves: dict, out_dir: Path) -> list[Path]:
    """Smoothed loss per run (top) and its relative deviation from the reference run of the same
    run folder (the row whose verdict is "reference": naive for the GPT bench, the model's own
    loss for Hugging Face models; bottom, with the tolerance band and the warm-up shaded).
    ``summary``: verdict rows (train_convergence.csv); ``curves``: (source, run) -> losses."""
    drawn = [r for r in summary if curves.get((r["source"], r["run"]))]
    if not drawn:
        return []
    reference = {r["source"]: r["run"] for r in drawn if r["verdict"] == "reference"}
    window = int(_float(drawn[0]["smooth"])) if drawn[0]["smooth"] else 20
    tol = _float(drawn[0]["tol"]) if drawn[0]["tol"] else 0.01
    warm = _float(drawn[0]["warmup_steps"]) if drawn[0]["warmup_steps"] else 0
    several_sources = len({r["source"] for r in drawn}) > 1

    def smoothed(loss):  # trailing mean, as suite.train.smooth (what the verdict used)
        return pd.Series(loss, dtype=float).rolling(window, min_periods=1).mean().to_numpy()

    fig, (ax_l, ax_d) = plt.subplots(2, 1, figsize=(6.5, 5.0), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2]})
    fig.subplots_adjust(left=0.11, right=0.98, top=0.9, bottom=0.1, hspace=0.08)
    for r in drawn:
        style = style_of(r["backend"])
        linestyle = ":" if r["run"] != r["backend"] else style["linestyle"]  # e.g. naive_rerun
        label = f"{r['run']} ({r['verdict']})" + (f", {r['source']}" if several_sources else "")
        s = smoothed(curves[r["source"], r["run"]])
        ax_l.plot(np.arange(len(s)), s, color=style["color"], linestyle=linestyle, label=label)
        ref_run = reference.get(r["source"], "naive")
        ref = curves.get((r["source"], ref_run))
        if ref and r["run"] != ref_run:
            s_ref = smoothed(ref)
            n = min(len(s), len(s_ref))
            ax_d.plot(np.arange(n), 100 * (s[:n] - s_ref[:n]) / s_ref[:n], color=style["color"],
                      linestyle=linestyle)
    ax_l.set_ylabel(f"loss (nats, mean of {window} steps)")
    ax_l.legend(frameon=False)
    ax_d.axhspan(-100 * tol, 100 * tol, color=REFERENCE_COLOR, alpha=0.2, lw=0)
    ax_d.axvspan(0, warm, color=REFERENCE_COLOR, alpha=0.1, lw=0)
    ax_d.set_ylabel("vs the reference (%)")
    ax_d.set_xlabel("step")
    ax_d.set_ylim(-5 * 100 * tol, 5 * 100 * tol)
    devices = ", ".join(sorted({r["device"] for r in drawn}))
    fig.suptitle(f"Convergence parity ({devices}): band = +/-{tol:.0%} tolerance, "
                 f"shaded = warm-up", fontsize=8)
    return save(fig, out_dir, "train_convergence")


def plot_training(run_dirs, out_dir) -> list[Path]:
    """``train_bench`` and ``train_convergence`` from the training folders ``run_dirs``: per
    setting and backend (and per convergence run) the complete row of the most recent run
    (suite.results.latest_complete), so a later complete run supersedes an earlier skipped one."""
    out_dir = Path(out_dir)
    written = []
    with plt.rc_context(PAPER_RC):
        bench = curated.rename_train_rows(results.train_bench_rows(run_dirs)[0])
        written += plot_train_bench(bench, out_dir)
        summary = curated.rename_train_rows(results.train_convergence_rows(run_dirs)[0])
        curves: dict[tuple[str, str], list[float]] = {}
        for source in dict.fromkeys(r["source"] for r in summary):
            rows = [dict(c, source=source)
                    for c in results.read_train_csv(source, results.TRAIN_CURVES_CSV)]
            for c in curated.rename_train_rows(rows):
                curves.setdefault((source, c["run"]), []).append(_float(c["loss"]))
        written += plot_train_convergence(summary, curves, out_dir)
    return written


# ---- everything -----------------------------------------------------------------------------

def main_device(df: pd.DataFrame) -> str | None:
    """The GPU with the most rows (ties: by name), whose figures are the committed ones; None
    when every row is from the CPU."""
    counts = df.loc[df["device"] != "cpu", "device"].value_counts()
    if counts.empty:
        return None
    return sorted(counts.index, key=lambda d: (-counts[d], d))[0]


def _kernel_figures(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    written = []
    for draw in (plot_memory_vs_v, plot_time_vs_v, plot_pareto, plot_grad_error):
        written += draw(df, out_dir)
    return written


def device_folder(device: str) -> str:
    """The folder under --out of a device's figures, other than the main device's."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"


def build_all(results_dir=None, out_dir="plots", device: str | None = None) -> list[Path]:
    """Draw every figure from the curated runs (or every run under ``results_dir``) into
    ``out_dir`` and nowhere else; returns the files written, and writes MANIFEST.json there (the
    inputs' hashes and the figures). The kernel figures of one device (``device``, default
    :func:`main_device`) go to ``out_dir``, every other device's to ``out_dir/<device>/``.
    Raises FileNotFoundError when there is no results.csv (after drawing the breakdown and the
    training figures, which need none)."""
    out_dir = Path(out_dir)
    with plt.rc_context(PAPER_RC):
        written = plot_memory_breakdown(out_dir)
        trains = train_dirs(results_dir)
        written += plot_training(trains, out_dir)
        df = load_results(results_dir)
        main = device or main_device(df)
        if device is not None and device not in set(df["device"]):
            raise ValueError(f"--device: no rows measured on {device!r}; devices: "
                             f"{', '.join(sorted(set(df['device'])))}")
        if main is not None:
            written += _kernel_figures(df[df["device"] == main], out_dir)
        for other, rows in df[df["device"] != main].groupby("device", sort=True):
            written += _kernel_figures(rows, out_dir / device_folder(other))
        written += plot_frontiers(kernel_run_dirs(results_dir), out_dir)
    write_manifest(out_dir, kernel_run_dirs(results_dir), trains, written)
    return written


def _frontier_figure(rows: list[dict], path: Path) -> Path:
    """x: peak MiB (log), y: ms; own's front as a line, peers as points, the filter hollow."""
    from suite.report.frontier_tables import (PHASE, cell_title, is_exact, is_own, own_front,
                                              points_of)
    VERMILLION = OKABE_ITO["vermillion"]

    points = points_of(rows)
    own = [p for p in points if is_own(p.provider) and is_exact(p.provider)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    front = own_front(own)
    on_front = {p.provider for p in front}
    ax.plot([p.mib for p in front], [p.ms for p in front], color=VERMILLION, drawstyle="steps-post",
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path



def plot_frontiers(run_dirs, out_dir: Path) -> list[Path]:
    """The time-memory frontier (suite/frontier.py) of each cell of each ``frontier-*`` run."""
    from suite.report import frontier_tables as frontier

    written = []
    for d in run_dirs:
        name = Path(d).name
        if not name.startswith("frontier-"):
            continue
        for rows in frontier.by_cell([d]).values():
            stem = f"frontier_{name.removeprefix('frontier-')}_{rows[0]['dist']}.png"
            written.append(_frontier_figure(rows, out_dir / stem))
    return written


# ---- the manifest: which inputs the committed figures were drawn from ---------------------

MANIFEST = "MANIFEST.json"
TRAIN_CSVS = (results.TRAIN_BENCH_CSV, results.TRAIN_CONVERGENCE_CSV, results.TRAIN_CURVES_CSV)


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _repo_path(path: Path) -> str:
    path = Path(path).resolve()
    return path.relative_to(curated.ROOT).as_posix() if path.is_relative_to(curated.ROOT) \
        else path.as_posix()


def manifest(run_dirs, train_run_dirs, figures, out_dir) -> dict:
    """What the figures in ``out_dir`` were drawn from: this module's hash (the generator), each
    input CSV's hash, and the figures (relative to ``out_dir``). Equal manifests: the figures
    are in step with their inputs."""
    inputs = [Path(d) / results.CSV_NAME for d in run_dirs]
    inputs += [Path(d) / name for d in train_run_dirs for name in TRAIN_CSVS
               if (Path(d) / name).exists()]
    # The generator: this module, the curated list (and its renames) and the providers' styles.
    styles = json.dumps([PROVIDER_STYLE, PROVIDER_LABEL], sort_keys=True)
    from suite.report import frontier_tables as frontier

    generator = hashlib.sha256((_sha256(Path(__file__)) + _sha256(Path(curated.__file__))
                                + _sha256(Path(frontier.__file__)) + styles).encode())
    return {"generator": generator.hexdigest(),
            "inputs": {_repo_path(p): _sha256(p) for p in sorted(inputs, key=_repo_path)},
            "figures": sorted(Path(f).relative_to(out_dir).as_posix() for f in figures)}


def write_manifest(out_dir, run_dirs, train_run_dirs, figures) -> Path:
    path = Path(out_dir) / MANIFEST
    data = manifest(run_dirs, train_run_dirs, figures, Path(out_dir))
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def add_arguments(parser) -> None:
    parser.add_argument("--results", default=None,
                        help="folder searched for **/results.csv and train*/ (default: the "
                             "curated runs of suite/report/curated.py)")
    parser.add_argument("--out", default="plots", help="folder for PNG and PDF (default: plots)")
    parser.add_argument("--device", default=None,
                        help="whose rows the figures in --out show, as results.csv names it "
                             "(default: the GPU with the most rows); other devices' figures "
                             "go to --out/<device>/")


def main(args) -> int:
    try:
        written = build_all(args.results, args.out, device=args.device)
    except (FileNotFoundError, ValueError) as err:
        print(f"plots: {err}")
        return 1
    for path in written:
        print(path)
    print(f"plots: wrote {len(written)} files to {args.out}")
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
