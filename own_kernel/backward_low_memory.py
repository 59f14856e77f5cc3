"""Backward in bounded memory (low_memory=True): dE by row chunks, then dC by vocabulary chunks.

backward.py accumulates dE over vocabulary chunks in an fp32 N x D buffer: 4 N D bytes beside
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

dE and dC each come out of one fp32 reduction and one rounding, as in backward.py, so the two
give the same accuracy (RowRound / ColRound: what rounding W removed; see dlogits.py). The price
is a second recompute of the logits: five N x V x D matmuls instead of four.

Workspace: pass 1 works in dC's buffer (not yet written), pass 2 in dC's unwritten tail while it
is large enough, then in one buffer of low_memory_frac of the gradients' bytes (low_memory_plan). Exact gradients only: the filter's column skipping
needs a chunk's every row at once (backward.py).
"""
import math
import warnings

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.backward import (HostScalar, WORKSPACE_ALIGN, addmm_fp32, backward,
                                 cublas_accumulates_fp32, mm_fp32, mm_scaled, normalise_weights,
                                 rank1_dc, sampled_mean, zeros_like)
from own_kernel.configs import POISON, config_for
from own_kernel.dlogits import cce_dlogits_kernel
from own_kernel.dlogits_tma import cce_dlogits_tma_kernel
from own_kernel.finalize_de import cce_finalize_de_kernel
from own_kernel.forward import LAST_COMPILED, dot_precision, num_sms, tma_ready
from own_kernel.tile import softcap_scalars

LAST_PLAN: dict = {}


def _ld(width: int) -> int:
    """W's row stride in entries: a multiple of 8, so rows start on 16 bytes (TMA)."""
    return -(-width // 8) * 8


def _up(nbytes: int) -> int:
    return -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def tile_bytes(rows: int, width: int, acc_rows: int, d: int, elt: int) -> int:
    """Workspace bytes of a W of rows x width (16-bit rows padded to _ld) and an fp32 acc_rows x d."""
    return _up(rows * _ld(width) * elt) + _up(acc_rows * d * 4)


def low_memory_plan(n: int, v: int, d: int, elt: int, cfg: dict) -> dict:
    """Chunk sizes of the low-memory backward, as a dict:
    - rows_1, width_1: pass 1's rows per chunk, and columns per group (width_1 < v adds an fp32
      rows_1 x D sum over the groups; else every column at once, the sum inside one GEMM);
    - width_2, rows_2: pass 2's columns per chunk and rows per group (rows_2 < n: an fp32
      width_2 x D sum);
    - workspace_2: pass 2's buffer, low_memory_frac of the gradients' bytes, or what the
      smallest chunks need. Pass 1 works in the larger of it and dC's buffer.
    Chunks are at least low_memory_min_entries / D rows (pass 1) or columns (pass 2), so their
    GEMMs' outputs have enough tiles to fill the GPU; row counts are multiples of
    low_memory_row_align (the kernels' row block) unless they cover every row."""
    align = cfg.get("low_memory_row_align", 128)
    per_d = -(-cfg.get("low_memory_min_entries", 2**21) // d)
    min_rows_1 = min(n, -(-per_d // align) * align)
    min_rows_2 = min(n, align)
    min_width = min(v, -(-per_d // 8) * 8)
    grads = (n + v) * d * elt
    dc_bytes = v * d * elt
    need_1 = tile_bytes(min_rows_1, min(v, 8), min_rows_1, d, elt)
    workspace_2 = max(int(cfg.get("low_memory_frac", 1 / 16) * grads),
                      tile_bytes(min_rows_2, min(min_width, 64), min(min_width, 64), d, elt),
                      need_1 if dc_bytes < need_1 else 0)

    def fitting(nbytes, per_row, least, total, step):
        # the most rows (or columns) of per_row bytes that fit: all, or a multiple of step >= least
        rows = max(0, nbytes - 2 * WORKSPACE_ALIGN) // per_row
        return total if rows >= total else max(least, rows // step * step)

    buf_1 = max(dc_bytes, workspace_2)
    rows_1, width_1 = fitting(buf_1, _ld(v) * elt + 4 * d, 1, n, align), v
    if rows_1 < min_rows_1:
        rows_1 = min_rows_1
        width_1 = fitting(buf_1 - _up(rows_1 * d * 4), rows_1 * elt, 8, v, 8)
    # Pass 2 in its workspace: every row at once (dC straight from one GEMM) where that leaves
    # chunks at least min_width wide; else row groups, the chunk's fp32 sum taking at most half
    # of the workspace (a min_width sum could leave W only a sliver: GEMMs of a few rows).
    width = fitting(workspace_2, n * elt, 0, v, 8) if n else v
    if width >= min_width:
        width_2, rows_2 = width, n
    else:
        width_2 = max(min(8, min_width), min(min_width, workspace_2 // 2 // (4 * d) // 8 * 8))
        while width_2 > 8 and tile_bytes(min_rows_2, width_2, width_2, d, elt) > workspace_2:
            width_2 -= 8
        rows_2 = fitting(workspace_2 - _up(width_2 * d * 4), _ld(width_2) * elt, min_rows_2, n, align)
    return dict(rows_1=rows_1, width_1=width_1, width_2=width_2, rows_2=rows_2,
                workspace_2=workspace_2,
                chunks_2=pass2_chunks(n, v, d, elt, width_2, rows_2, min(width_2, 256)))


def pass2_chunks(n: int, v: int, d: int, elt: int, width_2: int, rows_2: int,
                 min_tail: int) -> list[tuple[int, int, int, bool]]:
    """Pass 2's chunks [(v0, width, rows per group, W in dC)]. While dC's unwritten tail can
    hold W for every row of a chunk at least as wide as the workspace's (min_tail with row
    groups), W goes there, at dC's end, above the chunk's own rows (written by its GEMM), as
    backward.py's chunks do; then width_2 x rows_2 in the workspace. Widths are multiples of 8
    (an unaligned GEMM dimension sends cuBLAS to slow kernels), the last few columns apart."""
    chunks, v0 = [], 0
    while v0 < v:
        rest = v - v0
        tail = ((rest * d * elt - 2 * WORKSPACE_ALIGN) // (elt * (n + d))) // 8 * 8 if n else 0
        tail = min(tail, rest // 8 * 8)
        if tail >= (width_2 if rows_2 >= n else min_tail) and tail > 0:
            chunks.append((v0, tail, n, True))
            v0 += tail
            continue
        width = min(width_2, rest)
        width = width // 8 * 8 or width
        chunks.append((v0, width, rows_2, False))
        v0 += width
    return chunks


def _gemm_into(acc, a, b, first: bool, max_k: int) -> None:
    """acc (fp32) = a @ b (first) or += a @ b, in reductions of at most max_k, split at
    multiples of 8. An unaligned reduction (V 50257) sends cuBLAS to kernels several times
    slower; a long one loses accuracy: with K = 256000 in one GEMM, dE's error on lm inputs was
    1.4 times that of 8192-wide pieces (measurements/lowmem-v19/acc.txt), whose partial sums
    add in fp32 as backward.py's chunks do."""
    k = a.shape[1]
    cuts = list(range(0, k // 8 * 8, max(8, max_k // 8 * 8))) + [k // 8 * 8, k]
    spans = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo] or [(0, k)]
    for i, (lo, hi) in enumerate(spans):
        if first and i == 0:
            mm_fp32(a[:, lo:hi], b[lo:hi], acc)
        else:
            addmm_fp32(acc, a[:, lo:hi], b[lo:hi])


class _WriteW:
    """Launches of the softmax-gradient kernel into a given W: dlogits_tma.py where the inputs
    allow TMA and the config asks for it, else dlogits.py (any strides). Exact (no filter)."""

    def __init__(self, e, c, bias, targets, lse, nll, row_weight, row_weight_lse, softcap, smooth,
                 cfg, row_round, col_round, col_sum, tma):
        self.c, self.bias, self.cfg, self.tma = c, bias, cfg, tma
        self.rows = (targets, lse, nll, row_weight,
                     row_weight_lse if row_weight_lse is not None else row_weight)
        self.row_round, self.col_round, self.col_sum = row_round, col_round, col_sum
        self.scalars = (*softcap_scalars(softcap), float(smooth))
        self.flags = dict(HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
                          FILTER=False, HAS_GRAD_LSE=row_weight_lse is not None,
                          DOT_PRECISION=dot_precision(e.dtype))
        if tma:
            k = dict(cfg["dlogits_tma"])
            k.setdefault("SUBTILES", 1)
            k.setdefault("GROUP_N", 8)
            k.setdefault("FLATTEN", False)
            self.persistent = k.pop("PERSISTENT", False)
            self.k = k
            self.c_desc = TensorDescriptor.from_tensor(c, [k["BLOCK_V"], k["BLOCK_D"]])
        else:
            k = dict(cfg["dlogits"])
            k.setdefault("TILES", 1)
            k.setdefault("FLATTEN", False)
            self.k = k
            self.mask = torch.empty(1, device=e.device, dtype=torch.int8)

    def __call__(self, e, r0, w, v_start, col_round=True):
        """W (rows x width) = the softmax gradient of e's rows (global rows r0...) at columns
        [v_start, v_start + width); RowRound / ColRound (col_round) / ColSum summed as it goes."""
        n, width = e.shape[0], w.shape[1]
        rows = [t[r0:r0 + n] for t in self.rows]
        bias = self.bias if self.bias is not None else self.col_sum
        k = self.k
        if self.tma:
            bn, bv = k["BLOCK_N"], k["BLOCK_V"]
            tiles = triton.cdiv(n, bn) * triton.cdiv(width, bv)
            grid = (min(tiles, num_sms(e.device)) if self.persistent else tiles,)
            LAST_COMPILED["dlogits_tma"] = cce_dlogits_tma_kernel[grid](
                TensorDescriptor.from_tensor(e, [bn, k["BLOCK_D"]]), self.c_desc,
                TensorDescriptor.from_tensor(w, [bn, bv // k["SUBTILES"]]),
                bias, *rows, rows[3], self.row_round[r0:r0 + n], self.col_round,
                self.row_round, self.col_round, self.col_round, self.col_sum,
                n, self.c.shape[0], v_start, width, *self.scalars, D=e.shape[1],
                COL_ROUND=col_round and self.cfg.get("col_round", True), **self.flags, **k)
        else:
            bn, bv = k["BLOCK_N"], k["BLOCK_V"]
            groups = triton.cdiv(triton.cdiv(width, bv), k["TILES"])
            # dlogits.py always sums ColRound: pass 1's goes to a scratch copy (col_round False).
            col_round_buf = self.col_round if col_round else torch.empty_like(self.col_round)
            LAST_COMPILED["dlogits"] = cce_dlogits_kernel[(triton.cdiv(n, bn) * groups,)](
                e, self.c, bias, *rows, w, self.mask, rows[3], self.row_round[r0:r0 + n],
                col_round_buf, self.row_round, self.col_round, self.col_sum,
                n, self.c.shape[0], e.shape[1], v_start, width, 1, w.stride(0),
                e.stride(0), e.stride(1), self.c.stride(0), self.c.stride(1),
                *self.scalars, **self.flags, **k)


def _view(buf: torch.Tensor, offset: int, rows: int, cols: int, ld: int, dtype) -> torch.Tensor:
    """rows x cols of dtype at byte offset of a uint8 buffer, rows ld entries apart."""
    size = rows * ld * torch.finfo(dtype).bits // 8
    return buf[offset:offset + size].view(dtype).view(rows, ld)[:, :cols]


def backward_low_memory(e, c, bias, targets, lse, nll, p_max, row_weight, row_weight_lse, softcap,
                        smooth, filter_eps=None, filter_min_p_max=0.0, uniform=True):
    """backward.backward's gradients (dE, dC, dbias or None), exact, with workspace bounded by
    low_memory_plan instead of an fp32 N x D accumulator. uniform: as backward.backward's."""
    if filter_eps is not None:
        raise ValueError("low_memory: computes exact gradients only; pass filter_eps=None")
    (n, d), v, cfg, dbias = e.shape, c.shape[0], config_for(e.device, e.dtype), zeros_like(bias)
    if n == 0:
        return torch.zeros_like(e), torch.zeros_like(c), dbias
    if e.is_cuda and e.dtype != torch.float32 and not cublas_accumulates_fp32(e.device, e.dtype):
        warnings.warn("low_memory: this torch cannot add 16-bit products into fp32 in cuBLAS "
                      "(torch.mm out_dtype); running the default backward", stacklevel=3)
        return backward(e, c, bias, targets, lse, nll, p_max, row_weight, row_weight_lse, softcap,
                        smooth, None, uniform=uniform)
    elt = e.element_size()
    tma = cfg.get("recompute") == "tma" and tma_ready(e) and tma_ready(c)
    row_weight, row_weight_lse, scale_dev, row_scale = normalise_weights(
        e, row_weight, row_weight_lse, False, uniform)
    scale = HostScalar(scale_dev) if scale_dev is not None else HostScalar(value=1.0)
    e_mean, c_mean = sampled_mean(e), sampled_mean(c)
    plan = low_memory_plan(n, v, d, elt, cfg)
    LAST_PLAN.clear()
    LAST_PLAN.update(plan, tma=tma)

    f32 = dict(device=e.device, dtype=torch.float32)
    sums = torch.zeros(n + 2 * v, **f32)
    row_round, col_round, col_sum = sums[:n], sums[n:n + v], sums[n + v:]
    dc = torch.empty((v, d), device=e.device, dtype=e.dtype)
    de = torch.empty((n, d), device=e.device, dtype=e.dtype)
    dc_bytes = dc.view(-1).view(torch.uint8)
    work = torch.empty(plan["workspace_2"], device=e.device, dtype=torch.uint8)
    if POISON:  # every read of these must follow a write (tests)
        dc.fill_(float("nan"))
        work.view(e.dtype)[: work.numel() // elt].fill_(float("nan"))
    write_w = _WriteW(e, c, bias, targets, lse, nll, row_weight, row_weight_lse, softcap, smooth, cfg,
                      row_round, col_round, col_sum, tma)

    # Pass 1: dE, rows_1 rows at a time (over column groups of width_1, summed in fp32); W and
    # the fp32 result in dC's buffer (or the pass-2 buffer, when that is larger: a tiny dC).
    rows_1, width_1 = plan["rows_1"], plan["width_1"]
    max_k = cfg.get("low_memory_max_k", 8192)
    buf = dc_bytes if dc_bytes.numel() >= work.numel() else work
    acc_at = _up(rows_1 * _ld(width_1) * elt)
    scale_f = None
    for r0 in range(0, n, rows_1):
        rows = min(rows_1, n - r0)
        e_rows = e[r0:r0 + rows]
        acc = _view(buf, acc_at, rows, d, d, torch.float32)
        for v0 in range(0, v, width_1):
            width = min(width_1, v - v0)
            w = _view(buf, 0, rows, width, _ld(width_1), e.dtype)
            write_w(e_rows, r0, w, v0, col_round=False)
            _gemm_into(acc, w, c[v0:v0 + width], v0 == 0, max_k)
        if scale_f is None:
            scale_f = float(scale)
            if scale_f == 0.0 or not math.isfinite(scale_f):
                return torch.zeros_like(e), torch.zeros_like(c), dbias
        block_d = min(128, triton.next_power_of_2(max(d, 16)))
        cce_finalize_de_kernel[(triton.cdiv(rows, 32), triton.cdiv(d, block_d))](
            acc, row_round[r0:], c_mean, row_round, c_mean,
            row_scale[r0:] if row_scale is not None else row_round, de[r0:r0 + rows], rows, d,
            acc.stride(0), de.stride(0), de.stride(1), scale_f,
            FILTER=False, ROW_SCALE=row_scale is not None, BLOCK_N=32, BLOCK_D=block_d)
    if bias is not None and row_scale is None:
        dbias.copy_(col_sum * scale_f)  # pass 1 saw every (row, column) once
    # Per-row scaled W (normalise_weights): pass 2 scales its rows back before dC's GEMM and
    # sums dbias from them; the epilogue's column sums of unscaled rows are not used.
    scaled = None if row_scale is None else _ScaledRows(row_scale, v)

    # Pass 2: dC by column chunks (chunks_2), each over row groups (fp32 sum) or all rows at once.
    for v0, width, rows_2, in_dc in plan["chunks_2"]:
        ld = _ld(width)
        dc_chunk = dc[v0:v0 + width]
        if rows_2 >= n:
            at = (dc_bytes.numel() - n * ld * elt) // WORKSPACE_ALIGN * WORKSPACE_ALIGN
            w = _view(dc_bytes if in_dc else work, at if in_dc else 0, n, width, ld, e.dtype)
            write_w(e, 0, w, v0, col_round=scaled is None)
            if scaled is not None:
                scaled(w, 0, v0)
            mm_scaled(dc_chunk, w.t(), e, scale_f)
            continue
        acc = _view(work, _up(rows_2 * ld * elt), width, d, d, torch.float32)
        for r0 in range(0, n, rows_2):
            rows = min(rows_2, n - r0)
            w = _view(work, 0, rows, width, ld, e.dtype)
            e_rows = e[r0:r0 + rows]
            write_w(e_rows, r0, w, v0, col_round=scaled is None)
            if scaled is not None:
                scaled(w, r0, v0)
            _gemm_into(acc, w.t(), e_rows, r0 == 0, max_k)
        dc_chunk.copy_(acc.mul_(scale_f))
    del work
    if scaled is not None:
        if bias is not None:
            dbias.copy_(scaled.col_sum * scale_f)
    elif not tma or cfg.get("col_round", True):
        rank1_dc(dc, col_round, e_mean, scale_f)
    return de, dc, dbias


class _ScaledRows:
    """Pass 2's W rows times their row_scale, and dbias's column sums of the result."""

    def __init__(self, row_scale, v):
        self.row_scale = row_scale
        self.col_sum = torch.zeros(v, device=row_scale.device, dtype=torch.float32)

    def __call__(self, w, r0, v0):
        w.mul_(self.row_scale[r0:r0 + w.shape[0], None])
        self.col_sum[v0:v0 + w.shape[1]] += w.sum(dim=0, dtype=torch.float32)
