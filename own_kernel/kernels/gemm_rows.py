"""batch_invariant's dE GEMM: acc (fp32, M x D) += a (M x K) @ b (K x D) in Triton with one
pinned config (config.RowsGemm), so each row of acc gets the same instruction sequence (the same
products summed in the same order) whatever M is, where the row sits in its tile, and what the
other rows hold. cuBLAS (gemm.py's addmm_fp32) picks its algorithm, split-K included, by M.

Each program owns a BLOCK_M x BLOCK_D tile of acc:

    p = (((0 + a[:, K0] b[K0, :]) + a[:, K1] b[K1, :]) + ...)     (tensor cores, K slices in order)
    acc[rows, cols] <- acc[rows, cols] + p                       (one fp32 add, rounded to nearest)

one tl.dot per BLOCK_K slice, no atomics, no split-K; the call's chunk of K is fixed by the
route (plan.invariant_chunk_plan), so the sum's order is too. Why the product starts from zero:
folding acc itself through the MMA's accumulator (acc as tl.dot's addend) adds every slice of
all of V into a large running sum with the tensor cores' own accumulation, which lost dE
accuracy on an H100 (relative error 2.97e-3 against the default call's 2.51e-3 at Llama 3 (8B),
results/notes/batch-invariant.md); cuBLAS in the default call adds its chunk's product to dE's
fp32 sums the same way as here.

Two loaders, picked by the config, not by the call: pointer loads (any GPU), or TMA
descriptors (Hopper; the hardware zero-fills past M, K and D, so the loop has no masks). Program
ids run down GROUP_M row blocks per column block, so neighbouring programs share b's tiles in L2.
"""
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.kernels.tile import dot_precision
from own_kernel.policy.plan import cdiv


@triton.jit
def _grouped_tile(M, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_M: tl.constexpr):
    # (row block, column block) of this program: GROUP_M row blocks per column block at a time
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_d = tl.cdiv(D, BLOCK_D)
    per_group = GROUP_M * num_d
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def cce_rows_gemm_kernel(Acc, A, B, M, D, K, stride_acc, stride_am, stride_ak, stride_bk,
                         stride_bd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    pid_m, pid_d = _grouped_tile(M, D, BLOCK_M, BLOCK_D, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (offs_m < M)[:, None] & (offs_d < D)[None, :]
    at = Acc + offs_m[:, None].to(tl.int64) * stride_acc + offs_d[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(A + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak,
                    mask=(offs_m < M)[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(B + offs_k[:, None].to(tl.int64) * stride_bk + offs_d[None, :] * stride_bd,
                    mask=k_mask[:, None] & (offs_d < D)[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    acc += tl.load(at, mask=mask, other=0.0)
    tl.store(at, acc, mask=mask)


@triton.jit
def cce_rows_gemm_tma_kernel(Acc, a_desc, b_desc, M, D, K, stride_acc,
                             BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                             DOT_PRECISION: tl.constexpr):
    pid_m, pid_d = _grouped_tile(M, D, BLOCK_M, BLOCK_D, GROUP_M)
    m0, d0 = pid_m * BLOCK_M, pid_d * BLOCK_D
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = d0 + tl.arange(0, BLOCK_D)
    mask = (offs_m < M)[:, None] & (offs_d < D)[None, :]
    at = Acc + offs_m[:, None].to(tl.int64) * stride_acc + offs_d[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([m0, k0]), b_desc.load([k0, d0]), acc,
                     input_precision=DOT_PRECISION)
    acc += tl.load(at, mask=mask, other=0.0)
    tl.store(at, acc, mask=mask)


def addmm_rows(acc, a, b, rows_gemm, tma: bool) -> None:
    """acc (fp32, unit stride along D) += a @ b, each row's sums independent of the other rows
    (rows_gemm: the pinned config.RowsGemm; its tiles: block_n rows, block_v columns of D,
    block_d of K). tma: the TMA loader (route.rows_gemm_reads_tma decides), else pointers."""
    m, k = a.shape
    d = b.shape[1]
    if m == 0 or k == 0:
        return
    t = rows_gemm.tiles
    grid = (cdiv(m, t.block_n) * cdiv(d, t.block_v),)
    common = dict(BLOCK_M=t.block_n, BLOCK_D=t.block_v, BLOCK_K=t.block_d,
                  GROUP_M=rows_gemm.group_m, DOT_PRECISION=dot_precision(a.dtype),
                  num_warps=t.num_warps, num_stages=t.num_stages)
    if tma:
        cce_rows_gemm_tma_kernel[grid](
            acc, TensorDescriptor.from_tensor(a, [t.block_n, t.block_d]),
            TensorDescriptor.from_tensor(b, [t.block_d, t.block_v]), m, d, k, acc.stride(0),
            **common)
    else:
        cce_rows_gemm_kernel[grid](
            acc, a, b, m, d, k, acc.stride(0), a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), **common)


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
