"""The three-matmul path's one memory-bound pass: a chunk of rows' logits, turned in place into
their gradient (paths/three_matmul.py).

For row n of the chunk, with raw logits x (the GEMM's output, bias included), z = softcap(x),
lse = log sum_v exp(z_v), t the target and ls the label smoothing:

    loss_n = (1 - ls) (lse - z_t) + ls (lse - mean_v z_v)
    g_nv   = (p_v - (1 - ls) [v == t] - ls / V) * softcap'(x_v),   p_v = exp(z_v - lse)

One program per row: pass 1 reads the row for its online max and sum (tile.lse_tile_update),
pass 2 reads it again and overwrites it with g (tile.softmax_grad_tile, unweighted: the
reduction's weight goes onto the GEMMs' alpha, so fp16 keeps the small entries). The row's
lse stays the pair (max m, ln s): p_v = exp((z_v - m) - ln s) and lse - z_t = (m - z_t) + ln s,
neither rounded at the logits' magnitude. Where the target is the row's largest logit,
lse - z_t is ln s exactly (the max is that very value), so confident rows lose nothing to
cancellation; their p_t - 1 comes from expm1.

A row whose target is ignore_index or outside [0, V) gets loss 0 and a zero gradient row,
without pass 1 (the path's first chunk is queued before the host has read the targets' check).

With the filter, pass 2 also marks each BLOCK of columns where some |g| >= eps, or where the row
is flat (largest probability below flat_p_max: such rows stay exact); the dE and dC GEMMs then
run over marked blocks only.

Shifted logits (config.Fused.logits_shifted): the TMA forward wrote each logit, in the input
dtype, relative to its row's largest in its forward tile (forward_tma.py), and the row's lse,
nll and largest probability beside: pass 2 alone runs, on x = y + M[tile], in place.
"""
import torch
import triton
import triton.language as tl

from own_kernel.kernels.tile import (LOG2E, expm1, logits, lse_tile_update, softcap_scalars,
                             softmax_grad_tile)


@triton.jit
def _logits_to_grad_kernel(Z, stride_z, G, stride_g, Targets, Loss, Kept, RowRound, V,
                           ignore_index, smooth, tanh_scale, cap, eps, flat_p_max,
                           HAS_SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, FILTER: tl.constexpr,
                           BARRIER: tl.constexpr, ROW_ROUND: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    z_row = Z + row.to(tl.int64) * stride_z
    g_row = G + row.to(tl.int64) * stride_g
    cols = tl.arange(0, BLOCK)
    m = tl.full((1,), float("-inf"), tl.float32)
    s = tl.zeros((1,), tl.float32)
    z_sum = tl.zeros((1,), tl.float32)
    t64 = tl.load(Targets + row)
    valid = (t64 != ignore_index) & (t64 >= 0) & (t64 < V)
    for v0 in range(0, tl.where(valid, V, 0), BLOCK):
        v_mask = cols < V - v0
        x = tl.load(z_row + v0 + cols[None, :], mask=v_mask[None, :], other=0.0).to(tl.float32)
        m, s, z_sum = lse_tile_update(x, m, s, z_sum, v_mask, tanh_scale, cap, HAS_SOFTCAP,
                                      SMOOTH)
    m, s = tl.where(valid, m, 0.0), tl.where(valid, s, 1.0)  # finite in rows without a target
    log2_s = tl.log2(s)
    # Column 0 stands in for a missing target: nothing is read past the row.
    tgt = tl.where(valid, t64, 0).to(tl.int32) + tl.zeros((1,), tl.int32)
    z_t = logits(tl.load(z_row + tgt).to(tl.float32), tanh_scale, cap, HAS_SOFTCAP)
    # lse - z_t as (m - z_t) + ln s: exact where the target is the max (confident rows).
    nll = (m - z_t) + log2_s / LOG2E
    loss = nll
    if SMOOTH:
        loss = (1.0 - smooth) * nll + smooth * ((m - z_sum / V) + log2_s / LOG2E)
    tl.store(Loss + row + tl.arange(0, 1), tl.where(valid, loss, 0.0))
    pt_m1 = expm1(-nll)
    flat = tl.exp2(-log2_s) < flat_p_max
    row_round = tl.zeros((1,), tl.float32)
    for v0 in range(0, V, BLOCK):
        v_mask = cols < V - v0
        x = tl.load(z_row + v0 + cols[None, :], mask=v_mask[None, :], other=0.0).to(tl.float32)
        row_round += _grad_block(x, g_row, v0 + cols[None, :], v_mask[None, :], Kept, v0,
                                 v0 + cols, m, log2_s, tgt, pt_m1, valid, flat, eps, V, smooth,
                                 tanh_scale, cap, HAS_SOFTCAP, FILTER, BARRIER, ROW_ROUND, BLOCK)
    if ROW_ROUND:
        tl.store(RowRound + row + tl.arange(0, 1), row_round)


@triton.jit
def _grad_block(x, g_row, offs, mask, Kept, v0, offs_v, ref, off2, tgt, pt_m1, valid, flat, eps,
                V, smooth, tanh_scale, cap, HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
                BARRIER: tl.constexpr, ROW_ROUND: tl.constexpr, BLOCK: tl.constexpr):
    # One block of BLOCK columns of a row's raw logits x -> its unweighted gradient, stored at
    # g_row + offs (mask); x is laid out as (1, BLOCK) or as (tiles, tile width), each tile row
    # with its column indices offs_v and the target tgt shifted alike (offs_v == tgt at the
    # target). The row's lse is ref + off2 / log2(e) (tile.softmax_grad_tile). Returns what
    # rounding the gradient removed (ROW_ROUND, else 0); FILTER marks the block in Kept.
    one = tl.full((1,), 1.0, tl.float32)
    g = softmax_grad_tile(x, ref, off2, one, one, tgt, pt_m1, offs_v, V, smooth,
                          tanh_scale, cap, HAS_SOFTCAP)
    g = tl.where(valid, g, 0.0)
    if BARRIER:  # G overlaps Z's bytes: every warp's loads of this block come first
        tl.debug_barrier()
    g_used = g.to(g_row.dtype.element_ty)
    tl.store(g_row + offs, g_used, mask=mask)
    rounded = tl.zeros((1,), tl.float32)
    if ROW_ROUND:  # what rounding g removed, for dE's correction (paths/three_matmul.py)
        rounded = tl.sum(tl.sum(tl.where(mask, g - g_used.to(tl.float32), 0.0), axis=1), axis=0,
                         keep_dims=True)
    if FILTER:
        big = tl.max(tl.max(tl.where(mask, tl.abs(g), 0.0), axis=1), axis=0, keep_dims=True)
        keep = (big >= eps) | flat
        keep = keep & ((tl.zeros((1,), tl.int32) + valid.to(tl.int32)) != 0)
        # Every writer stores the same 1: no atomics needed.
        tl.store(Kept + v0 // BLOCK + tl.arange(0, 1), tl.full((1,), 1, tl.int8), mask=keep)
    return rounded


@triton.jit
def _shifted_to_grad_kernel(Y, stride_y, M, stride_m, Lse, LseLo, Nll, PMax, Targets, Kept,
                            RowRound, V, ignore_index, smooth, tanh_scale, cap, eps, flat_p_max,
                            HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
                            ROW_ROUND: tl.constexpr, BLOCK: tl.constexpr,
                            TILE_V: tl.constexpr):
    # The shifted logits' row (forward_tma.py: y = x - M[tile]) -> its gradient in place, one
    # pass: the row's lse, nll and largest probability come from the forward.
    row = tl.program_id(0)
    y_row = Y + row.to(tl.int64) * stride_y
    m_row = M + row.to(tl.int64) * stride_m
    one_el = tl.arange(0, 1)
    t64 = tl.load(Targets + row)
    valid = (t64 != ignore_index) & (t64 >= 0) & (t64 < V)
    tgt = tl.where(valid, t64, 0).to(tl.int32) + tl.zeros((1,), tl.int32)
    lse = tl.load(Lse + row + one_el)
    lo2 = tl.load(LseLo + row + one_el) * LOG2E
    pt_m1 = expm1(-tl.load(Nll + row + one_el))
    flat = tl.load(PMax + row + one_el) < flat_p_max
    # Each block as (tiles, TILE_V): one maximum per tile row, broadcast over it (not one
    # gathered per column), and the target shifted into each tile row's column indices.
    sub = tl.arange(0, BLOCK // TILE_V)
    lane = tl.arange(0, TILE_V)
    row_round = tl.zeros((1,), tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + sub[:, None] * TILE_V + lane[None, :]
        mask = offs < V
        x = tl.load(y_row + offs, mask=mask, other=0.0).to(tl.float32)
        tile = v0 // TILE_V + sub
        x += tl.load(m_row + tile, mask=tile * TILE_V < V, other=0.0)[:, None]
        row_round += _grad_block(x, y_row, offs, mask, Kept, v0, lane, lse, lo2,
                                 tgt - v0 - sub * TILE_V, pt_m1, valid, flat, eps, V, smooth,
                                 tanh_scale, cap, HAS_SOFTCAP, FILTER, False, ROW_ROUND, BLOCK)
    if ROW_ROUND:
        tl.store(RowRound + row + one_el, row_round)


def logits_to_grad(z: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor, *,
                   ignore_index: int, softcap: float | None, label_smoothing: float,
                   kept: torch.Tensor | None, eps: float, flat_p_max: float, block: int,
                   num_warps: int, g: torch.Tensor | None = None,
                   row_round: torch.Tensor | None = None) -> None:
    """Write the unweighted logit gradient of z (rows x V, unit stride along V) into g (None:
    over z itself; else g may share z's bytes, each row of g starting where z's does and
    taking at most as many bytes per column: fp32 logits, 16-bit gradient) and each row's loss
    into loss (fp32); row_round (fp32, one per row, or None): what rounding each row's gradient
    to g's dtype removed, summed. kept: None, or one int8 per ``block`` columns, zeroed by
    the caller, set where the filter keeps the block. Rows whose target is ignore_index or not
    a column of z get loss 0 and gradient 0."""
    rows, v = z.shape
    if rows == 0:
        return
    tanh_scale, cap = softcap_scalars(softcap)
    g = z if g is None else g
    _logits_to_grad_kernel[(rows,)](
        z, z.stride(0), g, g.stride(0), targets, loss, kept if kept is not None else loss,
        row_round if row_round is not None else loss, v, int(ignore_index),
        float(label_smoothing), tanh_scale, cap, float(eps), float(flat_p_max),
        HAS_SOFTCAP=softcap is not None, SMOOTH=label_smoothing > 0,
        FILTER=kept is not None, BARRIER=g.dtype != z.dtype, ROW_ROUND=row_round is not None,
        BLOCK=block, num_warps=num_warps)


def shifted_to_grad(y: torch.Tensor, m: torch.Tensor, tile_v: int, fwd, targets: torch.Tensor, *,
                    ignore_index: int, softcap: float | None, label_smoothing: float,
                    kept: torch.Tensor | None, eps: float, flat_p_max: float, block: int,
                    num_warps: int, row_round: torch.Tensor | None = None) -> None:
    """Write, over the shifted logits y (rows x V, the forward's: y = x - m[:, v // tile_v],
    forward_tma.py), their unweighted gradient; fwd: the forward's (lse, p_max, nll, lse_lo)
    of these rows. kept, row_round and the rows without a target as logits_to_grad's."""
    rows, v = y.shape
    if rows == 0:
        return
    lse, p_max, nll, lse_lo = fwd
    tanh_scale, cap = softcap_scalars(softcap)
    _shifted_to_grad_kernel[(rows,)](
        y, y.stride(0), m, m.stride(0), lse, lse_lo, nll, p_max, targets,
        kept if kept is not None else lse, row_round if row_round is not None else lse, v,
        int(ignore_index), float(label_smoothing), tanh_scale, cap, float(eps),
        float(flat_p_max), HAS_SOFTCAP=softcap is not None, FILTER=kept is not None,
        ROW_ROUND=row_round is not None, BLOCK=block, TILE_V=tile_v, num_warps=num_warps)
