"""Memory figures: peak extra memory against the vocabulary (``memory_vs_v_*``) and the training
memory of five LMs, paper Figure 1 style (``memory_breakdown``, from suite.model_configs)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from suite import model_configs
from suite.plots.data import FAMILY_KEYS, families, family_stem, family_title, lower_bound_mib
from suite.plots.panels import MEMORY_FLOOR_MIB, vs_v_figure
from suite.plots.style import COMPONENT_COLOR, REFERENCE_COLOR, save

def plot_memory_vs_v(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Peak extra memory vs V, the lower bound dE + dC dotted in the gradient phases. Memory does
    not depend on the input distribution, so each family is drawn from one (uniform if there)."""
    written = []
    for key, rows, ns in families(df, FAMILY_KEYS):
        dist = sorted(rows["dist"].unique(), key=lambda d: (d != "uniform", d))[0]
        rows = rows[rows["dist"] == dist]

        def lower_bound(ax, n, phase, at_phase):
            if "grad" in phase and not at_phase.empty:
                vs = np.array(sorted(at_phase["v"].unique()))
                ax.plot(vs, lower_bound_mib(n, key["d"], vs, key["dtype"]),
                        color=REFERENCE_COLOR, linestyle=":", zorder=0)

        fig = vs_v_figure(
            key, rows, [n for n in ns if n in set(rows["n"])], value_col="peak_extra_mib",
            ylabel="peak extra memory (MiB)", clip_below=MEMORY_FLOOR_MIB,
            title=f"Peak extra memory vs vocabulary: {family_title(key)}, {dist} inputs",
            reference_handle=Line2D([], [], color=REFERENCE_COLOR, linestyle=":",
                                    label="lower bound dE + dC"),
            draw_reference=lower_bound)
        stem = f"memory_vs_v_{key['dtype']}_{family_stem(key)}"
        written += save(fig, out_dir, stem)
    return written


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


