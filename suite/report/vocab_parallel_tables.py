"""The vocab-parallel tables: per shape, the own kernel's rows on one GPU next to its rows with C
sharded over K ranks of the same host (``bench --vocab-parallel K``).

    from suite.report.vocab_parallel_tables import vocab_parallel_section
    text = vocab_parallel_section("results/<run>-2xh100")   # markdown, or "" without rows

The run folder holds ``vp/<shape>-single`` and ``vp/<shape>-vp<K>`` bench folders (the GPU
commands in results/notes/vocab-parallel.md). Per (cell, provider, phase): time of each, the
ratio (sharded / single: below 1 is faster), peak memory beyond the inputs (the sharded one per
rank, the max over ranks) and its ratio, and the sharded rows' errors. A row that failed shows
its status.
"""
from __future__ import annotations

from pathlib import Path

from suite import results
from suite.report.envs import env_line, read_envs
from suite.report.formatting import fmt_err, fmt_mib, fmt_ms, fmt_ratio, md_table

PROVIDERS = ("own", "own_filter", "own_low_memory")


def run_pairs(run_dir) -> list[tuple[str, Path, Path, int]]:
    """(shape, single folder, sharded folder, K) of each shape with both folders."""
    vp = Path(run_dir) / "vp"
    pairs = []
    for single in sorted(vp.glob("*-single")):
        shape = single.name[:-len("-single")]
        for sharded in sorted(vp.glob(f"{shape}-vp*")):
            k = sharded.name[len(shape) + 3:]
            if k.isdigit():
                pairs.append((shape, single, sharded, int(k)))
    return pairs


def _cell_text(r: dict) -> str:
    return (f"N {r['n']}, D {r['d']}, V {r['v']}, {r['dtype']}, {r['dist']}"
            + (f", softcap {r['softcap']}" if r.get("softcap") not in ("", "none", None) else ""))


def _line(one: dict | None, many: dict) -> list[str]:
    if many["status"] != "ok" or one is None or one["status"] != "ok":
        bad = many if many["status"] != "ok" else one
        status = bad["status"] if bad else "no single-GPU row"
        return [many["provider"], many["phase"], status, "", "", "", "", "", "", "", ""]
    return [many["provider"], many["phase"], fmt_ms(one["ms"]), fmt_ms(many["ms"]),
            fmt_ratio(many["ms"], one["ms"]), fmt_mib(one["peak_extra_mib"]),
            fmt_mib(many["peak_extra_mib"]),
            fmt_ratio(many["peak_extra_mib"], one["peak_extra_mib"]),
            fmt_err(many.get("loss_rel_err")),
            f"{fmt_err(one.get('de_rel_err'))} → {fmt_err(many.get('de_rel_err'))}",
            fmt_err(many.get("dc_rel_err"))]


def shape_table(single: Path, sharded: Path, k: int) -> str:
    ones = {(r["cell_id"], r["provider"], r["phase"]): r for r in results.read_rows(single)}
    manys = [r for r in results.read_rows(sharded) if r["provider"] in PROVIDERS]
    header = ["provider", "phase", "ms, 1 GPU", f"ms, {k} ranks", "ratio",
              "peak extra, 1 GPU", f"per rank, {k} ranks", "ratio", "loss rel err",
              f"dE rel err, 1 GPU → {k} ranks", "dC rel err"]
    blocks = []
    for cell_id in dict.fromkeys(r["cell_id"] for r in manys):
        rows = [r for r in manys if r["cell_id"] == cell_id]
        body = [_line(ones.get((cell_id, r["provider"], r["phase"])), r) for r in rows]
        blocks.append(f"{_cell_text(rows[0])}\n\n{md_table(header, body)}")
    return "\n\n".join(blocks)


def vocab_parallel_section(run_dir) -> str:
    """Markdown: a table per shape of ``run_dir``'s vocab-parallel rows; "" when it has none."""
    pairs = run_pairs(run_dir)
    if not pairs:
        return ""
    parts = [f"### Vocabulary sharded over GPUs ({Path(run_dir).name})", ""]
    for shape, single, sharded, k in pairs:
        parts += [f"#### {shape}, {k} ranks", "", from_line(single), "", from_line(sharded), "",
                  shape_table(single, sharded, k), ""]
    return "\n".join(parts)


# ---- the multi-GPU training step (suite/train/distributed.py's results.csv) ------------------

TRAIN_DIR = "train-2gpu"
# a largest-batch search's folder (suite.train.distributed --max-batch)
MAX_BATCH_SUFFIX = "-maxbatch"


def train_dirs(run_dir) -> list[str]:
    """The training-step folders of a multi-GPU run (``train-*`` with a results.csv), by name:
    each step's folder (e.g. train-k1, train-k2) before its largest-batch search's."""
    return sorted(p.name for p in Path(run_dir).glob("train-*") if (p / "results.csv").exists())

TRAIN_HEADER = ["config", "GPUs", "lm_head", "batch per rank x seq", "step ms (p20–p80)",
                "tokens/s", "peak MiB per rank", "final loss", "parity against", "verdict"]


def _optional_columns(rows: list[dict]) -> list[tuple[str, callable]]:
    """Columns of the runs that recorded them: host syncs (the probe step) and the largest
    batch found (the --max-batch search)."""
    cols = []
    if any(r.get("host_syncs_per_step") for r in rows):
        cols.append(("host syncs / step (wait ms)", lambda r: (
            f"{r['host_syncs_per_step']} ({float(r['host_sync_wait_ms'] or 'nan'):.2f})"
            if r.get("host_syncs_per_step") else "–")))
    if any(r.get("largest_batch_per_rank") for r in rows):
        cols.append(("largest batch per rank (tokens/s there)", lambda r: (
            f"{r['largest_batch_per_rank']} ({float(r['largest_batch_tokens_per_s']):,.0f}), "
            f"stop: {r['max_batch_stop']}" if r.get("largest_batch_per_rank") else "–")))
    return cols


def _train_line(r: dict) -> list[str]:
    if r["status"] != "ok":
        return [f"`{r['config']}`", r["world_size"], "", "", r["status"], "", "", "", "",
                (r.get("error") or "")[:80]]
    head = ("vocab-sharded (ColwiseParallel)" if r["tp_head"] == "1"
            else "FSDP2, its own unit" if r.get("head_unit") == "1" else "FSDP2 / plain")
    return [f"`{r['config']}`", r["world_size"], head, f"{r['batch_per_rank']} x {r['seq_len']}",
            f"{fmt_ms(r['ms'])} ({fmt_ms(r['ms_p20'])}–{fmt_ms(r['ms_p80'])})",
            f"{float(r['tokens_per_s']):,.0f}", r["peak_mib_per_rank"].replace(";", " / "),
            f"{float(r['final_loss']):.4f}", r["parity_ref"] or "–", r["verdict"]]


def training_table(run_dir, folder: str = TRAIN_DIR) -> str:
    """Markdown: one row per training configuration of ``run_dir/<folder>`` (world size, head,
    step time with its p20–p80, tokens/s, peak per rank, loss parity, and where recorded the
    host syncs and the largest batch); "" when there is none."""
    path = Path(run_dir) / folder
    if not (path / "results.csv").exists():
        return ""
    rows = results.read_train_csv(path, "results.csv")
    extra = _optional_columns(rows)
    body = [_train_line(r) + [fmt(r) for _, fmt in extra] for r in rows]
    first = rows[0]
    worlds = sorted({int(r["world_size"]) for r in rows})
    gpus = " and ".join(str(w) for w in worlds)
    gpu = next((env.get("gpu_name", "") for env in read_envs(path)), "")
    title = (f"### Training step on {gpus} GPU{'s' if worlds != [1] else ''}"
             f"{f' ({gpu})' if gpu else ''}: {first['model']}, "
             f"{int(first['n_params']) / 1e9:.2f}B parameters, V {first['vocab']}, "
             f"{first['steps']} steps, {first['global_tokens']} tokens a step"
             f"{', largest-batch search' if folder.endswith(MAX_BATCH_SUFFIX) else ''}")
    return (f"{title}\n\n{from_line(path)}\n\n"
            f"{md_table(TRAIN_HEADER + [h for h, _ in extra], body)}")


def is_multi_gpu_run(run_dir) -> bool:
    return (Path(run_dir) / "vp").is_dir() or bool(train_dirs(run_dir))


def from_line(folder: Path) -> str:
    """Where a sub-run of a multi-GPU run was measured: its folder, GPU, versions, commit, date."""
    path = Path(folder).as_posix()
    return f"From [`{path}`]({path}/results.csv): {env_line(folder)}"


def multi_gpu_text(run_dir, command: str | None = None) -> str:
    """The run's vocab-parallel and training tables, each under the folder it was read from,
    all under the command that prints them again."""
    parts = [f"Generated by `{command}`." if command else ""]
    parts += [vocab_parallel_section(run_dir)] + [training_table(run_dir, d)
                                                  for d in train_dirs(run_dir)]
    return "\n\n".join(t for t in parts if t)
