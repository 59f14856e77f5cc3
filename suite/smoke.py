"""The CPU smoke check: ``bench`` without a GPU runs every provider once on one tiny cell (the
``smoke`` preset) and says what that checked: which providers ran and agree with the fp64
reference, which cannot run here and why, which failed. Its times are the Triton interpreter's
on a CPU, not GPU numbers; the longer CPU sweep is the ``smoke-sweep`` preset.
"""
from __future__ import annotations

import math

PRESET = "smoke"
SWEEP = "smoke-sweep"
# One call of loss and gradients per provider: the forward and the backward both run.
PHASES = ("loss+grad",)
REPS, WARMUP = 1, 0
FAILED = ("error", "nan", "oom", "crashed")


def tolerance(row: dict) -> float:
    """An exact provider's worst-case relative rounding against the fp64 reference on this
    cell: eps of its dtype times the three reductions' lengths (dot products over D, the
    softmax's sum over V, dC's sum over N)."""
    import torch  # here: suite.cli imports this module before it needs torch

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    eps = torch.finfo(dtypes[row["dtype"]]).eps
    return eps * (int(row["n"]) + int(row["d"]) + int(row["v"]))


def _errors(row: dict) -> list[float]:
    return [float(row[k]) for k in ("loss_rel_err", "de_rel_err", "dc_rel_err") if row.get(k)]


def _cell_text(row: dict) -> str:
    ignored = float(row["ignore_frac"] or 0)
    options = [f"softcap {row['softcap']}" if row.get("softcap") else "no softcap",
               "bias" if row.get("bias") in ("True", "1", "true") else "no bias",
               f"{ignored:.0%} of targets ignored"]
    return (f"{row['dist']} inputs, N {row['n']}, D {row['d']}, V {row['v']}, {row['dtype']}, "
            + ", ".join(options))


def summarize(rows: list[dict], exact: dict[str, bool]) -> tuple[str, bool]:
    """(text, failed): what the smoke run checked, provider by provider, and whether any
    provider failed (an error, or an exact provider outside ``tolerance``). A bench of other
    phases only (``--phases fwd``) is checked on its own rows: there the loss alone."""
    rows = [r for r in rows if r["phase"] in PHASES] or rows
    if not rows:
        return "smoke check: no rows were written", True
    phase = "/".join(sorted({r["phase"] for r in rows}))
    checked = "loss, dE and dC" if "loss+grad" in phase else "the loss"
    tol = tolerance(rows[0])
    groups = {"ok": [], "approx": [], "unsupported": [], "unavailable": [], "failed": []}
    for r in rows:
        name, status = r["provider"], r["status"]
        if status == "ok":
            worst = max(_errors(r), default=math.nan)
            if not exact.get(name, True):
                groups["approx"].append(f"{name} ({worst:.1e})")
            elif worst <= tol:
                groups["ok"].append(name)
            else:
                groups["failed"].append(f"{name}: relative error {worst:.2e} > {tol:.1e}")
        elif status in ("unsupported", "unavailable"):
            groups[status].append(f"{name}: {r['error']}")
        else:
            groups["failed"].append(f"{name}: {status}: {r['error']}")
    lines = [f"smoke check: {len(rows)} providers, one {phase} call each on one cell "
             f"({_cell_text(rows[0])}); {checked} against the fp64 reference.",
             f"  ran and agree (relative errors <= eps x (N + D + V) = {tol:.1e}): "
             f"{', '.join(groups['ok']) or 'none'}"]
    if groups["approx"]:
        lines.append("  ran, approximate gradients (worst relative error shown, not checked): "
                     + ", ".join(groups["approx"]))
    for key, title in (("unsupported", "cannot run this cell here"),
                       ("unavailable", "not available here"), ("failed", "FAILED")):
        lines += [f"  {title}:"] + [f"    {item}" for item in groups[key]] if groups[key] else []
    lines.append("Times are the Triton interpreter's on this CPU, not GPU numbers. The longer "
                 f"CPU sweep: --preset {SWEEP}.")
    return "\n".join(lines), bool(groups["failed"])
