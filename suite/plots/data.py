"""The rows the figures draw: the curated runs' results.csv (suite/report/curated.py) or every
run under a folder, as one DataFrame, and how rows group into figure families (a file each)."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pandas as pd

from suite import results
from suite.report import curated
from suite.schema import ROW_FIELD_DEFAULTS, ROW_FIELDS

NUMERIC = ["n", "d", "v", "softcap", "ignore_frac", "bias", "seed", "mean_loss", "entropy",
           "peak_extra_mib", "peak_abs_mib", "ms", "ms_p20", "ms_p80", "ms_min", "reps",
           "tokens_per_s", "tflops", "floor_ms", "floor_ratio", "loss_rel_err", "de_rel_err",
           "dc_rel_err", "dbias_rel_err"]


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
    df["softcap_label"] = [softcap_label(x) for x in df["softcap"]]
    df = df.sort_values(["timestamp", "run"], kind="stable")
    df = df.drop_duplicates(["device", "cell_id", "provider", "phase"], keep="last")
    return df.reset_index(drop=True)


def softcap_label(x) -> str:
    return "none" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:g}"


def family_stem(key: dict) -> str:
    """File-name part naming a family: D and the options that are not the default."""
    parts = [f"d{int(key['d'])}"]
    if key["softcap_label"] != "none":
        parts.append(f"softcap{key['softcap_label']}")
    if key["ignore_frac"]:
        parts.append(f"ignore{key['ignore_frac']:g}")
    if key["bias"]:
        parts.append("bias")
    return "_".join(parts)


def family_title(key: dict) -> str:
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


def vocab_label(v: float) -> str:
    return f"{v / 1000:.0f}k" if v >= 10000 else f"{v:g}"



# A family: rows of one device, dtype, D and options; a file per family, a row of panels per N.
FAMILY_KEYS = ["device", "dtype", "d", "softcap_label", "ignore_frac", "bias"]


def families(df: pd.DataFrame, keys) -> list[tuple[dict, pd.DataFrame, list]]:
    """(key, rows, Ns): groups of rows sharing ``keys``, with the token counts N that have at
    least two vocabulary sizes (a line needs two points)."""
    out = []
    for values, rows in df.groupby(keys, sort=True, dropna=False):
        ns = sorted(n for n, at_n in rows.groupby("n") if at_n["v"].nunique() >= 2)
        if ns:
            out.append((dict(zip(keys, values)), rows[rows["n"].isin(ns)], ns))
    return out


def lower_bound_mib(n, d, v, dtype):
    from suite.report.claims import gradient_lower_bound_mib
    return gradient_lower_bound_mib(n, d, v, dtype)


