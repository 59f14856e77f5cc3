"""Backward, step 2: dE += W @ C[chunk], accumulated in fp32 across vocabulary chunks.

Each program owns a (BLOCK_N x BLOCK_D) tile of the fp32 accumulator dE32 and runs the
reduction over the chunk's columns in BLOCK_K steps, skipping tiles the filter masked out.
Starting the accumulator from dE32 (not adding afterwards) keeps one fp32 rounding per chunk.
"""
import triton
import triton.language as tl


@triton.jit
def cce_grad_e_kernel(W, C, Mask, DE32,
                      N, D, v_start, chunk, mask_stride, stride_wn,
                      stride_cv, stride_cd, stride_gn,
                      FILTER: tl.constexpr, MASK_BV: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_db = tl.cdiv(D, BLOCK_D)
    db = pid % num_db
    nb = pid // num_db
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    d_mask = offs_d < D
    g_ptrs = DE32 + offs_n[:, None].to(tl.int64) * stride_gn + offs_d[None, :]
    acc = tl.load(g_ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    c_ptrs = C + (v_start + offs_k)[:, None].to(tl.int64) * stride_cv + offs_d[None, :] * stride_cd
    for k0 in range(0, chunk, BLOCK_K):
        k_mask = offs_k < chunk - k0
        keep = 1
        if FILTER:
            keep = tl.load(Mask + nb * mask_stride + k0 // MASK_BV)  # tiles count from v_start
        if keep != 0:
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            c = tl.load(c_ptrs, mask=k_mask[:, None] & d_mask[None, :], other=0.0)
            acc = tl.dot(w, c, acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K
        c_ptrs += BLOCK_K * stride_cv
    tl.store(g_ptrs, acc, mask=n_mask[:, None] & d_mask[None, :])
