"""How every generated table writes its numbers: one set of formatters for the report's tables,
the training tables and the reproduce command's Table 1."""
from __future__ import annotations

import math

NOT_MEASURED = "not measured"  # memory of a CPU run: the allocator's statistics are CUDA-only


def num(x) -> float:
    """Float of a CSV field; nan when empty or not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def num_or_none(x) -> float | None:
    """Float of a CSV field; None when empty, not a number or nan."""
    value = num(x)
    return None if math.isnan(value) else value


def _missing(x) -> bool:
    return math.isnan(num(x))


def fmt_mib(x) -> str:
    """MiB: small values keep two significant digits (a loss's few KiB stay visible)."""
    if _missing(x):
        return "–"
    v = num(x)
    if v == 0:
        return "0"
    if abs(v) < 0.01:
        return f"{v:.1e}"
    if abs(v) < 1:
        return f"{v:.2g}"
    return f"{v:.1f}" if abs(v) < 10 else f"{v:.0f}"


def fmt_ms(x) -> str:
    if _missing(x):
        return "–"
    v = num(x)
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def fmt_err(x) -> str:
    return "–" if _missing(x) else f"{num(x):.1e}"


def fmt_ratio(ours, theirs) -> str:
    """ours / theirs as '1.23x'; – when either is missing or theirs is 0."""
    if _missing(ours) or _missing(theirs) or num(theirs) == 0:
        return "–"
    return f"{num(ours) / num(theirs):.2f}x"


def fmt_sig(text: str, digits: int = 4) -> str:
    """A CSV cell for a table copied from a tool's CSV (the measurement notes): integers as
    written (a shape's 32768 stays 32768), other numbers to ``digits`` significant digits,
    words as written, an empty cell as –."""
    text = text.strip()
    if not text:
        return "–"
    if text.lstrip("+-").isdigit():
        return text
    try:
        return f"{float(text):.{digits}g}"
    except ValueError:
        return text


def fmt_gib(mib) -> str:
    v = num(mib) / 1024
    if math.isnan(v):
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def fmt_count(x) -> str:
    return "–" if _missing(x) else f"{num(x):,.0f}"


def fmt_pct(x, signed=True) -> str:
    if _missing(x):
        return "–"
    v = num(x)
    return f"{100 * v:+.3f} %" if signed else f"{100 * v:.3f} %"


def memory_text(row) -> str:
    """A row's peak extra MiB; 'not measured' on the CPU, where no allocator statistics exist."""
    if _missing(row.get("peak_extra_mib")):
        return NOT_MEASURED if row.get("device") == "cpu" else "–"
    return fmt_mib(row["peak_extra_mib"])


def md_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def latest_rows(rows: list[dict]) -> dict:
    """{(cell_id, provider, phase): row}, the latest (timestamp) of each: a resumed run with
    --rerun appends newer measurements, and readers show those."""
    latest = {}
    for r in rows:
        key = (r["cell_id"], r["provider"], r["phase"])
        if key not in latest or r.get("timestamp", "") >= latest[key].get("timestamp", ""):
            latest[key] = r
    return latest
