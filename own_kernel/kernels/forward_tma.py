"""Forward with tensor-memory-accelerator loads: the same per-row log-sum-exp as forward.py.

E and C arrive as tensor descriptors (Hopper's TMA): one thread issues each tile copy and the
hardware zero-fills rows, columns and the D tail past the tensor's edge, so the inner loop has no
address arithmetic or masks and the warps' registers go to the accumulator and the epilogue.
Columns past this program's split (not past V) are masked in the epilogue, as in forward.py.

    x = E[rows] @ C[cols].T (+ bias),  z = softcap(x) / T,  (m, s[, t]) <- online LSE of z
    (tile.py; t: the entropy's sum)

Needs 16-byte aligned bases and row strides and unit stride along D (forward.py checks; other
inputs take the pointer kernel).

STORE_Y (the three-matmul path's shifted logits, paths/three_matmul.py): each tile's logits are
also written,
in the input dtype, relative to their row's largest raw logit in that tile:

    M[n, tile] = max_v x[n, v],   Y[n, v] = x[n, v] - M[n, tile]   (Y rounded to 16 bits)

The entries that carry the softmax are those near their row's maximum, so near their tile's:
there y is small and 16 bits keep it to a fraction of a 16-bit rounding of the gradient
(|dp| <= p 2^-9 |y| <= 2^-9 / e), where 16-bit logits of magnitude |x| lose |x| 2^-9 in the
exponent. Half the bytes of fp32 logits, near their accuracy.
"""
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.policy.plan import cdiv
from own_kernel.kernels.tile import (dot_precision, halves, logits, lse_ent_fold,
                                     lse_ent_tile_update, lse_halves_update, lse_init,
                                     masked_logits, row_block_and_split, skip_if_all_ignored,
                                     softcap_scalars, store_block_partials, store_split_partials)


@triton.jit
def _store_shifted(x, Y, M, m_stride, n0, v0, offs_n, n_mask, v_mask,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, SLICES: tl.constexpr):
    # M[rows, tile] = the tile's largest raw logit per row; Y[rows, cols] = x - that, rounded
    # (TMA clips the stores at the rows and columns of Y). SLICES: stores of BLOCK_V / SLICES
    # columns (their staging buffer beside the pipeline's in shared memory). Returns the
    # maxima, which the online log-sum-exp reuses instead of reducing the tile again.
    x_max = tl.max(tl.where(v_mask[None, :], x, -1e30), axis=1)
    tl.store(M + offs_n.to(tl.int64) * m_stride + v0 // BLOCK_V, x_max, mask=n_mask)
    y = (x - x_max[:, None]).to(Y.dtype)
    if SLICES == 1:
        Y.store([n0, v0], y)
    else:
        tl.static_assert(SLICES == 2, "SLICES must be 1 or 2")
        y0, y1 = halves(y, BLOCK_N, BLOCK_V // 2)
        Y.store([n0, v0], y0)
        Y.store([n0, v0 + BLOCK_V // 2], y1)
    return x_max


@triton.jit
def _fold_shifted_tile(acc, x_max, v0, v_end, v_mask, m, s, z_sum, t, tanh_scale, cap,
                       HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                       NEED_ENT: tl.constexpr, HALVES: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_V: tl.constexpr):
    # The online state after a tile whose raw row maxima x_max the shifted store took: their
    # softcap is the tile's largest z (softcap and 1 / T keep the order), so the tile is not
    # reduced again. HALVES: its two column halves in turn, both against that one reference,
    # each half's mask made just before its fold (as tile.lse_halves_update).
    z_max = logits(x_max, tanh_scale, cap, HAS_SOFTCAP)
    if HALVES:
        x0, x1 = halves(acc, BLOCK_N, BLOCK_V // 2)
        half = tl.arange(0, BLOCK_V // 2)
        mask0 = v0 + half < v_end
        m, s, z_sum, t = lse_ent_fold(masked_logits(x0, mask0, tanh_scale, cap, HAS_SOFTCAP),
                                      z_max, m, s, z_sum, t, mask0, NEED_ZSUM, NEED_ENT)
        mask1 = v0 + BLOCK_V // 2 + half < v_end
        return lse_ent_fold(masked_logits(x1, mask1, tanh_scale, cap, HAS_SOFTCAP), z_max, m,
                            s, z_sum, t, mask1, NEED_ZSUM, NEED_ENT)
    z = masked_logits(acc, v_mask, tanh_scale, cap, HAS_SOFTCAP)
    return lse_ent_fold(z, z_max, m, s, z_sum, t, v_mask, NEED_ZSUM, NEED_ENT)


@triton.jit
def cce_fwd_tma_kernel(E, C, Bias, Targets, Part, Y, M, m_stride,
                       N, V, v_per_split, plane, splits, group_rows, grouped_splits, ignore_index,
                       tanh_scale, cap,
                       HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                       NEED_ENT: tl.constexpr, SKIP_IGNORED: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       D: tl.constexpr, FLATTEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr, STORE_Y: tl.constexpr,
                       Y_SLICES: tl.constexpr, PARTS: tl.constexpr, HALVES: tl.constexpr):
    pid = tl.program_id(0)
    num_nb = tl.cdiv(N, BLOCK_N)
    nb, split = row_block_and_split(pid, num_nb, splits, group_rows, grouped_splits)  # tile.py
    n0 = nb * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    n_mask = offs_n < N
    if SKIP_IGNORED:
        v_end = skip_if_all_ignored(Targets, offs_n, n_mask, ignore_index, v_start, v_end)

    if PARTS > 1:  # batch_invariant: one tile per split, its blocks' partials (tile.py)
        tl.static_assert(not STORE_Y, "batch_invariant writes no shifted logits")
        acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
        if v_end > v_start:  # else every row is ignored: no logits, empty partials
            for d0 in range(0, D, BLOCK_D):
                acc = tl.dot(E.load([n0, d0]), C.load([v_start, d0]).T, acc,
                             input_precision=DOT_PRECISION)
            if HAS_BIAS:
                offs_v = v_start + tl.arange(0, BLOCK_V)
                b = tl.load(Bias + offs_v, mask=offs_v < v_end, other=0.0)
                acc += b.to(tl.float32)[None, :]
        store_block_partials(acc, Part, v_start, N, V, v_end, plane, offs_n, n_mask, tanh_scale,
                             cap, HAS_SOFTCAP, NEED_ZSUM, NEED_ENT, BLOCK_N, BLOCK_V, PARTS)
    else:
        m, s, z_sum, t = lse_init(BLOCK_N)
        for v0 in tl.range(v_start, v_end, BLOCK_V, flatten=FLATTEN,
                           warp_specialize=WARP_SPECIALIZE):
            acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                acc = tl.dot(E.load([n0, d0]), C.load([v0, d0]).T, acc,
                             input_precision=DOT_PRECISION)
            offs_v = v0 + tl.arange(0, BLOCK_V)
            v_mask = offs_v < v_end
            if HAS_BIAS:
                acc += tl.load(Bias + offs_v, mask=v_mask, other=0.0).to(tl.float32)[None, :]
            if STORE_Y:
                x_max = _store_shifted(acc, Y, M, m_stride, n0, v0, offs_n, n_mask, v_mask,
                                       BLOCK_N, BLOCK_V, Y_SLICES)
                m, s, z_sum, t = _fold_shifted_tile(acc, x_max, v0, v_end, v_mask, m, s, z_sum, t,
                                                    tanh_scale, cap, HAS_SOFTCAP, NEED_ZSUM,
                                                    NEED_ENT, HALVES, BLOCK_N, BLOCK_V)
            elif HALVES:
                m, s, z_sum, t = lse_halves_update(acc, v0, v_end, m, s, z_sum, t, tanh_scale,
                                                   cap, HAS_SOFTCAP, NEED_ZSUM, NEED_ENT,
                                                   BLOCK_N, BLOCK_V)
            else:
                m, s, z_sum, t = lse_ent_tile_update(acc, m, s, z_sum, t, v_mask, tanh_scale,
                                                     cap, HAS_SOFTCAP, NEED_ZSUM, NEED_ENT)
        store_split_partials(Part, split, N, plane, offs_n, n_mask, m, s, z_sum, t, NEED_ZSUM,
                             NEED_ENT)


def forward_partials_tma(e, c, bias, targets, part, grid, softcap, ignore_index, cfg,
                         skip_ignored, sums, shifted=None):
    """Each split's (running max, sum[, sum of logits][, entropy's t]) per row into part, TMA
    loads. grid: plan.ForwardGrid; cfg: the Config; sums: lse_combine.PartialSums. shifted:
    None, or (Y, M) to write the shifted logits into (module docstring; Y: n x V in e's dtype,
    16-byte aligned rows; M: n x cdiv(V, block_v) fp32, unit stride along a row)."""
    (n, d), v = e.shape, c.shape[0]
    k = cfg.forward.tiles
    e_desc = TensorDescriptor.from_tensor(e, [k.block_n, k.block_d])
    y_desc, m, m_stride = e_desc, part, 0  # stand-ins, never touched without STORE_Y
    if shifted is not None:
        y, m = shifted
        y_desc = TensorDescriptor.from_tensor(y, [k.block_n, k.block_v // cfg.fused.y_slices])
        m_stride = m.stride(0)
    cce_fwd_tma_kernel[(cdiv(n, k.block_n) * grid.splits,)](
        e_desc, TensorDescriptor.from_tensor(c, [k.block_v, k.block_d]),
        bias if bias is not None else part, targets, part, y_desc, m, m_stride, n, v,
        grid.v_per_split,
        grid.parts(v) * n, grid.splits, grid.group_rows, grid.grouped_splits, int(ignore_index),
        *softcap_scalars(softcap, sums.temperature), HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap is not None, NEED_ZSUM=sums.zsum, NEED_ENT=sums.entropy,
        SKIP_IGNORED=skip_ignored, D=d,
        FLATTEN=cfg.forward.flatten, DOT_PRECISION=dot_precision(e.dtype),
        WARP_SPECIALIZE=cfg.forward.warp_specialize, STORE_Y=shifted is not None,
        Y_SLICES=cfg.fused.y_slices, PARTS=grid.parts_per_split,
        HALVES=cfg.forward.softcap_halves and softcap is not None, **k.launch())
