"""The training-step tables (suite.train's train_bench.csv and train_convergence.csv): per
vocabulary a row per backend, and the convergence verdicts against naive CE."""
from __future__ import annotations

import math
from pathlib import Path

from suite import results
from suite.report.curated import rename_train_rows
from suite.report.envs import env_line, remeasured_train
from suite.report.formatting import fmt_count, fmt_gib, fmt_pct, num
from suite.report.kernel_tables import ORDER

NOTE_CHARS = 160


def is_train_run(run_dir) -> bool:
    run_dir = Path(run_dir)
    return ((run_dir / results.TRAIN_BENCH_CSV).exists()
            or (run_dir / results.TRAIN_CONVERGENCE_CSV).exists())


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
    return sorted(groups.values(), key=lambda g: (g[0]["device"], num(g[0]["vocab"])))


def liger_selective_comparison(rows: list[dict]) -> str:
    """The steps of one setting: Liger CE's saving of the step's peak vs naive, then
    selective+liger_ce's further saving, when all three ran at one batch."""
    by = {r["backend"]: r for r in rows}
    steps = [by.get(b) for b in ("naive", "liger_ce", "selective+liger_ce")]
    vocab = rows[0]["vocab"]
    if not all(r and r["status"] == "ok" and r["peak_mib"] for r in steps) \
            or len({r["batch"] for r in steps}) != 1:
        return (f"Liger CE and row selection at V = {vocab}: not measured (needs naive, liger_ce and "
                f"selective+liger_ce with status ok at one batch, with CUDA memory stats).")
    naive, liger, selective = steps
    liger_saves = (num(naive["peak_mib"]) - num(liger["peak_mib"])) / 1024
    selective_saves = (num(liger["peak_mib"]) - num(selective["peak_mib"])) / 1024
    return (f"Liger CE and row selection at V = {vocab}, batch {naive['batch']} x {naive['seq_len']}: "
            f"Liger CE instead of naive CE saves {liger_saves:.1f} GiB of the step's peak "
            f"({fmt_gib(naive['peak_mib'])} -> {fmt_gib(liger['peak_mib'])} GiB); selecting the "
            f"labelled rows first (selective+liger_ce) saves {selective_saves:.1f} GiB more "
            f"(-> {fmt_gib(selective['peak_mib'])} GiB).")


def train_bench_table(rows: list[dict], superseded: list[dict]) -> str:
    """One setting (a vocabulary): a row per backend, notes for failures, the superseded rows
    named (they stay in their CSVs), and Liger CE's and row selection's savings."""
    first = next((r for r in rows if r["status"] == "ok"), rows[0])
    sources = list(dict.fromkeys(r["source"] for r in rows))
    batches = {r["batch"] for r in rows if r["status"] == "ok"}
    mixed = len(sources) > 1 or len(batches) > 1  # then each row names its batch and run
    ignored = num(first.get("ignored_frac"))
    head = (f"**V = {first['vocab']}**: {num(first['n_params']) / 1e6:.1f}M parameters "
            f"(d{first['d_model']} x {first['n_layer']} layers, {first['n_head']} heads), "
            + (f"batch {first['batch']} x {first['seq_len']} tokens" if not mixed
               else f"sequence length {first['seq_len']}")
            + (f", {ignored:.0%} of targets ignore_index" if not math.isnan(ignored) else "")
            + f", {'bf16 autocast' if first['dtype'] == 'bf16' else first['dtype']}, "
            f"{first['optimizer']}, {first['device']}; from "
            + ", ".join(f"`{s}`" for s in sources))
    cols = ["backend", "peak GiB", "loss GiB", "tokens/s", "largest batch"]
    paths = any(r.get("loss_path") for r in rows)  # runs since the step bench records it
    if paths:
        cols.append("own kernel's path")
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
        if paths:
            cells.append(r.get("loss_path") or "–")
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
    lines += ["", liger_selective_comparison(rows)]
    return "\n".join(lines)


def train_convergence_table(rows: list[dict]) -> str:
    """One convergence setting: a row per training run with its verdict against naive CE."""
    first = rows[0]
    sources = list(dict.fromkeys(r["source"] for r in rows))
    head = (f"**Convergence parity**: V = {first['vocab']}, d{first['d_model']} x "
            f"{first['n_layer']} layers, sequence length {first['seq_len']}, batch "
            f"{first['batch']}, {first['steps']} steps, lr {first['lr']}, {first['device']}; "
            f"pass = the curve (mean of {first['smooth']} steps) stays within "
            f"{100 * num(first['tol']):.3g} % of the reference's (its range over +-"
            f"{first.get('shift_steps') or 0} steps) after step {first['warmup_steps']} "
            f"(the wider of --tol and 1.5 times the reference rerun's spread, the noise floor) "
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
        final = num(r["final_loss"])
        lines.append("| " + " | ".join([
            r["run"], r["backend"], r["verdict"] or "–", dev,
            "–" if math.isnan(final) else f"{final:.4f}", fmt_pct(r["final_rel_diff"]),
            fmt_count(r["tokens_per_s"]), fmt_gib(r["peak_mib"])]) + " |")
    if notes:
        lines += [""] + notes
    return "\n".join(lines)


def render_train(run_dirs, command: str | None = None) -> str:
    """The training-step table of the folders (suite.train): per vocabulary and backend the row
    with status ok from the most recent run, Liger CE's and row selection's savings, convergence verdicts."""
    run_dirs = [Path(d) for d in run_dirs]
    for d in run_dirs:
        if not is_train_run(d):
            raise ValueError(f"no {results.TRAIN_BENCH_CSV} or {results.TRAIN_CONVERGENCE_CSV} "
                             f"in {d}")
    bench, bench_old = map(rename_train_rows, results.train_bench_rows(run_dirs))
    conv = rename_train_rows(results.train_convergence_rows(run_dirs)[0])
    csvs = [(d / name).as_posix() for d in run_dirs
            for name in (results.TRAIN_BENCH_CSV, results.TRAIN_CONVERGENCE_CSV)
            if (d / name).exists()]
    command = command or "python -m suite report " + " ".join(d.as_posix() for d in run_dirs)
    parts = [
        f"Generated by `{command}` from "
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


def train_headline(run_dirs, command: str) -> str:
    """The README's training-step summary of Hugging Face (or GPT) folders: per model, each
    backend's whole-step peak and its saving over the reference's at the common batch, its
    largest batch, tokens/s and convergence verdict."""
    run_dirs = [Path(d) for d in run_dirs]
    bench = rename_train_rows(results.train_bench_rows(run_dirs)[0])
    conv = rename_train_rows(results.train_convergence_rows(run_dirs)[0])
    verdicts = {(r["model"], r["run"]): r["verdict"] for r in conv}
    lines = [f"Generated by `{command}`. Whole training step (forward, loss, backward, AdamW) at "
             f"the reference's largest power-of-two batch, bf16 autocast; saved: the reference's "
             f"peak minus the backend's; convergence: against the model's own loss (its rerun "
             f"is the noise floor).", "",
             "| model | params | backend | step peak GiB | saved GiB | largest batch | tokens/s "
             "| convergence |", "|---|---|---|---|---|---|---|---|"]
    for rows in _by_setting(bench, [k for k in results.TRAIN_BENCH_KEY if k != "backend"]):
        model = rows[0]["model"]
        ref = next((r for r in rows if r["backend"] in ("hf_loss", "naive")), None)
        for r in sorted(rows, key=lambda r: r is not ref):
            if r["status"] != "ok":
                continue
            saved = (fmt_gib(num(ref["peak_mib"]) - num(r["peak_mib"]))
                     if ref is not None and r is not ref else "–")
            lines.append(f"| {model} (V {r['vocab']}, batch {r['batch']}) | "
                         f"{num(r['n_params']) / 1e9:.2f}B | "
                         f"`{r['backend']}` | {fmt_gib(r['peak_mib'])} | {saved} | "
                         f"{fmt_max_batch(r)} x {r['seq_len']} | {fmt_count(r['tokens_per_s'])} | "
                         f"{verdicts.get((model, r['backend']), '–')} |")
    not_ok = sorted({f"{r['backend']} ({r['status']})" for r in bench if r["status"] != "ok"})
    if not_ok:
        lines += ["", "Not run: " + ", ".join(not_ok) + "."]
    by_env: dict[str, list[Path]] = {}  # folders measured alike share one line
    for d in run_dirs:
        by_env.setdefault(env_line(d), []).append(d)
    for line, folders in by_env.items():
        named = ", ".join(f"[`{d.as_posix()}`]({d.as_posix()}/{results.TRAIN_BENCH_CSV})"
                          for d in folders)
        lines += ["", f"From {named}: {line}"]
    return "\n".join(lines)
