"""Backward, step 1: recompute a chunk of logits and write the softmax gradient to a workspace.

For the vocabulary chunk [v_start, v_start + chunk) and every row block, recompute z, then
    d[n, v] = w_n * (softmax(z)[n, v] - (1 - ls) [v == t_n] - ls / V) * softcap'(z)
where w_n is the row's weight (0 for ignored rows) and softcap'(z) = 1 - (z / s)^2. The chunk of
d goes to the workspace W (N x chunk) in the input dtype, for tensor-core GEMMs dE += W @ C and
dC = W^T @ E (grad_e.py, grad_c.py).

Filtering: a tile whose every |d| <= eps is not written and its mask bit is 0; the GEMMs skip it.
Rounding/skip corrections: per row and per column, what the GEMMs will miss = (exact fp32 sum
of d) - (sum of the d they use: rounded to the input dtype, and 0 for skipped tiles). backward.py
adds that back through the mean row of C (for dE) and of E (for dC). So neither rounding d nor
skipping tiles leaks into the component that all rows of C (or E) share, where the true
contributions cancel: that is where accumulating in bf16 loses dE (ANCHORS.md).
"""
import triton
import triton.language as tl

from own_kernel.tile import logit_tile


@triton.jit
def cce_dlogits_kernel(E, C, Bias, Targets, Lse, RowWeight, RowWeightLse, W, Mask,
                       RowLost, ColLost, ColSum,
                       N, V, D, v_start, chunk, mask_stride, stride_wn,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       softcap, smooth, eps,
                       HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
                       HAS_GRAD_LSE: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_vb = tl.cdiv(chunk, BLOCK_V)
    # Vocabulary blocks vary fastest: the chunk of C stays in L2 while E row blocks stream.
    vb = pid % num_vb
    nb = pid // num_vb
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = vb * BLOCK_V + tl.arange(0, BLOCK_V)  # column inside the chunk
    offs_v = v_start + offs_w
    n_mask = offs_n < N
    v_mask = (offs_w < chunk) & (offs_v < V)

    z = logit_tile(E, C, Bias, offs_n, offs_v, n_mask, v_mask, D,
                   stride_en, stride_ed, stride_cv, stride_cd, softcap,
                   HAS_BIAS, HAS_SOFTCAP, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION)
    lse = tl.load(Lse + offs_n, mask=n_mask, other=0.0)
    w = tl.load(RowWeight + offs_n, mask=n_mask, other=0.0)
    tgt = tl.load(Targets + offs_n, mask=n_mask, other=-1)

    p = tl.exp2((z - lse[:, None]) * 1.4426950408889634)
    # Cross-entropy part w * (p - y_smoothed), plus w_lse * p for a gradient flowing into lse.
    wp = w
    if HAS_GRAD_LSE:
        wp = w + tl.load(RowWeightLse + offs_n, mask=n_mask, other=0.0)
    y = smooth / V + tl.where(offs_v[None, :] == tgt[:, None], 1.0 - smooth, 0.0)
    d = wp[:, None] * p - w[:, None] * y
    if HAS_SOFTCAP:
        zs = z / softcap
        d = d * (1.0 - zs * zs)
    d = tl.where(v_mask[None, :], d, 0.0)
    row_sum = tl.sum(d, axis=1)
    col_sum = tl.sum(d, axis=0)
    if HAS_BIAS:
        tl.atomic_add(ColSum + offs_v, col_sum, mask=v_mask)

    keep = True
    if FILTER:
        keep = tl.max(tl.abs(d)) > eps
        tl.store(Mask + nb * mask_stride + (v_start // BLOCK_V) + vb, keep.to(tl.int8))
    if keep:
        d_used = d.to(W.dtype.element_ty)
        w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_w[None, :]
        tl.store(w_ptrs, d_used, mask=n_mask[:, None] & (offs_w < chunk)[None, :])
        d_used = d_used.to(tl.float32)
        row_sum -= tl.sum(d_used, axis=1)
        col_sum -= tl.sum(d_used, axis=0)
    tl.atomic_add(RowLost + offs_n, row_sum, mask=n_mask)
    tl.atomic_add(ColLost + offs_v, col_sum, mask=v_mask)
