"""Backward, step 1 on the cuBLAS path: the softmax gradient of a chunk of precomputed logits.

cuBLAS has written X = E @ C[chunk].T in fp32 (N x width); this kernel turns it into
    d[n, v] = (w_n + w'_n) p[n, v] - w_n ((1 - ls) [v == t_n] + ls / V),   times softcap'(z)
exactly as dlogits.py does after its own recompute (see there for the symbols), and writes d
rounded to the input dtype to W for the GEMMs dE += W @ C and dC = W^T @ E.

Sums it keeps, in fp32 (the corrections paths/recompute.py adds back through mean rows):
- RowRound / ColRound: d minus its rounded value, per row and per column (of the vocabulary);
- with FILTER, over the rows that may skip (eps[n] > 0; eps 0 marks a flat row, which
  paths/recompute.py
  handles exactly on its own): per column ColKeep = 1 when some |d[n, v]| > eps[n] (a column of
  all-negligible entries is skipped by the GEMMs) and ColWSum += sum of the rounded values; per
  row RowWSum += sum of the rounded values (paths/recompute.py subtracts the kept share);
  KeptCount +=
  the number of columns this launch kept (the first program to set a column's ColKeep counts
  it), which sizes the gathered GEMMs. ColKeep and ColWSum are indexed by vocabulary entry;
- ColSum = sum of d per column (dbias).

Each program owns a strip of BLOCK_V columns and a range of rows, walked in BLOCK_N-row tiles.
Column sums accumulate elementwise in (BLOCK_N x BLOCK_V) registers and are reduced across rows
once at the end: a reduction across warps per tile (and an atomic per column per tile) costs
more than the tile's memory traffic. Row sums reduce per tile (within warps) into atomics.

On Hopper (softmax_grad.tma) X and W are tensor descriptors (TMA): tiles of X stream into
shared memory STAGES deep while the warps work on an earlier tile, and no registers hold
addresses. With pointer loads the kernel waited on each tile's load in turn and ran at ~40 % of
the memory bandwidth there. The chunk's width is a multiple of 8 (backward.chunk_plan), so both
descriptors' row strides are 16-byte aligned; TMA zero-fills reads past N and clips writes
there. GPUs before Hopper have no TMA (Triton would only emulate the descriptors): with tma
False (the portable target) the same kernel loads X and stores W through masked pointers, rows
stride_xn and stride_wn apart, and the portable target tunes its tiles on the user's GPU
(policy/autotune.py), timed into scratch sums.
"""
import triton
import triton.language as tl

from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.policy.autotune import shape_bucket, tune_key, tuned_launch
from own_kernel.policy.plan import cdiv
from own_kernel.kernels.rows import Partials
from own_kernel.kernels.tile import (accumulate, entropy_terms, num_sms, row_terms, softcap_scalars,
                             softmax_ent_grad_tile)


@triton.jit
def load_x(X, n0, col0, offs_n, offs_w, m, stride_xn, TMA: tl.constexpr):
    # A BLOCK_N x BLOCK_V tile of the fp32 logits: by TMA (zero past N), or by pointers
    # (masked: zero outside the rows and columns in m).
    if TMA:
        x = X.load([n0, col0])
    else:
        x = tl.load(X + offs_n[:, None].to(tl.int64) * stride_xn + offs_w[None, :], mask=m,
                    other=0.0)
    return x


@triton.jit
def store_w(W, d, n0, col0, offs_n, offs_w, m, stride_wn, TMA: tl.constexpr):
    # d rounded to W's dtype, stored (TMA clips rows past N; pointers store inside m only);
    # returns the rounded tile.
    if TMA:
        d_used = d.to(W.dtype)
        W.store([n0, col0], d_used)
    else:
        d_used = d.to(W.dtype.element_ty)
        tl.store(W + offs_n[:, None].to(tl.int64) * stride_wn + offs_w[None, :], d_used, mask=m)
    return d_used


@triton.jit
def cce_softmax_grad_kernel(X, W, Bias, Targets, Lse, LseLo, Nll, RowWeight, RowWeightLse,
                            Ent, RowWeightEnt, RowEps,
                            RowRound, ColRound, RowWSum, ColWSum, ColKeep, KeptCount, ColSum,
                            Part, N, V, v_start, width, rows_per_program, stride_xn, stride_wn,
                            tanh_scale, cap, smooth,
                            HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                            FILTER: tl.constexpr, HAS_GRAD_LSE: tl.constexpr,
                            HAS_ENTROPY: tl.constexpr, DETERMINISTIC: tl.constexpr, TMA: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    num_strips = tl.cdiv(width, BLOCK_V)
    strip = pid % num_strips
    row_range = pid // num_strips
    row_start = row_range * rows_per_program
    # DETERMINISTIC partials (rows.Partials): per strip, rows (RowRound, RowWSum); then per
    # row range, columns (ColRound, ColSum, ColWSum).
    row_part = Part + strip * N
    col_plane = tl.cdiv(N, rows_per_program) * width
    col_part = Part + 2 * num_strips * N + row_range * width
    row_end = tl.minimum(row_start + rows_per_program, N)
    offs_w = strip * BLOCK_V + tl.arange(0, BLOCK_V)  # column inside the chunk
    offs_v = v_start + offs_w
    w_mask = offs_w < width
    if HAS_BIAS:
        b = tl.load(Bias + offs_v, mask=w_mask, other=0.0).to(tl.float32)
    col_round = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    col_sum = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    col_wsum = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    col_keep = tl.full((BLOCK_N, BLOCK_V), -1.0, dtype=tl.float32)

    for n0 in tl.range(row_start, row_end, BLOCK_N, num_stages=STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < row_end
        m = n_mask[:, None] & w_mask[None, :]
        lse, lo2, w, wp, tgt, pt_m1 = row_terms(Lse, LseLo, Nll, RowWeight, RowWeightLse,
                                                Targets, offs_n, n_mask, HAS_GRAD_LSE)
        ent, pz_t, wh = entropy_terms(Ent, RowWeightEnt, Nll, offs_n, n_mask, HAS_ENTROPY)
        x = load_x(X, n0, strip * BLOCK_V, offs_n, offs_w, m, stride_xn, TMA)
        if HAS_BIAS:
            x += b[None, :]
        d = softmax_ent_grad_tile(x, lse, lo2, w, wp, tgt, pt_m1, ent, pz_t, wh, offs_v, V,
                                  smooth, tanh_scale, cap, HAS_SOFTCAP, HAS_ENTROPY)
        d = tl.where(m, d, 0.0)
        d_used = store_w(W, d, n0, strip * BLOCK_V, offs_n, offs_w, m, stride_wn, TMA)
        d_used = d_used.to(tl.float32)
        r = d - d_used
        col_round += r
        accumulate(RowRound + offs_n, row_part + offs_n, tl.sum(r, axis=1), n_mask, DETERMINISTIC)
        if HAS_BIAS:
            col_sum += d
        if FILTER:
            eps = tl.load(RowEps + offs_n, mask=n_mask, other=float("inf"))
            may_skip = eps > 0
            d_skip = tl.where(may_skip[:, None], d_used, 0.0)
            col_wsum += d_skip
            accumulate(RowWSum + offs_n, row_part + num_strips * N + offs_n,
                       tl.sum(d_skip, axis=1), n_mask, DETERMINISTIC)
            col_keep = tl.maximum(col_keep, tl.where(may_skip[:, None], tl.abs(d) - eps[:, None], -1.0))

    accumulate(ColRound + offs_v, col_part + offs_w, tl.sum(col_round, axis=0), w_mask,
               DETERMINISTIC)
    if HAS_BIAS:
        accumulate(ColSum + offs_v, col_part + col_plane + offs_w, tl.sum(col_sum, axis=0),
                   w_mask, DETERMINISTIC)
    if FILTER:
        accumulate(ColWSum + offs_v, col_part + 2 * col_plane + offs_w, tl.sum(col_wsum, axis=0),
                   w_mask, DETERMINISTIC)
        keep = (tl.max(col_keep, axis=0) > 0).to(tl.int32)
        # relaxed (tile.accumulate): the count needs each max's old value, not an ordering
        before = tl.atomic_max(ColKeep + offs_v, keep, mask=w_mask, sem="relaxed")
        tl.atomic_add(KeptCount, tl.sum(tl.where(w_mask & (before == 0), keep, 0)),
                      sem="relaxed")


def write_w_from_logits(x, w, bias, rows, sums, v_start, softcap, smooth, cfg, *, v,
                        tuned=False, filters=False, kept_count=None, deterministic=False,
                        temperature=1.0):
    """W = the softmax gradient from fp32 logits X (both N x width, any row stride with unit
    column stride; inside dC's unwritten rows) at columns [v_start, v_start + width); the sums
    as dlogits_tma.py adds them, and, filtered, the number of newly kept columns into
    kept_count[0]. cfg: the Config (its softmax_grad launch shape); tuned: the pointer
    variant's shape timed on this GPU among cfg.softmax_grad_candidates instead (the route's
    softmax_grad_tuned)."""
    k = cfg.softmax_grad
    args = (x, w, bias, rows, v_start, softcap, smooth, v, filters, deterministic, temperature)
    if tuned:
        n, width = x.shape
        kernel = "softmax_grad_filter" if filters else "softmax_grad"  # FILTER: more registers
        key = tune_key(kernel, x.device, w.dtype, shape_bucket(n, width),
                       candidates=cfg.softmax_grad_candidates)
        k = tuned_launch(key, cfg.softmax_grad_candidates,
                         lambda trial, scratch: _launch(trial, *args, scratch, scratch.kept_count),
                         n, sums.col_round.numel(), x.device, filters)
    _launch(k, *args, sums, kept_count)


def _launch(k, x, w, bias, rows, v_start, softcap, smooth, v, filters, deterministic,
            temperature, sums, kept_count):
    """One launch of cce_softmax_grad_kernel with the launch shape k (a config.SoftmaxGrad)."""
    n, width = x.shape
    # Row blocks split across programs until the grid fills `waves` programs per SM.
    strips = cdiv(width, k.block_v)
    splits = max(1, min(cdiv(n, k.block_n), cdiv(k.waves * num_sms(x.device), strips)))
    rows_per_program = cdiv(cdiv(n, splits), k.block_n) * k.block_n
    part = Partials(deterministic, strips, n, cdiv(n, rows_per_program), width, x.device)
    stand_in = sums.col_round  # for pointers whose flag is off: never read
    x_in, w_out = ((TensorDescriptor.from_tensor(x, [k.block_n, k.block_v]),
                    TensorDescriptor.from_tensor(w, [k.block_n, k.block_v])) if k.tma else (x, w))
    cce_softmax_grad_kernel[(strips * cdiv(n, rows_per_program),)](
        x_in, w_out,
        bias if bias is not None else stand_in, rows.targets, rows.lse, rows.lse_lo_or_zeros(), rows.nll, rows.weight,
        rows.weight_lse if rows.weight_lse is not None else rows.weight, *rows.entropy_args(),
        rows.eps if filters else rows.weight, sums.row_round, sums.col_round, sums.row_skip,
        sums.col_wsum if filters else stand_in, sums.col_keep if filters else stand_in,
        kept_count if filters else stand_in, sums.col_sum, part.buffer,
        n, v, v_start, width, rows_per_program, x.stride(0), w.stride(0),
        *softcap_scalars(softcap, temperature), float(smooth),
        HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None, FILTER=filters,
        HAS_GRAD_LSE=rows.weight_lse is not None, HAS_ENTROPY=rows.weight_ent is not None, DETERMINISTIC=deterministic, TMA=k.tma,
        BLOCK_N=k.block_n, BLOCK_V=k.block_v, num_warps=k.num_warps, STAGES=k.stages)
    written = {"row_round", "col_round"} | ({"col_sum"} if bias is not None else set())
    part.add_to(sums, v_start, written | ({"row_skip", "col_wsum"} if filters else set()))
