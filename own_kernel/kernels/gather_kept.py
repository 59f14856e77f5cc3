"""Backward, filtered cuBLAS chunks: gather the kept columns of W for the GEMMs on them.

Out[:, j] = W[:, Kept[j]] for j < num_kept, 0 for the padding j >= num_kept (the GEMMs' column
count is padded, see backward.finish_chunk), and 0 in the flat rows (RowEps == 0: their own exact
GEMMs cover them). The softmax-gradient kernel added every entry of the rows that may skip to
RowSkip; the kept columns' share was not skipped, so it comes off again:
RowSkip[n] -= sum_j Out[n, j]. One pass instead of four (gather, pad, flat rows, row sums): with
filtering the host's launches, not the GPU, set the pace. One program per row block, looping
over the columns, so the row sums need no atomics (same result every run).
"""
import torch
import triton
import triton.language as tl

from own_kernel.policy.plan import cdiv


@triton.jit
def cce_gather_kept_kernel(W, Kept, RowEps, Out, RowSkip, N, num_kept, size,
                           stride_wn, stride_on,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    skips = n_mask & (tl.load(RowEps + offs_n, mask=n_mask, other=0.0) != 0)
    row_w = W + offs_n[:, None].to(tl.int64) * stride_wn
    row_o = Out + offs_n[:, None].to(tl.int64) * stride_on
    kept_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, size, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        real = offs_k < num_kept
        cols = tl.load(Kept + offs_k, mask=real, other=0)
        w = tl.load(row_w + cols[None, :], mask=skips[:, None] & real[None, :], other=0.0)
        tl.store(row_o + offs_k[None, :], w, mask=n_mask[:, None] & (offs_k < size)[None, :])
        kept_sum += tl.sum(w.to(tl.float32), axis=1)
    row_skip = tl.load(RowSkip + offs_n, mask=n_mask, other=0.0)
    tl.store(RowSkip + offs_n, row_skip - kept_sum, mask=n_mask)


def gather_kept(w, kept, num_kept, row_eps, row_skip):
    """W's kept columns (kept[:num_kept]; kept's length is the padded count) in a new buffer,
    zero in the padding and in the flat rows; their share comes off row_skip."""
    n = w.shape[0]
    out = torch.empty((n, kept.numel()), device=w.device, dtype=w.dtype)
    cce_gather_kept_kernel[(cdiv(n, 32),)](w, kept, row_eps, out, row_skip, n, num_kept,
                                          kept.numel(), w.stride(0), out.stride(0),
                                          BLOCK_N=32, BLOCK_K=64)
    return out
