"""Reproduce the paper's Table 1 (arXiv 2411.09009) at Gemma 2 (2B) and check its claims.

    python -m suite reproduce [--out results/<name>] [--device cuda] [--reps R]
    python -m suite reproduce --from-results results/<name>   # only rewrite table1.md

The run measures every method of Table 1 on both input distributions through suite.runner,
then writes ``<out>/table1.md``: our memory / time per method and phase in the paper's layout,
the paper's A100 figures and the ratio ours / paper, and PASS / FAIL checks of the paper's
headline claims. Reading needs only the standard library (no torch, no pandas).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from suite.schema import DTYPE_BYTES

MIB = 2**20

# The paper's Table 1 setting.
PRESET = "gemma2-2b"
GEMMA2_2B = dict(n=8192, d=2304, v=256000, dtype="bf16", softcap=30.0)
DISTS = ("uniform", "lm")
TABLE1_PHASES = ("loss", "grad", "loss+grad")
PHASE_TITLE = {"loss": "loss", "grad": "gradient", "loss+grad": "loss+gradient"}

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
CCE_METHODS = ("apple_cce", "apple_cce_nofilter", "own", "own_filter", "own_low_memory")

# The paper's published numbers, not our measurements: Table 1 of Wijmans et al., "Cut Your
# Losses in Large-Vocabulary Language Models", arXiv 2411.09009 (ICLR 2025). A100-SXM4 80 GB,
# PyTorch 2.4.1, CUDA 12.4; E and C from Gemma 2 (2B) Instruct on Alpaca. (MiB, ms) per phase;
# None where the paper gives no figure.
PAPER_SOURCE = ("Wijmans et al., Cut Your Losses in Large-Vocabulary Language Models, "
                "arXiv 2411.09009, Table 1 (A100-SXM4 80 GB, PyTorch 2.4.1, CUDA 12.4)")
PAPER_TABLE1 = {
    "lower bound": {"loss": (0.004, None), "grad": (1161, None), "loss+grad": (1161, None)},
    "CCE": {"loss": (1, 46), "grad": (1163, 100), "loss+grad": (1164, 145)},
    "Liger Kernels": {"loss": (1474, 304), "grad": (None, None), "loss+grad": (1474, 304)},
    "torchtune (8 chunks)": {"loss": (8000, 55), "grad": (1630, 115), "loss+grad": (9631, 169)},
    "torch.compile": {"loss": (4000, 49), "grad": (12000, 92), "loss+grad": (16000, 143)},
    "baseline": {"loss": (24000, 82), "grad": (16000, 122), "loss+grad": (28000, 208)},
    "CCE, no vocab sorting": {"loss": (0.09, 45), "grad": (1162, 115), "loss+grad": (1162, 159)},
    "CCE, no gradient filter": {"loss": (0.09, 45), "grad": (1163, 314), "loss+grad": (1162, 357)},
}

# Claim-check tolerances (see claim_checks).
BASELINE_LOSS_MIB = 24000
BASELINE_LOSS_GRAD_MIB = 28000
BASELINE_REL_TOL = 0.05
# "1 MB": the paper's Table 1 rounds to the closest MB, so a loss that rounds to 1 MiB or less
# (below 1.5 MiB) meets the claim.
CCE_LOSS_MAX_MIB = 1.5
CCE_LOSS_GRAD_MAX_OVER_LOWER_BOUND = 1.1
GRAD_ERR_MAX_OVER_NAIVE = 1.5
NOT_RUN_STATUSES = ("unavailable", "unsupported")


def gradient_lower_bound_mib(n, d, v, dtype):
    """Memory a loss+gradient must hold at least: dE (N x D) and dC (V x D) in the input dtype."""
    try:
        elt = DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}") from None
    return (n + v) * d * elt / MIB


def loss_lower_bound_mib():
    """A forward must hold at least its fp32 scalar output."""
    return 4 / MIB


def lower_bound_mib(phase, n=GEMMA2_2B["n"], d=GEMMA2_2B["d"], v=GEMMA2_2B["v"],
                    dtype=GEMMA2_2B["dtype"]):
    return loss_lower_bound_mib() if phase in ("fwd", "loss") else gradient_lower_bound_mib(n, d, v, dtype)


# ---- reading a run --------------------------------------------------------------------------

def num(x):
    """Float of a CSV field; None when empty or not a number."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_rows(results_dir) -> list[dict]:
    """Rows of a run folder (suite.results.read_rows: torn lines dropped, last row per
    (cell, provider, phase)); a clear error when the folder holds no results in our schema."""
    from suite.results import read_rows as read_run
    from suite.schema import ROW_FIELDS

    path = Path(results_dir) / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"--from-results: no results.csv in {results_dir}")
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    missing = [c for c in ROW_FIELDS if c not in header]
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


def lookup(rows: list[dict], provider: str, dist: str, phase: str) -> dict | None:
    """The latest row of (provider, dist, phase): rows are appended as cells finish."""
    found = [r for r in rows if r["provider"] == provider and r["dist"] == dist and r["phase"] == phase]
    return found[-1] if found else None


def read_envs(results_dir) -> list[dict]:
    """env.json, then env-2.json, env-3.json, ... (one per session that resumed the run)."""
    root = Path(results_dir)
    paths = [root / "env.json"] + sorted(root.glob("env-*.json"), key=lambda p: (len(p.name), p.name))
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


# ---- formatting -----------------------------------------------------------------------------

def fmt_mib(x) -> str:
    if x is None:
        return "–"
    if x == 0:
        return "0"
    if abs(x) < 0.01:
        return f"{x:.1e}"
    if abs(x) < 10:
        return f"{x:.2g}" if abs(x) < 1 else f"{x:.1f}"
    return f"{x:.0f}"


def fmt_ms(x) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def fmt_err(x) -> str:
    return "–" if x is None else f"{x:.1e}"


def fmt_ratio(ours, theirs) -> str:
    if ours is None or not theirs:
        return "–"
    return f"{ours / theirs:.2f}x"


def _fmt_paper(mib, ms) -> str:
    """The paper's figures as printed there (no added digits)."""
    if mib is None:
        return "–"
    return f"{mib:g} / {'–' if ms is None else f'{ms:g}'}"


def status_text(row) -> str:
    return "not run" if row is None else row["status"]


def cell_text(row) -> str:
    if row is None:
        return "not run"
    if row["status"] != "ok":
        return f"**{row['status']}**"
    return f"{fmt_mib(num(row['peak_extra_mib']))} / {fmt_ms(num(row['ms']))}"


def md_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


# ---- claim checks ---------------------------------------------------------------------------

@dataclass
class Check:
    claim: str
    dist: str
    method: str
    measured: str
    tolerance: str
    verdict: str  # PASS | FAIL | NOT RUN


def _not_ok(row, what: str):
    """(measured, verdict) for a row that cannot be compared: missing, not runnable, failed."""
    if row is None:
        return f"{what}: not in the results", "NOT RUN"
    if row["status"] in NOT_RUN_STATUSES:
        return f"{what}: {row['status']} ({row.get('error', '')[:80]})", "NOT RUN"
    return f"{what}: {row['status']} ({row.get('error', '')[:80]})", "FAIL"


def _mib_verdict(mib, passes):
    """(measured, verdict) of a memory figure; a run without memory numbers (CPU) is NOT RUN."""
    if mib is None:
        return "no memory recorded (not a CUDA run?)", "NOT RUN"
    return f"{mib:.4g} MiB", "PASS" if passes(mib) else "FAIL"


def _grad_errors(rows, provider, dist):
    """(row, dE error, dC error) of the first of loss+grad / grad that carries the errors."""
    for phase in ("loss+grad", "grad"):
        row = lookup(rows, provider, dist, phase)
        if row is not None and row["status"] == "ok" and (num(row.get("de_rel_err")) is not None
                                                           or num(row.get("dc_rel_err")) is not None):
            return row, num(row.get("de_rel_err")), num(row.get("dc_rel_err"))
    return lookup(rows, provider, dist, "loss+grad"), None, None


CLAIM_LOSS = '"loss memory 24 GB -> 1 MB"'
CLAIM_HEAD = '"classifier head 28 GB -> 1 GB"'
CLAIM_SPEED = '"without sacrificing speed"'
CLAIM_GRAD = "gradients agree with the fp32 reference"


def claim_checks(rows: list[dict], methods=CCE_METHODS, dists=DISTS) -> list[Check]:
    """PASS / FAIL of the paper's headline claims on the Table 1 rows (``table1_rows``).

    - loss memory: baseline ``loss`` within 5 % of 24000 MiB; each CCE ``loss`` rounds to at
      most 1 MiB (< 1.5 MiB; the paper rounds its table to the closest MB).
    - classifier head: baseline ``loss+grad`` within 5 % of 28000 MiB; each CCE ``loss+grad``
      <= 1.1 x the lower bound (dE + dC).
    - speed: each CCE ``loss+grad`` median time <= torch.compile's on the same inputs.
    - gradients: each CCE dE and dC relative error vs the fp32 reference <= 1.5 x the naive
      baseline's (bf16 logits, fp32 softmax) on the same inputs.
    A method that failed (oom, error, nan, crashed) FAILs; one that is not installed or not
    measured is NOT RUN.
    """
    checks = []
    lb = lower_bound_mib("loss+grad")
    for dist in dists:
        for claim, phase, target in ((CLAIM_LOSS, "loss", BASELINE_LOSS_MIB),
                                     (CLAIM_HEAD, "loss+grad", BASELINE_LOSS_GRAD_MIB)):
            row = lookup(rows, "naive", dist, phase)
            lo, hi = target * (1 - BASELINE_REL_TOL), target * (1 + BASELINE_REL_TOL)
            tol = f"baseline {PHASE_TITLE[phase]} within 5 % of {target} MiB ({lo:.0f}–{hi:.0f})"
            if row is None or row["status"] != "ok":
                measured, verdict = _not_ok(row, "naive")
            else:
                mib = num(row["peak_extra_mib"])
                measured, verdict = _mib_verdict(mib, lambda m: lo <= m <= hi)
            checks.append(Check(claim, dist, "naive", measured, tol, verdict))
            for method in methods:
                row = lookup(rows, method, dist, phase)
                limit = CCE_LOSS_MAX_MIB if phase == "loss" else CCE_LOSS_GRAD_MAX_OVER_LOWER_BOUND * lb
                tol = (f"rounds to <= 1 MiB (< {CCE_LOSS_MAX_MIB:g} MiB)" if phase == "loss" else
                       f"<= {CCE_LOSS_GRAD_MAX_OVER_LOWER_BOUND:g} x lower bound {lb:.0f} MiB "
                       f"= {limit:.0f} MiB")
                if row is None or row["status"] != "ok":
                    measured, verdict = _not_ok(row, method)
                else:
                    mib = num(row["peak_extra_mib"])
                    measured, verdict = _mib_verdict(
                        mib, (lambda m: m < limit) if phase == "loss" else (lambda m: m <= limit))
                checks.append(Check(claim, dist, method, measured, tol, verdict))

        ref = lookup(rows, "torch_compile", dist, "loss+grad")
        ref_ms = num(ref["ms"]) if ref is not None and ref["status"] == "ok" else None
        for method in methods:
            row = lookup(rows, method, dist, "loss+grad")
            if ref_ms is None:  # nothing to compare with
                checks.append(Check(CLAIM_SPEED, dist, method,
                                    f"reference torch_compile: {status_text(ref)}",
                                    "loss+gradient time <= torch.compile's", "NOT RUN"))
                continue
            tol = f"loss+gradient time <= torch.compile's {fmt_ms(ref_ms)} ms"
            if row is None or row["status"] != "ok":
                measured, verdict = _not_ok(row, method)
            else:
                ms = num(row["ms"])
                if ms is None:
                    measured, verdict = "no time recorded", "NOT RUN"
                else:
                    measured = f"{fmt_ms(ms)} ms ({ms / ref_ms:.2f}x torch.compile)"
                    verdict = "PASS" if ms <= ref_ms else "FAIL"
            checks.append(Check(CLAIM_SPEED, dist, method, measured, tol, verdict))

        naive_row, naive_de, naive_dc = _grad_errors(rows, "naive", dist)
        for method in methods:
            row, de, dc = _grad_errors(rows, method, dist)
            if naive_de is None or naive_dc is None:  # nothing to compare with
                what = status_text(naive_row) if naive_row is None or naive_row["status"] != "ok" \
                    else "no gradient error recorded"
                checks.append(Check(CLAIM_GRAD, dist, method, f"reference naive: {what}",
                                    f"dE, dC error <= {GRAD_ERR_MAX_OVER_NAIVE:g} x naive's",
                                    "NOT RUN"))
                continue
            de_max, dc_max = GRAD_ERR_MAX_OVER_NAIVE * naive_de, GRAD_ERR_MAX_OVER_NAIVE * naive_dc
            tol = (f"<= {GRAD_ERR_MAX_OVER_NAIVE:g} x naive's (dE {fmt_err(naive_de)}, "
                   f"dC {fmt_err(naive_dc)}): dE <= {fmt_err(de_max)}, dC <= {fmt_err(dc_max)}")
            if row is None or row["status"] != "ok":
                measured, verdict = _not_ok(row, method)
            elif de is None or dc is None:
                measured, verdict = f"{method}: no gradient error recorded", "NOT RUN"
            else:
                measured = f"dE {fmt_err(de)}, dC {fmt_err(dc)}"
                verdict = "PASS" if de <= de_max and dc <= dc_max else "FAIL"
            checks.append(Check(CLAIM_GRAD, dist, method, measured, tol, verdict))
    return checks


# ---- table1.md ------------------------------------------------------------------------------

# env.json fields shown in the report (suite.results.environment), in this order.
ENV_FIELDS = [("gpu_name", "GPU"), ("gpu_count", "GPUs visible"),
              ("compute_capability", "compute capability"), ("driver", "NVIDIA driver"),
              ("cuda", "CUDA (torch build)"), ("torch", "torch"), ("triton", "triton"),
              ("cut_cross_entropy", "cut-cross-entropy (Apple CCE)"),
              ("liger_kernel", "liger-kernel"), ("python", "python"), ("platform", "platform"),
              ("cpu", "CPU"), ("triton_interpret", "TRITON_INTERPRET"), ("git_commit", "git commit"),
              ("git_dirty", "uncommitted changes"), ("date", "date"), ("run_id", "run id")]


def _env_lines(envs: list[dict], devices: list[str]) -> list[str]:
    lines = [f"- rows measured on: {', '.join(devices) if devices else 'unknown device'}"]
    if not envs:
        return lines + ["- env.json: missing"]
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


def render_table1(rows: list[dict], envs: list[dict], source: str) -> tuple[str, list[Check]]:
    """``rows``: the whole run; returns (markdown, checks)."""
    t1 = table1_rows(rows)
    dists = [d for d in DISTS if any(r["dist"] == d for r in t1)] or list(DISTS)
    devices = sorted({r.get("device", "") for r in t1 if r.get("device")})
    g = GEMMA2_2B
    out = [
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
        *_env_lines(envs, devices),
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
    for dist in dists:
        out += [f"## Ours, `{dist}` inputs (MiB / ms)", ""]
        body = []
        for method, label, _ in METHODS:
            if method == "lower_bound":
                body.append([label] + [f"{fmt_mib(lower_bound_mib(p))} / –" for p in TABLE1_PHASES])
            else:
                body.append([label] + [cell_text(lookup(t1, method, dist, p)) for p in TABLE1_PHASES])
        out += [md_table(["method"] + [PHASE_TITLE[p] for p in TABLE1_PHASES], body), ""]

    out += ["## The paper's Table 1 (MiB / ms)", "",
            f"Published numbers, copied from {PAPER_SOURCE}; not measured here.", ""]
    body = []
    for paper_row, phases in PAPER_TABLE1.items():
        body.append([paper_row] + [_fmt_paper(*phases[p]) for p in TABLE1_PHASES])
    out += [md_table(["method"] + [PHASE_TITLE[p] for p in TABLE1_PHASES], body), ""]

    for dist in dists:
        out += [f"## Ours / paper, `{dist}` inputs (memory ratio / time ratio)", ""]
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
                    cells.append(f"{fmt_ratio(num(row['peak_extra_mib']), theirs_mib)} / "
                                 f"{fmt_ratio(num(row['ms']), theirs_ms)}")
            body.append([f"{label} vs paper's {paper_row}"] + cells)
        out += [md_table(["method"] + [PHASE_TITLE[p] for p in TABLE1_PHASES], body), ""]

    checks = claim_checks(t1, dists=dists)
    counts = {v: sum(c.verdict == v for c in checks) for v in ("PASS", "FAIL", "NOT RUN")}
    out += [
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
    return "\n".join(out), checks


def write_table1(results_dir, out_path=None) -> tuple[Path, list[Check]]:
    results_dir = Path(results_dir)
    rows = read_rows(results_dir)
    text, checks = render_table1(rows, read_envs(results_dir), results_dir.as_posix() + "/results.csv")
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
    parser.add_argument("--out", default=f"results/table1_{PRESET}",
                        help=f"run folder for results.csv, env.json, table1.md "
                             f"(default: results/table1_{PRESET})")
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
    print(f"reproduce: wrote {path}")
    return 0
