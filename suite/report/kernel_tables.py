"""Markdown tables from a results folder; ``--update-readme`` rewrites README.md between
``<!-- results:<section>:start -->`` and ``<!-- results:<section>:end -->`` (never typed by hand).

    python -m suite report results/gemma2-2b-h200 --update-readme           # section gemma2-2b
    python -m suite report results/train-h200 results/train-h200-v151936 --update-readme
                                                    # training-step folders: section train

Folders holding ``train_bench.csv`` / ``train_convergence.csv`` (suite.train) get the training
table (:func:`render_train`), any number of them at once; a kernel run folder gets
:func:`render`.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from suite import results
from suite.reproduce import GEMMA2_2B
from suite.results import ENV_NAME, read_rows
from suite.schema import DTYPE_BYTES, PHASES

README = Path(__file__).resolve().parent.parent / "README.md"
MAX_CELL_TABLES = 6
# Baseline first, then the peers from most to least memory, then this project's kernel.
ORDER = ("naive", "torch_compile", "chunked", "selective", "liger_ce", "liger_flce",
         "torch_native", "apple_torch_compile", "apple_cce", "apple_cce_nofilter", "own",
         "own_low_memory", "own_filter")


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


def versus_table(rows: list[dict], provider: str, peers) -> str:
    """One row per cell: ``provider``'s loss+grad time over the floor and over each peer's, its
    memory over the gradients' size (dE + dC (+ dbias) in the cell's dtype) and over each peer's,
    and the dE errors; then per peer how many cells it was faster, and in how many cells its
    memory was within 1.10x the gradients.
    Rows from several folders: the latest (timestamp) of each (cell, provider, phase) wins."""
    latest = {k: r for k, r in _latest(rows).items() if k[2] == "loss+grad"}

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
    faster = {p: [0, 0] for p in peers}  # cells faster, cells compared
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
            if mine_ok and ok(r):
                ratio = _num(me["ms"]) / _num(r["ms"])
                faster[p][0] += ratio < 1
                faster[p][1] += 1
                cols.append(f"{ratio:.2f}")
            else:
                cols.append("–" if r is None else (r["status"] if not ok(r) else "–"))
        for r in others:
            cols.append(f"{_num(me['peak_extra_mib']) / _num(r['peak_extra_mib']):.2f}"
                        if mine_ok and ok(r) and _num(r["peak_extra_mib"]) > 0 else "–")
        cols.append(fmt_err(me["de_rel_err"]) if mine_ok else "–")
        cols += [fmt_err(r["de_rel_err"]) if ok(r) else "–" for r in others]
        lines.append("| " + " | ".join(cols) + " |")
    lines.append("")
    lines += [f"- {provider} faster than {p} (loss+grad) in {n} of {m} cells" for p, (n, m) in faster.items()]
    lines.append(f"- {provider} loss+grad memory within {GRADS_RATIO:.2f}× the gradients in "
                 f"{near_grads[0]} of {near_grads[1]} cells")
    return "\n".join(lines)


GRADS_RATIO = 1.10  # issue 3's target: loss+grad memory <= 1.10x the gradients (dE + dC)

# Issue 3's other targets for the own kernel (bf16, on the GPU): forward time over one floor
# (one cuBLAS E @ C.T of the cell's shape), exact loss+grad over floors (1.15 x the four matmuls
# it needs at least), own_filter against torch.compile on lm inputs (time, memory), gradient
# errors over the naive baseline's (exact, filtered), the loss phase's memory in MiB.
FWD_MAX, EXACT_MAX = 1.10, 1.15 * 4
FILTER_TIME_MAX, FILTER_MIB_MAX = 1.0, 0.25
EXACT_ERR_MAX, FILTER_ERR_MAX = 1.5, 3.0
LOSS_MIB_MAX = 1.0


def _latest(rows: list[dict]) -> dict:
    """{(cell_id, provider, phase): row}, the latest (timestamp) of each."""
    latest = {}
    for r in rows:
        key = (r["cell_id"], r["provider"], r["phase"])
        if key not in latest or r["timestamp"] >= latest[key]["timestamp"]:
            latest[key] = r
    return latest


def targets_table(rows: list[dict]) -> str:
    """One row per bf16 cell with issue 3's targets for the own kernel: each value against its
    bound (✗ where it misses), then per target how many cells meet it. A value needs its rows
    with status ok (and the peer's, for a ratio); otherwise it shows –."""
    latest = _latest(rows)

    def get(cell, provider, phase):
        r = latest.get((cell, provider, phase))
        return r if r is not None and r["status"] == "ok" else None

    def err_ratio(cell, provider):
        me, base = get(cell, provider, "loss+grad"), get(cell, "naive", "loss+grad")
        if me is None or base is None:
            return math.nan
        ratios = [_num(me[k]) / _num(base[k]) for k in ("de_rel_err", "dc_rel_err")
                  if _num(base[k]) > 0 and math.isfinite(_num(me[k]))]
        return max(ratios) if ratios else math.nan

    def ratio(cell, provider, peer, col):
        me, other = get(cell, provider, "loss+grad"), get(cell, peer, "loss+grad")
        if me is None or other is None or not _num(other[col]) > 0:
            return math.nan
        return _num(me[col]) / _num(other[col])

    def over_grads(cell, provider):
        me = get(cell, provider, "loss+grad")
        return math.nan if me is None else _num(me["peak_extra_mib"]) * 2**20 / grads_bytes(me)

    first = {}  # a row of each bf16 cell, for its shape
    for (cell, _, _), r in latest.items():
        if r["dtype"] == "bf16" and cell not in first:
            first[cell] = r
    cells = sorted(first, key=lambda c: (first[c]["dist"], int(first[c]["n"]), int(first[c]["d"]),
                                         int(first[c]["v"]), _num(first[c].get("softcap"))))
    counts: dict = {}

    def mark(name, value, ok, fmt="{:.2f}"):
        """The value, ✗ where it misses; counted under `name` when it is measured."""
        if not math.isfinite(value):
            return "–"
        met, total = counts.get(name, (0, 0))
        counts[name] = (met + bool(ok), total + 1)
        return fmt.format(value) + ("" if ok else " ✗")

    def loss_mib(cell, r):
        """own's loss-phase memory; the 1 MiB target is for the Gemma 2 (2B) shape only."""
        loss = get(cell, "own", "loss")
        mib = _num(loss["peak_extra_mib"]) if loss else math.nan
        gemma = all(_num(r.get(k)) == float(GEMMA2_2B[k]) for k in ("n", "d", "v", "softcap"))
        if gemma:
            return mark("loss", mib, mib <= LOSS_MIB_MAX)
        return f"{mib:.2f}" if math.isfinite(mib) else "–"

    head = ["dist", "N", "D", "V", "softcap", "fwd ×floor", "own ×floor", "own_filter ÷ apple_cce",
            "own_filter ÷ torch_compile (time / MiB)", "MiB ÷ grads own / own_low_memory",
            "err ÷ naive own / own_filter / own_low_memory", "loss MiB own (target at Gemma)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        r = first[c]
        softcap = _num(r.get("softcap"))
        fwd = get(c, "own", "fwd")
        exact = get(c, "own", "loss+grad")
        fwd_x = _num(fwd["floor_ratio"]) if fwd else math.nan
        exact_x = _num(exact["floor_ratio"]) if exact else math.nan
        vs_apple = ratio(c, "own_filter", "apple_cce", "ms")
        t_tc, m_tc = ratio(c, "own_filter", "torch_compile", "ms"), ratio(
            c, "own_filter", "torch_compile", "peak_extra_mib")
        if r["dist"] == "lm" and math.isfinite(t_tc) and math.isfinite(m_tc):
            vs_tc = mark("filter_tc", t_tc, t_tc <= FILTER_TIME_MAX and m_tc <= FILTER_MIB_MAX,
                         "{:.2f}") + f" / {m_tc:.2f}"
        else:
            vs_tc = "–"  # the target is for lm inputs
        loss = get(c, "own", "loss")
        cols = [r["dist"], r["n"], r["d"], r["v"],
                f"{softcap:g}" if math.isfinite(softcap) and softcap > 0 else "–",
                mark("fwd", fwd_x, fwd_x <= FWD_MAX),
                mark("exact", exact_x, exact_x <= EXACT_MAX),
                mark("apple", vs_apple, vs_apple < 1),
                vs_tc,
                " / ".join(mark(f"grads {p}", x, x <= GRADS_RATIO, "{:.3f}") for p, x in
                           (("own", over_grads(c, "own")),
                            ("own_low_memory", over_grads(c, "own_low_memory")))),
                " / ".join(mark(f"err {p}", x, x <= bound) for p, bound in
                           (("own", EXACT_ERR_MAX), ("own_filter", FILTER_ERR_MAX),
                            ("own_low_memory", EXACT_ERR_MAX)) for x in [err_ratio(c, p)]),
                loss_mib(c, r)]
        lines.append("| " + " | ".join(cols) + " |")

    def count(name, what):
        met, total = counts.get(name, (0, 0))
        return f"- {what}: {met} of {total} cells"

    lines += ["", count("fwd", f"forward ≤ {FWD_MAX:.2f}× floor (own)"),
              count("exact", f"loss+grad, exact, ≤ {EXACT_MAX:.2f} floors (own)"),
              count("filter_tc", f"own_filter ≤ torch_compile's time at ≤ {FILTER_MIB_MAX:g}× its "
                                 f"memory (lm inputs)"),
              count("apple", "own_filter faster than apple_cce"),
              count("grads own", f"loss+grad memory ≤ {GRADS_RATIO:.2f}× the gradients (own)"),
              count("grads own_low_memory",
                    f"loss+grad memory ≤ {GRADS_RATIO:.2f}× the gradients (own_low_memory)"),
              count("err own", f"dE and dC errors ≤ {EXACT_ERR_MAX:g}× naive's (own)"),
              count("err own_filter", f"dE and dC errors ≤ {FILTER_ERR_MAX:g}× naive's (own_filter)"),
              count("err own_low_memory", f"dE and dC errors ≤ {EXACT_ERR_MAX:g}× naive's "
                                          f"(own_low_memory)"),
              count("loss", f"loss memory ≤ {LOSS_MIB_MAX:g} MiB (own, Gemma 2 (2B) shape)")]
    return "\n".join(lines)


def grads_bytes(row) -> int:
    """Bytes of the gradients a loss+grad call returns: dE (N x D), dC (V x D), dbias (V)."""
    n, d, v = int(row["n"]), int(row["d"]), int(row["v"])
    bias = str(row.get("bias", "0")) in ("1", "True", "true")
    return ((n + v) * d + (v if bias else 0)) * DTYPE_BYTES[row["dtype"]]


def env_line(run_dir) -> str:
    path = Path(run_dir) / ENV_NAME
    if not path.exists():
        return ""
    env = json.loads(path.read_text())
    where = env.get("gpu_name") or f"CPU ({env.get('cpu', '?')}), not GPU numbers"
    commit = (env.get("git_commit") or "unknown")[:10]
    line = (f"Measured on {where}, torch {env.get('torch')}, triton {env.get('triton')}, "
            f"CUDA {env.get('cuda')}, liger-kernel {env.get('liger_kernel')}, cut-cross-entropy "
            f"{env.get('cut_cross_entropy')}; commit {commit}, {env.get('date', '')[:10]}.")
    later = remeasured(run_dir, env)
    return line + (f" Re-measured since: {later}." if later else "")


def remeasured(run_dir, first_env: dict) -> str:
    """Which providers' latest rows come from a later session than env.json's (a resumed run
    with --rerun), with that session's commit and date: '' when none do."""
    from suite.reproduce import read_envs

    envs = {e.get("run_id"): e for e in read_envs(run_dir)}
    latest: dict[str, str] = {}
    for row in read_rows(run_dir):
        latest[row["provider"]] = row.get("run_id")
    by_session: dict[str, list[str]] = {}
    for provider, run_id in latest.items():
        env = envs.get(run_id)
        if env is None or run_id == first_env.get("run_id"):
            continue
        key = f"commit {(env.get('git_commit') or 'unknown')[:10]}, {env.get('date', '')[:10]}"
        by_session.setdefault(key, []).append(provider)
    return "; ".join(f"{', '.join(sorted(ps))} at {key}" for key, ps in sorted(by_session.items()))


def remeasured_train(run_dir, chosen: list[dict]) -> str:
    """' Re-measured since: ...' for the chosen training rows of run_dir that a later session
    wrote (its env-<k>.json has their run_id): '' when none did."""
    from suite.reproduce import read_envs

    envs = read_envs(run_dir)
    later = {e.get("run_id"): e for e in envs[1:] if e.get("run_id")}
    by_session: dict[str, set] = {}
    for row in chosen:
        env = later.get(row.get("run_id"))
        if env is None or row.get("source") != Path(run_dir).as_posix():
            continue
        key = f"commit {(env.get('git_commit') or 'unknown')[:10]}, {env.get('date', '')[:10]}"
        by_session.setdefault(key, set()).add(row["backend"])
    if not by_session:
        return ""
    return " Re-measured since: " + "; ".join(
        f"{', '.join(sorted(bs))} at {key}" for key, bs in sorted(by_session.items())) + "."


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


# ---- training-step runs (suite.train) ------------------------------------------------------

# What seed 000 reports on an A100 (nvidia-smi, its own 50M model, batch 64 x 2048): Liger's CE
# took 16 GB off the step, selective CE then 11 GB more (30316 MB -> 19274 MB).
SEED000_TEXT = "seed 000 reports -16 GB, then -11 GB more, on an A100 (its own model and data)"
NOTE_CHARS = 160


def is_train_run(run_dir) -> bool:
    run_dir = Path(run_dir)
    return ((run_dir / results.TRAIN_BENCH_CSV).exists()
            or (run_dir / results.TRAIN_CONVERGENCE_CSV).exists())


def fmt_gib(mib) -> str:
    v = _num(mib) / 1024
    if math.isnan(v):
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def fmt_count(x) -> str:
    v = _num(x)
    return "–" if math.isnan(v) else f"{v:,.0f}"


def fmt_pct(x, signed=True) -> str:
    v = _num(x)
    if math.isnan(v):
        return "–"
    return f"{100 * v:+.3f} %" if signed else f"{100 * v:.3f} %"


def fmt_max_batch(row) -> str:
    """The searched largest batch; ">= cap" when the search stopped at --max-batch."""
    if not row.get("max_batch"):
        return "–"
    return f">= {row['max_batch']} (cap)" if row.get("max_batch_capped") == "1" else row["max_batch"]


def _note(name, row, status_col="status") -> str:
    text = " ".join((row.get("error") or "").split())
    text = text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS] + "..."
    return f"- {name}: {row[status_col]}" + (f": {text}" if text else "")


def _train_order(names) -> list[str]:
    """Backends in ORDER; selective+X right after X; others after, as they come."""
    def rank(name):
        base = name.removeprefix("selective+")
        i = ORDER.index(base) if base in ORDER else len(ORDER)
        return (i, base != name)

    return sorted(dict.fromkeys(names), key=rank)


def _by_setting(rows, key) -> list[list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k, "") for k in key), []).append(r)
    return sorted(groups.values(), key=lambda g: (g[0]["device"], _num(g[0]["vocab"])))


def seed000_comparison(rows: list[dict]) -> str:
    """Seed 000's steps in one setting: Liger CE's saving of the step's peak vs naive, then
    selective+liger_ce's further saving, when all three ran at one batch."""
    by = {r["backend"]: r for r in rows}
    steps = [by.get(b) for b in ("naive", "liger_ce", "selective+liger_ce")]
    vocab = rows[0]["vocab"]
    if not all(r and r["status"] == "ok" and r["peak_mib"] for r in steps) \
            or len({r["batch"] for r in steps}) != 1:
        return (f"Seed 000's steps at V = {vocab}: not measured (needs naive, liger_ce and "
                f"selective+liger_ce with status ok at one batch, with CUDA memory stats).")
    naive, liger, selective = steps
    liger_saves = (_num(naive["peak_mib"]) - _num(liger["peak_mib"])) / 1024
    selective_saves = (_num(liger["peak_mib"]) - _num(selective["peak_mib"])) / 1024
    return (f"Seed 000's steps at V = {vocab}, batch {naive['batch']} x {naive['seq_len']}: "
            f"Liger CE instead of naive CE saves {liger_saves:.1f} GiB of the step's peak "
            f"({fmt_gib(naive['peak_mib'])} -> {fmt_gib(liger['peak_mib'])} GiB); selecting the "
            f"labelled rows first (selective+liger_ce) saves {selective_saves:.1f} GiB more "
            f"(-> {fmt_gib(selective['peak_mib'])} GiB). For comparison, {SEED000_TEXT}.")


def train_bench_table(rows: list[dict], superseded: list[dict]) -> str:
    """One setting (a vocabulary): a row per backend, notes for failures, the superseded rows
    named (they stay in their CSVs), and seed 000's comparison."""
    first = next((r for r in rows if r["status"] == "ok"), rows[0])
    sources = list(dict.fromkeys(r["source"] for r in rows))
    batches = {r["batch"] for r in rows if r["status"] == "ok"}
    mixed = len(sources) > 1 or len(batches) > 1  # then each row names its batch and run
    ignored = _num(first.get("ignored_frac"))
    head = (f"**V = {first['vocab']}**: {_num(first['n_params']) / 1e6:.1f}M parameters "
            f"(d{first['d_model']} x {first['n_layer']} layers, {first['n_head']} heads), "
            + (f"batch {first['batch']} x {first['seq_len']} tokens" if not mixed
               else f"sequence length {first['seq_len']}")
            + (f", {ignored:.0%} of targets ignore_index" if not math.isnan(ignored) else "")
            + f", {'bf16 autocast' if first['dtype'] == 'bf16' else first['dtype']}, "
            f"{first['optimizer']}, {first['device']}; from "
            + ", ".join(f"`{s}`" for s in sources))
    cols = ["backend", "peak GiB", "loss GiB", "tokens/s", "largest batch"]
    if mixed:
        cols += ["batch", "run"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    notes = []
    by = {r["backend"]: r for r in rows}
    for name in _train_order(by):
        r = by[name]
        if r["status"] == "ok":
            cells = [name, fmt_gib(r["peak_mib"]), fmt_gib(r["loss_mib"]),
                     fmt_count(r["tokens_per_s"]), fmt_max_batch(r)]
        else:
            cells = [name, r["status"], "–", "–", fmt_max_batch(r)]
            notes.append(_note(name, r))
        if mixed:
            cells += [r["batch"] or "–", f"`{r['source']}`"]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += [""] + notes
    if superseded:
        by_source: dict[str, dict[str, list[str]]] = {}
        for r in superseded:
            by_source.setdefault(r["source"], {}).setdefault(r["status"], []).append(r["backend"])
        parts = ["; ".join(f"{status}: {', '.join(names)}" for status, names in statuses.items())
                 + f" (`{source}`)" for source, statuses in by_source.items()]
        lines += ["", "Not shown, superseded by the row above of each backend: "
                  + "; ".join(parts) + "."]
    lines += ["", seed000_comparison(rows)]
    return "\n".join(lines)


def train_convergence_table(rows: list[dict]) -> str:
    """One convergence setting: a row per training run with its verdict against naive CE."""
    first = rows[0]
    sources = list(dict.fromkeys(r["source"] for r in rows))
    head = (f"**Convergence parity**: V = {first['vocab']}, d{first['d_model']} x "
            f"{first['n_layer']} layers, sequence length {first['seq_len']}, batch "
            f"{first['batch']}, {first['steps']} steps, lr {first['lr']}, {first['device']}; "
            f"pass = the curve (mean of {first['smooth']} steps) stays within "
            f"{100 * _num(first['tol']):g} % of naive's after step {first['warmup_steps']} "
            f"and the final loss is within it too; tokens/s over the second half of training; "
            f"peak includes the run's whole token set, kept on the device; from "
            + ", ".join(f"`{s}`" for s in sources))
    lines = [head, "",
             "| run | backend | verdict | max deviation (step) | final loss | final vs naive "
             "| tokens/s | peak GiB |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        if r["verdict"] not in results.CONVERGENCE_DONE:
            notes.append(_note(r["run"], r, status_col="verdict"))
        dev = fmt_pct(r["max_rel_dev"], signed=False)
        if dev != "–" and r["max_rel_dev_step"]:
            dev += f" ({r['max_rel_dev_step']})"
        final = _num(r["final_loss"])
        lines.append("| " + " | ".join([
            r["run"], r["backend"], r["verdict"] or "–", dev,
            "–" if math.isnan(final) else f"{final:.4f}", fmt_pct(r["final_rel_diff"]),
            fmt_count(r["tokens_per_s"]), fmt_gib(r["peak_mib"])]) + " |")
    if notes:
        lines += [""] + notes
    return "\n".join(lines)


def render_train(run_dirs) -> str:
    """The training-step table of the folders (suite.train): per vocabulary and backend the row
    with status ok from the most recent run, seed 000's comparison, convergence verdicts."""
    run_dirs = [Path(d) for d in run_dirs]
    for d in run_dirs:
        if not is_train_run(d):
            raise ValueError(f"no {results.TRAIN_BENCH_CSV} or {results.TRAIN_CONVERGENCE_CSV} "
                             f"in {d}")
    bench, bench_old = results.train_bench_rows(run_dirs)
    conv, _ = results.train_convergence_rows(run_dirs)
    csvs = [(d / name).as_posix() for d in run_dirs
            for name in (results.TRAIN_BENCH_CSV, results.TRAIN_CONVERGENCE_CSV)
            if (d / name).exists()]
    command = " ".join(d.as_posix() for d in run_dirs)
    parts = [
        f"Generated by `python -m suite report {command} --update-readme` from "
        + ", ".join(f"[`{c}`]({c})" for c in csvs) + ". "
        "Per vocabulary and backend, the row with status ok from the most recent run (else the "
        "latest attempt). peak: `max_memory_allocated` over a whole training step (forward, "
        "loss, backward, clipping, AdamW); loss: the loss's own peak, measured in the same step "
        "split at the hidden states (logits, their gradient, dE, dC); tokens/s: all tokens of "
        "the batch over the median step time (CUDA events); largest batch: found by search "
        "(doubling, then bisection; \">= cap\" when it reached `--max-batch`). The bench "
        "starts from the random init (a nearly flat softmax), where gradient filtering "
        "(apple_cce, own_filter) skips more of the backward than in a trained model; the "
        "convergence table's tokens/s is the fairer number for them.",
        "\n".join(f"- `{d.as_posix()}`: {env_line(d) or 'no env.json'}"
                  + remeasured_train(d, bench + conv) for d in run_dirs)]
    key = [k for k in results.TRAIN_BENCH_KEY if k != "backend"]
    settings = _by_setting(bench, key)
    if not settings:
        parts.append(f"No {results.TRAIN_BENCH_CSV} rows in these folders.")
    for rows in settings:
        mine = {tuple(r[k] for k in key) for r in rows}
        old = [r for r in bench_old if tuple(r[k] for k in key) in mine]
        parts.append(train_bench_table(rows, old))
    conv_key = [k for k in results.TRAIN_CONVERGENCE_KEY if k != "run"]
    conv_settings = _by_setting(conv, conv_key)
    if not conv_settings:
        parts.append(f"No {results.TRAIN_CONVERGENCE_CSV} in these folders: no convergence "
                     f"verdicts.")
    parts += [train_convergence_table(rows) for rows in conv_settings]
    return "\n\n".join(parts)


def update_readme(text: str, section: str, readme=README) -> None:
    readme = Path(readme)
    start, end = f"<!-- results:{section}:start -->", f"<!-- results:{section}:end -->"
    doc = readme.read_text()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(doc):
        raise ValueError(f"{readme} has no '{start}' ... '{end}' markers")
    readme.write_text(pattern.sub(lambda _: f"{start}\n{text}\n{end}", doc))


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+",
                        help="a run folder holding results.csv (e.g. results/gemma2-2b-...), or "
                             "one or more training-step folders (train_bench.csv, "
                             "train_convergence.csv; e.g. results/train-h200 ...)")
    parser.add_argument("--update-readme", action="store_true",
                        help="rewrite README.md between the results:<section> markers")
    parser.add_argument("--versus", default=None, metavar="PROVIDER",
                        help="one comparison row per cell of PROVIDER against --peers, over "
                             "any number of run folders (e.g. results/grid-h200*)")
    parser.add_argument("--targets", action="store_true",
                        help="issue 3's targets for the own kernel, one row per bf16 cell, over "
                             "any number of run folders (README section targets)")
    parser.add_argument("--peers", default="apple_cce,torch_compile",
                        help="comma-separated providers for --versus (default: %(default)s)")
    parser.add_argument("--section", default=None,
                        help="README marker name (default: gemma2-2b; train for training runs)")


def _rows_of(folders) -> list[dict]:
    rows = []
    for d in folders:
        got = read_rows(d)
        if not got:
            raise ValueError(f"no results in {d}/results.csv")
        rows += got
    return rows


def _generated_by(args, options: str) -> str:
    folders = ", ".join(f"`{Path(d).as_posix()}`" for d in args.results)
    return (f"Generated by `python -m suite report {' '.join(Path(d).as_posix() for d in args.results)}"
            f"{options}{f' --section {args.section}' if args.section else ''}"
            f"{' --update-readme' if args.update_readme else ''}` from {folders}.")


def _print_and_update(args, text: str, default_section: str) -> int:
    if args.update_readme:
        update_readme(text, args.section or default_section)
    print(text)
    if args.update_readme:
        print(f"\nreport: README.md section '{args.section or default_section}' updated")
    return 0


def _versus_main(args) -> int:
    peers = [p for p in args.peers.split(",") if p]
    if not peers:
        raise ValueError("--peers: expected comma-separated provider names, got nothing")
    rows = _rows_of(args.results)
    text = (_generated_by(args, f" --versus {args.versus} --peers {','.join(peers)}")
            + f" Loss+gradient phase; a ratio below 1 means {args.versus} is faster / smaller.\n\n"
            + versus_table(rows, args.versus, peers))
    return _print_and_update(args, text, "versus")


def _targets_main(args) -> int:
    rows = _rows_of(args.results)
    text = (_generated_by(args, " --targets")
            + " bf16 cells; times over the floor (one cuBLAS E @ C.T of the cell's shape, timed in "
              "the same run); ratios are own_filter's loss+grad time or memory over the peer's; "
              "MiB ÷ grads is the loss+grad peak over dE + dC (+ dbias); err ÷ naive is the larger "
              "of the dE and dC errors over the naive baseline's; ✗ marks a value that misses its "
              "bound, – one not measured.\n\n"
            + targets_table(rows))
    return _print_and_update(args, text, "targets")


def main(args) -> int:
    train = [d for d in args.results if is_train_run(d)]
    try:
        if args.versus and args.targets:
            raise ValueError("give --versus or --targets, not both")
        if args.versus:
            return _versus_main(args)
        if args.targets:
            return _targets_main(args)
        if train and len(train) != len(args.results):
            other = [d for d in args.results if d not in train]
            raise ValueError(f"mix of training-step folders and other folders: "
                             f"{', '.join(other)} hold no train_bench.csv / train_convergence.csv")
        if not train and len(args.results) > 1:
            raise ValueError("give one run folder holding results.csv (several folders: only "
                             "training-step runs)")
        section = args.section or ("train" if train else "gemma2-2b")
        text = render_train(args.results) if train else render(args.results[0])
        if args.update_readme:
            update_readme(text, section)
    except (ValueError, FileNotFoundError) as err:
        print(f"report: {err}")
        return 1
    print(text)
    if args.update_readme:
        print(f"\nreport: README.md section '{section}' updated")
    return 0
