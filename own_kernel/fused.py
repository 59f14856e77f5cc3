"""The three-matmul training path: loss and both gradients in the forward, in row chunks whose
logits live briefly in a bounded workspace.

When the loss's upstream gradient is one scalar (reduction "mean" or "sum"), the backward only
scales, so the forward can do all the work once per chunk of rows R:

    Z_R   = E_R C^T (+ bias)          cuBLAS, into the workspace (input dtype)
    G_R   = dL/dZ_R, loss_R           logits_grad.py: one kernel, two reads of Z_R, G over Z_R
    dE_R  = w G_R C                   cuBLAS, fp32 out (the K = V reduction never rounds to
                                      16 bits mid-way; w on alpha), stored in E's dtype
    dC   += w G_R^T E_R               cuBLAS into an fp32 accumulator when there are several
                                      chunks (16-bit accumulation loses the cancellations of
                                      frequent tokens' columns on LM-like inputs)

with w the reduction's weight (1 / count for the mean). Three matmuls instead of the recompute
path's four; the price is the workspace: the chunk's logits, its fp32 dE rows and, with several
chunks, dC's fp32 accumulator (plan.fused_plan; fp32 inputs need only the logits). With the filter, the kernel marks column blocks
holding an entry >= eps (or a flat row's), and dE and dC run over marked blocks only.

Rows whose target is ignored are gathered out by the caller (api.py): every row here has a target.
"""
from __future__ import annotations

import torch

from own_kernel.config import Config
from own_kernel.gemm import addmm_fp32, mm_scaled
from own_kernel.logits_grad import logits_to_grad
from own_kernel.options import Options
from own_kernel.plan import FusedPlan, cdiv


ALIGN = 8  # columns: cuBLAS's fast 16-bit kernels need K and leading dims multiples of 8


def aligned_runs(runs: list[tuple[int, int]], v: int) -> list[tuple[int, int]]:
    """runs with the last V mod 8 columns as their own run (at V 50257 one GEMM over all the
    columns fell off cuBLAS's fast kernels)."""
    cut = v - v % ALIGN
    out = []
    for a, b in runs:
        out += [(a, cut), (cut, b)] if a < cut < b else [(a, b)]
    return out


def kept_runs(kept: torch.Tensor, block: int, v: int) -> list[tuple[int, int]]:
    """Column ranges [a, b) of the consecutive marked blocks (a host read of the marks)."""
    runs, start = [], None
    for i, k in enumerate(kept.tolist() + [0]):
        if k and start is None:
            start = i
        elif not k and start is not None:
            runs.append((start * block, min(v, i * block)))
            start = None
    return runs


class _Sums:
    """The gradients being assembled: dE rows as they complete, dC (fp32 over chunks, or the
    single chunk's own), dbias's fp32 column sums. fp32 inputs need no fp32 copies: dE's rows
    and dC (the outputs themselves) are the GEMMs' outputs and dC's accumulator."""

    def __init__(self, e, c, bias, plan: FusedPlan, weight: float, filtered: bool):
        self.weight = weight
        self.de = torch.empty_like(e)
        fp32 = e.dtype == torch.float32
        self.de32 = (None if fp32 else
                     torch.empty(plan.rows, e.shape[1], device=e.device, dtype=torch.float32))
        v, d = c.shape
        # Exact, the first chunk writes every row of dC's fp32 buffer (beta 0): no pass to zero
        # its 4 V D bytes. Filtered, skipped blocks must read as zero.
        self.dc32_zeroed = filtered
        if plan.accumulate_dc:
            alloc = torch.zeros if filtered else torch.empty
            self.dc32 = alloc(v, d, device=c.device, dtype=torch.float32)
            self.dc = None
        else:
            self.dc32 = None
            # A skipped block's dC rows stay zero; exact, every row is written.
            self.dc = torch.zeros_like(c) if filtered else torch.empty_like(c)
        self.dbias32 = (torch.zeros(v, device=c.device, dtype=torch.float32)
                        if bias is not None else None)

    def add_chunk(self, g, e_rows, c, r0: int, runs) -> None:
        rows = g.shape[0]
        de_rows = self.de[r0:r0 + rows]
        de32 = de_rows if self.de32 is None else self.de32[:rows]
        one_run = len(runs) == 1  # else (several runs, or none kept) the rows sum from zero
        if not one_run:
            de32.zero_()
        for a, b in runs:  # the weight on alpha: no pass to scale the rows afterwards
            addmm_fp32(de32, g[:, a:b], c[a:b], alpha=self.weight, beta=float(not one_run))
        if self.de32 is not None:
            de_rows.copy_(de32)
        dc_beta = 0.0 if r0 == 0 and not self.dc32_zeroed else 1.0
        for a, b in runs:
            if self.dc32 is not None:
                addmm_fp32(self.dc32[a:b], g[:, a:b].t(), e_rows, alpha=self.weight,
                           beta=dc_beta)
            else:
                mm_scaled(self.dc[a:b], g[:, a:b].t(), e_rows, self.weight)
            if self.dbias32 is not None:
                self.dbias32[a:b] += g[:, a:b].sum(0, dtype=torch.float32)

    def result(self, c, bias):
        dc = self.dc if self.dc32 is None else self.dc32.to(c.dtype)  # fp32: dC itself
        self.dc32 = None
        dbias = None if bias is None else (self.dbias32 * self.weight).to(bias.dtype)
        return self.de, dc, dbias


def fused_loss_and_grads(e, c, targets, bias, opts: Options, cfg: Config, plan: FusedPlan,
                         weight: float):
    """(weight * sum of the rows' losses (fp32, 0-d), dE, dC, dbias or None) of rows that all
    have a target. weight: the reduction's, 1 / count for the mean, 1 for the sum."""
    n = e.shape[0]
    v = c.shape[0]
    block = cfg.fused.block
    filt = opts.filter
    # Rows 16-byte aligned whatever V (50257: cuBLAS's fast kernels need aligned leading dims).
    ws = torch.empty(plan.rows, plan.row_stride, device=e.device, dtype=e.dtype)[:, :v]
    losses = torch.empty(n, device=e.device, dtype=torch.float32)
    kept = (torch.empty(cdiv(v, block), device=e.device, dtype=torch.int8)
            if filt is not None else None)
    sums = _Sums(e, c, bias, plan, weight, filtered=filt is not None)
    every_column = aligned_runs([(0, v)], v)
    for r0 in range(0, n, plan.rows):
        r1 = min(n, r0 + plan.rows)
        z = ws[:r1 - r0]
        for a, b in every_column:
            if bias is None:
                torch.mm(e[r0:r1], c[a:b].t(), out=z[:, a:b])
            else:
                torch.addmm(bias[a:b], e[r0:r1], c[a:b].t(), out=z[:, a:b])
        if kept is not None:
            kept.zero_()
        logits_to_grad(z, targets[r0:r1], losses[r0:r1], softcap=opts.softcap,
                       label_smoothing=opts.label_smoothing, kept=kept,
                       eps=filt.eps if filt else 0.0, flat_p_max=filt.min_p_max if filt else 0.0,
                       block=block, num_warps=cfg.fused.num_warps)
        runs = every_column if kept is None else aligned_runs(kept_runs(kept, block, v), v)
        sums.add_chunk(z, e[r0:r1], c, r0, runs)
    del ws, z
    de, dc, dbias = sums.result(c, bias)
    return losses.sum() * weight, de, dc, dbias


class FusedLce(torch.autograd.Function):
    """The loss (mean or sum) with its gradients computed in the forward; the backward scales
    them by the upstream gradient (a host read of that one value: 1 skips the pass over dC)."""

    @staticmethod
    def forward(ctx, e, c, targets, bias, opts: Options, cfg: Config, plan: FusedPlan,
                weight: float):
        loss, de, dc, dbias = fused_loss_and_grads(e, c, targets, bias, opts, cfg, plan, weight)
        ctx.grads = (de, dc, dbias)  # intermediates, not inputs or outputs: plain attributes
        return loss

    @staticmethod
    def backward(ctx, grad):
        de, dc, dbias = ctx.grads
        del ctx.grads
        scale = float(grad)
        if scale != 1.0:
            de, dc = de.mul_(scale), dc.mul_(scale)
            dbias = dbias.mul_(scale) if dbias is not None else None
        return de, dc, None, dbias, None, None, None, None
