"""The training step (suite.train) of the training folders: whole-step peak memory by component
and tokens/s per backend (``train_bench``), and loss curves against the reference's
(``train_convergence``)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from suite import results
from suite.plots.style import (COMPONENT_COLOR, PAPER_RC, REFERENCE_COLOR, provider_order, save,
                               style_of)
from suite.report import curated

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


LEGEND_COLUMNS = 2


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

    # The legend goes below the panels, never over the curves; its height grows with its rows.
    legend_rows = math.ceil(len(drawn) / LEGEND_COLUMNS)
    legend_h = 0.18 * legend_rows + 0.05
    fig_h = 5.0 + legend_h
    fig, (ax_l, ax_d) = plt.subplots(2, 1, figsize=(6.5, fig_h), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2]})
    fig.subplots_adjust(left=0.11, right=0.98, top=1 - 0.5 / fig_h,
                        bottom=(legend_h + 0.5) / fig_h, hspace=0.08)
    for r in drawn:
        style = style_of(r["backend"])
        linestyle = ":" if r["run"] != r["backend"] else style["linestyle"]  # e.g. naive_rerun
        # the run folder by its name: a path would differ from one checkout to the next
        label = f"{r['run']} ({r['verdict']})" + \
            (f", {Path(r['source']).name}" if several_sources else "")
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
    fig.legend(*ax_l.get_legend_handles_labels(), loc="lower center", ncol=LEGEND_COLUMNS,
               frameon=False, fontsize=6, bbox_to_anchor=(0.5, 0.0))
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


