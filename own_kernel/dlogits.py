"""Backward, step 1: recompute a chunk of logits and write the softmax gradient to a workspace.

For the vocabulary chunk [v_start, v_start + chunk) and each row block, recompute z and
    d[n, v] = (w_n + w'_n) p[n, v] - w_n ((1 - ls) [v == t_n] + ls / V),   times softcap'(z)
where w_n is the row's loss weight (0 for ignored rows), w'_n the weight of a gradient flowing
into lse (z-loss), p = softmax(z) and softcap'(z) = 1 - tanh^2(x / s). The chunk of d goes to the
workspace W (N x chunk) in the input dtype for tensor-core GEMMs: dE += W @ C, dC = W^T @ E.

Each program handles TILES consecutive vocabulary tiles of one row block.

What the GEMMs will miss is summed per row and per column, in fp32:
- rounding (kept tiles): exact d minus d rounded to the input dtype;
- skipping (filter_eps): a tile whose every |d[n, v]| <= eps[n] is not written, its mask bit is
  0, the GEMMs skip it, and its d is summed instead (eps[n] = 0 keeps row n exact).
backward.py adds these sums back through a mean row of C (for dE) and of E (for dC): the
rounding sums through the plain means, the skipped sums through means weighted by the skipped
mass (a rank-1 model of the skipped tiles). So neither rounding nor skipping leaks into the
component that all rows of C (or E) share, where the true contributions cancel: that is where
accumulating in bf16 loses dE (ANCHORS.md).
"""
import triton
import triton.language as tl

from own_kernel.tile import logit_tile, row_terms, softmax_grad_tile


@triton.jit
def cce_dlogits_kernel(E, C, Bias, Targets, Lse, Nll, RowWeight, RowWeightLse, W, Mask, RowEps,
                       RowRound, ColRound, RowSkip, ColSkip, ColSum,
                       N, V, D, v_start, chunk, mask_stride, stride_wn,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       tanh_scale, softcap_log2e, smooth,
                       HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
                       HAS_GRAD_LSE: tl.constexpr, TILES: tl.constexpr, FLATTEN: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_vb = tl.cdiv(chunk, BLOCK_V)
    num_groups = tl.cdiv(num_vb, TILES)
    # Vocabulary groups vary fastest: the chunk of C stays in L2 while E row blocks stream.
    group = pid % num_groups
    nb = pid // num_groups
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    lse2, w, wp, tgt, pt_m1 = row_terms(Lse, Nll, RowWeight, RowWeightLse, Targets, offs_n, n_mask,
                                 HAS_GRAD_LSE)
    row_round = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_skip = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if FILTER:
        eps = tl.load(RowEps + offs_n, mask=n_mask, other=float("inf"))

    vb_end = tl.minimum(group * TILES + TILES, num_vb)
    for vb in tl.range(group * TILES, vb_end, flatten=FLATTEN):
        offs_w = vb * BLOCK_V + tl.arange(0, BLOCK_V)  # column inside the chunk
        offs_v = v_start + offs_w
        v_mask = (offs_w < chunk) & (offs_v < V)
        x = logit_tile(E, C, Bias, offs_n, offs_v, n_mask, v_mask, D,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION)
        d = softmax_grad_tile(x, lse2, w, wp, tgt, pt_m1, offs_v, V, smooth, tanh_scale, softcap_log2e,
                              HAS_SOFTCAP)
        d = tl.where(v_mask[None, :], d, 0.0)
        col = tl.sum(d, axis=0)
        if HAS_BIAS:
            tl.atomic_add(ColSum + offs_v, col, mask=v_mask)

        keep = True
        if FILTER:
            keep = tl.max(tl.abs(d) - eps[:, None]) > 0
            tl.store(Mask + nb * mask_stride + vb, keep.to(tl.int8))  # tile vb of this chunk
        if keep:
            d_used = d.to(W.dtype.element_ty)
            w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_w[None, :]
            tl.store(w_ptrs, d_used, mask=n_mask[:, None] & (offs_w < chunk)[None, :])
            d_used = d_used.to(tl.float32)
            row_round += tl.sum(d, axis=1) - tl.sum(d_used, axis=1)
            tl.atomic_add(ColRound + offs_v, col - tl.sum(d_used, axis=0), mask=v_mask)
        else:
            row_skip += tl.sum(d, axis=1)
            tl.atomic_add(ColSkip + offs_v, col, mask=v_mask)
    tl.atomic_add(RowRound + offs_n, row_round, mask=n_mask)
    if FILTER:
        tl.atomic_add(RowSkip + offs_n, row_skip, mask=n_mask)
