"""Results on disk: ``results/<run>/results.csv`` (schema.ROW_FIELDS) and ``env.json``.

Rows are appended, flushed and fsynced after every (cell, provider), so a killed run loses
nothing it finished; ``done_pairs`` tells ``--resume`` which pairs to skip.
"""
from __future__ import annotations

import csv
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from suite.schema import ROW_FIELD_DEFAULTS, ROW_FIELDS, TRAIN_BENCH_CSV, TRAIN_CONVERGENCE_CSV, TRAIN_CURVES_CSV  # noqa: F401

CSV_NAME = "results.csv"
ENV_NAME = "env.json"
# Where a run goes unless --out names a folder: runs/, which git ignores. results/ holds the
# curated runs alone (suite/report/curated.py); a run joins them by a deliberate move, so no
# command writes there by default (a later `nox -s tests` checks results/ for strays).
RUNS_DIR = Path("runs")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout. CCE_BENCH_COMMIT, when set, wins (dirty unknown): a copy
    of the checkout on a GPU machine may have no .git, or a .git whose HEAD is older than the
    files it was copied with (seen on this project's machines: every run of a session recorded
    the session's first commit, "dirty"); env.json's own_kernel_digest names the kernel's
    source whatever the git state (suite/provenance.py)."""
    override = os.environ.get("CCE_BENCH_COMMIT")
    if override:
        return override, None
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=root, capture_output=True, text=True, timeout=10,
                                check=True).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def environment(device: str | None = None) -> dict:
    import torch

    cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    env = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel"),
        "cut_cross_entropy": _version("cut-cross-entropy"),
        "cuda": torch.version.cuda,
        "is_gpu_run": bool(cuda),
        "device": device,
        "gpu_name": None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "compute_capability": None,
        "driver": None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        # The own kernel's config overrides (own_kernel/policy/config.py) a run was measured under.
        "own_config_overrides": os.environ.get("CCE_OWN_CONFIG") or None,
        "argv": sys.argv,
    }
    env["git_commit"], env["git_dirty"] = git_commit()
    # the kernel's own source, whatever the git state: python -m suite provenance RUN
    from suite.provenance import installed_digest

    env["own_kernel_digest"] = installed_digest()
    # Each peer provider's installed version, and the commit where pip recorded one (a source
    # install): the results name the peer versions they measured.
    from suite.catalog import peer_origins

    env["peers"] = peer_origins()
    if cuda:
        index = torch.device(device or "cuda").index or 0
        env["gpu_name"] = torch.cuda.get_device_name(index)
        env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
        env["driver"] = _nvidia_driver()
        env.update(gpu_board(index))
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["cpu_threads"] = torch.get_num_threads()
    return env


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def gpu_board(index: int) -> dict:
    """Which board ran: its UUID, power limit and highest SM clock. Boards of one model differ in
    the clock they hold at the power limit, where these kernels run, so times compare within
    one board (results/notes/gluon-forward.md#the-power-cap-why-the-two-methods-disagree)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(index).uuid)
    board = {"gpu_uuid": uuid, "power_limit_w": None, "sm_clock_max_mhz": None}
    try:
        out = subprocess.run(["nvidia-smi", "-i", f"GPU-{uuid}", "--format=csv,noheader,nounits",
                              "--query-gpu=power.limit,clocks.max.sm"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        limit, clock = (x.strip() for x in out.strip().splitlines()[0].split(","))
        board.update(power_limit_w=float(limit), sm_clock_max_mhz=int(clock))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        pass   # no nvidia-smi, or a board that does not report them: the UUID still names it
    return board


def device_label(device) -> str:
    """Short label for a device, used in folder names and the ``device`` column."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device.index or 0)
    return "cpu"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


class CsvAppender:
    """Appends rows to the CSV ``path`` as they come, flushed and fsynced, so a killed run keeps
    what it finished; a torn last line (a kill during a write) is cut first. A new file gets the
    header ``fields``; an existing one with other columns is an error (it is not touched).
    ``extras``: "raise" on keys outside ``fields``, or "ignore" them."""

    def __init__(self, path, fields, extras: str = "raise"):
        self.path, self.fields, self.extras = Path(path), list(fields), extras
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), [])
            if header != self.fields:
                raise ValueError(f"{self.path}: its columns are not this version's "
                                 f"({', '.join(self.fields)}); move it aside or pick another "
                                 f"output folder")
            self._repair_torn_tail()

    def _repair_torn_tail(self):
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def write(self, rows: list[dict]) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.fields, extrasaction="raise")
            if new:
                w.writeheader()
            if self.extras == "raise":
                unknown = {k for r in rows for k in r} - set(self.fields)
                if unknown:
                    raise ValueError(f"{self.path}: no columns {sorted(unknown)}")
            w.writerows({k: _cell(r.get(k)) for k in self.fields} for r in rows)
            f.flush()
            os.fsync(f.fileno())

    def add(self, row: dict) -> None:
        self.write([row])


class ResultsWriter:
    """Appends rows to ``run_dir/results.csv``; writes ``env.json`` (``env-<k>.json`` for each
    later session resuming the same folder, so every row's ``run_id`` has its environment)."""

    def __init__(self, run_dir, env: dict, run_id: str):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / CSV_NAME
        self.run_id = run_id
        env = dict(env, run_id=run_id)
        env_path = self.run_dir / ENV_NAME
        k = 2
        while env_path.exists():
            if json.loads(env_path.read_text()).get("run_id") == run_id:
                break  # a child of this same session (--isolate)
            env_path = self.run_dir / f"env-{k}.json"
            k += 1
        if not env_path.exists():
            env_path.write_text(json.dumps(env, indent=2) + "\n")
        self._csv = CsvAppender(self.path, _results_columns(self.path))

    def write(self, rows: list[dict]) -> None:
        rows = [{**ROW_FIELD_DEFAULTS, **r} for r in rows]
        for r in rows:  # an older file lacks the defaulted columns: only defaults fit there
            for k in set(ROW_FIELD_DEFAULTS) - set(self._csv.fields):
                if str(r.pop(k)) != ROW_FIELD_DEFAULTS[k]:
                    raise ValueError(f"{self.path}: written before the {k} column; rows with "
                                     f"{k} != {ROW_FIELD_DEFAULTS[k]} need another folder")
        self._csv.write(rows)


def _results_columns(path: Path) -> list[str]:
    """ROW_FIELDS, or an older results.csv's header: ROW_FIELDS less some of the defaulted
    columns (each was added after results were first written)."""
    if path.exists() and path.stat().st_size:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        kept = [k for k in ROW_FIELDS if k in header]
        if header == kept and set(ROW_FIELDS) - set(header) <= set(ROW_FIELD_DEFAULTS):
            return header
    return ROW_FIELDS


def read_rows(run_dir) -> list[dict]:
    """Complete rows of a run, last one winning per (cell_id, provider, phase)."""
    path = Path(run_dir) / CSV_NAME
    if not path.exists():
        return []
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            r = {**r, **{k: v for k, v in ROW_FIELD_DEFAULTS.items() if not r.get(k)}}
            if None in r or any(r.get(k) is None for k in ROW_FIELDS) or not r["timestamp"]:
                continue  # torn line
            rows[(r["cell_id"], r["provider"], r["phase"])] = r
    return list(rows.values())


def done_pairs(run_dir, phases=None, run_id=None) -> set[tuple[str, str]]:
    """(cell_id, provider) pairs with a row for every phase in ``phases`` (any row if None);
    with ``run_id``, rows of that run only."""
    seen: dict[tuple[str, str], set] = {}
    for r in read_rows(run_dir):
        if run_id is not None and r["run_id"] != run_id:
            continue
        seen.setdefault((r["cell_id"], r["provider"]), set()).add(r["phase"])
    return {pair for pair, got in seen.items() if phases is None or set(phases) <= got}


def load_dataframe(run_dir):
    """The run's rows as a pandas DataFrame with numeric columns parsed (for plots/reports)."""
    import pandas as pd

    df = pd.DataFrame(read_rows(run_dir), columns=ROW_FIELDS)
    numeric = ["n", "d", "v", "softcap", "ignore_frac", "bias", "seed", "mean_loss", "entropy",
               "peak_extra_mib", "peak_abs_mib", "ms", "ms_p20", "ms_p80", "ms_min", "reps",
               "tokens_per_s", "tflops", "floor_ms", "floor_ratio", "loss_rel_err", "de_rel_err",
               "dc_rel_err", "dbias_rel_err"]
    for col in numeric:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


# ---- training-step runs (suite.train): results/train*/ ------------------------------------

# One bench measurement: a setting (device, model shape, dtype) at a vocabulary, and a backend.
TRAIN_BENCH_KEY = ("device", "model", "vocab", "d_model", "n_layer", "n_head", "seq_len", "dtype",
                   "softcap", "backend")
TRAIN_CONVERGENCE_KEY = ("device", "model", "vocab", "d_model", "n_layer", "seq_len", "batch", "steps",
                         "lr", "run")
# Convergence verdicts that come from a finished training run (the others say why none ran).
CONVERGENCE_DONE = ("reference", "noise floor", "pass", "fail", "diverged")


def train_run_dirs(results_dir) -> list[Path]:
    """The folders ``results_dir/train*/`` holding a training CSV, by name."""
    root = Path(results_dir)
    return [d for d in sorted(root.glob("train*")) if d.is_dir() and
            ((d / TRAIN_BENCH_CSV).exists() or (d / TRAIN_CONVERGENCE_CSV).exists())]


def read_train_csv(run_dir, name: str) -> list[dict]:
    """Rows of ``run_dir/name`` (torn lines dropped), each with ``source``: the folder as given;
    [] when the file is missing."""
    path = Path(run_dir) / name
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if None not in r and None not in r.values()]
    # Rows from before the model column (or without a value in it) are the suite's own GPT.
    return [dict(r, model=r.get("model") or "gpt", source=Path(run_dir).as_posix())
            for r in rows]


def latest_complete(rows: list[dict], key, complete) -> tuple[list[dict], list[dict]]:
    """Per ``key``, the most recent row for which ``complete(row)`` holds, else the most recent
    row (recency: the run's ``timestamp``, then the folder name). An incomplete attempt (skipped,
    timed out, OOM on a fragmented heap) must not hide a later complete run, and a later failure
    must not hide an earlier success either: a measurement is kept, not overwritten.
    Returns (chosen rows in first-seen key order, the rows not chosen)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k, "") for k in key), []).append(r)
    chosen, others = [], []
    for group in groups.values():
        by_recency = sorted(group, key=lambda r: (r.get("timestamp", ""), r["source"]))
        done = [r for r in by_recency if complete(r)]
        best = (done or by_recency)[-1]
        chosen.append(best)
        others += [r for r in group if r is not best]
    return chosen, others


def train_bench_rows(run_dirs) -> tuple[list[dict], list[dict]]:
    """(chosen, superseded) bench rows of the folders: per setting and backend, the row with
    status ok from the most recent run (else the most recent row)."""
    rows = [r for d in run_dirs for r in read_train_csv(d, TRAIN_BENCH_CSV)]
    return latest_complete(rows, TRAIN_BENCH_KEY, lambda r: r["status"] == "ok")


def train_convergence_rows(run_dirs) -> tuple[list[dict], list[dict]]:
    """(chosen, superseded) convergence verdict rows, chosen like :func:`train_bench_rows`."""
    rows = [r for d in run_dirs for r in read_train_csv(d, TRAIN_CONVERGENCE_CSV)]
    return latest_complete(rows, TRAIN_CONVERGENCE_KEY,
                           lambda r: r["verdict"] in CONVERGENCE_DONE)
