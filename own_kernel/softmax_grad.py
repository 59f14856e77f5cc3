"""Backward, step 1 on the cuBLAS path: the softmax gradient of a chunk of precomputed logits.

cuBLAS has written X = E @ C[chunk].T in fp32 (N x width); this kernel turns it into
    d[n, v] = (w_n + w'_n) p[n, v] - w_n ((1 - ls) [v == t_n] + ls / V),   times softcap'(z)
exactly as dlogits.py does after its own recompute (see there for the symbols), and writes d
rounded to the input dtype to W for the GEMMs dE += W @ C and dC = W^T @ E.

Sums it keeps, in fp32 (the corrections backward.py adds back through mean rows):
- RowRound / ColRound: d minus its rounded value, per row and per column (of the vocabulary);
- with FILTER, over the rows that may skip (eps[n] > 0; eps 0 marks a flat row, which backward.py
  handles exactly on its own): per column of the chunk ColKeep = 1 when some |d[n, v]| > eps[n]
  (a column of all-negligible entries is skipped by the GEMMs) and ColWSum = sum of the rounded
  values; per row RowWSum = sum of the rounded values (backward.py subtracts the kept share);
- ColSum = sum of d per column (dbias).
Each program handles one row block and TILES consecutive column tiles; row sums stay in
registers across its tiles.
"""
import triton
import triton.language as tl

from own_kernel.tile import LOG2E, softcap_tanh


@triton.jit
def cce_softmax_grad_kernel(X, W, Bias, Targets, Lse, RowWeight, RowWeightLse, RowEps,
                            RowRound, ColRound, RowWSum, ColWSum, ColKeep, ColSum,
                            N, V, v_start, width, stride_xn, stride_wn,
                            tanh_scale, softcap_log2e, smooth,
                            HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                            FILTER: tl.constexpr, HAS_GRAD_LSE: tl.constexpr,
                            TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    num_vb = tl.cdiv(width, BLOCK_V)
    num_groups = tl.cdiv(num_vb, TILES)
    group = pid % num_groups
    nb = pid // num_groups
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    lse2 = tl.load(Lse + offs_n, mask=n_mask, other=0.0) * LOG2E
    w = tl.load(RowWeight + offs_n, mask=n_mask, other=0.0)
    wp = w
    if HAS_GRAD_LSE:
        wp = w + tl.load(RowWeightLse + offs_n, mask=n_mask, other=0.0)
    tgt = tl.load(Targets + offs_n, mask=n_mask, other=-1)
    if FILTER:
        eps = tl.load(RowEps + offs_n, mask=n_mask, other=float("inf"))
        may_skip = eps > 0
    row_round = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_wsum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    x_rows = X + offs_n[:, None].to(tl.int64) * stride_xn
    w_rows = W + offs_n[:, None].to(tl.int64) * stride_wn

    for vb in range(group * TILES, tl.minimum(group * TILES + TILES, num_vb)):
        offs_w = vb * BLOCK_V + tl.arange(0, BLOCK_V)  # column inside the chunk
        offs_v = v_start + offs_w
        w_mask = offs_w < width
        m = n_mask[:, None] & w_mask[None, :]
        x = tl.load(x_rows + offs_w[None, :], mask=m, other=0.0)
        if HAS_BIAS:
            x += tl.load(Bias + offs_v, mask=w_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_SOFTCAP:
            th = softcap_tanh(x, tanh_scale)
            p = tl.exp2(th * softcap_log2e - lse2[:, None])
        else:
            p = tl.exp2(x * LOG2E - lse2[:, None])
        y = smooth / V + tl.where(offs_v[None, :] == tgt[:, None], 1.0 - smooth, 0.0)
        d = wp[:, None] * p - w[:, None] * y
        if HAS_SOFTCAP:
            d = d * (1.0 - th * th)
        d = tl.where(m, d, 0.0)
        d_used = d.to(W.dtype.element_ty)
        tl.store(w_rows + offs_w[None, :], d_used, mask=m)
        d_used = d_used.to(tl.float32)
        r = d - d_used
        row_round += tl.sum(r, axis=1)
        tl.atomic_add(ColRound + offs_v, tl.sum(r, axis=0), mask=w_mask)
        if HAS_BIAS:
            tl.atomic_add(ColSum + offs_v, tl.sum(d, axis=0), mask=w_mask)
        if FILTER:
            d_skip = tl.where(may_skip[:, None], d_used, 0.0)
            row_wsum += tl.sum(d_skip, axis=1)
            tl.atomic_add(ColWSum + offs_w, tl.sum(d_skip, axis=0), mask=w_mask)
            keep = tl.max(tl.where(may_skip[:, None], tl.abs(d) - eps[:, None], -1.0), axis=0) > 0
            tl.atomic_max(ColKeep + offs_w, keep.to(tl.int32), mask=w_mask)
    tl.atomic_add(RowRound + offs_n, row_round, mask=n_mask)
    if FILTER:
        tl.atomic_add(RowWSum + offs_n, row_wsum, mask=n_mask)
