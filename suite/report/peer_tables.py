"""The peers as a user finds them, from one peer run folder (suite/kernel/peers_gpu.sh writes
it): who has what, and the RL head's table.

    python -m suite report results/peers-2026-h100 --who-has-what   # RESULTS.md: who has what
    python -m suite report results/peers-2026-h100 --rl             # RESULTS.md: the RL head
    python -m suite report results/peers-2026-h100 --peer-list      # the README's peers
    python -m suite report results/multigpu-2xh200-2 --tensor-parallel  # Liger's TP kernel

The folder holds the bench's loss+grad cells (results.csv) and the RL tool's rows (rl/rl.csv:
``python -m suite kernel rl``); both tables read only what those runs wrote (and the registry's
names). A peer's cell gives its time and memory and its verdict against the own kernel's row
of the same cell (suite.report.verdict's rule); where a peer is faster, the lines under the
table say by how much.
"""
from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from suite import results
from suite.report.curated import read_run_rows
from suite.report.envs import env_line, peer_versions
from suite.report.formatting import fmt_err, fmt_mib, fmt_ms, latest_rows, md_table, num
from suite.report.kernel_tables import provider_order
from suite.report.verdict import FASTER, RULE_TEXT, time_verdict
from suite.report.vocab_parallel_tables import from_line

RL_FOLDER = "rl"
PROBE = "verl-probe.json"
OWN = "own"                   # the bench rows' reference: the own kernel as a user calls it
OWN_RL = "own_logp_entropy"   # the RL rows' reference: the own kernel's log-prob + entropy call
# each provider's method in the RL tool (its log-prob function); others have none there
RL_METHOD_OF = {"own": OWN_RL, "liger_flce": "liger_flce_logp",
                "liger_scaled_ce": "liger_scaled_ce", "verl_lce": "verl_lce",
                "liger_scaled_ce_tp": "liger_scaled_ce_tp"}
MEASURE_WITH = "bash suite/kernel/peers_gpu.sh"
# how the suite installs the peers (the README's sentence; the notes say more)
INSTALLED_AS = ("**Peers as their users install them**: Apple's `cut-cross-entropy` from its "
                "repository (the PyPI release stays measurable as `apple_cce_pypi`), QuACK and "
                "Liger's CuTe backend in a virtual environment, verl's kernel without verl's own "
                "dependencies; `python -m suite list` shows each peer's version or the line that "
                "installs it, `env.json` what a run measured "
                "([`results/notes/peers.md`](results/notes/peers.md)).")


def _not_yet(what: str, folder: str) -> str:
    """The sentence a table prints in place of rows its folder does not hold yet."""
    return (f"No {what} in [`{folder}`]({folder}) yet: measure it with `{MEASURE_WITH}` (its "
            f"header gives the device calls).")


def read_rl_rows(run_dir) -> list[dict]:
    """RUN/rl/rl.csv's rows, [] when absent."""
    path = Path(run_dir) / RL_FOLDER / "rl.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if None not in r.values()]


def _rl_as_bench(row) -> dict:
    """An RL row with the bench's time keys, so suite.report.verdict compares it."""
    return dict(row, ms=row.get("ms_median"))


def _shape_title(row) -> str:
    return f"N {row['n']} D {row['d']} V {row['v']}"


def _cells(rows) -> list[tuple[str, str]]:
    """(cell_id, title) of the loss+grad cells, in the order the run measured them."""
    seen = {}
    for r in rows:
        if r["phase"] == "loss+grad" and r["cell_id"] not in seen:
            softcap = f", softcap {num(r['softcap']):g}" if r.get("softcap") else ""
            seen[r["cell_id"]] = f"loss+grad, {_shape_title(r)}{softcap}"
    return list(seen.items())


def _timed_text(row, own_row, mib_key="peak_extra_mib", ms_key="ms") -> str:
    """'ms, MiB (verdict against own)' of an ok row; its status otherwise."""
    if row is None:
        return "–"
    if row["status"] != "ok":
        return row["status"]
    verdict = time_verdict(row, own_row) if own_row is not None else None
    mib = fmt_mib(row.get(mib_key))
    return (f"{fmt_ms(row.get(ms_key))} ms, {mib} MiB" if mib != "–" else
            f"{fmt_ms(row.get(ms_key))} ms") + (f", {verdict}" if verdict else "")


def _outputs(method_rows) -> str:
    """What a provider's RL method returned: log-probs, entropy (their errors were finite)."""
    if not method_rows:
        return "loss only"
    ok = [r for r in method_rows if r["status"] == "ok"]
    if not ok:
        return method_rows[0]["status"]
    logp = any(math.isfinite(num(r["logp_max_abs_err"])) for r in ok)
    entropy = any(math.isfinite(num(r["entropy_max_abs_err"])) for r in ok)
    return " + ".join(n for n, has in (("log-prob", logp), ("entropy", entropy)) if has) or "–"


class _Run:
    """One peer run folder's rows, indexed the way the tables read them."""

    def __init__(self, run_dir):
        self.dir = Path(run_dir)
        bench = [r for r in read_run_rows(run_dir) if r["phase"] == "loss+grad"]
        self.latest = {(c, p): r for (c, p, _), r in latest_rows(bench).items()}
        self.cells = _cells(bench)
        self.rl = read_rl_rows(run_dir)
        self.rl_models = list(dict.fromkeys(r["model"] for r in self.rl))
        self.providers = provider_order(bench) if bench else []
        for method in dict.fromkeys(r["method"] for r in self.rl):
            provider = next((p for p, m in RL_METHOD_OF.items() if m == method), None)
            if provider and provider not in self.providers:
                self.providers.append(provider)

    def rl_row(self, model, method):
        return next((r for r in self.rl if r["model"] == model and r["method"] == method), None)

    def ran(self, provider) -> str:
        """What the provider reported it ran; a module's folder from its package on, not from
        the measuring machine's site-packages."""
        texts = [r.get("ran") for (_, p), r in self.latest.items() if p == provider]
        method = RL_METHOD_OF.get(provider)
        texts += [r.get("ran") for r in self.rl if r["method"] == method]
        return re.sub(r"\S*/site-packages/", "", next((t for t in texts if t), ""))


def _who_rows(run: _Run) -> list[list[str]]:
    body = []
    for p in run.providers:
        method = RL_METHOD_OF.get(p)
        line = [f"`{p}`", _outputs([r for r in run.rl if r["method"] == method] if method
                                   else [])]
        versus = p != OWN  # the own rows are what the others are compared with
        line += [_timed_text(run.latest.get((c, p)), run.latest.get((c, OWN)) if versus else None)
                 for c, _ in run.cells]
        line += [_timed_text(_rl_as_bench(r) if (r := run.rl_row(m, method)) else None,
                             _rl_as_bench(o) if versus and (o := run.rl_row(m, OWN_RL)) else None)
                 if method else "–" for m in run.rl_models]
        body.append(line)
    return body


def _faster_lines(run: _Run) -> list[str]:
    """A line per (peer, cell) where the peer is faster than the own kernel, with by how much."""
    lines = []

    def add(p, where, mine, own, own_name):
        if time_verdict(mine, own) == FASTER:
            ratio = num(own["ms"]) / num(mine["ms"])
            lines.append(f"`{p}` is faster than `{own_name}` at {where}: {fmt_ms(mine['ms'])} "
                         f"against {fmt_ms(own['ms'])} ms (the own kernel takes {ratio:.2f}x "
                         f"its time)")

    for p in run.providers:
        if p.startswith("own"):
            continue
        for c, title in run.cells:
            if (mine := run.latest.get((c, p))) and (own := run.latest.get((c, OWN))):
                add(p, title, mine, own, OWN)
        method = RL_METHOD_OF.get(p)
        for m in run.rl_models if method else []:
            mine, own = run.rl_row(m, method), run.rl_row(m, OWN_RL)
            if mine and own:
                add(p, f"the RL step at {m} ({_shape_title(mine)})", _rl_as_bench(mine),
                    _rl_as_bench(own), OWN_RL)
    return lines


def _not_run_lines(run: _Run) -> list[str]:
    lines = []
    for (c, p), r in run.latest.items():
        if r["status"] != "ok":
            title = dict(run.cells).get(c, c)
            lines.append(f"`{p}` at {title}: {r['status']} ({' '.join(r['error'].split())})")
    for r in run.rl:
        if r["status"] != "ok":
            lines.append(f"`{r['method']}` in the RL step at {r['model']}: {r['status']}"
                         + (f" ({r['note']})" if r.get("note") else ""))
    return lines


def who_has_what(run_dir, command: str) -> str:
    """The who-has-what table of a peer run folder (a sentence when it holds no rows yet)."""
    run = _Run(run_dir)
    where = Path(run_dir).as_posix()
    if not run.providers:
        return f"Generated by `{command}`. {_not_yet('peer run', where)}"
    header = (["provider", "per-token outputs"] + [t for _, t in run.cells]
              + [f"RL step (log-prob + entropy + backward), {m}" for m in run.rl_models])
    text = (f"Generated by `{command}`. From [`{where}`]({where}/results.csv) and "
            f"[`{where}/{RL_FOLDER}`]({where}/{RL_FOLDER}/rl.csv): {env_line(run_dir)} "
            f"Each cell: median ms, peak MiB beyond the inputs, and "
            f"the verdict against `{OWN}` (loss+grad) or `{OWN_RL}` (RL step) of the same run: "
            f"{RULE_TEXT}. Per-token outputs: what the provider's log-prob function returned "
            f"in the RL step (`loss only`: it has none).\n\n"
            + md_table(header, _who_rows(run)))
    ran = [f"`{p}`: {t}" for p in run.providers if (t := run.ran(p))]
    for title, lines in (("What ran (each provider's own report)", ran),
                         ("Faster than the own kernel", _faster_lines(run)),
                         ("Not run", _not_run_lines(run))):
        if lines:
            text += f"\n\n{title}:\n" + "\n".join(f"- {line}" for line in lines)
    return text


def rl_table(run_dir, command: str) -> str:
    """Every RL row of a peer run folder, and verl's gradient probe where it ran."""
    run = _Run(run_dir)
    where = Path(run_dir).as_posix()
    if not run.rl:
        return f"Generated by `{command}`. {_not_yet('RL rows', f'{where}/{RL_FOLDER}')}"
    header = ["shape", "method", "status", "ms (p20–p80)", "peak MiB", "logp err", "H err",
              "dE err", "dC err", f"vs {OWN_RL}"]
    body = []
    for r in run.rl:
        own = run.rl_row(r["model"], OWN_RL)
        ok = r["status"] == "ok"
        verdict = time_verdict(_rl_as_bench(r), _rl_as_bench(own)) if own and r is not own \
            else None
        body.append([f"{r['model']} ({_shape_title(r)})", f"`{r['method']}`", r["status"],
                     f"{fmt_ms(r['ms_median'])} ({fmt_ms(r['ms_p20'])}–{fmt_ms(r['ms_p80'])})"
                     if ok else "–", fmt_mib(r["peak_extra_mib"]) if ok else "–",
                     fmt_err(r["logp_max_abs_err"]), fmt_err(r["entropy_max_abs_err"]),
                     fmt_err(r["de_rel_err"]), fmt_err(r["dc_rel_err"]), verdict or "–"])
    text = (f"Generated by `{command}`. From [`{where}/{RL_FOLDER}`]({where}/{RL_FOLDER}/rl.csv)"
            f" (`python -m suite kernel rl`), in the run [`{where}`]({where}/results.csv): "
            f"{env_line(run_dir)} One call plus the backward of sum w·logp + β·H "
            f"(w, β per token; without the H term where a method has no entropy), bf16 lm "
            f"inputs; logp and H errors: largest absolute error against fp64 on the checked "
            f"rows; dE and dC: relative to the fp64 gradient of the method's objective; "
            f"verdict: {RULE_TEXT}.\n\n" + md_table(header, body))
    probe = Path(run_dir) / PROBE
    if probe.is_file():
        text += ("\n\nverl's backward with the upstream gradients of a sum (expanded, stride 0), "
                 "called bare and through the provider (`suite.providers.verl."
                 "probe_expanded_grads`):\n" + "\n".join(
                     f"- {k}: {v}" for k, v in json.loads(probe.read_text()).items()))
    return text


def peer_list(run_dir, command: str, tp_dir=None) -> str:
    """The README's peers: how they are installed, and one sentence of the peer run: the
    versions, who returns per-token log-probs and entropy, and who is faster than own; with
    ``tp_dir`` (a folder :func:`tensor_parallel` reads), a sentence on Liger's TP kernel."""
    run = _Run(run_dir)
    where = Path(run_dir).as_posix()
    head = f"Generated by `{command}`. {INSTALLED_AS}"
    if not run.providers:
        return f"{head} {_not_yet('peer run', where)}"
    outputs = {p: _outputs([r for r in run.rl if r["method"] == m])
               for p, m in RL_METHOD_OF.items() if p in run.providers}
    both = [f"`{p}`" for p, o in outputs.items() if o == "log-prob + entropy"]
    faster = _faster_lines(run)
    return (f"{head} In one H100 run ([`{where}`]({where}/results.csv); every cell and the RL "
            f"step: [RESULTS.md](results/RESULTS.md#who-has-what)), with "
            f"{peer_versions(run_dir)}; per-token log-probs and entropy with their backward: "
            f"{', '.join(both) or 'none'}; faster than the own kernel ({RULE_TEXT}): "
            + ("; ".join(faster) if faster else "none") + "."
            + (f" {tensor_parallel_line(tp_dir)}" if tp_dir else ""))


# ---- Liger's tensor-parallel kernel against the own vocab-parallel path -----------------------

TP_PEERS = ("liger_scaled_ce_tp", "liger_scaled_ce_tp_torch")
PHASE = "loss+grad"
OUTSIDE_MIB = re.compile(r"took (\d+) MiB of device memory outside torch")


TP_FOLDER = "tp"  # a multi-GPU run's vocab-parallel runs with Liger's TP kernel: tp/<shape>-vp<K>


def _tp_folders(run_dir) -> list[Path]:
    return sorted(p for p in (Path(run_dir) / TP_FOLDER).glob("*-vp*")
                  if (p / "results.csv").is_file())


def tensor_parallel_line(run_dir) -> str:
    """One sentence: the native TP kernel's loss+grad verdict against own, per shape."""
    where = Path(run_dir).as_posix()
    parts = []
    for folder in _tp_folders(run_dir):
        rows = {(r["provider"], r["phase"]): r for r in results.read_rows(folder)}
        mine, own = rows.get((TP_PEERS[0], PHASE)), rows.get((OWN, PHASE))
        if mine is None or own is None:
            continue
        if mine["status"] != "ok" or own["status"] != "ok":
            parts.append(f"N {mine['n']} D {mine['d']} V {mine['v']}: {mine['status']} "
                         f"(the own kernel: {own['status']})")
            continue
        gpu = json.loads((folder / "env.json").read_text()).get("gpu_name", "GPU")
        parts.append(f"N {mine['n']} D {mine['d']} V {mine['v']} on {mine['world_size']} x "
                     f"{gpu}: {time_verdict(mine, own)}, {fmt_ms(mine['ms'])} ms against the "
                     f"own kernel's {fmt_ms(own['ms'])}")
    if not parts:
        return f"Liger's tensor-parallel kernel: no rows in [`{where}`]({where}) yet."
    return (f"Liger's tensor-parallel kernel (`{TP_PEERS[0]}`, CUTLASS + NVSHMEM) against the "
            f"own kernel's vocabulary-parallel path at {PHASE} ([`{where}`]({where}); every "
            f"row: [RESULTS.md](results/RESULTS.md#who-has-what)): " + "; ".join(parts) + ".")


def _tp_line(row, own_row) -> list[str]:
    if row["status"] != "ok":
        return [f"`{row['provider']}`", row["phase"], row["status"]] + ["–"] * 6
    outside = OUTSIDE_MIB.search(row.get("ran") or "")
    verdict = time_verdict(row, own_row) if own_row is not None and row is not own_row else None
    return [f"`{row['provider']}`", row["phase"],
            f"{fmt_ms(row['ms'])} ({fmt_ms(row['ms_p20'])}–{fmt_ms(row['ms_p80'])})",
            fmt_mib(row.get("peak_extra_mib")), outside[1] if outside else "–",
            fmt_err(row.get("loss_rel_err")), fmt_err(row.get("de_rel_err")),
            fmt_err(row.get("dc_rel_err")), verdict or "–"]


def tensor_parallel(run_dir, command: str) -> str:
    """Per shape of ``run_dir/tp/<shape>-vp<K>`` (``bench --vocab-parallel K``): the own
    kernel's sharded rows beside Liger's tensor-parallel function's, native and its fallback."""
    folders = _tp_folders(run_dir)
    if not folders:
        return (f"Generated by `{command}`. No {TP_FOLDER}/<shape>-vp<K> folders in "
                f"`{Path(run_dir).as_posix()}` yet.")
    header = ["provider", "phase", "ms (p20–p80)", "peak MiB per rank",
              "MiB outside torch's allocator", "loss err", "dE err", "dC err",
              f"vs `{OWN}`"]
    parts = [f"Generated by `{command}`. Each table one `python -m suite bench --vocab-parallel "
             f"K` run: the rows' time and peak are the slowest rank's; the memory LCK's "
             f"configure() took outside torch's allocator (NVSHMEM's symmetric heap and its "
             f"workspaces) is not in the peak column and is given beside it; errors against "
             f"the fp64 reference (dC gathered over the ranks); verdict: {RULE_TEXT}."]
    for folder in folders:
        rows = [r for r in results.read_rows(folder) if r["provider"] in (OWN, *TP_PEERS)]
        for cell_id in dict.fromkeys(r["cell_id"] for r in rows):
            mine = [r for r in rows if r["cell_id"] == cell_id]
            own = {r["phase"]: r for r in mine if r["provider"] == OWN and r["status"] == "ok"}
            first = mine[0]
            parts.append(f"**N {first['n']}, D {first['d']}, V {first['v']}, {first['dtype']}, "
                         f"{first['world_size']} ranks.** {from_line(folder)}\n\n"
                         + md_table(header, [_tp_line(r, own.get(r["phase"])) for r in mine]))
    return "\n\n".join(parts)
