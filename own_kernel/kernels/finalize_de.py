"""Backward, last step: dE = scale * (dE32 + row_round x mean(C) + row_skip x skip-weighted mean(C)),
cast to the input dtype in one pass (no N x D temporary). ROW_SCALE: each row also times its
own scale (fp16 rows whose upstream weights differ: backward.weight_scales). Without dE32 (the
three-matmul path, whose GEMM then adds its product to these rows) the correction alone: torch's
broadcast product into 16-bit rows takes its strided, casting kernel, far below the copy rate
(results/notes/where-time-goes.md)."""
import triton
import triton.language as tl

from own_kernel.policy.plan import cdiv


@triton.jit
def cce_finalize_de_kernel(DE32, RowRound, CMean, RowSkip, CSkipMean, RowScale, DE, N, D,
                           stride_gn, stride_en, stride_ed, out_scale,
                           HAS_DE32: tl.constexpr, FILTER: tl.constexpr, ROW_SCALE: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n_mask = offs_n < N
    d_mask = offs_d < D
    m = n_mask[:, None] & d_mask[None, :]
    g = tl.load(RowRound + offs_n, mask=n_mask, other=0.0)[:, None] \
        * tl.load(CMean + offs_d, mask=d_mask, other=0.0)[None, :]
    if HAS_DE32:
        g += tl.load(DE32 + offs_n[:, None].to(tl.int64) * stride_gn + offs_d[None, :], mask=m,
                     other=0.0)
    if FILTER:
        g += tl.load(RowSkip + offs_n, mask=n_mask, other=0.0)[:, None] \
            * tl.load(CSkipMean + offs_d, mask=d_mask, other=0.0)[None, :]
    g = g * out_scale
    if ROW_SCALE:
        g = g * tl.load(RowScale + offs_n, mask=n_mask, other=0.0)[:, None]
    tl.store(DE + offs_n[:, None].to(tl.int64) * stride_en + offs_d[None, :] * stride_ed,
             g.to(DE.dtype.element_ty), mask=m)


def finalize_de(de32, row_round, c_mean, de, scale, *, row_skip=None, c_skip_mean=None,
                row_scale=None):
    """de (input dtype) = scale * (de32 + row_round x c_mean [+ row_skip x c_skip_mean])
    [times row_scale per row]. de32 None: the correction alone."""
    n, d = de.shape
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    cce_finalize_de_kernel[(cdiv(n, 32), cdiv(d, block_d))](
        de32 if de32 is not None else row_round, row_round, c_mean,
        row_skip if row_skip is not None else row_round,
        c_skip_mean if c_skip_mean is not None else c_mean,
        row_scale if row_scale is not None else row_round, de, n, d,
        0 if de32 is None else de32.stride(0), de.stride(0), de.stride(1), float(scale),
        HAS_DE32=de32 is not None, FILTER=row_skip is not None, ROW_SCALE=row_scale is not None,
        BLOCK_N=32, BLOCK_D=block_d)
