"""The kernel benchmark's tables, from a run folder's results.csv: one table per cell
(provider x phase), an aggregate for many cells, and one provider against its peers per cell."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from suite.report.claims import GRADS_RATIO, grads_bytes
from suite.report.envs import env_line
from suite.report.formatting import (NOT_MEASURED, fmt_err, fmt_mib, fmt_ms, latest_rows,
                                     num as _num)
from suite.report.curated import read_run_rows as read_rows
from suite.report.verdict import RULE_TEXT, Tally, time_verdict
from suite.schema import PHASES

MAX_CELL_TABLES = 6
# Baseline first, then the peers from most to least memory, then this project's kernel.
ORDER = ("naive", "torch_compile", "chunked", "selective", "liger_ce", "liger_flce",
         "torch_native", "torch_native_accurate", "apple_torch_compile", "apple_cce",
         "apple_cce_nofilter", "own", "own_recompute", "own_low_memory", "own_filter", "own_fused", "own_fused_4g", "own_fused_6g",
         "own_fused_filter", "own_portable",
         "own_portable_filter", "own_portable_fused")



def _phase_cell(row, with_mem=True) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return row["status"]
    if not with_mem:
        return fmt_ms(row["ms"])
    if math.isnan(_num(row["peak_extra_mib"])):
        # The CPU has no allocator statistics: say so rather than leave the memory out.
        if row.get("device") == "cpu":
            return f"{NOT_MEASURED} / {fmt_ms(row['ms'])}"
        return fmt_ms(row["ms"])
    return f"{fmt_mib(row['peak_extra_mib'])} / {fmt_ms(row['ms'])}"


def _cell_title(r) -> str:
    sc = f"softcap {r['softcap']}" if r["softcap"] else "no softcap"
    extra = ""
    if _num(r["ignore_frac"]) > 0:
        extra += f", {r['ignore_frac']} ignored"
    if r["bias"] == "1":
        extra += ", bias"
    stats = ""
    if r["entropy"]:
        stats = f" — entropy {_num(r['entropy']):.2f} nats, loss {_num(r['mean_loss']):.2f}"
    return (f"**{r['dist']}**: N={r['n']} D={r['d']} V={r['v']} {r['dtype']}, {sc}{extra}"
            f"{stats}")


def provider_order(rows, providers=None) -> list[str]:
    """Providers (default: all in the rows) in ORDER, then any others as they come."""
    present = list(dict.fromkeys(r["provider"] for r in rows))
    wanted = [p for p in dict.fromkeys(providers or present) if p in present]
    return sorted(wanted, key=lambda p: ORDER.index(p) if p in ORDER else len(ORDER))


def _floor_text(rows) -> str:
    """The cell's floor; where its rows come from several sessions of the run (a resumed run),
    each session's floor, since each row's ×floor is over its own session's."""
    floors = dict.fromkeys((r.get("run_id"), r["floor_ms"]) for r in rows if r["floor_ms"])
    if not floors:
        return ""
    if len(floors) == 1:
        return f"; floor (one E@Cᵀ) {fmt_ms(next(iter(floors))[1])} ms"
    return (f"; rows from {len(floors)} sessions of this run, floors (one E@Cᵀ) "
            f"{', '.join(fmt_ms(f) for _, f in floors)} ms: ×floor is each row's time over its "
            f"own session's floor")


def cell_table(rows: list[dict], providers=None) -> str:
    """One cell: provider x phase, peak extra MiB / median ms, floor ratio and errors."""
    by = {(r["provider"], r["phase"]): r for r in rows}
    names = provider_order(rows, providers)
    lines = [_cell_title(rows[0]) + _floor_text(rows), "",
             "| provider | fwd ms | loss MiB / ms | grad MiB / ms | loss+grad MiB / ms "
             "| ×floor | loss err | dE err | dC err |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes = {}
    for p in names:
        ph = {k: by.get((p, k)) for k in PHASES}
        lg = ph["loss+grad"]
        acc = lg if lg is not None and lg["status"] == "ok" else ph["grad"]
        any_row = next(r for r in ph.values() if r is not None)
        if all(r is None or r["status"] == any_row["status"] for r in ph.values()) \
                and any_row["status"] != "ok":
            notes[p] = f"{any_row['status']}: {any_row['error']}"
        else:
            for k, r in ph.items():
                if r is not None and r["status"] != "ok":
                    notes.setdefault(p, f"{k} {r['status']}: {r['error']}")
        lines.append("| " + " | ".join([
            p,
            _phase_cell(ph["fwd"], with_mem=False),
            _phase_cell(ph["loss"]),
            _phase_cell(ph["grad"]),
            _phase_cell(lg),
            f"{_num(lg['floor_ratio']):.2f}" if lg and lg["status"] == "ok" and lg["floor_ratio"]
            else "–",
            fmt_err(next((r["loss_rel_err"] for r in ph.values()
                          if r is not None and r["status"] == "ok"), "")),
            fmt_err(acc["de_rel_err"]) if acc and acc["status"] == "ok" else "–",
            fmt_err(acc["dc_rel_err"]) if acc and acc["status"] == "ok" else "–",
        ]) + " |")
    if notes:
        lines.append("")
        lines += [f"- {p}: {text}" for p, text in notes.items()]
    return "\n".join(lines)


def aggregate_table(rows: list[dict], providers=None) -> str:
    """Many cells: per provider, status counts, median floor ratio and worst errors."""
    names = provider_order(rows, providers)
    lines = ["| provider | rows ok / all | other statuses | median ×floor (loss+grad) "
             "| max dE err | max dC err |", "|---|---|---|---|---|---|"]
    for p in names:
        mine = [r for r in rows if r["provider"] == p]
        if not mine:
            continue
        ok = [r for r in mine if r["status"] == "ok"]
        others = {}
        for r in mine:
            if r["status"] != "ok":
                others[r["status"]] = others.get(r["status"], 0) + 1
        ratios = [_num(r["floor_ratio"]) for r in ok if r["phase"] == "loss+grad"]
        ratios = [x for x in ratios if not math.isnan(x)]
        de = [_num(r["de_rel_err"]) for r in ok if not math.isnan(_num(r["de_rel_err"]))]
        dc = [_num(r["dc_rel_err"]) for r in ok if not math.isnan(_num(r["dc_rel_err"]))]
        statuses = ", ".join(f"{k} {v}" for k, v in others.items()) or "–"
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "–"
        lines.append(f"| {p} | {len(ok)} / {len(mine)} | {statuses} | {ratio} | "
                     f"{fmt_err(max(de)) if de else '–'} | {fmt_err(max(dc)) if dc else '–'} |")
    return "\n".join(lines)


def summary(rows: list[dict], cells=None, providers=None) -> str:
    """Per-cell tables for small runs, one aggregate table for large ones."""
    cells = list(dict.fromkeys(cells or [r["cell_id"] for r in rows]))
    # The latest row of each (cell, provider, phase): a --rerun appends newer measurements.
    latest = {(r["cell_id"], r["provider"], r["phase"]): r for r in rows if r["cell_id"] in set(cells)}
    rows = list(latest.values())
    if not rows:
        return "(no results)"
    if len(cells) > MAX_CELL_TABLES:
        return aggregate_table(rows, providers)
    parts = []
    for cid in cells:
        mine = [r for r in rows if r["cell_id"] == cid]
        if mine:
            parts.append(cell_table(mine, providers))
    return "\n\n".join(parts)


def versus_table(rows: list[dict], provider: str, peers) -> str:
    """One row per cell: ``provider``'s loss+grad time over the floor and over each peer's (with
    the verdict of suite.report.verdict: faster, level or slower), its memory over the gradients'
    size (dE + dC (+ dbias) in the cell's dtype) and over each peer's, and the dE errors; then
    per peer the verdicts' counts, and in how many cells its memory was within 1.10x the
    gradients. ``rows``: one run's; the latest (timestamp) of each (cell, provider, phase) wins."""
    latest = {k: r for k, r in latest_rows(rows).items() if k[2] == "loss+grad"}

    def shape(cell):
        r = latest[(cell, provider, "loss+grad")]
        ig = _num(r.get("ignore_frac"))
        return (r["dtype"], r["dist"], int(r["n"]), int(r["d"]), int(r["v"]),
                ig if math.isfinite(ig) else 0.0)

    cells = sorted({c for c, p, _ in latest if p == provider}, key=shape)
    if not cells:
        raise ValueError(f"--versus: no loss+grad rows of provider {provider!r}")
    # A column for the fraction of ignored targets only where some cell has any.
    ignored = any(shape(c)[-1] > 0 for c in cells)
    head = ["dtype", "dist", "N", "D", "V"] + (["ignored"] if ignored else []) + [f"{provider} ×floor"]
    head += [f"{provider} MiB ÷ grads"]
    head += [f"time / {p}" for p in peers] + [f"MiB / {p}" for p in peers]
    head += [f"dE err {provider}"] + [f"dE err {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tallies = {p: Tally() for p in peers}
    near_grads = [0, 0]  # cells with memory <= GRADS_RATIO x the gradients, cells measured

    def ok(r):
        return r is not None and r["status"] == "ok"

    for c in cells:
        me = latest[(c, provider, "loss+grad")]
        others = [latest.get((c, p, "loss+grad")) for p in peers]
        mine_ok = ok(me)
        cols = [me["dtype"], me["dist"], me["n"], me["d"], me["v"]]
        cols += [f"{shape(c)[-1]:g}"] if ignored else []
        cols += [f"{_num(me['floor_ratio']):.2f}" if mine_ok and me["floor_ratio"] else
                ("–" if mine_ok else me["status"])]
        over_grads = _num(me["peak_extra_mib"]) * 2**20 / grads_bytes(me) if mine_ok else math.nan
        cols.append(f"{over_grads:.3f}" if math.isfinite(over_grads) else "–")
        if math.isfinite(over_grads):
            near_grads[0] += over_grads <= GRADS_RATIO
            near_grads[1] += 1
        for p, r in zip(peers, others):
            cols.append(_time_cell(me, r, tallies[p]))
        for r in others:
            cols.append(f"{_num(me['peak_extra_mib']) / _num(r['peak_extra_mib']):.2f}"
                        if mine_ok and ok(r) and _num(r["peak_extra_mib"]) > 0 else "–")
        cols.append(fmt_err(me["de_rel_err"]) if mine_ok else "–")
        cols += [fmt_err(r["de_rel_err"]) if ok(r) else "–" for r in others]
        lines.append("| " + " | ".join(cols) + " |")
    lines.append("")
    lines += [f"- {provider} against {p} (loss+grad; {RULE_TEXT}): {t.text()}"
              for p, t in tallies.items()]
    lines.append(f"- {provider} loss+grad memory within {GRADS_RATIO:.2f}× the gradients in "
                 f"{near_grads[0]} of {near_grads[1]} cells")
    if any(f" {OTHER_SESSION} |" in line for line in lines):
        lines.append(f"- {OTHER_SESSION}: the two rows come from different sessions of this run "
                     f"(it was resumed), each with its own floor")
    return "\n".join(lines)


def _time_cell(me, other, tally: Tally) -> str:
    """'0.93 faster' (time ratio and verdict), counted in ``tally``; the peer's status where it
    did not run."""
    verdict = time_verdict(me, other)
    if verdict is None:
        if other is not None and other["status"] != "ok":
            return other["status"]
        return "–"
    tally.add(verdict)
    return f"{_num(me['ms']) / _num(other['ms']):.2f} {verdict}" + _other_session(me, other)


OTHER_SESSION = "†"


def _other_session(me, other) -> str:
    """A mark on a comparison of rows from two sessions of a resumed run."""
    return "" if me.get("run_id") == other.get("run_id") else f" {OTHER_SESSION}"


def render(run_dir, command: str | None = None) -> str:
    """The run folder's tables, under a line saying how they were made and where."""
    run_dir = Path(run_dir)
    command = command or f"python -m suite report {run_dir.as_posix()}"
    rows = read_rows(run_dir)
    if not rows:
        raise ValueError(f"no results in {run_dir}/results.csv")
    csv_path = run_dir.as_posix() + "/results.csv"
    ok = next((r for r in rows if r["status"] == "ok"), rows[0])
    gpu = ok["device"] != "cpu"
    timer = "CUDA events, L2 flushed" if gpu else "perf_counter"
    memory = ("peak MiB over what was allocated before the call" if gpu else
              f"peak MiB ({NOT_MEASURED} on the CPU: no allocator statistics there)")
    head = (f"Generated by `{command}` from "
            f"[`{csv_path}`]({csv_path}). {env_line(run_dir)} Cells: {memory} / median ms "
            f"({timer}, {ok['reps'] or '?'} reps); "
            f"×floor = loss+grad time over one E@Cᵀ of the same shape; errors are relative to "
            f"an {'fp32' if gpu else 'fp64'} reference.")
    return head + "\n\n" + summary(rows)
