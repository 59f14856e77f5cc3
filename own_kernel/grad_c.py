"""Backward, step 3: dC[chunk] = scale * (W^T @ E + (what W's columns miss) x mean(E)).

Each program owns a (BLOCK_M x BLOCK_D) tile of dC rows in the chunk and reduces over all N
rows in BLOCK_K steps, skipping tiles the filter masked out. The epilogue adds back, through
the mean hidden state, what rounding d to the input dtype and skipping tiles removed from each
column's sum, then writes dC once in the input dtype.
"""
import triton
import triton.language as tl


@triton.jit
def cce_grad_c_kernel(W, E, Mask, ColRound, EMean, ColSkip, ESkipMean, DC, out_scale,
                      N, V, D, v_start, chunk, mask_stride, stride_wn,
                      stride_en, stride_ed, stride_cv, stride_cd,
                      FILTER: tl.constexpr, MASK_BN: tl.constexpr, MASK_BV: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_db = tl.cdiv(D, BLOCK_D)
    db = pid % num_db
    mb = pid // num_db
    offs_w = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # column of W = row of dC inside the chunk
    offs_v = v_start + offs_w
    offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = (offs_w < chunk) & (offs_v < V)
    d_mask = offs_d < D
    mask_col = mb * BLOCK_M // MASK_BV  # tiles count from v_start
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    w_ptrs = W + offs_k[:, None].to(tl.int64) * stride_wn + offs_w[None, :]
    e_ptrs = E + offs_k[:, None].to(tl.int64) * stride_en + offs_d[None, :] * stride_ed
    for k0 in range(0, N, BLOCK_K):
        k_mask = offs_k < N - k0
        keep = 1
        if FILTER:
            keep = tl.load(Mask + (k0 // MASK_BN) * mask_stride + mask_col)
        if keep != 0:
            w = tl.load(w_ptrs, mask=k_mask[:, None] & m_mask[None, :], other=0.0)
            e = tl.load(e_ptrs, mask=k_mask[:, None] & d_mask[None, :], other=0.0)
            acc = tl.dot(tl.trans(w), e, acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K * stride_wn
        e_ptrs += BLOCK_K * stride_en
    # What W's columns miss (see dlogits.py), added back through mean rows of E.
    col_round = tl.load(ColRound + offs_v, mask=m_mask, other=0.0)
    acc += col_round[:, None] * tl.load(EMean + offs_d, mask=d_mask, other=0.0)[None, :]
    if FILTER:
        col_skip = tl.load(ColSkip + offs_v, mask=m_mask, other=0.0)
        acc += col_skip[:, None] * tl.load(ESkipMean + offs_d, mask=d_mask, other=0.0)[None, :]
    acc = acc * out_scale
    c_ptrs = DC + offs_v[:, None].to(tl.int64) * stride_cv + offs_d[None, :] * stride_cd
    tl.store(c_ptrs, acc.to(DC.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
