"""batch_invariant's dE GEMM: acc (fp32, M x D) += a (M x K) @ b (K x D) in Triton with one
pinned tile config, so each row of acc gets the same instruction sequence (the same products
summed in the same order) whatever M is, where the row sits in its tile, and what the other rows
hold. cuBLAS (gemm.py's addmm_fp32) picks its algorithm, split-K included, by M.

Each program owns a BLOCK_M x BLOCK_D tile of acc, sums its K in BLOCK_K steps in order in
registers, then adds that to acc once: no atomics, no split-K.
"""
import triton
import triton.language as tl

from own_kernel.kernels.tile import dot_precision
from own_kernel.policy.plan import cdiv


@triton.jit
def cce_rows_gemm_kernel(Acc, A, B, M, D, K, stride_acc, stride_am, stride_ak, stride_bk,
                         stride_bd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m_mask = offs_m < M
    d_mask = offs_d < D
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(A + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(B + offs_k[:, None].to(tl.int64) * stride_bk + offs_d[None, :] * stride_bd,
                    mask=k_mask[:, None] & d_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    at = Acc + offs_m[:, None].to(tl.int64) * stride_acc + offs_d[None, :]
    mask = m_mask[:, None] & d_mask[None, :]
    tl.store(at, tl.load(at, mask=mask, other=0.0) + acc, mask=mask)


def addmm_rows(acc, a, b, tiles) -> None:
    """acc (fp32, unit stride along D) += a @ b, each row's sums independent of the other rows
    (tiles: the pinned config.Tiles: block_n rows, block_v columns of D, block_d of K)."""
    m, k = a.shape
    d = b.shape[1]
    if m == 0 or k == 0:
        return
    cce_rows_gemm_kernel[(cdiv(m, tiles.block_n), cdiv(d, tiles.block_v))](
        acc, a, b, m, d, k, acc.stride(0), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        BLOCK_M=tiles.block_n, BLOCK_D=tiles.block_v, BLOCK_K=tiles.block_d,
        DOT_PRECISION=dot_precision(a.dtype), num_warps=tiles.num_warps,
        num_stages=tiles.num_stages)


@triton.jit
def cce_ordered_sum_kernel(Part, Out, S, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    total = tl.load(Out + offs, mask=mask, other=0.0)
    part = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in range(S):
        part += tl.load(Part + k * N + offs, mask=mask, other=0.0)
    tl.store(Out + offs, total + part, mask=mask)


def add_slices_in_order(out, part) -> None:
    """out (N,) fp32 += part (S x N, contiguous) summed over S from slice 0 up, the same order
    for every column whatever N (a torch sum over dim 0 may split S by N)."""
    s, n = part.shape
    if n:
        cce_ordered_sum_kernel[(cdiv(n, 256),)](part, out, s, n, BLOCK=256)
