"""The route of one call: which path computes it, with which plan, and what it holds in memory.

Decided once per call, here, from integers and flags (``Call``) and the device's config: no
tensor is read and nothing is launched, so every decision can be tested on the CPU at real
shapes (tests/test_route.py). api.py asks ``route`` once and hands the result to the autograd
entry it names; each entry keeps the route's config for its backward. ``own_kernel.plan``
(api.py) is the public way to ask for it before running a call.

Paths:

- ``"three-matmul"`` (fused.py): a mean or sum with gradients, eager, whose row chunks fit the
  workspace budget (``workspace_mib``; None = the device's default);
- ``"recompute"`` (forward.py, backward.py): the forward's lse, then the backward recomputes the
  logits in vocabulary chunks (every other call with gradients);
- ``"low-memory"`` (backward_low_memory.py): ``low_memory=True``;
- ``"forward-only"``: no gradient is needed (torch.no_grad, inference_mode, inputs that do not
  require grad): the forward's lse pass alone.

The entry (how the path is reached): ``"fused"`` (FusedLce), ``"eager"`` (LceRowsEager),
``"compiled"`` (the custom ops, under torch.compile) or ``"vocab-parallel"`` (each rank's shard,
vocab_parallel.py). ``_entry`` is the one place that picks it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from own_kernel.policy.config import Config
from own_kernel.policy.plan import FusedPlan, chunk_plan, fused_plan, low_memory_plan

PATHS = ("three-matmul", "recompute", "low-memory", "forward-only")
ENTRIES = ("fused", "eager", "compiled", "vocab-parallel")


@dataclass(frozen=True)
class Call:
    """What the route depends on: the 2-D problem (n rows, v columns of this rank's c, d
    hidden), the input dtype and the call's options."""
    n: int
    v: int
    d: int
    dtype: torch.dtype
    reduction: str = "mean"
    needs_grad: bool = True
    has_bias: bool = False
    return_lse: bool = False
    low_memory: bool = False
    filtered: bool = False
    vocab_parallel: bool = False
    compiling: bool = False
    workspace_mib: int | None = None    # the caller's budget; None = the config's default
    entropy: bool = False               # return_entropy: the entropy's sum and gradient
    temperature: bool = False           # logits divided by a temperature other than 1
    # c (and bias) fp32 under 16-bit autocast (dtype: the GEMMs'): their gradients are fp32.
    # The three-matmul path sums dC in fp32 anyway and returns those sums as C's gradient;
    # every other path gets autocast's 16-bit copy and autograd casts dC back to fp32.
    fp32_weight: bool = False

    @property
    def elt(self) -> int:
        return self.dtype.itemsize


@dataclass(frozen=True)
class Route:
    """One call's path, the entry that runs it, the config every pass of the call runs with
    (its backward included) and, on the three-matmul path, its row chunks. note: why a
    budget goes unused, or ""."""
    path: str
    entry: str
    cfg: Config
    fused: FusedPlan | None = None
    budget_mib: int = 0         # the three-matmul budget in force (0: none)
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """What ``own_kernel.plan`` reports of a call before it runs.

    path: "three-matmul", "recompute", "low-memory" or "forward-only" (module docstring).
    chunks, chunk_size: the three-matmul path's row chunks and rows per chunk; the recompute
    path's vocabulary chunks and the widest one's columns; the low-memory path's pass-1 row
    chunks and rows per chunk; 0 and 0 without a backward.
    peak_bytes: an estimate of the memory the call holds at its peak beyond its inputs (the
    gradients, the workspaces and per-row vectors; not the gathered rows of ignored targets,
    which depend on the targets' values, nor the filter's gathered columns).
    budget_mib: the three-matmul path's workspace budget in force (0: none).
    note: why a budget goes unused (the path cannot take it, or its chunks do not fit), or ""."""
    path: str
    chunks: int
    chunk_size: int
    peak_bytes: int
    budget_mib: int
    note: str = ""


def _entry(call: Call) -> str:
    """The autograd entry that runs the call: vocab-parallel first (each rank's shard), then
    torch.compile's custom ops, then the eager entries."""
    if call.vocab_parallel:
        return "vocab-parallel"
    if call.compiling:
        return "compiled"
    return "eager"


def _three_matmul_excluded(call: Call) -> str:
    """Why the call cannot take the three-matmul path whatever the budget (else "")."""
    reasons = (
        (not call.needs_grad, "no gradient is needed"),
        (call.reduction == "none", 'reduction="none" has per-row upstream gradients'),
        (call.return_lse, "return_lse=True needs the lse's gradient"),
        (call.entropy, "return_entropy=True needs the entropy's gradient"),
        (call.temperature, "temperature= is applied on the recompute path only"),
        (call.low_memory, "low_memory=True asks for the low-memory backward"),
        (call.vocab_parallel, "vocab_parallel shards the vocabulary"),
        (call.compiling, "torch.compile runs the custom ops"),
        (call.n == 0, "there are no rows"),
    )
    return next((why for excluded, why in reasons if excluded), "")


def budget_mib(call: Call, cfg: Config) -> tuple[int, str]:
    """(the three-matmul budget in MiB, why it is 0 or goes unused, or "")."""
    if call.workspace_mib is not None:
        return call.workspace_mib, ""
    if call.filtered and not cfg.fused.filtered:
        # Measured (results/notes/fused-path.md): the filter skips (row, column) tiles in the
        # recompute path, but hardly a whole column block of a chunk of ~10^3 rows here, so
        # on Hopper filtered calls take this path only when given a budget.
        return 0, f"the {cfg.name} target keeps filtered calls on the recompute path by default"
    fp32 = call.dtype == torch.float32
    return (cfg.fused.default_workspace_mib_fp32 if fp32 else cfg.fused.default_workspace_mib), ""


def route(call: Call, cfg: Config) -> Route:
    """The call's path and entry, with the three-matmul path's plan where it runs. Cheap: every
    call asks it (no chunk planning beyond fused_plan's few integers)."""
    entry = _entry(call)
    mib, why_not = budget_mib(call, cfg)
    excluded = _three_matmul_excluded(call)
    if not excluded and mib:
        # The TMA forward reads rows of D elements at 16-byte aligned strides (fused.py copies
        # an e whose base is not aligned)
        shift_ok = cfg.forward.tma and (call.d * call.elt) % 16 == 0
        plan, why_not = fused_plan(call.n, call.v, call.d, call.elt, mib * 2**20, cfg,
                                   filtered=call.filtered, dc_fp32=call.fp32_weight,
                                   shift_ok=shift_ok)
        if plan is not None:
            return Route("three-matmul", "fused", cfg, plan, mib)
    elif excluded and call.workspace_mib:
        why_not = excluded
    note = f"workspace_mib={mib} unused: {why_not}" if mib and why_not else why_not
    if not call.needs_grad:
        path = "forward-only"
    else:
        path = "low-memory" if call.low_memory else "recompute"
    return Route(path, entry, cfg, None, 0, note)


def describe(call: Call, r: Route) -> Plan:
    """The route's chunking and estimated peak (Plan): the passes' own planning functions at
    the call's shape, nothing launched."""
    cfg, n, v, d, elt = r.cfg, call.n, call.v, call.d, call.elt
    if r.path == "three-matmul":
        peak = _gradient_bytes(call) + _weight_copy_bytes(call) + r.fused.extra_bytes + 4 * n
        return Plan(r.path, r.fused.chunks, r.fused.rows, peak, r.budget_mib, r.note)
    if r.path == "forward-only":
        return Plan(r.path, 0, 0, _vectors(call), r.budget_mib, r.note)
    # The other paths' gradients of an fp32 weight: the 16-bit dC too (autograd casts it)
    grads = _gradient_bytes(call) + 2 * _weight_copy_bytes(call)
    if r.path == "low-memory":
        lm = low_memory_plan(n, v, d, elt, cfg)
        peak = grads + lm.workspace_2 + _vectors(call)
        return Plan(r.path, -(-n // max(lm.rows_1, 1)), lm.rows_1, peak, r.budget_mib, r.note)
    chunks = chunk_plan(n, v, d, elt, cfg, tma=cfg.chunks.recompute == "tma",
                        filtered=call.filtered)
    peak = grads + 4 * n * d + _vectors(call)  # + dE's fp32 accumulator
    widest = max((ch.width for ch in chunks), default=0)
    return Plan(r.path, len(chunks), widest, peak, r.budget_mib, r.note)


def _gradient_bytes(call: Call) -> int:
    """dE, dC and dbias in their dtypes (an fp32 weight's: fp32)."""
    weight_elt = 4 if call.fp32_weight else call.elt
    return (call.n * call.d * call.elt
            + (call.v * call.d + (call.v if call.has_bias else 0)) * weight_elt)


def _weight_copy_bytes(call: Call) -> int:
    """Autocast's 16-bit copy of an fp32 weight (and bias), which the GEMMs read: the
    three-matmul path holds it through its forward only, the others through the backward."""
    if not call.fp32_weight:
        return 0
    return (call.v * call.d + (call.v if call.has_bias else 0)) * call.elt


def _vectors(call: Call) -> int:
    """The per-row and per-column fp32 vectors (loss, lse, largest probability, nll, weights;
    column sums): a few floats per row and column."""
    return 4 * (6 * call.n + 2 * call.v)
