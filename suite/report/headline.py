"""The README's headline: per GPU, one run at the Gemma 2 (2B) shape, every line generated from
that run alone (``python -m suite report RUN --headline --update-readme``).

    from suite.report.headline import headline
    text = headline(["results/headline-h200"], "python -m suite report ... --headline")

A run's block names the GPU, the commit and date it measured, then says in prose what its
verdicts are, exact and approximate methods apart (a method whose gradient filter skips entries
is approximate, whatever its speed), then the two tables. The prose claims nothing the tables do
not carry: faster, level and slower against torch.compile by suite.report.verdict's one rule,
memory against the gradients' own size, errors against the naive baseline's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from suite.report.claims import (GEMMA2_2B, GRAD_ERR_MAX_OVER_NAIVE, GRADS_RATIO,
                                 gradient_lower_bound_mib)
from suite.report.curated import read_run_rows as read_rows
from suite.report.envs import peer_versions, read_envs
from suite.report.formatting import (fmt_err, fmt_mib, fmt_ms, latest_rows, md_table,
                                     memory_text, num)
from suite.report.kernel_tables import provider_order
from suite.report.verdict import FASTER, LEVEL, RULE_TEXT, SLOWER, time_verdict

HEADLINE_DISTS = ("uniform", "lm")
FAST_PEER = "torch_compile"  # the verdict column: each provider against it
OWN_DEFAULT = "own"          # the call a user makes
NOT_RUN_CHARS = 200


def is_gemma(row) -> bool:
    g = GEMMA2_2B
    return (all(num(row.get(k)) == float(g[k]) for k in ("n", "d", "v", "softcap"))
            and row.get("dtype") == g["dtype"] and not num(row.get("ignore_frac")) > 0
            and str(row.get("bias", "0")) in ("0", "", "False"))


def shape_text() -> str:
    g = GEMMA2_2B
    return f"N {g['n']}, D {g['d']}, V {g['v']}, {g['dtype']}, softcap {g['softcap']:g}"


def where(run_dir, rows) -> str:
    """The GPU a run measured on, from its env files (the CPU: not GPU numbers)."""
    gpu = next((e.get("gpu_name") for e in read_envs(run_dir) if e.get("gpu_name")), None)
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


def is_exact(provider: str) -> bool:
    """The registry's word (a provider this checkout does not register: not vouched exact)."""
    from suite import catalog

    try:
        return catalog.get(provider).exact
    except ValueError:
        return False


@dataclass(frozen=True)
class Run:
    """A headline run's Gemma 2 (2B) rows: the latest per (cell, provider, phase), one run."""
    folder: Path
    rows: list
    latest: dict
    dists: list
    main_dist: str

    @classmethod
    def read(cls, run_dir) -> "Run":
        folder = Path(run_dir)
        rows = [r for r in read_rows(folder) if is_gemma(r)]
        if not rows:
            raise ValueError(f"--headline: no Gemma 2 (2B) cell ({shape_text()}) in "
                             f"{folder.as_posix()}/results.csv")
        latest = latest_rows(rows)
        one_run(list(latest.values()), f"--headline {folder.as_posix()}")
        dists = [d for d in HEADLINE_DISTS if any(r["dist"] == d for r in rows)]
        return cls(folder, rows, latest, dists, "lm" if "lm" in dists else dists[0])

    def row(self, provider, phase="loss+grad", dist=None):
        """The ok row of ``provider`` at ``phase`` on ``dist`` (default: the main inputs)."""
        dist = dist or self.main_dist
        r = next((r for (_, p, ph), r in self.latest.items()
                  if p == provider and ph == phase and r["dist"] == dist), None)
        return r if r is not None and r["status"] == "ok" else None

    def ran(self, provider) -> bool:
        return any(self.row(provider, dist=d) for d in self.dists)

    def providers(self) -> list[str]:
        return provider_order(self.rows)

    def env(self) -> dict:
        """The env file of the run's session (its run_id), else its first."""
        envs = read_envs(self.folder)
        run_id = next(iter(self.latest.values())).get("run_id")
        return next((e for e in envs if e.get("run_id") == run_id), envs[0] if envs else {})


# ---- the tables -------------------------------------------------------------------------------

def _header(run: Run) -> list[str]:
    d = run.main_dist
    return (["provider", "loss MiB", "loss+grad MiB"]
            + [f"loss+grad ms, {x}" for x in run.dists]
            + [f"vs {FAST_PEER}, {d}", f"×floor, {d}", f"dE err, {d}"])


def _line(run: Run, p: str) -> list[str]:
    lg, loss = run.row(p), run.row(p, "loss")
    versus = time_verdict(lg, run.row(FAST_PEER)) if p != FAST_PEER else None
    return ([f"`{p}`", memory_text(loss) if loss else "–", memory_text(lg) if lg else "–"]
            + [fmt_ms(r["ms"]) if (r := run.row(p, dist=x)) else "–" for x in run.dists]
            + [versus or "–",
               f"{num(lg['floor_ratio']):.2f}" if lg and lg["floor_ratio"] else "–",
               fmt_err(lg["de_rel_err"]) if lg else "–"])


def tables(run: Run) -> str:
    """The exact methods' table, then the approximate ones'."""
    ran = [p for p in run.providers() if run.ran(p)]
    parts = []
    for title, group in (("Exact", [p for p in ran if is_exact(p)]),
                         ("Approximate (a gradient filter)", [p for p in ran if not is_exact(p)])):
        if group:
            parts.append(f"{title}:\n\n" + md_table(_header(run), [_line(run, p) for p in group]))
    return "\n\n".join(parts)


def not_run_lines(run: Run) -> list[str]:
    out = []
    for p in run.providers():
        if not run.ran(p):
            failed = next(r for (_, q, _), r in run.latest.items() if q == p)
            out.append(_not_run_text(p, failed))
    return out


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


# ---- the prose: what the tables say, generated ------------------------------------------------

def _names(providers) -> str:
    names = [f"`{p}`" for p in providers]
    if not names:
        return "none"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _by_verdict(run: Run, providers) -> dict[str, list[str]]:
    ref = run.row(FAST_PEER)
    out = {FASTER: [], LEVEL: [], SLOWER: []}
    for p in providers:
        verdict = time_verdict(run.row(p), ref)
        if verdict is not None:
            out[verdict].append(p)
    return out


def _speed_sentence(run: Run, providers) -> str:
    if run.row(FAST_PEER) is None:
        return f"`{FAST_PEER}` did not run here, so no method gets a speed verdict."
    v = _by_verdict(run, providers)
    return (f"Against `{FAST_PEER}` ({fmt_ms(run.row(FAST_PEER)['ms'])} ms) at loss+grad on "
            f"{run.main_dist} inputs, faster: {_names(v[FASTER])}; level: {_names(v[LEVEL])}; "
            f"slower: {_names(v[SLOWER])}.")


def _error_sentence(run: Run, providers) -> str:
    naive = run.row("naive")
    if naive is None or not naive.get("de_rel_err"):
        return ""
    bound = GRAD_ERR_MAX_OVER_NAIVE * num(naive["de_rel_err"])
    worse = [p for p in providers if (r := run.row(p)) and num(r["de_rel_err"]) > bound]
    return (f"A dE error above {GRAD_ERR_MAX_OVER_NAIVE:g}× the naive baseline's "
            f"({fmt_err(naive['de_rel_err'])}): {_names(worse)}.")


def _own_sentence(run: Run) -> str:
    own, ref = run.row(OWN_DEFAULT), run.row(FAST_PEER)
    if own is None or ref is None:
        return ""
    verdict = time_verdict(own, ref)
    if verdict is None:
        return ""
    relation = {FASTER: "faster than", LEVEL: "level with", SLOWER: "slower than"}[verdict]
    return (f"This project's kernel as a user calls it (`{OWN_DEFAULT}`, exact) is {relation} "
            f"`{FAST_PEER}`: {fmt_ms(own['ms'])} against {fmt_ms(ref['ms'])} ms, holding "
            f"{fmt_mib(own['peak_extra_mib'])} against {fmt_mib(ref['peak_extra_mib'])} MiB.")


def prose(run: Run) -> str:
    """Two paragraphs, exact then approximate methods, each from the tables' own columns."""
    ran = [p for p in run.providers() if run.ran(p) and p != FAST_PEER]
    exact = [p for p in ran if is_exact(p)]
    approx = [p for p in ran if not is_exact(p)]
    grads = gradient_lower_bound_mib(GEMMA2_2B["n"], GEMMA2_2B["d"], GEMMA2_2B["v"],
                                     GEMMA2_2B["dtype"])
    small = [p for p in exact if (r := run.row(p)) and num(r["peak_extra_mib"]) <= GRADS_RATIO * grads]
    parts = [" ".join(s for s in (
        "**Exact methods** (the loss and gradients of `naive` up to rounding).",
        _speed_sentence(run, exact), _own_sentence(run),
        f"Within {GRADS_RATIO:.2f}× the gradients' own memory at loss+grad: {_names(small)}."
        if any(run.row(p) and run.row(p)["peak_extra_mib"] for p in exact) else "",
        _error_sentence(run, exact)) if s)]
    if approx:
        parts.append(" ".join(s for s in (
            "**Approximate methods** (a gradient filter skips the gradient entries it deems "
            "negligible; not exact).", _speed_sentence(run, approx),
            _error_sentence(run, approx)) if s))
    return "\n\n".join(parts)


# ---- the block ------------------------------------------------------------------------------

def headline_table(run_dir) -> str:
    """One run folder's block: where and at which commit it was measured, the prose, the peers'
    versions, the exact and the approximate methods' tables, and what did not run."""
    run = Run.read(run_dir)
    env = run.env()
    commit = (env.get("git_commit") or "unknown")[:7] + (" (dirty)" if env.get("git_dirty") else "")
    g = GEMMA2_2B
    grads = fmt_mib(gradient_lower_bound_mib(g["n"], g["d"], g["v"], g["dtype"]))
    floor = next((r["floor_ms"] for r in run.latest.values() if r["floor_ms"]), "")
    path = run.folder.as_posix()
    title = (f"**{where(run.folder, run.rows)}**, one run at commit `{commit}` "
             f"({env.get('date', '')[:10] or 'date not recorded'}), "
             f"[`{path}`]({path}/results.csv): {shape_text()} (the gradients dE + dC alone: "
             f"{grads} MiB; the floor, one E @ Cᵀ: {fmt_ms(floor)} ms).")
    text = (f"{title}\n\n{prose(run)}\n\nPeers measured: {peer_versions(run.folder)}.\n\n"
            + tables(run))
    missing = not_run_lines(run)
    if missing:  # one paragraph: the README stays short however many providers a run has
        text += "\n\nNot run there: " + "; ".join(missing) + "."
    return text


def headline(run_dirs, command: str) -> str:
    """The README's headline: one block per run folder, one folder per GPU, each from one run."""
    gpus: dict[str, str] = {}
    for d in run_dirs:
        rows = read_rows(d)
        if not rows:
            raise ValueError(f"--headline: no results in {Path(d).as_posix()}/results.csv")
        gpu = where(d, rows)
        if gpu in gpus:
            raise ValueError(f"--headline: {gpus[gpu]} and {Path(d).as_posix()} were both measured "
                             f"on {gpu}: give one run folder per GPU")
        gpus[gpu] = Path(d).as_posix()
    blocks = "\n\n".join(headline_table(d) for d in run_dirs)
    return (f"Generated by `{command}`. Memory: peak MiB beyond what was allocated before the "
            f"call; time: median ms (CUDA events, L2 flushed); vs {FAST_PEER}: {RULE_TEXT}; "
            f"×floor: loss+grad time over one cuBLAS E @ Cᵀ of the same shape, measured in the "
            f"same run; dE err: relative to an fp32 reference.\n\n" + blocks)
