"""The three-matmul training path: loss and both gradients in the forward, in row chunks whose
logits live briefly in a bounded workspace.

When the loss's upstream gradient is one scalar (reduction "mean" or "sum"), the backward only
scales, so the forward can do all the work once per chunk of rows R:

    Z_R   = E_R C^T (+ bias)          cuBLAS, into the workspace (fp32; 16-bit: config.Fused)
    G_R   = dL/dZ_R, loss_R           logits_grad.py: one kernel, two reads of Z_R, G over Z_R
    (or, shifted logits: the TMA forward writes Z_R in 16 bits relative to each tile's row max
    with the rows' lse and losses, forward_tma.py; then one read of Z_R, G over it;
    or, target-shifted logits: cuBLAS writes Z_R^T in 16 bits less each row's target logit,
    its bias; target_shifted_grad.py turns them into G^T)
    dE_R  = w G_R C                   cuBLAS, into dE's rows (w on alpha; fp32 sums when
                                      the filter or V mod 8 splits the K = V reduction)
    dC   += w G_R^T E_R               cuBLAS, its fp32 sums added into dC's 16-bit buffer
                                      (one rounding per chunk; config.Fused.dc_accumulator
                                      "fp32": into an fp32 accumulator, one rounding)

with w the reduction's weight (1 / count for the mean); with 16-bit G, dE's rows first hold the
rounding correction w row_round x mean(C) (finalize_de.py), which dE's GEMM adds to. Three
matmuls instead of the recompute path's four; the price is the workspace: the chunk's logits,
fp32 dE rows where dE's reduction is split, and, with several chunks and dc_accumulator
"fp32", dC's fp32 accumulator (plan.fused_plan; fp32 inputs need only the logits). With the
filter, the kernel marks column blocks holding an entry >= eps (or a flat row's), and dE and
dC run over marked blocks only.

Under autocast an fp32 weight (C, and its bias) arrives as it is: its gradient is fp32 anyway,
so dC's fp32 sums, in one chunk or several, are returned as that gradient (scaled in place) and
no 16-bit dC or cast back exists. The GEMMs read a 16-bit copy of C made here and dropped after
the last chunk's dE, before dC's buffer is made (dC's GEMM reads G and E only): a one-chunk
call holds the larger of the two, not both. The backward only scales.

No host read idles the GPU: the targets' check is read once the first chunk is queued (that
chunk keeps its rows without a target, zeroed by the pass; the rest's such rows are gathered
out), and the backward scales by the upstream gradient on the device.
"""
from __future__ import annotations

import math

import torch

from own_kernel.kernels.finalize_de import finalize_de
from own_kernel.kernels.gemm import (HostScalar, addmm_fp32, logits_fp32, mm_scaled,
                                     sampled_mean)
from own_kernel.kernels.logits_grad import logits_to_grad, shifted_to_grad
from own_kernel.kernels.scale import scale_into
from own_kernel.kernels.target import target_logit
from own_kernel.kernels.target_shifted_grad import target_shifted_to_grad
from own_kernel.kernels.tile import num_sms
from own_kernel.paths.forward import forward
from own_kernel.paths.shared import refuse_create_graph, used_rows
from own_kernel.paths.targets import raise_on_bad_targets
from own_kernel.policy.config import Config
from own_kernel.policy.options import Options
from own_kernel.policy.plan import (ALIGN, FusedPlan, aligned_runs, cdiv, even_rows,
                                    target_shift_splits)
from own_kernel.policy.route import Route


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
    """The gradients being assembled: dE rows as they complete (summed in fp32 rows when the
    plan splits their reduction), dC (its own buffer, or fp32 sums over chunks), dbias's
    fp32 column sums. fp32 inputs need no fp32 copies: dE's rows and dC (the outputs
    themselves) are the GEMMs' outputs and dC's accumulator. The upstream gradient is applied
    by :meth:`gradients` in the backward, on the device (an fp32 accumulator of dC is kept
    until then and rounded there), so reading that gradient on the host (which would idle the GPU
    while the host catches up) costs nothing to avoid."""

    def __init__(self, e, c, bias, plan: FusedPlan, filtered: bool):
        """c and bias as the caller gave them: their dtype is their gradients' (an fp32 weight
        under autocast beside 16-bit e: fp32, summed in dC's fp32 buffer whatever the chunks)."""
        if c.dtype != e.dtype and not plan.accumulate_dc:
            raise ValueError(f"c: a {c.dtype} weight beside {e.dtype} hidden states needs a "
                             f"plan that sums dC in fp32 (plan.fused_plan's dc_fp32)")
        self.de = torch.empty(e.shape, device=e.device, dtype=e.dtype)
        self.de32 = (torch.empty(plan.rows, e.shape[1], device=e.device, dtype=torch.float32)
                     if plan.de_rows_fp32 else None)
        v, d = c.shape
        # Exact, the first chunk writes every row of dC (its fp32 buffer with beta 0): no pass
        # to zero its bytes. Filtered, a skipped block's rows must read as zero.
        self.dc32_zeroed = filtered
        # dC's buffer (fp32 sums, or dC's own 16-bit one): made at its first GEMM (dc_buffer)
        self.dc_sums: torch.Tensor | None = None
        self.accumulate_dc = plan.accumulate_dc
        self.dc_layout = dict(size=(v, d), device=c.device,
                              dtype=torch.float32 if plan.accumulate_dc else c.dtype)
        self.dbias32 = (torch.zeros(v, device=c.device, dtype=torch.float32)
                        if bias is not None else None)
        self.dtype, self.bias_dtype = c.dtype, None if bias is None else bias.dtype
        self.weight = 1.0  # the reduction's, set once the host has read the targets' count
        # 16-bit G: what rounding removed from each row goes back into dE through C's mean row
        # (as finalize_de.py does on the recompute path): where every row of C shares a large
        # component, dE's true terms along it cancel and the rounding residue would not.
        self.row_round = self.c_mean = None
        if e.dtype != torch.float32:
            self.row_round = torch.empty(plan.rows, device=c.device, dtype=torch.float32)
            self.c_mean = sampled_mean(c)

    def add_de(self, g, de_rows, c, runs, last: bool) -> None:
        """The chunk's dE rows into de_rows, weighted by self.weight on the GEMMs' alpha (no
        pass to scale the rows afterwards). After the last chunk's the rounding residues and
        C's mean row are dropped: a one-chunk call then makes dC's buffer (add_dc) with none of
        its per-row vectors alive (its peak, which they held above torch.compile's where their
        large buffers are the same)."""
        self._add_de(g, de_rows, c, runs)
        if last:
            self.row_round = self.c_mean = None

    def dc_buffer(self) -> torch.Tensor:
        """dC's sums, made at their first write (zeros where filtered: see __init__)."""
        if self.dc_sums is None:
            alloc = torch.zeros if self.dc32_zeroed else torch.empty
            self.dc_sums = alloc(**self.dc_layout)  # contiguous: scale_into
        return self.dc_sums

    def _add_de(self, g, de_rows, c, runs) -> None:
        one_run = len(runs) == 1  # else (several runs, or none kept) the rows sum from zero
        rows = g.shape[0]
        if one_run and self.de32 is None:  # one GEMM: its fp32 sums rounded once, into dE
            (a, b), = runs
            if self.row_round is None:
                mm_scaled(de_rows, g[:, a:b], c[a:b], self.weight)
            else:  # the correction first, added to the GEMM's fp32 sums before the rounding
                finalize_de(None, self.row_round[:rows], self.c_mean, de_rows, self.weight)
                mm_scaled(de_rows, g[:, a:b], c[a:b], self.weight, accumulate=True)
            return
        de32 = de_rows if self.de32 is None else self.de32[:rows]  # fp32 sums over the runs
        if not one_run:
            de32.zero_()
        for a, b in runs:
            addmm_fp32(de32, g[:, a:b], c[a:b], alpha=self.weight, beta=float(not one_run))
        if self.row_round is not None:
            de32.addr_(self.row_round[:rows], self.c_mean, alpha=self.weight)
        if self.de32 is not None:
            de_rows.copy_(de32)

    def add_dc(self, g, e_rows, first: bool, runs) -> None:
        """The chunk's share of dC and dbias, weighted as dE's."""
        # The first chunk writes dC's sums (beta 0; into fp32 sums the filter zeroed, it adds:
        # a skipped block's rows must read as zero). With dC's own 16-bit buffer as the
        # accumulator (plan.accumulate_dc off, several chunks), the rest add theirs into it.
        dc_beta = 0.0 if first and not self.dc32_zeroed else 1.0
        dc = self.dc_buffer()
        for a, b in runs:
            if self.accumulate_dc:
                addmm_fp32(dc[a:b], g[:, a:b].t(), e_rows, alpha=self.weight, beta=dc_beta)
            else:
                mm_scaled(dc[a:b], g[:, a:b].t(), e_rows, self.weight, accumulate=not first)
            if self.dbias32 is not None:
                self.dbias32[a:b] += g[:, a:b].sum(0, dtype=torch.float32)

    def zero(self) -> None:
        """No row has a target: every gradient is zero."""
        self.de.zero_()
        self.dc_buffer().zero_()
        self.weight = 0.0

    def gradients(self, grad: torch.Tensor, in_place: bool = True):
        """(dE, dC, dbias or None) times the upstream gradient ``grad`` (a 0-d device tensor).
        in_place: scaled in their own buffers (the sums are then spent); else into new ones
        (the sums stay for another backward: retain_graph)."""
        def out(t):
            return t if in_place else torch.empty_like(t)

        de = scale_into(self.de, out(self.de), grad)
        sums = self.dc_buffer()
        if sums.dtype == self.dtype:  # dC's own buffer (fp32 inputs, an fp32 weight: the sums)
            dc = scale_into(sums, out(sums), grad)
        else:  # fp32 sums scaled while rounded to 16 bits: one pass, as the rounding alone
            dc = scale_into(sums, torch.empty(sums.shape, device=de.device, dtype=self.dtype),
                            grad)
        dbias = (None if self.dbias32 is None else
                 (self.dbias32 * (grad * self.weight)).to(self.bias_dtype))
        return de, dc, dbias


class _Rows:
    """Rows of the problem a run of chunks goes over: E's rows, their targets and where their dE
    rows go: slices of the call's own (no ignored target among them), or gathered copies of the
    rows with a target whose dE is scattered back by :meth:`finish`."""

    def __init__(self, e, targets, de, index=None):
        self.e, self.targets, self.de, self.index = e, targets, de, index

    @classmethod
    def rest(cls, e, targets, de, start: int, used: int, ignore_index: int) -> "_Rows":
        """Rows [start, N) of which ``used`` have a target: the slices when all have one, else
        those rows gathered (a row without a target costs three matmuls' work for nothing)."""
        if used == e.shape[0] - start:
            return cls(e[start:], targets[start:], de[start:])
        index = used_rows(targets[start:] != ignore_index, used, offset=start)
        return cls(e.index_select(0, index), targets[index],
                   torch.empty(used, e.shape[1], device=e.device, dtype=e.dtype), index)

    def finish(self, de, start: int) -> None:
        if self.index is not None:
            de[start:].zero_()
            de.index_copy_(0, self.index, self.de)


def _logits_and_grad(z, g, e_rows, c, bias, targets, losses, opts: Options, route: Route, kept,
                     columns, row_round=None) -> None:
    """z = the rows' logits (fp32 sums rounded to z's dtype), then (logits_grad.py) their
    gradient into g (z itself, or a 16-bit view of fp32 z's bytes), their losses, and, into
    row_round, what rounding the gradient removed."""
    if z.dtype != e_rows.dtype:  # fp32 logits of 16-bit inputs
        logits_fp32(z, e_rows, c, bias, columns)
    else:
        for a, b in columns:
            if bias is None:
                torch.mm(e_rows, c[a:b].t(), out=z[:, a:b])
            else:
                torch.addmm(bias[a:b], e_rows, c[a:b].t(), out=z[:, a:b])
    filt, cfg = route.filter, route.cfg
    if kept is not None:
        kept.zero_()
    logits_to_grad(z, targets, losses, ignore_index=opts.ignore_index, softcap=opts.softcap,
                   label_smoothing=opts.label_smoothing, kept=kept,
                   eps=filt.eps if filt else 0.0, flat_p_max=filt.min_p_max if filt else 0.0,
                   block=cfg.fused.block, num_warps=cfg.fused.num_warps, g=g,
                   row_round=row_round)


def _shifted_logits_and_grad(y, tile_max, e_rows, c, bias, targets, losses, opts: Options,
                             route: Route, kept, row_round) -> None:
    """The rows' shifted logits y and tile_max, with their losses, from the TMA forward
    (paths/forward.py, kernels/forward_tma.py), then their gradient over y
    (logits_grad.shifted_to_grad)."""
    cfg = route.cfg
    loss, lse, p_max, nll, lse_lo, _ = forward(e_rows, c, bias, targets, opts, route,
                                               shifted=(y, tile_max))
    losses.copy_(loss)
    filt = route.filter
    if kept is not None:
        kept.zero_()
    shifted_to_grad(y, tile_max, cfg.forward.tiles.block_v, (lse, p_max, nll, lse_lo), targets,
                    ignore_index=opts.ignore_index, softcap=opts.softcap,
                    label_smoothing=opts.label_smoothing, kept=kept,
                    eps=filt.eps if filt else 0.0, flat_p_max=filt.min_p_max if filt else 0.0,
                    block=cfg.fused.block, num_warps=cfg.fused.num_warps, row_round=row_round)


def _target_shifted_logits_and_grad(y, e_rows, c, bias, targets, losses, opts: Options,
                                    route: Route, kept, row_round, scratch) -> torch.Tensor:
    """y (V x the rows rounded up to 8) = C E_rows^T less each row's target logit, rounded to
    the input dtype and added by cuBLAS as its bias (config.Fused.target_shift: no bias or
    filter here), then
    their gradient over y (target_shifted_grad.py) with their losses and row_round; returns
    the gradient as rows x V (a transposed view of y). scratch: fp32 room for the pass's
    partials (the chunk's dE rows, or None)."""
    shift = target_logit(e_rows, c, None, targets, None).neg_().to(e_rows.dtype)
    rows, padded = e_rows.shape[0], y.shape[1]
    gemm_rows, gemm_shift = e_rows, shift
    if padded != rows:  # a ragged chunk runs as a multiple of 8 rows (plan.fused_plan)
        gemm_rows = torch.cat([e_rows, e_rows.new_zeros(padded - rows, e_rows.shape[1])])
        gemm_shift = torch.cat([shift, shift.new_zeros(padded - rows)])
    torch.addmm(gemm_shift, c, gemm_rows.t(), out=y)
    y = y[:, :rows]
    block_r, block_v, num_warps, per_sm = route.cfg.fused.target_shift_tiles
    splits = target_shift_splits(rows, y.shape[0], block_r, block_v, per_sm * num_sms(y.device))
    target_shifted_to_grad(y, shift, targets, losses, ignore_index=opts.ignore_index,
                           softcap=opts.softcap, label_smoothing=opts.label_smoothing,
                           block_r=block_r, block_v=block_v, num_warps=num_warps,
                           splits=splits, row_round=row_round, scratch=scratch)
    return y.t()


def fused_loss_and_grads(e, c, targets, bias, opts: Options, route: Route, check: HostScalar,
                         mean: bool):
    """(the mean or sum of the rows' losses (fp32, 0-d), _Sums holding the gradients), by the
    route's plan (Route.fused: its chunks and logits format) and config.

    The first chunk (rows [0, plan.rows), ignored targets included: its pass zeroes their rows)
    is queued before the host reads the targets' check (paths/targets.py): the GPU works on it
    while the host waits for that small kernel. The check's count then gives the mean's weight
    and the rest's rows with a target, gathered when some have none."""
    n, v = e.shape[0], c.shape[0]
    cfg, plan = route.cfg, route.fused
    logits, tile_max = _workspace(e, plan)
    # (target-shifted logits take V x rows views of the same buffer instead: chunk())
    ws, gs = logits[:, :v], logits.view(e.dtype)[:, :v]
    losses = torch.empty(n, device=e.device, dtype=torch.float32)
    kept = (torch.empty(cdiv(v, cfg.fused.block), device=e.device, dtype=torch.int8)
            if route.filter is not None else None)
    sums = _Sums(e, c, bias, plan, filtered=route.filter is not None)
    # An fp32 weight under autocast: the GEMMs read its 16-bit copy, dropped after the last dE
    c, bias = (None if t is None else t.to(e.dtype) for t in (c, bias))
    # The TMA forward needs 16-byte aligned bases (rare: an offset view): Route.fused_copies
    e, c = (t.clone() if copy else t for t, copy in zip((e, c), route.fused_copies))
    every_column = aligned_runs([(0, v)], v)

    def chunk(rows: _Rows, r0: int, r1: int, loss_at: int):
        """Queues rows [r0, r1) of ``rows``: their logits, gradient and losses; returns the
        gradient."""
        g = gs[:r1 - r0]
        args = (rows.e[r0:r1], c, bias, rows.targets[r0:r1],
                losses[loss_at + r0:loss_at + r1], opts, route, kept)
        row_round = None if sums.row_round is None else sums.row_round[:r1 - r0]
        if plan.target_shifted:
            padded = cdiv(r1 - r0, ALIGN) * ALIGN
            y = logits.view(-1)[:v * padded].view(v, padded)
            # the pass's partials in the chunk's dE rows, which dE's GEMM writes after it
            # (2 MiB at N 4096, D 7168 took the call past torch.compile's peak)
            return _target_shifted_logits_and_grad(y, *args, row_round,
                                                   _fp32_room(rows.de[r0:r1]))
        if plan.shifted:
            m = (rows.de[r0:r1].view(torch.float32)[:, :plan.shift_tiles]
                 if plan.tile_max_in_de else tile_max[:r1 - r0])
            _shifted_logits_and_grad(g, m, *args, row_round)
        else:
            _logits_and_grad(ws[:r1 - r0], g, *args, every_column, row_round)
        return g

    head = _Rows(e[:plan.rows], targets[:plan.rows], sums.de[:plan.rows])
    first = head.e.shape[0]
    z = chunk(head, 0, first, 0)
    raise_on_bad_targets(check, targets, v, opts.ignore_index)
    _, num_used, used_first = (int(x) for x in check.values())
    if num_used == 0:
        sums.zero()
        return torch.full((), math.nan if mean else 0.0, device=e.device), sums
    sums.weight = 1.0 / num_used if mean else 1.0
    m = num_used - used_first  # the rest's rows (those with a target)

    def add(z, rows: _Rows, r0: int, r1: int, first_chunk: bool, last: bool):
        """The chunk's GEMMs; the last's after the losses' sum, its dC after C's last reader
        (autocast's 16-bit copy of an fp32 weight goes before dC's buffer is made)."""
        nonlocal c, losses, loss
        runs = _runs(kept, cfg, v, every_column)
        if last:
            loss, losses = losses[:first + m].sum() * sums.weight, None
        sums.add_de(z, rows.de[r0:r1], c, runs, last)
        if last:
            c = None
        sums.add_dc(z, rows.e[r0:r1], first_chunk, runs)

    loss = None
    add(z, head, 0, first, True, m == 0)
    rest = _Rows.rest(e, targets, sums.de, first, m, opts.ignore_index)
    step = even_rows(m, plan.rows, plan.row_align)  # the rest's gathered rows: fewer
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        add(chunk(rest, r0, r1, first), rest, r0, r1, False, r1 == m)
    del logits, ws, gs, z, tile_max
    sums.de32 = None
    rest.finish(sums.de, first)
    return loss, sums


def _workspace(e, plan: FusedPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the chunk's logits buffer, its shifted logits' tile maxima or None)."""
    # Rows 16-byte aligned whatever V (50257: cuBLAS's fast kernels need aligned leading dims).
    # fp32 logits of 16-bit inputs (plan.logits_fp32): the gradient, in the input dtype, is
    # written over the first half of each row's bytes (logits_grad.py).
    logits = torch.empty(cdiv(plan.rows, ALIGN) * ALIGN if plan.target_shifted else plan.rows,
                         plan.row_stride, device=e.device,
                         dtype=torch.float32 if plan.logits_fp32 else e.dtype)
    # Shifted logits (plan.shifted): each row's max per forward tile, beside the 16-bit logits,
    # or in the chunk's own dE rows (plan.tile_max_in_de: written after the gradient pass)
    tile_max = (torch.empty(plan.rows, plan.shift_tiles, device=e.device, dtype=torch.float32)
                if plan.shifted and not plan.tile_max_in_de else None)
    return logits, tile_max


def _fp32_room(t: torch.Tensor) -> torch.Tensor | None:
    """t's bytes as a flat fp32 tensor where t is contiguous and they align, else None."""
    if not t.is_contiguous() or (t.numel() * t.element_size()) % 4 \
            or (t.storage_offset() * t.element_size()) % 4:
        return None
    return t.view(-1).view(torch.float32)


def _runs(kept, cfg: Config, v: int, every_column):
    return every_column if kept is None else aligned_runs(kept_runs(kept, cfg.fused.block, v), v)


def _graph_is_kept() -> bool:
    """Whether this backward's graph is kept (retain_graph=True): then the gradients are
    scaled into new tensors and the unscaled ones kept for the next backward; else they are
    scaled in place (no second copy at the peak). Unknown (an autograd without the query):
    kept, which is right either way."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


class FusedLce(torch.autograd.Function):
    """The loss (mean or sum) with its gradients computed in the forward; the backward scales
    them by the upstream gradient on the device (no host read of it). The gradients are the
    forward's state (ctx.sums), not saved tensors: autograd's saved-tensor hooks never see
    them, and a graph that is not kept drops them after its backward, as it drops saved
    tensors."""

    @staticmethod
    def forward(ctx, e, c, targets, bias, opts: Options, route: Route, check: HostScalar,
                mean: bool):
        # The path picks each GEMM's dtypes itself: autocast must not recast them (on the CPU
        # it turned the fallbacks' fp32 products of 16-bit inputs back into 16-bit ones).
        with torch.autocast(e.device.type, enabled=False):
            loss, sums = fused_loss_and_grads(e, c, targets, bias, opts, route, check, mean)
        ctx.sums = sums  # intermediates, not inputs or outputs: plain attributes
        return loss

    @staticmethod
    def backward(ctx, grad):
        refuse_create_graph()
        sums = getattr(ctx, "sums", None)
        if sums is None:  # autograd's own words for saved tensors already freed
            raise RuntimeError(
                "linear_cross_entropy: trying to backward through the graph a second time; "
                "its gradients were freed by the first backward. Specify retain_graph=True "
                "in the first backward to call it again.")
        kept = _graph_is_kept()
        if not kept:
            del ctx.sums
        de, dc, dbias = sums.gradients(grad, in_place=not kept)
        return de, dc, None, dbias, None, None, None, None
