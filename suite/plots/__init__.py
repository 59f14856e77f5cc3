"""Every figure of cce-bench, drawn from the curated runs (suite/report/curated.py): their
``results.csv`` (columns: suite.schema) and training-step CSVs (suite.train).

    python -m suite plots [--results DIR] [--out plots/]

Writes only under ``--out``, with MANIFEST.json: the hashes of the inputs and of this generator,
which a test compares with the committed runs (a stale figure fails it).

Writes PNG and PDF into ``--out``; no GPU needed. Output is deterministic, and the same bytes
wherever the checkout lies: fixed rcParams and fonts (DejaVu, shipped with matplotlib), the Agg
backend, no dates, versions or paths in the files (suite/plots/style.py).

One module per figure family, on one style (``style``), the rows (``data``) and shared panels
(``panels``):

1. ``memory``: ``memory_vs_v_*``, peak extra memory vs vocabulary size, one line per provider,
   a panel per phase, a file per dtype and shape family; ``memory_breakdown``, the training
   memory of five LMs, paper Figure 1 style (suite.model_configs).
2. ``timing``: ``time_vs_v_*``, median time vs vocabulary size with the matmul floor (k x one
   E @ C.T).
3. ``pareto``: ``pareto_*``, memory vs time at loss+grad, one panel per shape, Pareto front of
   the providers.
4. ``grad_error``: ``grad_error_*``, relative error of dE and dC vs an fp32 reference, per
   provider and inputs.
5. ``training``: ``train_bench``, the training-step benchmark (suite.train) of the curated
   training folders: whole-step peak memory by component and tokens/s per backend, a row per
   vocabulary; ``train_convergence``, loss curves per backend and their deviation from the
   reference's.
6. ``frontier``: ``frontier_*``, the time-memory frontier of exact loss+grad of each
   ``frontier-*`` run (suite/report/frontier_tables.py).

A cell that did not run (status != ok) is drawn as an ``x`` at the top of its panel, labelled
with its status, never silently dropped.
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, same rasteriser everywhere

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from suite.plots.data import kernel_run_dirs, load_results, train_dirs  # noqa: E402
from suite.plots.frontier import plot_frontiers  # noqa: E402
from suite.plots.grad_error import plot_grad_error  # noqa: E402
from suite.plots.manifest import MANIFEST, manifest, write_manifest  # noqa: E402
from suite.plots.memory import plot_memory_breakdown, plot_memory_vs_v  # noqa: E402
from suite.plots.pareto import pareto_front, plot_pareto  # noqa: E402
from suite.plots.style import (OKABE_ITO, PAPER_RC, PROVIDER_LABEL, PROVIDER_STYLE,  # noqa: E402
                               label_of, provider_order, save, style_of)
from suite.plots.timing import plot_time_vs_v  # noqa: E402
from suite.plots.training import (plot_train_bench, plot_train_convergence,  # noqa: E402
                                  plot_training)
from suite.report import curated  # noqa: E402

__all__ = ["FAMILIES", "MANIFEST", "OKABE_ITO", "PAPER_RC", "PROVIDER_LABEL", "PROVIDER_STYLE",
           "add_arguments", "build_all", "curated", "device_folder", "kernel_run_dirs",
           "label_of", "load_results", "main", "main_device", "manifest", "pareto_front", "plt",
           "plot_frontiers", "plot_grad_error", "plot_memory_breakdown", "plot_memory_vs_v",
           "plot_pareto", "plot_time_vs_v", "plot_train_bench", "plot_train_convergence",
           "plot_training", "provider_order", "save", "style_of", "train_dirs", "write_manifest"]

# What build_all draws, in order; ``families=`` picks some (a test rebuilds a cheap few).
FAMILIES = ("memory_breakdown", "training", "kernel", "frontier")


def main_device(df: pd.DataFrame) -> str | None:
    """The GPU with the most rows (ties: by name), whose figures are the committed ones; None
    when every row is from the CPU."""
    counts = df.loc[df["device"] != "cpu", "device"].value_counts()
    if counts.empty:
        return None
    return sorted(counts.index, key=lambda d: (-counts[d], d))[0]


def kernel_figures(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Memory, time, Pareto and gradient-error figures of ``df``'s rows."""
    written = []
    for draw in (plot_memory_vs_v, plot_time_vs_v, plot_pareto, plot_grad_error):
        written += draw(df, out_dir)
    return written


def device_folder(device: str) -> str:
    """The folder under --out of a device's figures, other than the main device's."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"


def build_all(results_dir=None, out_dir="plots", device: str | None = None,
              families=FAMILIES) -> list[Path]:
    """Draw every figure from the curated runs (or every run under ``results_dir``) into
    ``out_dir`` and nowhere else; returns the files written, and writes MANIFEST.json there (the
    inputs' hashes and the figures) when every family was drawn. The kernel figures of one
    device (``device``, default :func:`main_device`) go to ``out_dir``, every other device's to
    ``out_dir/<device>/``. Raises FileNotFoundError when there is no results.csv (after drawing
    the breakdown and the training figures, which need none)."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"families: expected some of {', '.join(FAMILIES)}, got {unknown}")
    out_dir = Path(out_dir)
    written: list[Path] = []
    trains = train_dirs(results_dir)
    with plt.rc_context(PAPER_RC):
        if "memory_breakdown" in families:
            written += plot_memory_breakdown(out_dir)
        if "training" in families:
            written += plot_training(trains, out_dir)
        if "kernel" in families:
            written += _kernel_figures_by_device(load_results(results_dir), out_dir, device)
        if "frontier" in families:
            written += plot_frontiers(kernel_run_dirs(results_dir), out_dir)
    if set(families) == set(FAMILIES):
        write_manifest(out_dir, kernel_run_dirs(results_dir), trains, written)
    return written


def _kernel_figures_by_device(df: pd.DataFrame, out_dir: Path, device: str | None) -> list[Path]:
    main = device or main_device(df)
    if device is not None and device not in set(df["device"]):
        raise ValueError(f"--device: no rows measured on {device!r}; devices: "
                         f"{', '.join(sorted(set(df['device'])))}")
    written = kernel_figures(df[df["device"] == main], out_dir) if main is not None else []
    for other, rows in df[df["device"] != main].groupby("device", sort=True):
        written += kernel_figures(rows, out_dir / device_folder(other))
    return written


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

