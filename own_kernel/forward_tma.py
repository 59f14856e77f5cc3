"""Forward with tensor-memory-accelerator loads: the same per-row log-sum-exp as forward.py.

E and C arrive as tensor descriptors (Hopper's TMA): one thread issues each tile copy and the
hardware zero-fills rows, columns and the D tail past the tensor's edge, so the inner loop has no
address arithmetic or masks and the warps' registers go to the accumulator and the epilogue.
Columns past this program's split (not past V) are masked in the epilogue, as in forward.py.

    x = E[rows] @ C[cols].T (+ bias),  z = softcap(x) / T,  (m, s[, t]) <- online LSE of z
    (tile.py; t: the entropy's sum)

Needs 16-byte aligned bases and row strides and unit stride along D (forward.py checks; other
inputs take the pointer kernel).
"""
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.plan import cdiv
from own_kernel.tile import (dot_precision, lse_ent_tile_update, row_block_and_split,
                             skip_if_all_ignored, softcap_scalars, store_split_partials)


@triton.jit
def cce_fwd_tma_kernel(E, C, Bias, Targets, Part,
                       N, V, v_per_split, plane, splits, group_rows, ignore_index,
                       tanh_scale, cap,
                       HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                       NEED_ENT: tl.constexpr, SKIP_IGNORED: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       D: tl.constexpr, FLATTEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr):
    pid = tl.program_id(0)
    num_nb = tl.cdiv(N, BLOCK_N)
    nb, split = row_block_and_split(pid, num_nb, splits, group_rows)  # see tile.py
    n0 = nb * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    n_mask = offs_n < N
    if SKIP_IGNORED:
        v_end = skip_if_all_ignored(Targets, offs_n, n_mask, ignore_index, v_start, v_end)

    m = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    t = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in tl.range(v_start, v_end, BLOCK_V, flatten=FLATTEN,
                       warp_specialize=WARP_SPECIALIZE):
        acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            acc = tl.dot(E.load([n0, d0]), C.load([v0, d0]).T, acc, input_precision=DOT_PRECISION)
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_mask = offs_v < v_end
        if HAS_BIAS:
            acc += tl.load(Bias + offs_v, mask=v_mask, other=0.0).to(tl.float32)[None, :]
        m, s, z_sum, t = lse_ent_tile_update(acc, m, s, z_sum, t, v_mask, tanh_scale, cap,
                                             HAS_SOFTCAP, NEED_ZSUM, NEED_ENT)

    store_split_partials(Part, split, N, plane, offs_n, n_mask, m, s, z_sum, t, NEED_ZSUM,
                         NEED_ENT)


def forward_partials_tma(e, c, bias, targets, part, grid, softcap, ignore_index, cfg,
                         skip_ignored, sums):
    """Each split's (running max, sum[, sum of logits][, entropy's t]) per row into part, TMA
    loads. grid: plan.ForwardGrid; cfg: the Config; sums: lse_combine.PartialSums."""
    (n, d), v = e.shape, c.shape[0]
    k = cfg.forward.tiles
    cce_fwd_tma_kernel[(cdiv(n, k.block_n) * grid.splits,)](
        TensorDescriptor.from_tensor(e, [k.block_n, k.block_d]),
        TensorDescriptor.from_tensor(c, [k.block_v, k.block_d]),
        bias if bias is not None else part, targets, part, n, v, grid.v_per_split,
        grid.splits * n, grid.splits, grid.group_rows, int(ignore_index),
        *softcap_scalars(softcap, sums.temperature), HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap is not None, NEED_ZSUM=sums.zsum, NEED_ENT=sums.entropy,
        SKIP_IGNORED=skip_ignored, D=d,
        FLATTEN=cfg.forward.flatten, DOT_PRECISION=dot_precision(e.dtype),
        WARP_SPECIALIZE=cfg.forward.warp_specialize, **k.launch())
