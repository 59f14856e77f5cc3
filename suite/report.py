"""Markdown tables from a results folder; ``--update-readme`` rewrites README.md between
``<!-- results:<section>:start -->`` and ``<!-- results:<section>:end -->`` (never typed by hand).
"""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from suite.results import ENV_NAME, read_rows
from suite.schema import PHASES

README = Path(__file__).resolve().parent.parent / "README.md"
MAX_CELL_TABLES = 6
# Baseline first, then the peers from most to least memory, then this project's kernel.
ORDER = ("naive", "torch_compile", "chunked", "selective", "liger_ce", "liger_flce",
         "torch_native", "apple_torch_compile", "apple_cce", "apple_cce_nofilter", "own",
         "own_filter")


def _num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def fmt_mib(x) -> str:
    v = _num(x)
    if math.isnan(v):
        return "–"
    return f"{v:.1f}" if abs(v) < 10 else f"{v:.0f}"


def fmt_ms(x) -> str:
    v = _num(x)
    if math.isnan(v):
        return "–"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def fmt_err(x) -> str:
    v = _num(x)
    return "–" if math.isnan(v) else f"{v:.1e}"


def _phase_cell(row, with_mem=True) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return row["status"]
    if not with_mem or math.isnan(_num(row["peak_extra_mib"])):
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


def _provider_order(rows, providers=None) -> list[str]:
    """Providers (default: all in the rows) in ORDER, then any others as they come."""
    present = list(dict.fromkeys(r["provider"] for r in rows))
    wanted = [p for p in dict.fromkeys(providers or present) if p in present]
    return sorted(wanted, key=lambda p: ORDER.index(p) if p in ORDER else len(ORDER))


def cell_table(rows: list[dict], providers=None) -> str:
    """One cell: provider x phase, peak extra MiB / median ms, floor ratio and errors."""
    by = {(r["provider"], r["phase"]): r for r in rows}
    names = _provider_order(rows, providers)
    floor = next((r["floor_ms"] for r in rows if r["floor_ms"]), "")
    lines = [_cell_title(rows[0]) + (f"; floor (one E@Cᵀ) {fmt_ms(floor)} ms" if floor else ""),
             "",
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
    names = _provider_order(rows, providers)
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


def env_line(run_dir) -> str:
    path = Path(run_dir) / ENV_NAME
    if not path.exists():
        return ""
    env = json.loads(path.read_text())
    where = env.get("gpu_name") or f"CPU ({env.get('cpu', '?')}), not GPU numbers"
    commit = (env.get("git_commit") or "unknown")[:10]
    return (f"Measured on {where}, torch {env.get('torch')}, triton {env.get('triton')}, "
            f"CUDA {env.get('cuda')}, liger-kernel {env.get('liger_kernel')}, cut-cross-entropy "
            f"{env.get('cut_cross_entropy')}; commit {commit}, {env.get('date', '')[:10]}.")


def render(run_dir) -> str:
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    if not rows:
        raise ValueError(f"no results in {run_dir}/results.csv")
    csv_path = run_dir.as_posix() + "/results.csv"
    ok = next((r for r in rows if r["status"] == "ok"), rows[0])
    gpu = ok["device"] != "cpu"
    timer = "CUDA events, L2 flushed" if gpu else "perf_counter"
    head = (f"Generated by `python -m suite report {run_dir.as_posix()} --update-readme` from "
            f"[`{csv_path}`]({csv_path}). {env_line(run_dir)} Cells: peak MiB over what was "
            f"allocated before the call / median ms ({timer}, {ok['reps'] or '?'} reps); "
            f"×floor = loss+grad time over one E@Cᵀ of the same shape; errors are relative to "
            f"an {'fp32' if gpu else 'fp64'} reference.")
    return head + "\n\n" + summary(rows)


def update_readme(text: str, section: str, readme=README) -> None:
    readme = Path(readme)
    start, end = f"<!-- results:{section}:start -->", f"<!-- results:{section}:end -->"
    doc = readme.read_text()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(doc):
        raise ValueError(f"{readme} has no '{start}' ... '{end}' markers")
    readme.write_text(pattern.sub(lambda _: f"{start}\n{text}\n{end}", doc))


def add_arguments(parser) -> None:
    parser.add_argument("results", help="a run folder holding results.csv (e.g. results/gemma2-2b-...)")
    parser.add_argument("--update-readme", action="store_true",
                        help="rewrite README.md between the results:<section> markers")
    parser.add_argument("--section", default="gemma2-2b",
                        help="README marker name (default: gemma2-2b)")


def main(args) -> int:
    try:
        text = render(args.results)
        if args.update_readme:
            update_readme(text, args.section)
    except (ValueError, FileNotFoundError) as err:
        print(f"report: {err}")
        return 1
    print(text)
    if args.update_readme:
        print(f"\nreport: README.md section '{args.section}' updated")
    return 0
