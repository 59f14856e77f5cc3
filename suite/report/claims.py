"""Every claim the suite checks, with its bounds and the providers it names, in one place:

- the own kernel's targets (:func:`targets_table`, ``report --targets``), per bf16 cell;
- the paper's headline claims at its Table 1 setting (:func:`claim_checks`, ``reproduce``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from suite import presets
from suite.report.formatting import fmt_err, fmt_ms, latest_rows, num, num_or_none
from suite.report.verdict import FASTER, RULE_TEXT, at_most, time_verdict
from suite.schema import DTYPE_BYTES

MIB = 2**20

# The paper's Table 1 setting: the Gemma 2 (2B) shape (suite.presets) in bf16; its claims and
# the loss-memory target hold here.
_G = presets.GEMMA2_2B
GEMMA2_2B = dict(n=_G.n, d=_G.d, v=_G.v, dtype="bf16", softcap=_G.softcap)

# ---- the gradients' size: the least memory a loss+grad call can hold ------------------------


def gradient_lower_bound_mib(n, d, v, dtype, bias=False) -> float:
    """Memory a loss+gradient must hold at least: dE (N x D), dC (V x D) (and dbias (V)) in the
    input dtype."""
    try:
        elt = DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}") from None
    return ((n + v) * d + (v if bias else 0)) * elt / MIB


def loss_lower_bound_mib() -> float:
    """A forward must hold at least its fp32 scalar output."""
    return 4 / MIB


def lower_bound_mib(phase, n=GEMMA2_2B["n"], d=GEMMA2_2B["d"], v=GEMMA2_2B["v"],
                    dtype=GEMMA2_2B["dtype"]) -> float:
    if phase in ("fwd", "loss"):
        return loss_lower_bound_mib()
    return gradient_lower_bound_mib(n, d, v, dtype)


def grads_bytes(row) -> float:
    """Bytes of the gradients a loss+grad call of this row's cell returns."""
    bias = str(row.get("bias", "0")) in ("1", "True", "true")
    return gradient_lower_bound_mib(int(row["n"]), int(row["d"]), int(row["v"]), row["dtype"],
                                    bias) * MIB


# ---- the own kernel's targets (bf16, on the GPU) ----------------------------------------------

# The targets are the exact recompute path's (own_recompute: workspace 0), its filtered and its
# low-memory variants'.
OWN, OWN_FILTER, OWN_LOW_MEMORY = "own_recompute", "own_filter", "own_low_memory"
OWN_DEFAULT = "own"  # the API's default call
BASELINE, FAST_PEER, CCE_PEER = "naive", "torch_compile", "apple_cce"
GRADS_RATIO = 1.10  # loss+grad memory <= 1.10x the gradients (dE + dC)
# Forward time over one floor (one cuBLAS E @ C.T of the cell's shape); exact loss+grad over
# floors (1.15 x the four matmuls it needs at least); own_filter against torch.compile on lm
# inputs (time, memory); gradient errors over the naive baseline's (exact, filtered); the loss
# phase's memory in MiB (at the Gemma 2 (2B) shape).
FWD_MAX, EXACT_MAX = 1.10, 1.15 * 4
FILTER_MIB_MAX = 0.25
EXACT_ERR_MAX, FILTER_ERR_MAX = 1.5, 3.0
LOSS_MIB_MAX = 1.0
TARGET_COLUMNS = [
    "dist", "N", "D", "V", "softcap", "fwd ×floor", f"{OWN} ×floor",
    f"{OWN_FILTER} ÷ {CCE_PEER}", f"{OWN_FILTER} ÷ {FAST_PEER} (time / MiB)",
    f"MiB ÷ grads {OWN} / {OWN_LOW_MEMORY}",
    f"err ÷ {BASELINE} {OWN} / {OWN_FILTER} / {OWN_LOW_MEMORY}", f"loss MiB {OWN} (target at Gemma)"]
TARGET_COUNTS = [  # (counter, what the line under the table says)
    ("fwd", f"forward ≤ {FWD_MAX:.2f}× floor ({OWN})"),
    ("exact", f"loss+grad, exact, ≤ {EXACT_MAX:.2f} floors ({OWN})"),
    ("filter_tc", f"{OWN_FILTER} no slower than {FAST_PEER} (faster or level) at "
                  f"≤ {FILTER_MIB_MAX:g}× its memory (lm inputs)"),
    ("apple", f"{OWN_FILTER} faster than {CCE_PEER}"),
    (f"grads {OWN}", f"loss+grad memory ≤ {GRADS_RATIO:.2f}× the gradients ({OWN})"),
    (f"grads {OWN_LOW_MEMORY}", f"loss+grad memory ≤ {GRADS_RATIO:.2f}× the gradients "
                                f"({OWN_LOW_MEMORY})"),
    (f"err {OWN}", f"dE and dC errors ≤ {EXACT_ERR_MAX:g}× {BASELINE}'s ({OWN})"),
    (f"err {OWN_FILTER}", f"dE and dC errors ≤ {FILTER_ERR_MAX:g}× {BASELINE}'s ({OWN_FILTER})"),
    (f"err {OWN_LOW_MEMORY}", f"dE and dC errors ≤ {EXACT_ERR_MAX:g}× {BASELINE}'s "
                              f"({OWN_LOW_MEMORY})"),
    ("loss", f"loss memory ≤ {LOSS_MIB_MAX:g} MiB ({OWN}, Gemma 2 (2B) shape)"),
]


class _Targets:
    """The latest ok rows of many folders, and per target how many cells met it."""

    def __init__(self, rows):
        self.latest = latest_rows(rows)
        self.counts: dict = {}

    def get(self, cell, provider, phase):
        r = self.latest.get((cell, provider, phase))
        return r if r is not None and r["status"] == "ok" else None

    def floor_ratio(self, cell, provider, phase):
        r = self.get(cell, provider, phase)
        return num(r["floor_ratio"]) if r else math.nan

    def err_ratio(self, cell, provider):
        me, base = self.get(cell, provider, "loss+grad"), self.get(cell, BASELINE, "loss+grad")
        if me is None or base is None:
            return math.nan
        ratios = [num(me[k]) / num(base[k]) for k in ("de_rel_err", "dc_rel_err")
                  if num(base[k]) > 0 and math.isfinite(num(me[k]))]
        return max(ratios) if ratios else math.nan

    def verdict(self, cell, provider, peer):
        """suite.report.verdict's verdict of provider's loss+grad time against peer's."""
        return time_verdict(self.get(cell, provider, "loss+grad"), self.get(cell, peer, "loss+grad"))

    def ratio(self, cell, provider, peer, col):
        me, other = self.get(cell, provider, "loss+grad"), self.get(cell, peer, "loss+grad")
        if me is None or other is None or not num(other[col]) > 0:
            return math.nan
        return num(me[col]) / num(other[col])

    def over_grads(self, cell, provider):
        me = self.get(cell, provider, "loss+grad")
        return math.nan if me is None else num(me["peak_extra_mib"]) * MIB / grads_bytes(me)

    def mark(self, name, value, ok, fmt="{:.2f}"):
        """The value, ✗ where it misses; counted under `name` when it is measured."""
        if not math.isfinite(value):
            return "–"
        met, total = self.counts.get(name, (0, 0))
        self.counts[name] = (met + bool(ok), total + 1)
        return fmt.format(value) + ("" if ok else " ✗")

    def count_line(self, name, what):
        met, total = self.counts.get(name, (0, 0))
        return f"- {what}: {met} of {total} cells"


def _is_gemma(row) -> bool:
    return all(num(row.get(k)) == float(GEMMA2_2B[k]) for k in ("n", "d", "v", "softcap"))


def _target_cols(t: _Targets, c, r) -> list[str]:
    softcap = num(r.get("softcap"))
    fwd_x, exact_x = t.floor_ratio(c, OWN, "fwd"), t.floor_ratio(c, OWN, "loss+grad")
    vs_apple = t.ratio(c, OWN_FILTER, CCE_PEER, "ms")
    apple_verdict = t.verdict(c, OWN_FILTER, CCE_PEER)
    t_tc = t.ratio(c, OWN_FILTER, FAST_PEER, "ms")
    m_tc = t.ratio(c, OWN_FILTER, FAST_PEER, "peak_extra_mib")
    tc_verdict = t.verdict(c, OWN_FILTER, FAST_PEER)
    if r["dist"] == "lm" and tc_verdict is not None and math.isfinite(m_tc):
        vs_tc = t.mark("filter_tc", t_tc, tc_verdict != "slower" and m_tc <= FILTER_MIB_MAX,
                       "{:.2f} " + tc_verdict) + f" / {m_tc:.2f}"
    else:
        vs_tc = "–"  # the target is for lm inputs
    loss = t.get(c, OWN, "loss")
    loss_mib = num(loss["peak_extra_mib"]) if loss else math.nan
    if _is_gemma(r):
        loss_text = t.mark("loss", loss_mib, loss_mib <= LOSS_MIB_MAX)
    else:
        loss_text = f"{loss_mib:.2f}" if math.isfinite(loss_mib) else "–"
    return [r["dist"], r["n"], r["d"], r["v"],
            f"{softcap:g}" if math.isfinite(softcap) and softcap > 0 else "–",
            t.mark("fwd", fwd_x, fwd_x <= FWD_MAX),
            t.mark("exact", exact_x, exact_x <= EXACT_MAX),
            t.mark("apple", vs_apple if apple_verdict else math.nan, apple_verdict == FASTER,
                   "{:.2f} " + (apple_verdict or "")),
            vs_tc,
            " / ".join(t.mark(f"grads {p}", x, x <= GRADS_RATIO, "{:.3f}") for p, x in
                       ((OWN, t.over_grads(c, OWN)), (OWN_LOW_MEMORY, t.over_grads(c, OWN_LOW_MEMORY)))),
            " / ".join(t.mark(f"err {p}", x, x <= bound) for p, bound in
                       ((OWN, EXACT_ERR_MAX), (OWN_FILTER, FILTER_ERR_MAX),
                        (OWN_LOW_MEMORY, EXACT_ERR_MAX)) for x in [t.err_ratio(c, p)]),
            loss_text]


def targets_table(rows: list[dict]) -> str:
    """One row per bf16 cell with the own kernel's targets: each value against its bound (✗
    where it misses), then per target how many cells meet it. A value needs its rows with status
    ok (and the peer's, for a ratio); otherwise it shows –."""
    t = _Targets(rows)
    first = {}  # a row of each bf16 cell, for its shape
    for (cell, _, _), r in t.latest.items():
        if r["dtype"] == "bf16" and cell not in first:
            first[cell] = r
    cells = sorted(first, key=lambda c: (first[c]["dist"], int(first[c]["n"]), int(first[c]["d"]),
                                         int(first[c]["v"]), num(first[c].get("softcap"))))
    lines = ["| " + " | ".join(TARGET_COLUMNS) + " |", "|" + "---|" * len(TARGET_COLUMNS)]
    lines += ["| " + " | ".join(_target_cols(t, c, first[c])) + " |" for c in cells]
    lines += [""] + [t.count_line(name, what) for name, what in TARGET_COUNTS]
    return "\n".join(lines)


# ---- the paper's headline claims (Table 1, Gemma 2 (2B)) ---------------------------------------

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
CCE_METHODS = ("apple_cce", "apple_cce_nofilter", OWN_DEFAULT, OWN_FILTER, OWN_LOW_MEMORY)
CLAIM_DISTS = ("uniform", "lm")
BASELINE_LOSS_MIB = 24000
BASELINE_LOSS_GRAD_MIB = 28000
BASELINE_REL_TOL = 0.05
# "1 MB": the paper's Table 1 rounds to the closest MB, so a loss that rounds to 1 MiB or less
# (below 1.5 MiB) meets the claim.
CCE_LOSS_MAX_MIB = 1.5
CCE_LOSS_GRAD_MAX_OVER_LOWER_BOUND = 1.1
GRAD_ERR_MAX_OVER_NAIVE = 1.5
NOT_RUN_STATUSES = ("unavailable", "unsupported")
PHASE_TITLE = {"loss": "loss", "grad": "gradient", "loss+grad": "loss+gradient"}
CLAIM_LOSS = '"loss memory 24 GB -> 1 MB"'
CLAIM_HEAD = '"classifier head 28 GB -> 1 GB"'
CLAIM_SPEED = '"without sacrificing speed"'
CLAIM_GRAD = "gradients agree with the fp32 reference"


@dataclass
class Check:
    claim: str
    dist: str
    method: str
    measured: str
    tolerance: str
    verdict: str  # PASS | FAIL | NOT RUN


def lookup(rows: list[dict], provider: str, dist: str, phase: str) -> dict | None:
    """The latest row of (provider, dist, phase): rows are appended as cells finish."""
    found = [r for r in rows if r["provider"] == provider and r["dist"] == dist and r["phase"] == phase]
    return found[-1] if found else None


def status_text(row) -> str:
    return "not run" if row is None else row["status"]


def _not_ok(row, what: str):
    """(measured, verdict) for a row that cannot be compared: missing, not runnable, failed."""
    if row is None:
        return f"{what}: not in the results", "NOT RUN"
    if row["status"] in NOT_RUN_STATUSES:
        return f"{what}: {row['status']} ({row.get('error', '')[:80]})", "NOT RUN"
    return f"{what}: {row['status']} ({row.get('error', '')[:80]})", "FAIL"


def _mib_verdict(row, what: str, passes):
    """(measured, verdict) of a row's memory; a run without memory numbers (CPU) is NOT RUN."""
    if row is None or row["status"] != "ok":
        return _not_ok(row, what)
    mib = num_or_none(row["peak_extra_mib"])
    if mib is None:
        return "no memory recorded (not a CUDA run?)", "NOT RUN"
    return f"{mib:.4g} MiB", "PASS" if passes(mib) else "FAIL"


def _grad_errors(rows, provider, dist):
    """(row, dE error, dC error) of the first of loss+grad / grad that carries the errors."""
    for phase in ("loss+grad", "grad"):
        row = lookup(rows, provider, dist, phase)
        if row is not None and row["status"] == "ok" and (
                num_or_none(row.get("de_rel_err")) is not None
                or num_or_none(row.get("dc_rel_err")) is not None):
            return row, num_or_none(row.get("de_rel_err")), num_or_none(row.get("dc_rel_err"))
    return lookup(rows, provider, dist, "loss+grad"), None, None


def _memory_checks(rows, methods, dist) -> list[Check]:
    checks, lb = [], lower_bound_mib("loss+grad")
    for claim, phase, target in ((CLAIM_LOSS, "loss", BASELINE_LOSS_MIB),
                                 (CLAIM_HEAD, "loss+grad", BASELINE_LOSS_GRAD_MIB)):
        lo, hi = target * (1 - BASELINE_REL_TOL), target * (1 + BASELINE_REL_TOL)
        tol = f"baseline {PHASE_TITLE[phase]} within 5 % of {target} MiB ({lo:.0f}–{hi:.0f})"
        measured, verdict = _mib_verdict(lookup(rows, BASELINE, dist, phase), BASELINE,
                                         lambda m: lo <= m <= hi)
        checks.append(Check(claim, dist, BASELINE, measured, tol, verdict))
        for method in methods:
            if phase == "loss":
                limit = CCE_LOSS_MAX_MIB
                tol, passes = f"rounds to <= 1 MiB (< {limit:g} MiB)", lambda m: m < limit
            else:
                limit = CCE_LOSS_GRAD_MAX_OVER_LOWER_BOUND * lb
                tol = (f"<= {CCE_LOSS_GRAD_MAX_OVER_LOWER_BOUND:g} x lower bound {lb:.0f} MiB "
                       f"= {limit:.0f} MiB")
                passes = lambda m: m <= limit  # noqa: E731
            measured, verdict = _mib_verdict(lookup(rows, method, dist, phase), method, passes)
            checks.append(Check(claim, dist, method, measured, tol, verdict))
    return checks


def _speed_checks(rows, methods, dist) -> list[Check]:
    ref = lookup(rows, FAST_PEER, dist, "loss+grad")
    ref_ms = num_or_none(ref["ms"]) if ref is not None and ref["status"] == "ok" else None
    checks = []
    for method in methods:
        row = lookup(rows, method, dist, "loss+grad")
        if ref_ms is None:  # nothing to compare with
            checks.append(Check(CLAIM_SPEED, dist, method, f"reference {FAST_PEER}: {status_text(ref)}",
                                "loss+gradient time no slower than torch.compile's", "NOT RUN"))
            continue
        tol = (f"loss+gradient time no slower than torch.compile's {fmt_ms(ref_ms)} ms "
               f"({RULE_TEXT})")
        if row is None or row["status"] != "ok":
            measured, verdict = _not_ok(row, method)
        elif (ms := num_or_none(row["ms"])) is None or at_most(row, ref) is None:
            measured, verdict = "no time range (p20–p80) recorded", "NOT RUN"
        else:
            measured = (f"{fmt_ms(ms)} ms ({ms / ref_ms:.2f}x torch.compile, "
                        f"{time_verdict(row, ref)})")
            verdict = "PASS" if at_most(row, ref) else "FAIL"
        checks.append(Check(CLAIM_SPEED, dist, method, measured, tol, verdict))
    return checks


def _agreement_checks(rows, methods, dist) -> list[Check]:
    naive_row, naive_de, naive_dc = _grad_errors(rows, BASELINE, dist)
    checks = []
    for method in methods:
        row, de, dc = _grad_errors(rows, method, dist)
        if naive_de is None or naive_dc is None:  # nothing to compare with
            what = status_text(naive_row) if naive_row is None or naive_row["status"] != "ok" \
                else "no gradient error recorded"
            checks.append(Check(CLAIM_GRAD, dist, method, f"reference {BASELINE}: {what}",
                                f"dE, dC error <= {GRAD_ERR_MAX_OVER_NAIVE:g} x naive's", "NOT RUN"))
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


def claim_checks(rows: list[dict], methods=CCE_METHODS, dists=CLAIM_DISTS) -> list[Check]:
    """PASS / FAIL of the paper's headline claims on the Table 1 rows.

    - loss memory: baseline ``loss`` within 5 % of 24000 MiB; each CCE ``loss`` rounds to at
      most 1 MiB (< 1.5 MiB; the paper rounds its table to the closest MB).
    - classifier head: baseline ``loss+grad`` within 5 % of 28000 MiB; each CCE ``loss+grad``
      <= 1.1 x the lower bound (dE + dC).
    - speed: each CCE ``loss+grad`` time no slower than torch.compile's on the same inputs
      (suite.report.verdict: faster or level).
    - gradients: each CCE dE and dC relative error vs the fp32 reference <= 1.5 x the naive
      baseline's (bf16 logits, fp32 softmax) on the same inputs.
    A method that failed (oom, error, nan, crashed) FAILs; one that is not installed or not
    measured is NOT RUN.
    """
    checks = []
    for dist in dists:
        checks += _memory_checks(rows, methods, dist)
        checks += _speed_checks(rows, methods, dist)
        checks += _agreement_checks(rows, methods, dist)
    return checks
