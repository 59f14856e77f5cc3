"""The forward pass every path runs: per-row loss, log-sum-exp, largest probability, -log
p_target, lse's rounding residue and (asked for) the entropy, without the N x V logits.

The route's forward kernel (Route.forward) computes each vocabulary split's partial (max, sum)
per row: kernels/forward_ws.py ("ws": two partials per split, one per consumer warpgroup),
kernels/forward_tma.py ("tma"), kernels/forward.py ("pointer", its tiles timed on
the GPU where the route says: Route.forward_tuned) or, off the three-matmul path, cuBLAS's fp32
logits of row chunks in the workspace budget, each read once by kernels/logits_lse.py
("cublas": one split, Route.forward_rows); kernels/target.py takes each row's target
logit and kernels/lse_combine.py combines the splits into the rows' results. The grid (splits
per row block, launch order) is plan.split_plan's for this launch's rows; with batch_invariant
one partial per fixed block of columns (plan.invariant_split_plan), combined left to right.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from own_kernel.kernels.forward import forward_partials
from own_kernel.kernels.forward_tma import forward_partials_tma
from own_kernel.kernels.gemm import logits_fp32
from own_kernel.kernels.logits_lse import logits_partials
from own_kernel.kernels.lse_combine import PartialSums, combine
from own_kernel.kernels.target import target_logit
from own_kernel.kernels.tile import num_sms
from own_kernel.policy.autotune import shape_bucket, time_launch, tune_key, tuned_tiles
from own_kernel.policy.config import with_overrides
from own_kernel.policy.options import Options
from own_kernel.policy.plan import aligned_runs, split_plan
from own_kernel.policy.route import Route


def forward(e, c, bias, targets, opts: Options, route: Route, *, skip_ignored=False,
            shifted=None):
    """Returns (loss, lse, p_max, nll, lse_lo, entropy), each (N,) fp32, natural log units:
    each row's loss (0 where the target is ignore_index), log-sum-exp, largest softmax
    probability (the gradient filter's flatness test), -log of the target's probability (the
    backward's target column; lse_combine.py says why it is kept apart), and what rounding lse
    to fp32 removed (lse + lse_lo is the lse to ~fp32 precision of its small part: the
    backward's softmax), and with ``opts.entropy`` each row's softmax entropy (0 where ignored;
    else an empty tensor). The logits are softcap(x) / temperature. Rows whose target is
    outside [0, V) and not ignore_index get a loss without the target term (the caller raises
    on them). skip_ignored: rows whose target is ignore_index get lse +inf and p_max 0 (no
    gradient flows through them: the backward's softmax exp(z - lse) is 0 there), and row
    blocks with only such rows compute no logits. shifted: None, or (Y, M) for the TMA kernel
    to write the shifted logits into (forward_tma.py; the three-matmul path's)."""
    if e.shape[0] == 0:  # distinct tensors: a custom op's outputs may not alias each other
        return tuple(torch.empty(0, device=e.device, dtype=torch.float32) for _ in range(6))
    part, z_target, sums = forward_parts(e, c, bias, targets, opts, route,
                                         skip_ignored=skip_ignored, shifted=shifted)
    return combine(part, z_target, targets, opts.ignore_index, opts.label_smoothing, c.shape[0],
                   skip_ignored, sums)


def forward_parts(e, c, bias, targets, opts: Options, route: Route, *, skip_ignored=False,
                  shifted=None):
    """(part, z_target, sums): the vocabulary splits' partials (sums.planes x splits x N, in
    column order), each row's target logit (0 where the target is not a column of c), and what
    the partials hold (lse_combine.PartialSums); combine() makes forward()'s rows of them, and
    the vocab-parallel path gathers every rank's first (paths/vocab_parallel.py)."""
    (n, d), v = e.shape, c.shape[0]
    softcap, ignore_index = opts.softcap, opts.ignore_index
    sums = PartialSums(opts.label_smoothing > 0, opts.entropy, float(opts.temperature))
    tma = route.forward == "tma"
    if shifted is not None and not tma:
        raise ValueError("shifted logits are written by the TMA forward only: needs "
                         "config.forward.tma and 16-byte aligned rows of e and c")
    if route.forward == "cublas":  # no grid: row chunks of cuBLAS's logits, one split
        part = _cublas_partials(e, c, bias, sums, softcap, route)
        return part, target_logit(e, c, bias, targets, softcap, opts.temperature), sums
    cfg = route.cfg
    if route.forward_tuned:
        cfg = _tuned(e, c, bias, targets, sums, softcap, ignore_index, cfg, skip_ignored)
    if route.call.batch_invariant:  # fixed vocabulary blocks (Route.forward_grid)
        grid = route.forward_grid(num_sms(e.device), v)
    else:
        grid = split_plan(n, v, d, e.element_size(), cfg, num_sms(e.device))
    ws = route.forward == "ws"  # two partials a split: one per consumer warpgroup
    part = torch.empty((sums.planes, 2 * grid.splits if ws else grid.parts(v), n),
                       device=e.device, dtype=torch.float32)
    if ws:  # imported here: Gluon is a newer Triton's (route.gluon_hopper)
        from own_kernel.kernels.forward_ws import forward_partials_ws

        # every row, skip_ignored or not: combine() marks the ignored ones inert
        forward_partials_ws(e, c, part, grid, sums.zsum, softcap, sums.temperature)
    elif tma:
        forward_partials_tma(e, c, bias, targets, part, grid, softcap, ignore_index, cfg,
                             skip_ignored, sums, shifted)
    else:
        forward_partials(e, c, bias, targets, part, grid, softcap, ignore_index, cfg,
                         skip_ignored, sums)
    return part, target_logit(e, c, bias, targets, softcap, opts.temperature), sums


def _cublas_partials(e, c, bias, sums: PartialSums, softcap, route: Route) -> torch.Tensor:
    """The partials of one split per row (sums.planes x 1 x N) from cuBLAS's fp32 logits of
    route.forward_rows's row chunks, each chunk read once by logits_lse.py. Every row, its
    target ignored or not: combine() makes the ignored ones inert."""
    n, v = e.shape[0], c.shape[0]
    plan, cfg = route.forward_rows, route.cfg
    part = torch.empty((sums.planes, 1, n), device=e.device, dtype=torch.float32)
    logits = torch.empty(plan.rows, plan.row_stride, device=e.device, dtype=torch.float32)
    runs = aligned_runs([(0, v)], v)
    for r0 in range(0, n, plan.rows):
        x = logits[:min(plan.rows, n - r0), :v]
        logits_fp32(x, e[r0:r0 + x.shape[0]], c, bias, runs)
        logits_partials(x, part, r0, softcap, sums, block=cfg.fused.block,
                        num_warps=cfg.fused.num_warps)
    return part


def _tuned(e, c, bias, targets, sums, softcap, ignore_index, cfg, skip_ignored):
    """cfg with the pointer forward's tiles tuned on this GPU for this shape bucket
    (policy/autotune.py): each candidate times the partials pass into a scratch buffer (the
    result is not used), once per bucket and machine."""
    (n, d), v = e.shape, c.shape[0]
    # The forward's other options set its loads and its grid: part of the pick's key.
    variant = tuple((f.name, getattr(cfg.forward, f.name))
                    for f in dataclasses.fields(cfg.forward) if f.name != "tiles")
    key = tune_key("forward", e.device, e.dtype, shape_bucket(n, v, d),
                   candidates=cfg.forward_candidates, variant=variant)

    def time_ms(tiles):
        trial = _with_forward_tiles(cfg, tiles)
        grid = split_plan(n, v, d, e.element_size(), trial, num_sms(e.device))
        part = torch.empty((sums.planes, grid.splits, n), device=e.device, dtype=torch.float32)
        return time_launch(lambda: forward_partials(e, c, bias, targets, part, grid, softcap,
                                                    ignore_index, trial, skip_ignored, sums))

    return _with_forward_tiles(cfg, tuned_tiles(key, cfg.forward_candidates, time_ms))


@functools.lru_cache(maxsize=64)
def _with_forward_tiles(cfg, tiles):
    return with_overrides(cfg, {"forward": {"tiles": tiles}})
