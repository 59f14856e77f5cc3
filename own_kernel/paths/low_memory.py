"""Backward in bounded memory (low_memory=True): dE by row chunks, then dC by vocabulary chunks.

paths/recompute.py accumulates dE over vocabulary chunks in an fp32 N x D buffer: 4 N D bytes beside
gradients of 2 (N + V) D bytes (16-bit), up to twice their size when N is near V. Here no buffer
of that kind exists; each output row is finished inside one chunk:

  pass 1, rows [r0, r1):      W = softmax gradient of those rows x all V       (dlogits kernel)
                              dE[rows] = scale (W @ C + RowRound x mean(C))    (fp32 in the GEMM;
                                         over column groups when dC's buffer cannot hold enough
                                         rows of W, an fp32 rows x D sum)
  pass 2, columns [v0, v1):   W_g = softmax gradient of row group g x columns (pass2_chunks)
                              dC[cols] = scale sum_g W_g^T @ E[g]   (one GEMM when every row fits,
                                                                     else an fp32 w x D sum)
  end:                        dC += scale ColRound x mean(E)                   (rank1_dc)

dE and dC each come out of one fp32 reduction and one rounding, as in paths/recompute.py, so the two
give the same accuracy (RowRound / ColRound: what rounding W removed; see dlogits.py). The price
is a second recompute of the logits: five N x V x D matmuls instead of four.

Workspace: pass 1 works in dC's buffer (not yet written), pass 2 in dC's unwritten tail while it
is large enough, then in one buffer of low_memory.frac of the gradients' bytes (plan.low_memory_plan). Exact gradients only: the filter's column skipping
needs a chunk's every row at once (paths/recompute.py).
"""
import dataclasses
import math

import torch

from own_kernel.kernels.finalize_de import finalize_de
from own_kernel.kernels.gemm import HostScalar, addmm_fp32, mm_fp32, mm_scaled, sampled_mean
from own_kernel.kernels.rank1_dc import rank1_dc
from own_kernel.kernels.rows import Rows, Sums
from own_kernel.paths.recompute import normalise_weights
from own_kernel.paths.shared import zeros_or_none
from own_kernel.paths.writers import writers_of
from own_kernel.policy.options import Options
from own_kernel.policy.plan import WORKSPACE_ALIGN, round_up, row_stride
from own_kernel.policy.route import Route


class _WriteW:
    """The softmax-gradient launches of both passes, by the route's writer: "ws" or "tma"
    (kernels/dlogits_ws.py, dlogits_tma.py) where the inputs allow TMA and the config asks for
    it, else "pointer" (kernels/dlogits.py, any strides). Exact (no filter)."""

    def __init__(self, e, c, bias, rows, sums, opts, route: Route):
        self.rows, self.sums = rows, sums
        self.writer, _ = writers_of(route, e, c, bias, opts)

    def __call__(self, e_rows, r0, w, v_start, col_round=True):
        """W (rows x width) = the softmax gradient of e's rows r0... (e_rows) at columns
        [v_start, v_start + width); RowRound, ColRound (col_round) and ColSum added."""
        n = e_rows.shape[0]
        rows = self.rows.select(r0, r0 + n)
        sums = dataclasses.replace(self.sums, row_round=self.sums.row_round[r0:r0 + n])
        self.writer.write(w, rows, sums, v_start, col_round=col_round, e_rows=e_rows)


def _view(buf: torch.Tensor, offset: int, rows: int, cols: int, ld: int, dtype) -> torch.Tensor:
    """rows x cols of dtype at byte offset of a uint8 buffer, rows ld entries apart."""
    size = rows * ld * torch.finfo(dtype).bits // 8
    return buf[offset:offset + size].view(dtype).view(rows, ld)[:, :cols]


def _gemm_into(acc, a, b, first: bool, max_k: int) -> None:
    """acc (fp32) = a @ b (first) or += a @ b, in reductions of at most max_k, split at
    multiples of 8. An unaligned reduction (V 50257) sends cuBLAS to kernels several times
    slower; a long one loses accuracy: with K = 256000 in one GEMM, dE's error on lm inputs was
    1.4 times that of 8192-wide pieces (results/notes/low-memory.md), whose partial sums add in
    fp32 as paths/recompute.py's chunks do."""
    k = a.shape[1]
    cuts = list(range(0, k // 8 * 8, max(8, max_k // 8 * 8))) + [k // 8 * 8, k]
    spans = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo] or [(0, k)]
    for i, (lo, hi) in enumerate(spans):
        if first and i == 0:
            mm_fp32(a[:, lo:hi], b[lo:hi], acc)
        else:
            addmm_fp32(acc, a[:, lo:hi], b[lo:hi])


class _ScaledRows:
    """Pass 2's W rows times their row_scale, and dbias's column sums of the result."""

    def __init__(self, row_scale, v):
        self.row_scale = row_scale
        self.col_sum = torch.zeros(v, device=row_scale.device, dtype=torch.float32)

    def __call__(self, w, r0, v0):
        w.mul_(self.row_scale[r0:r0 + w.shape[0], None])
        self.col_sum[v0:v0 + w.shape[1]] += w.sum(dim=0, dtype=torch.float32)


def backward_low_memory(e, c, bias, rows: Rows, opts: Options, route: Route, *, uniform=True,
                        de_dtype=None):
    """recompute.backward's gradients (dE, dC, dbias or None), exact, with workspace bounded by
    the route's plan (plan.low_memory_plan) instead of an fp32 N x D accumulator, W by the
    route's writer. de_dtype: as backward's."""
    (n, d), v = e.shape, c.shape[0]
    if n == 0:
        return torch.zeros_like(e, dtype=de_dtype), torch.zeros_like(c), zeros_or_none(bias)
    elt, cfg = e.element_size(), route.cfg
    rows, scale_dev, row_scale = normalise_weights(e, rows, False, uniform)
    scale = HostScalar(scale_dev) if scale_dev is not None else HostScalar(value=1.0)
    e_mean, c_mean = sampled_mean(e), sampled_mean(c)
    plan = route.low_memory_plan
    sums = Sums.zeros(n, v, e.device)
    dc = torch.empty((v, d), device=e.device, dtype=e.dtype)
    work = torch.empty(plan.workspace_2, device=e.device, dtype=torch.uint8)
    if cfg.poison:  # every read of these must follow a write (tests)
        dc.fill_(float("nan"))
        work.view(e.dtype)[: work.numel() // elt].fill_(float("nan"))
    write_w = _WriteW(e, c, bias, rows, sums, opts, route)
    de = _pass_1(e, c, dc, work, write_w, plan, c_mean, row_scale, scale, cfg, de_dtype)
    if de is None:  # every weight 0
        return torch.zeros_like(e, dtype=de_dtype), torch.zeros_like(c), zeros_or_none(bias)
    scale_f = float(scale)
    dbias = zeros_or_none(bias)
    if bias is not None and row_scale is None:
        dbias.copy_(sums.col_sum * scale_f)  # pass 1 saw every (row, column) once
    scaled = None if row_scale is None else _ScaledRows(row_scale, v)
    _pass_2(e, dc, work, write_w, plan, scale_f, scaled, cfg)
    del work
    if scaled is not None:  # dbias from the scaled-back rows; no rounding sums to add
        if bias is not None:
            dbias.copy_(scaled.col_sum * scale_f)
    elif route.col_round_summed:
        rank1_dc(dc, sums.col_round, e_mean, scale_f)
    return de, dc, dbias


def _pass_1(e, c, dc, work, write_w, plan, c_mean, row_scale, scale, cfg, de_dtype=None):
    """dE, rows_1 rows at a time (over column groups of width_1, summed in fp32); W and the
    fp32 result in dC's buffer (or the pass-2 buffer, when that is larger: a tiny dC). None
    when the weights' scale is 0 (no gradient)."""
    (n, d), v, elt = e.shape, c.shape[0], e.element_size()
    dc_bytes = dc.view(-1).view(torch.uint8)
    buf = dc_bytes if dc_bytes.numel() >= work.numel() else work
    rows_1, width_1 = plan.rows_1, plan.width_1
    acc_at = round_up(rows_1 * row_stride(width_1) * elt)
    de = torch.empty((n, d), device=e.device, dtype=de_dtype or e.dtype)
    scale_f = None
    for r0 in range(0, n, rows_1):
        rows = min(rows_1, n - r0)
        e_rows = e[r0:r0 + rows]
        acc = _view(buf, acc_at, rows, d, d, torch.float32)
        for v0 in range(0, v, width_1):
            width = min(width_1, v - v0)
            w = _view(buf, 0, rows, width, row_stride(width_1), e.dtype)
            write_w(e_rows, r0, w, v0, col_round=False)
            _gemm_into(acc, w, c[v0:v0 + width], v0 == 0, cfg.low_memory.max_k)
        if scale_f is None:
            scale_f = float(scale)
            if scale_f == 0.0 or not math.isfinite(scale_f):
                return None
        finalize_de(acc, write_w.sums.row_round[r0:r0 + rows], c_mean, de[r0:r0 + rows],
                    scale_f, row_scale=row_scale[r0:r0 + rows] if row_scale is not None else None)
    return de


def _pass_2(e, dc, work, write_w, plan, scale_f, scaled, cfg):
    """dC by column chunks (plan.chunks_2), each over row groups (fp32 sum) or all rows at
    once; per-row scaled W (scaled) scaled back before its GEMM."""
    (n, d), elt = e.shape, e.element_size()
    dc_bytes = dc.view(-1).view(torch.uint8)
    for v0, width, rows_2, in_dc in plan.chunks_2:
        ld = row_stride(width)
        dc_chunk = dc[v0:v0 + width]
        if rows_2 >= n:
            at = (dc_bytes.numel() - n * ld * elt) // WORKSPACE_ALIGN * WORKSPACE_ALIGN
            w = _view(dc_bytes if in_dc else work, at if in_dc else 0, n, width, ld, e.dtype)
            write_w(e, 0, w, v0, col_round=scaled is None)
            if scaled is not None:
                scaled(w, 0, v0)
            mm_scaled(dc_chunk, w.t(), e, scale_f)
            continue
        acc = _view(work, round_up(rows_2 * ld * elt), width, d, d, torch.float32)
        for r0 in range(0, n, rows_2):
            rows = min(rows_2, n - r0)
            w = _view(work, 0, rows, width, ld, e.dtype)
            e_rows = e[r0:r0 + rows]
            write_w(e_rows, r0, w, v0, col_round=scaled is None)
            if scaled is not None:
                scaled(w, r0, v0)
            _gemm_into(acc, w.t(), e_rows, r0 == 0, cfg.low_memory.max_k)
        dc_chunk.copy_(acc.mul_(scale_f))
