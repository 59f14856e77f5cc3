"""One look for every figure: rcParams, palettes, each provider's colour, marker, line style,
label and legend order (from its registration, suite/providers/), and the one writer of figure
files, whose bytes depend on nothing but the figure (no dates, no versions, no paths)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

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
    """The providers of suite/providers/ (suite.providers.BUILT_IN), whatever plugin
    (suite.frontier's budget sweep, a user's --plugin) was imported first: the figures' fixed
    styles and the manifest's generator hash must not depend on import order (style_of still
    finds a plugin's style live)."""
    from suite import catalog
    from suite.providers import BUILT_IN

    return [p for p in catalog.in_figure_order() if p.name in BUILT_IN]


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


# What the files say about themselves: nothing that changes from one build to the next (no
# date, no matplotlib version); the PDF's fonts are subset the same way on every build.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None}


def save(fig, out_dir: Path, stem: str, formats=("png", "pdf")) -> list[Path]:
    """Write ``stem``.<format> for each format into ``out_dir``, close the figure; the bytes
    are the same on every rebuild, wherever the checkout lies."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = {"png": PNG_METADATA, "pdf": PDF_METADATA}
    paths = []
    for fmt in formats:
        paths.append(out_dir / f"{stem}.{fmt}")
        fig.savefig(paths[-1], format=fmt, metadata=metadata[fmt])
    plt.close(fig)
    return paths


