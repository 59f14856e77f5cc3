"""Reproduce the paper's Table 1 (arXiv 2411.09009) at Gemma 2 (2B) and check its claims.

    python -m suite reproduce [--out runs/<name>] [--device cuda] [--reps R]
    python -m suite reproduce --from-results results/<name>   # only rewrite table1.md

The run measures every method of Table 1 on both input distributions through suite.runner,
then writes ``<out>/table1.md``: our memory / time per method and phase in the paper's layout,
the paper's A100 figures and the ratio ours / paper, and PASS / FAIL checks of the paper's
headline claims (suite.report.claims). Reading needs only the standard library (no torch, no
pandas); suite.runner is imported only to measure.
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from suite.report.curated import ROOT
from suite.results import RUNS_DIR
from suite.report.claims import (CCE_METHODS, CLAIM_DISTS, CLAIM_GRAD, CLAIM_HEAD,  # noqa: F401
                                 CLAIM_LOSS, CLAIM_SPEED, GEMMA2_2B, GRAD_ERR_MAX_OVER_NAIVE,
                                 PAPER_SOURCE, PAPER_TABLE1, PHASE_TITLE, Check, claim_checks,
                                 gradient_lower_bound_mib, lookup, lower_bound_mib, status_text)
from suite.report.envs import peer_versions, read_envs
from suite.report.formatting import (fmt_mib, fmt_ms, fmt_ratio, md_table, memory_text,
                                     num_or_none as num)

# The paper's Table 1 setting.
PRESET = "gemma2-2b"
DISTS = CLAIM_DISTS
TABLE1_PHASES = ("loss", "grad", "loss+grad")

# (provider, our label, the paper's row it is compared with). "lower_bound" is computed.
METHODS = [
    ("lower_bound", "lower bound (dE + dC, computed)", "lower bound"),
    ("own", "own kernel, exact", "CCE, no gradient filter"),
    ("own_filter", "own kernel, gradient filter", "CCE"),
    ("own_low_memory", "own kernel, exact, low_memory=True", "CCE, no gradient filter"),
    ("apple_cce", "Apple CCE (default)", "CCE"),
    ("apple_cce_nofilter", "Apple CCE, no gradient filter", "CCE, no gradient filter"),
    ("liger_flce", "Liger fused linear CE", "Liger Kernels"),
    ("chunked", "torchtune-style, 8 chunks", "torchtune (8 chunks)"),
    ("torch_compile", "torch.compile", "torch.compile"),
    ("naive", "baseline (naive)", "baseline"),
]
MEASURED = [m for m, _, _ in METHODS if m != "lower_bound"]


# ---- reading a run --------------------------------------------------------------------------

def read_rows(results_dir) -> list[dict]:
    """Rows of a run folder (suite.results.read_rows: torn lines dropped, last row per
    (cell, provider, phase)); a clear error when the folder holds no results in our schema."""
    from suite.results import read_rows as read_run
    from suite.schema import ROW_FIELD_DEFAULTS, ROW_FIELDS

    path = Path(results_dir) / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"--from-results: no results.csv in {results_dir}")
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    missing = [c for c in ROW_FIELDS if c not in header and c not in ROW_FIELD_DEFAULTS]
    if missing:
        raise ValueError(f"{path}: not in the suite.schema layout, missing columns {missing}")
    return read_run(results_dir)


def table1_rows(rows: list[dict]) -> list[dict]:
    """The rows of the Table 1 cell: Gemma 2 (2B) shape, bf16, softcap 30, no bias or ignores."""
    g = GEMMA2_2B
    return [r for r in rows
            if num(r["n"]) == g["n"] and num(r["d"]) == g["d"] and num(r["v"]) == g["v"]
            and r["dtype"] == g["dtype"] and num(r.get("softcap")) == g["softcap"]
            and not num(r.get("ignore_frac")) and not num(r.get("bias"))]


# ---- formatting (the report's formatters; these two are Table 1's own) -------------------------

def _fmt_paper(mib, ms) -> str:
    """The paper's figures as printed there (no added digits)."""
    if mib is None:
        return "–"
    return f"{mib:g} / {'–' if ms is None else f'{ms:g}'}"


def cell_text(row) -> str:
    if row is None:
        return "not run"
    if row["status"] != "ok":
        return f"**{row['status']}**"
    return f"{memory_text(row)} / {fmt_ms(row['ms'])}"


# ---- table1.md ------------------------------------------------------------------------------

# env.json fields shown in the report (suite.results.environment), in this order.
ENV_FIELDS = [("gpu_name", "GPU"), ("gpu_count", "GPUs visible"),
              ("compute_capability", "compute capability"), ("driver", "NVIDIA driver"),
              ("cuda", "CUDA (torch build)"), ("torch", "torch"), ("triton", "triton"),
              ("cut_cross_entropy", "cut-cross-entropy (Apple CCE)"),
              ("liger_kernel", "liger-kernel"), ("python", "python"), ("platform", "platform"),
              ("cpu", "CPU"), ("triton_interpret", "TRITON_INTERPRET"), ("git_commit", "git commit"),
              ("git_dirty", "uncommitted changes"), ("date", "date"), ("run_id", "run id")]


def _env_lines(envs: list[dict], devices: list[str], run_dir=None) -> list[str]:
    lines = [f"- rows measured on: {', '.join(devices) if devices else 'unknown device'}"]
    if not envs:
        return lines + ["- env.json: missing"]
    if run_dir is not None:
        lines.append(f"- peers measured: {peer_versions(run_dir)}")
    known = {k for k, _ in ENV_FIELDS}
    for i, env in enumerate(envs):
        if i:
            lines.append(f"- resumed in session {i + 1} (env-{i + 1}.json):")
        prefix = "  " if i else ""
        for key, label in ENV_FIELDS:
            if env.get(key) not in (None, ""):
                lines.append(f"{prefix}- {label}: {env[key]}")
        for key in sorted(set(env) - known - {"argv", "hostname", "device", "is_gpu_run"}):
            value = env[key]
            if not isinstance(value, (dict, list)) and value not in (None, ""):
                lines.append(f"{prefix}- {key}: {value}")
    return lines


def _reps_text(rows) -> str:
    reps = sorted({int(num(r.get("reps"))) for r in rows if num(r.get("reps"))})
    return "/".join(map(str, reps)) if reps else "the runner's default number of"


def _intro(t1, envs, source, devices) -> list[str]:
    """The title, the setting, the hardware and how this setup differs from the paper's."""
    g = GEMMA2_2B
    return [
        "# Table 1 at Gemma 2 (2B), re-measured",
        "",
        f"Generated by `python -m suite reproduce` from `{source}`; do not edit by hand "
        "(`python -m suite reproduce --from-results DIR` rewrites it).",
        "",
        f"Setting of the paper's Table 1: N = {g['n']} tokens, D = {g['d']}, V = {g['v']}, "
        f"{g['dtype']} E and C, logit softcap {g['softcap']:g}, mean reduction. Each cell is "
        "peak extra memory in MiB (max_memory_allocated during the phase minus memory allocated "
        "before it) / median time in ms. Phases: loss = forward with autograd on; gradient = "
        "backward only, peak reset after the forward; loss+gradient = forward and backward. "
        "A bold status (oom, error, ...) marks a method that did not run.",
        "",
        "## Hardware and software",
        "",
        *_env_lines(envs, devices, Path(source).parent),
        "",
        "## Differences from the paper's setup",
        "",
        "- GPU and software: the paper measured on an A100-SXM4 80 GB with PyTorch 2.4.1 and "
        f"CUDA 12.4; this run on {', '.join(devices) or 'the device above'} with the versions "
        "above. Times are not comparable across GPUs one to one; the ratio table shows by how much "
        "they differ.",
        "- Inputs: the paper captured E and C from Gemma 2 (2B) Instruct on Alpaca. Here they are "
        "synthetic (suite.inputs): `uniform` (E ~ N(0, 1/D), C ~ N(0, 1), uniform targets: a "
        "nearly flat softmax, the best case for gradient filtering) and `lm` (a Zipfian token "
        "prior carried by a hidden direction all rows share, targets drawn from the model's "
        "softmax: peaked like a trained LM head). Gradient filtering and vocabulary sorting "
        "depend on the softmax, so filtered kernels' backward times depend on the inputs.",
        "- Methods: the paper's CCE is Apple's kernel as published (with vocabulary sorting); "
        "here Apple CCE is the PyPI package named in the environment, and the own kernel "
        "(own_kernel/) is compared with the paper's CCE rows (exact with 'no gradient filter', "
        "filtered with 'CCE'). The paper's Liger row was measured with the Liger release of its "
        "time; here liger-kernel is the version above.",
        f"- Timing here: median of {_reps_text(t1)} timed calls after warm-up (suite.measure); "
        "memory from torch.cuda.max_memory_allocated.",
        "",
    ]


PHASE_HEADER = ["method"] + [PHASE_TITLE[p] for p in TABLE1_PHASES]


def _ours(t1, dist) -> list[str]:
    body = []
    for method, label, _ in METHODS:
        if method == "lower_bound":
            body.append([label] + [f"{fmt_mib(lower_bound_mib(p))} / –" for p in TABLE1_PHASES])
        else:
            body.append([label] + [cell_text(lookup(t1, method, dist, p)) for p in TABLE1_PHASES])
    return [f"## Ours, `{dist}` inputs (MiB / ms)", "", md_table(PHASE_HEADER, body), ""]


def _paper() -> list[str]:
    body = [[paper_row] + [_fmt_paper(*phases[p]) for p in TABLE1_PHASES]
            for paper_row, phases in PAPER_TABLE1.items()]
    return ["## The paper's Table 1 (MiB / ms)", "",
            f"Published numbers, copied from {PAPER_SOURCE}; not measured here.", "",
            md_table(PHASE_HEADER, body), ""]


def _ours_over_paper(t1, dist) -> list[str]:
    body = []
    for method, label, paper_row in METHODS:
        if method == "lower_bound":
            continue
        cells = []
        for p in TABLE1_PHASES:
            row = lookup(t1, method, dist, p)
            theirs_mib, theirs_ms = PAPER_TABLE1[paper_row][p]
            if row is None or row["status"] != "ok":
                cells.append(status_text(row))
            else:
                cells.append(f"{fmt_ratio(row['peak_extra_mib'], theirs_mib)} / "
                             f"{fmt_ratio(row['ms'], theirs_ms)}")
        body.append([f"{label} vs paper's {paper_row}"] + cells)
    return [f"## Ours / paper, `{dist}` inputs (memory ratio / time ratio)", "",
            md_table(PHASE_HEADER, body), ""]


def _claims(checks) -> list[str]:
    counts = {v: sum(c.verdict == v for c in checks) for v in ("PASS", "FAIL", "NOT RUN")}
    return [
        "## Claim checks", "",
        "The paper's headline claims, checked on this run for Apple CCE and the own kernel. A FAIL "
        "is a finding, reported as measured. Tolerances: the baseline must land within 5 % of the "
        "paper's 24000 / 28000 MiB; a CCE loss that rounds to at most 1 MiB (below 1.5 MiB: the paper "
        "rounds its table to the closest MB); a CCE loss+gradient within 1.1 x the "
        f"lower bound (dE + dC = {lower_bound_mib('loss+grad'):.0f} MiB); a CCE loss+gradient no "
        "slower than torch.compile on the same inputs; dE and dC relative errors against an fp32 "
        f"reference at most {GRAD_ERR_MAX_OVER_NAIVE:g} x the naive baseline's (bf16 logits, "
        "fp32 softmax) on the same inputs. A method that failed (oom, error, nan) FAILs; one not "
        "installed or not measured is NOT RUN.", "",
        f"Summary: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['NOT RUN']} NOT RUN.", "",
        md_table(["claim", "inputs", "method", "measured", "tolerance", "verdict"],
                 [[c.claim, c.dist, c.method, c.measured, c.tolerance, f"**{c.verdict}**"]
                  for c in checks]),
        "",
    ]


def render_table1(rows: list[dict], envs: list[dict], source: str) -> tuple[str, list[Check]]:
    """``rows``: the whole run; returns (markdown, checks)."""
    t1 = table1_rows(rows)
    dists = [d for d in DISTS if any(r["dist"] == d for r in t1)] or list(DISTS)
    devices = sorted({r.get("device", "") for r in t1 if r.get("device")})
    out = _intro(t1, envs, source, devices)
    for dist in dists:
        out += _ours(t1, dist)
    out += _paper()
    for dist in dists:
        out += _ours_over_paper(t1, dist)
    checks = claim_checks(t1, dists=dists)
    return "\n".join(out + _claims(checks)), checks


def _shown(results_dir: Path) -> str:
    """The run folder as table1.md names it: relative to the checkout when inside it, so the
    file does not depend on where the checkout lies or on the working directory."""
    path = results_dir.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else results_dir.as_posix()


def write_table1(results_dir, out_path=None) -> tuple[Path, list[Check]]:
    results_dir = Path(results_dir)
    rows = read_rows(results_dir)
    text, checks = render_table1(rows, read_envs(results_dir), _shown(results_dir) + "/results.csv")
    out_path = Path(out_path) if out_path else results_dir / "table1.md"
    out_path.write_text(text)
    return out_path, checks


# ---- running --------------------------------------------------------------------------------

def run_protocol(args) -> None:
    """Measure Table 1 through suite.runner into ``args.out`` (resuming by default)."""
    from suite import runner

    cells = runner.preset_cells(PRESET)
    runner.run(cells, MEASURED, list(TABLE1_PHASES), args.out, resume=args.resume,
               reps=args.reps, warmup=args.warmup, device=args.device, isolate=args.isolate)


def add_arguments(parser) -> None:
    parser.add_argument("--out", default=str(RUNS_DIR / f"table1_{PRESET}"),
                        help=f"run folder for results.csv, env.json, table1.md "
                             f"(default: runs/table1_{PRESET}; runs/ is git-ignored)")
    parser.add_argument("--device", default="cuda", help="torch device to measure on (default: cuda)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (runner default)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (runner default)")
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction,
                        default=True, help="skip (cell, provider) pairs already in --out (default on)")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                        help="each cell in a child process, so a crashing kernel is recorded as "
                             "'crashed' and the run goes on (default on)")
    parser.add_argument("--from-results", metavar="DIR", default=None,
                        help="do not measure: rewrite DIR/table1.md from DIR/results.csv")


def main(args) -> int:
    if args.reps is not None and args.reps < 1:
        print(f"reproduce: --reps must be >= 1, got {args.reps}")
        return 2
    source = args.from_results
    if source is None:
        reason = _cannot_measure(args.device)
        if reason:
            print(f"reproduce: {reason}; nothing measured. (--from-results DIR rewrites "
                  f"DIR/table1.md from a GPU run's results.csv.)")
            return 2
    try:
        if source is None:
            run_protocol(args)
            source = args.out
        path, checks = write_table1(source)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"reproduce: {err}")
        return 1
    for c in checks:
        print(f"{c.verdict:8s} {c.claim} [{c.dist}] {c.method}: {c.measured}")
    # A FAIL is the reproduction's finding about a claim, not a failure of the command.
    print(f"reproduce: wrote {path}")
    return 0


def _cannot_measure(device: str) -> str | None:
    """Why Table 1 cannot be measured on ``device`` here (its shape and memory claims are a
    GPU's), else None."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        return f"--device: expected cuda or cuda:<index>, got {device!r}"
    if dev.type != "cuda":
        return f"the paper's Table 1 is measured on a CUDA device, not {device!r}"
    if not torch.cuda.is_available():
        return "the paper's Table 1 is measured on a CUDA device, and none is available here"
    return None
