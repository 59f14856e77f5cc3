"""The exact call's targets against torch.compile, one row per frontier cell, read from the
frontier's run folders and its forward step's (``python -m suite frontier RUN ... --forward FWD
--targets-csv OUT``). The notes' target tables are table blocks over that CSV, so no target
figure is typed by hand.

Each target and how a cell meets it (times are medians of the timed calls; "faster", "level",
"slower" by the p20–p80 rule of suite/report/verdict.py):
- ``default``: the default call (``own``, a 1 GiB workspace) no slower than torch.compile
  (≤ 1.0× its time: faster or level);
- ``best``: the fastest own exact point within torch.compile's peak memory (1 MiB of allocator
  slack) at ≤ 0.97× its time by the medians, and faster by the rule;
- ``ws0``: the call at a 0 MiB budget (``own_ws0``) within 4.1 floors (one cuBLAS E @ C.T,
  timed in the same process);
- ``filter``: ``own_filter`` (``filter_eps="auto"``) no slower than the default;
- ``err``: every own exact point's dE and dC errors against fp64 within 1.2× torch.compile's;
- ``fwd`` and ``portable_fwd``: the forward alone (phase fwd) within 1.05 and 1.25 floors, the
  Hopper default and the portable config forced (``own_portable``).
A cell without the rows a target reads leaves its columns empty; ``met`` is then empty too.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from suite.report.envs import read_envs
from suite.report.formatting import num
from suite.report.frontier_tables import MEM_SLACK_MIB, by_cell, is_exact, is_own
from suite.report.verdict import FASTER, at_most, time_verdict

BEST_MAX_RATIO = 0.97
WS0_MAX_FLOORS = 4.1
ERR_MAX_RATIO = 1.2
FWD_MAX_FLOORS = 1.05
PORTABLE_FWD_MAX_FLOORS = 1.25
COLUMNS = ("cell_id", "n", "d", "v", "softcap", "default_over_compile", "default_vs_compile",
           "default_met", "best_provider", "best_over_compile", "best_vs_compile",
           "best_mib_over_compile", "best_met", "ws0_floors", "ws0_met",
           "filter_over_default", "filter_vs_default", "filter_met", "err_provider",
           "err_over_compile", "err_met", "fwd_floors", "fwd_met", "portable_fwd_floors",
           "portable_fwd_met", "gpu", "commit", "fwd_commit")


def _ok(rows: list[dict], provider: str, phase: str) -> dict | None:
    """The provider's last ok row of one phase in one cell (a resumed run's latest), else None."""
    found = [r for r in rows if r["provider"] == provider and r["phase"] == phase
             and r["status"] == "ok"]
    return found[-1] if found else None


def _ratio(a: dict | None, b: dict | None, column: str = "ms") -> float | None:
    if a is None or b is None:
        return None
    x, y = num(a[column]), num(b[column])
    return None if math.isnan(x) or math.isnan(y) or y == 0 else x / y


def _met(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def _own_exact(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["phase"] == "loss+grad" and r["status"] == "ok"
            and is_own(r["provider"]) and is_exact(r["provider"])]


def best_within(candidates: list[dict], compile_row: dict, mib_column: str,
                max_ratio: float) -> dict:
    """The fastest of candidates within torch.compile's memory (its mib_column, 1 MiB of
    allocator slack), against it: met at <= max_ratio of its time and faster by the rule."""
    cap = num(compile_row[mib_column]) + MEM_SLACK_MIB
    fits = [r for r in candidates if num(r[mib_column]) <= cap]
    if not fits:
        return {}
    best = min(fits, key=lambda r: num(r["ms"]))
    ratio, word = _ratio(best, compile_row), time_verdict(best, compile_row)
    return dict(best_provider=best["provider"], best_over_compile=ratio, best_vs_compile=word,
                best_mib_over_compile=_ratio(best, compile_row, mib_column),
                best_met=ratio is not None and ratio <= max_ratio and word == FASTER)


def _worst_error(rows: list[dict], compile_row: dict) -> dict:
    """The own exact point whose dE or dC error is the largest multiple of torch.compile's."""
    worst = None
    for r in _own_exact(rows):
        for column in ("de_rel_err", "dc_rel_err"):
            ratio = _ratio(r, compile_row, column)
            if ratio is not None and (worst is None or ratio > worst[1]):
                worst = (r["provider"], ratio)
    if worst is None:
        return {}
    return dict(err_provider=worst[0], err_over_compile=worst[1],
                err_met=_met(worst[1], ERR_MAX_RATIO))


def _floors(row: dict | None) -> float | None:
    value = num(row["floor_ratio"]) if row is not None else math.nan
    return None if math.isnan(value) else value


def _forward(fwd_rows: list[dict]) -> dict:
    fwd = _floors(_ok(fwd_rows, "own", "fwd"))
    portable = _floors(_ok(fwd_rows, "own_portable", "fwd"))
    return dict(fwd_floors=fwd, fwd_met=_met(fwd, FWD_MAX_FLOORS), portable_fwd_floors=portable,
                portable_fwd_met=_met(portable, PORTABLE_FWD_MAX_FLOORS))


def cell_targets(rows: list[dict], fwd_rows: list[dict]) -> dict:
    """One cell's row: its frontier rows (phase loss+grad) and its forward step's (phase fwd)."""
    first = rows[0]
    out = {k: first[k] for k in ("cell_id", "n", "d", "v", "softcap")}
    out.update(_forward(fwd_rows))
    compile_row, own = _ok(rows, "torch_compile", "loss+grad"), _ok(rows, "own", "loss+grad")
    ws0 = _floors(_ok(rows, "own_ws0", "loss+grad"))
    out.update(ws0_floors=ws0, ws0_met=_met(ws0, WS0_MAX_FLOORS))
    filtered = _ok(rows, "own_filter", "loss+grad")
    out.update(filter_over_default=_ratio(filtered, own),
               filter_vs_default=time_verdict(filtered, own), filter_met=at_most(filtered, own))
    if compile_row is None:
        return out
    out.update(default_over_compile=_ratio(own, compile_row),
               default_vs_compile=time_verdict(own, compile_row),
               default_met=at_most(own, compile_row))
    out.update(best_within(_own_exact(rows), compile_row, "peak_extra_mib", BEST_MAX_RATIO))
    out.update(_worst_error(rows, compile_row))
    return out


def _commits(envs: list[dict]) -> str:
    """The commits of the sessions that wrote a run folder (its env.json, env-2.json, ...)."""
    seen = [(env.get("git_commit") or "unknown")[:10] for env in envs]
    return " ".join(dict.fromkeys(seen))


def _cells(run_dirs, phase: str) -> dict[str, tuple[list[dict], Path]]:
    """Each cell's rows of one phase, from the first run folder that has the cell, with it."""
    cells: dict[str, tuple[list[dict], Path]] = {}
    for d in run_dirs:
        for cell_id, rows in by_cell([d], phase).items():
            cells.setdefault(cell_id, (rows, Path(d)))
    return cells


def targets(run_dirs, forward_dirs=()) -> list[dict]:
    """A row per loss+grad cell of run_dirs, with the forward step's rows of the same cell."""
    forward = _cells(forward_dirs, "fwd")
    out = []
    for cell_id, (rows, folder) in _cells(run_dirs, "loss+grad").items():
        fwd_rows, fwd_folder = forward.get(cell_id, ([], None))
        row = cell_targets(rows, fwd_rows)
        envs = read_envs(folder)
        row.update(gpu=envs[0].get("gpu_name", "") if envs else "", commit=_commits(envs),
                   fwd_commit=_commits(read_envs(fwd_folder)) if fwd_folder else None)
        out.append(row)
    return out


def _cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_csv(rows: list[dict], path, columns=COLUMNS) -> Path:
    """rows as a CSV of these columns (yes / no for a met flag, floats to 4 digits, an empty
    cell for a value a row lacks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell_text(row.get(k)) for k in columns})
    return path
