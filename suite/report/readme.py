"""Where the generated tables go: README.md (the headline tables, one per GPU) and
results/RESULTS.md (every full table), each between ``<!-- results:<section>:start -->`` and
``<!-- results:<section>:end -->`` markers, never typed by hand."""
from __future__ import annotations

import os
import re
from pathlib import Path

from suite.report.claims import GEMMA2_2B, gradient_lower_bound_mib
from suite.report.envs import peer_versions, read_envs
from suite.report.formatting import (fmt_err, fmt_mib, fmt_ms, latest_rows, md_table,
                                     memory_text, num)
from suite.report.kernel_tables import provider_order
from suite.report.verdict import RULE_TEXT, time_verdict
from suite.report.curated import read_run_rows as read_rows

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
RESULTS_DOC = ROOT / "results" / "RESULTS.md"
HEADLINE_DISTS = ("uniform", "lm")
FAST_PEER = "torch_compile"  # the headline's verdict column: each provider against it
NOT_RUN_CHARS = 200


def rebase_links(text: str, doc: Path) -> str:
    """Markdown links to repository paths (as the report prints them, relative to the
    repository's root) made relative to ``doc``'s folder, so they work inside results/."""
    folder = doc.resolve().parent
    if not folder.is_relative_to(ROOT):  # a document outside the checkout: leave links alone
        return text

    def rebase(match):
        target = match.group(1)
        if re.match(r"^[a-z]+:|^#|^/", target):
            return match.group(0)
        return f"]({Path(os.path.relpath(ROOT / target, folder)).as_posix()})"

    return re.sub(r"\]\(([^)\s]+)\)", rebase, text)


def update_markers(text: str, section: str, path) -> None:
    """Replace what lies between the section's markers in ``path`` with ``text`` (its links
    rebased to the document's folder)."""
    path = Path(path)
    text = rebase_links(text, path)
    start, end = f"<!-- results:{section}:start -->", f"<!-- results:{section}:end -->"
    doc = path.read_text()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(doc):
        raise ValueError(f"{path} has no '{start}' ... '{end}' markers")
    path.write_text(pattern.sub(lambda _: f"{start}\n{text}\n{end}", doc))


def update_readme(text: str, section: str, readme=README) -> None:
    update_markers(text, section, readme)


def _is_gemma(row) -> bool:
    g = GEMMA2_2B
    return (all(num(row.get(k)) == float(g[k]) for k in ("n", "d", "v", "softcap"))
            and row.get("dtype") == g["dtype"] and not num(row.get("ignore_frac")) > 0
            and str(row.get("bias", "0")) in ("0", "", "False"))


def _shape_text() -> str:
    g = GEMMA2_2B
    return f"N {g['n']}, D {g['d']}, V {g['v']}, {g['dtype']}, softcap {g['softcap']:g}"


def _where(run_dir, rows) -> str:
    envs = read_envs(run_dir)
    gpu = next((e.get("gpu_name") for e in envs if e.get("gpu_name")), None)
    return gpu or ("CPU (not GPU numbers)" if rows[0].get("device") == "cpu" else rows[0]["device"])


def one_run(rows, what: str) -> list[dict]:
    """``rows`` when they all come from one run (one session, one run_id: the floor, the machine's
    state and the code are the same for all); ValueError naming the sessions otherwise."""
    sessions = sorted({r.get("run_id") or "?" for r in rows})
    if len(sessions) > 1:
        raise ValueError(f"{what}: rows from {len(sessions)} runs ({', '.join(sessions)}); a table "
                         f"that compares providers takes all its rows from one run, so that they "
                         f"share its floor: measure them in one `python -m suite bench` run")
    return rows


def headline_table(run_dir) -> str:
    """One compact table of a run folder's Gemma 2 (2B) cells, all from one run: per provider the
    loss and loss+grad memory (lm inputs), the loss+grad time on both input distributions, its
    verdict against torch.compile (suite.report.verdict), ×floor and the dE error (lm); providers
    that did not run are named below with their status and the reason."""
    run_dir = Path(run_dir)
    rows = [r for r in read_rows(run_dir) if _is_gemma(r)]
    if not rows:
        raise ValueError(f"--headline: no Gemma 2 (2B) cell ({_shape_text()}) in "
                         f"{run_dir}/results.csv")
    latest = latest_rows(rows)
    one_run(list(latest.values()), f"--headline {run_dir.as_posix()}")

    def row(provider, dist, phase):
        r = next((r for (c, p, ph), r in latest.items()
                  if p == provider and ph == phase and r["dist"] == dist), None)
        return r if r is not None and r["status"] == "ok" else None

    dists = [d for d in HEADLINE_DISTS if any(r["dist"] == d for r in rows)]
    main_dist = "lm" if "lm" in dists else dists[0]
    header = (["provider", "loss MiB", "loss+grad MiB"]
              + [f"loss+grad ms, {d}" for d in dists]
              + [f"vs {FAST_PEER}, {main_dist}", f"×floor, {main_dist}", f"dE err, {main_dist}"])
    body, not_run = [], []
    for p in provider_order(rows):
        lg = row(p, main_dist, "loss+grad")
        if lg is None and not any(row(p, d, "loss+grad") for d in dists):
            failed = next(r for (c, q, ph), r in latest.items() if q == p)
            not_run.append(_not_run_text(p, failed))
            continue
        loss = row(p, main_dist, "loss")
        versus = time_verdict(lg, row(FAST_PEER, main_dist, "loss+grad")) if p != FAST_PEER else None
        body.append([f"`{p}`", memory_text(loss) if loss else "–", memory_text(lg) if lg else "–"]
                    + [fmt_ms(r["ms"]) if (r := row(p, d, "loss+grad")) else "–" for d in dists]
                    + [versus or "–",
                       f"{num(lg['floor_ratio']):.2f}" if lg and lg["floor_ratio"] else "–",
                       fmt_err(lg["de_rel_err"]) if lg else "–"])
    g = GEMMA2_2B
    grads = fmt_mib(gradient_lower_bound_mib(g["n"], g["d"], g["v"], g["dtype"]))
    floor = next((r["floor_ms"] for r in latest.values() if r["floor_ms"]), "")
    title = (f"**{_where(run_dir, rows)}**: {_shape_text()} (the gradients dE + dC alone: "
             f"{grads} MiB; the floor, one E @ Cᵀ: {fmt_ms(floor)} ms); one run, "
             f"[`{run_dir.as_posix()}`]({run_dir.as_posix()}/results.csv)")
    text = (title + "\n\nPeers measured: " + peer_versions(run_dir) + ".\n\n"
            + md_table(header, body))
    if not_run:
        text += "\n\nNot run there:\n" + "\n".join(f"- {t}" for t in not_run)
    return text


def _not_run_text(provider: str, row) -> str:
    reason = " ".join((row.get("error") or "").split())
    reason = reason if len(reason) <= NOT_RUN_CHARS else reason[:NOT_RUN_CHARS] + "..."
    also = _unsupported_anyway(provider, row)
    return (f"`{provider}`: {row['status']}" + (f" ({reason})" if reason else "")
            + (f"; installed, it could not run this cell either: {also}" if also else ""))


def _unsupported_anyway(provider: str, row) -> str | None:
    """Why a provider that was unavailable (not installed) would not run the cell anyway (an
    option it lacks, e.g. a softcap), or None: "not installed" alone would not say it."""
    if row["status"] != "unavailable":
        return None
    from suite import catalog

    try:
        p = catalog.get(provider)
    except ValueError:
        return None  # a provider this checkout no longer registers
    softcap = row.get("softcap")
    return p.unsupported_reason(bias=row.get("bias") in ("1", "True", "true"),
                                softcap=num(softcap) if softcap not in (None, "", "None") else None)


def headline(run_dirs, command: str) -> str:
    """The README's headline: one table per run folder, one folder per GPU, each from one run."""
    gpus: dict[str, str] = {}
    for d in run_dirs:
        rows = read_rows(d)
        if not rows:
            raise ValueError(f"--headline: no results in {Path(d).as_posix()}/results.csv")
        gpu = _where(d, rows)
        if gpu in gpus:
            raise ValueError(f"--headline: {gpus[gpu]} and {Path(d).as_posix()} were both measured "
                             f"on {gpu}: give one run folder per GPU")
        gpus[gpu] = Path(d).as_posix()
    tables = "\n\n".join(headline_table(d) for d in run_dirs)
    return (f"Generated by `{command}`. Memory: peak MiB beyond what was allocated before the "
            f"call; time: median ms (CUDA events, L2 flushed); vs {FAST_PEER}: {RULE_TEXT}; "
            f"×floor: loss+grad time over one cuBLAS E @ Cᵀ of the same shape, measured in the "
            f"same run; dE err: relative to an fp32 reference.\n\n"
            + tables)
