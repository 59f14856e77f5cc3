"""Backward, dC corrections: DC[v, :] += scale * (A[v] * X[:] + A2[v] * X2[:]).

Once at the end of the backward: what rounding d to the input dtype removed from
each column (A = ColRound, X = mean(E)) and, with RANK2 after gradient filtering on the cuBLAS
path, the skipped columns' rank-1 model (A2 = their skipped gradient mass, X2 = the hidden states'
mean weighted by the skipped mass per row). One pass in fp32, no V x D temporary.
"""
import triton
import triton.language as tl

from own_kernel.policy.plan import cdiv


@triton.jit
def cce_rank1_dc_kernel(DC, A, X, A2, X2, V, D, stride_cv, stride_cd, scale,
                        RANK2: tl.constexpr,
                        BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    v_mask = offs_v < V
    d_mask = offs_d < D
    m = v_mask[:, None] & d_mask[None, :]
    ptrs = DC + offs_v[:, None].to(tl.int64) * stride_cv + offs_d[None, :] * stride_cd
    g = tl.load(A + offs_v, mask=v_mask, other=0.0)[:, None] \
        * tl.load(X + offs_d, mask=d_mask, other=0.0)[None, :] * scale
    if RANK2:
        g += tl.load(A2 + offs_v, mask=v_mask, other=0.0)[:, None] \
            * tl.load(X2 + offs_d, mask=d_mask, other=0.0)[None, :] * scale
    g += tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
    tl.store(ptrs, g.to(DC.dtype.element_ty), mask=m)


def rank1_dc(dc, a, x, scale, a2=None, x2=None):
    """dc[v, :] += scale * (a[v] * x + a2[v] * x2) (the second term where given)."""
    v, d = dc.shape
    if v == 0:
        return
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    cce_rank1_dc_kernel[(cdiv(v, 32), cdiv(d, block_d))](
        dc, a, x, a2 if a2 is not None else a, x2 if x2 is not None else x,
        v, d, dc.stride(0), dc.stride(1), float(scale),
        RANK2=a2 is not None, BLOCK_V=32, BLOCK_D=block_d)
