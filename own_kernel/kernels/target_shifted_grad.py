"""The three-matmul path's gradient pass over 16-bit logits that cuBLAS wrote vocabulary-major
and shifted by each row's target logit (paths/three_matmul.py, config.Fused.target_shift).

For a chunk of R rows, with b_r = bf16(-x_{r,t_r}) (the row's raw target logit, negated and
rounded to the input dtype), one cuBLAS GEMM with b as its bias writes

    Y = C E_R^T + b          (V x R, the input dtype: Y[v, r] = x_rv - x_rt, rounded once)

so the values that carry a row's probability mass, those near its target's and its largest
logit, are small and keep 16-bit's relative precision: the target's own entry is
x_t + b (|x_t| 2^-9 at most, then rounded), as the TMA forward's shifted logits keep each
tile's largest (forward_tma.py). cuBLAS can add a bias only per row of its column-major
output, a column of this row-major one: hence Y^T, and this pass reads each chunk row as a
column. Softmax is shift-invariant, so without a softcap the pass works on y itself; with
one, x = y - b (fp32) goes through the tanh.

Two kernels, each over a grid of (BLOCK_R rows) x (vocabulary splits), each program a strip of
BLOCK_R contiguous columns of Y over its split's rows of Y:
- partials: per row and split, s = sum_v exp(z_v - z_t), relative to the row's own target
  logit z_t, so that lse - z_t = ln(sum of the splits' s) with no cancellation on any row
  (confident rows included: logits_grad.py's (m - z_t) + ln s, with m = z_t there). A split
  whose largest z is more than GUARD above z_t (a row with loss > GUARD) sums again relative
  to that largest, where exp cannot overflow.
- gradient: the splits' sums combined per row, the loss, then the strip overwritten with the
  unweighted gradient (tile.softmax_grad_tile; the loss weight goes onto the GEMMs' alpha),
  p_t - 1 from expm1(-nll) (logits_grad.py's rules). Rows without a target (ignore_index, or
  outside [0, V)) get loss 0 and a zero gradient column.

What the strided strips need to run near their bytes (H200, results/notes/
target-shifted-logits.md, each step measured): each thread folds its own elements (exp, max
and sum elementwise), the strip reduced once at the end, not across warps every step; whole
row blocks load unmasked along their contiguous axis (EVEN_R); each step loads the next tile
before it works on this one (twice the bytes in flight); and the grid holds enough programs
(plan.target_shift_splits).
"""
import torch
import triton
import triton.language as tl

from own_kernel.kernels.tile import LOG2E, expm1, logits, softcap_scalars, softmax_grad_tile
from own_kernel.policy.plan import cdiv


# Largest z - z_t summed relative to z_t: exp(60) V stays far inside fp32 for any V < 1e12.
GUARD = tl.constexpr(60.0)


@triton.jit
def _rows(R, BLOCK_R: tl.constexpr, EVEN_R: tl.constexpr):
    # The program's rows and their mask: a constant where R is a multiple of BLOCK_R, which
    # folds away and leaves the strip's loads unmasked along their contiguous axis.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    if EVEN_R:
        return rows, tl.full((BLOCK_R,), 1, tl.int1)
    return rows, rows < R


@triton.jit
def _strip(Y, stride_v, v0, rows, r_mask, cols, v_end):
    # Pointers and mask of Y[v0 + cols, rows] as a (BLOCK_R, BLOCK_V) tile (row-major logits'
    # orientation; its axis 0 is contiguous in memory), and the columns' mask.
    v_mask = cols < v_end - v0
    offs = (v0 + cols).to(tl.int64)[None, :] * stride_v + rows[:, None]
    return Y + offs, r_mask[:, None] & v_mask[None, :], v_mask


@triton.jit
def _load(Y, stride_v, v0, rows, r_mask, cols, v_end):
    # The tile at v0 as stored (masked past v_end: a tile wholly past it reads nothing).
    ptrs, mask, v_mask = _strip(Y, stride_v, v0, rows, r_mask, cols, v_end)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _z(y, back, tanh_scale, cap, HAS_SOFTCAP: tl.constexpr):
    # A loaded tile's z, and its x (= y - bias under a softcap; y itself without one).
    x = y.to(tl.float32)
    if HAS_SOFTCAP:
        x += back[:, None]
    return logits(x, tanh_scale, cap, HAS_SOFTCAP), x


@triton.jit
def _row_terms(Y, stride_v, Bias, Targets, rows, r_mask, V, ignore_index, tanh_scale, cap,
               HAS_SOFTCAP: tl.constexpr):
    # Per row: whether it has a target, the target (0 without), the shift back to x (-bias)
    # and the target's z.
    t64 = tl.load(Targets + rows, mask=r_mask, other=ignore_index)
    valid = r_mask & (t64 != ignore_index) & (t64 >= 0) & (t64 < V)
    tgt = tl.where(valid, t64, 0).to(tl.int32)
    back = -tl.load(Bias + rows, mask=r_mask, other=0.0).to(tl.float32)
    x_t = tl.load(Y + tgt.to(tl.int64) * stride_v + rows, mask=r_mask, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        x_t += back
    return valid, tgt, back, logits(x_t, tanh_scale, cap, HAS_SOFTCAP)


@triton.jit
def _target_shifted_partials_kernel(Y, stride_v, Bias, Targets, Part, R, V, split_v,
                                    ignore_index, tanh_scale, cap, HAS_SOFTCAP: tl.constexpr,
                                    SMOOTH: tl.constexpr, BLOCK_R: tl.constexpr,
                                    BLOCK_V: tl.constexpr, EVEN_R: tl.constexpr):
    rows, r_mask = _rows(R, BLOCK_R, EVEN_R)
    split = tl.program_id(1)
    v_lo = split * split_v
    v_hi = tl.minimum(V, v_lo + split_v)
    valid, tgt, back, z_t = _row_terms(Y, stride_v, Bias, Targets, rows, r_mask, V, ignore_index,
                                       tanh_scale, cap, HAS_SOFTCAP)
    cols = tl.arange(0, BLOCK_V)
    s = tl.zeros((BLOCK_R, BLOCK_V), tl.float32)
    m = tl.full((BLOCK_R, BLOCK_V), -1e30, tl.float32)
    z_sum = tl.zeros((BLOCK_R, BLOCK_V), tl.float32)
    # Each step loads the next tile before it works on this one: twice the bytes in flight
    # per program, which a strip's short rows need to keep the memory busy.
    y_next = _load(Y, stride_v, v_lo, rows, r_mask, cols, v_hi)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        y = y_next
        y_next = _load(Y, stride_v, v0 + BLOCK_V, rows, r_mask, cols, v_hi)
        ptrs, mask, v_mask = _strip(Y, stride_v, v0, rows, r_mask, cols, v_hi)
        z, x = _z(y, back, tanh_scale, cap, HAS_SOFTCAP)
        z = tl.where(mask, z, -1e30)  # exp -> 0, never the max
        m = tl.maximum(m, z)
        s += tl.exp2((z - z_t[:, None]) * LOG2E)
        if SMOOTH:
            z_sum += tl.where(mask, z, 0.0)
    m_row = tl.max(m, axis=1)
    ref = z_t
    s_row = tl.sum(s, axis=1)
    far = (m_row - z_t > GUARD) & r_mask
    if tl.max(far.to(tl.int32), axis=0) > 0:  # rare: sum again relative to the split's max
        s = tl.zeros((BLOCK_R, BLOCK_V), tl.float32)
        for v0 in range(v_lo, v_hi, BLOCK_V):
            ptrs, mask, v_mask = _strip(Y, stride_v, v0, rows, r_mask, cols, v_hi)
            z, x = _z(tl.load(ptrs, mask=mask, other=0.0), back, tanh_scale, cap, HAS_SOFTCAP)
            s += tl.exp2((tl.where(mask, z, -1e30) - m_row[:, None]) * LOG2E)
        ref = tl.where(far, m_row, z_t)
        s_row = tl.where(far, tl.sum(s, axis=1), s_row)
    plane = tl.num_programs(1) * R
    at = Part + split * R + rows
    tl.store(at, ref, mask=r_mask)
    tl.store(at + plane, s_row, mask=r_mask)
    tl.store(at + 2 * plane, tl.sum(z_sum, axis=1), mask=r_mask)


@triton.jit
def _combine(Part, rows, r_mask, R, splits, BLOCK_R: tl.constexpr):
    # The splits' (ref, s, z_sum) -> the row's (ref, s, z_sum), s = sum exp(z - ref) over V.
    plane = splits * R
    ref = tl.full((BLOCK_R,), -1e30, tl.float32)
    for k in range(splits):
        ref = tl.maximum(ref, tl.load(Part + k * R + rows, mask=r_mask, other=0.0))
    s = tl.zeros((BLOCK_R,), tl.float32)
    z_sum = tl.zeros((BLOCK_R,), tl.float32)
    for k in range(splits):
        ref_k = tl.load(Part + k * R + rows, mask=r_mask, other=0.0)
        s_k = tl.load(Part + plane + k * R + rows, mask=r_mask, other=1.0)
        s += s_k * tl.exp2((ref_k - ref) * LOG2E)
        z_sum += tl.load(Part + 2 * plane + k * R + rows, mask=r_mask, other=0.0)
    return ref, s, z_sum


@triton.jit
def _target_shifted_grad_kernel(Y, stride_v, Bias, Targets, Part, Loss, R, V, split_v,
                                ignore_index, smooth, tanh_scale, cap,
                                HAS_SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr,
                                ROW_ROUND: tl.constexpr, BLOCK_R: tl.constexpr,
                                BLOCK_V: tl.constexpr, EVEN_R: tl.constexpr):
    rows, r_mask = _rows(R, BLOCK_R, EVEN_R)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    v_lo = split * split_v
    v_hi = tl.minimum(V, v_lo + split_v)
    valid, tgt, back, z_t = _row_terms(Y, stride_v, Bias, Targets, rows, r_mask, V, ignore_index,
                                       tanh_scale, cap, HAS_SOFTCAP)
    ref, s, z_sum = _combine(Part, rows, r_mask, R, splits, BLOCK_R)
    log2_s = tl.log2(s)
    # lse - z_t = (ref - z_t) + ln s: ln s alone where ref is z_t (every row of loss < GUARD)
    nll = (ref - z_t) + log2_s / LOG2E
    if split == 0:
        loss = nll
        if SMOOTH:
            loss = (1.0 - smooth) * nll + smooth * (nll + z_t - z_sum / V)
        tl.store(Loss + rows, tl.where(valid, loss, 0.0), mask=r_mask)
    pt_m1 = expm1(-nll)
    one = tl.full((BLOCK_R,), 1.0, tl.float32)
    cols = tl.arange(0, BLOCK_V)
    rounded = tl.zeros((BLOCK_R, BLOCK_V), tl.float32)
    y_next = _load(Y, stride_v, v_lo, rows, r_mask, cols, v_hi)  # prefetched as above
    for v0 in range(v_lo, v_hi, BLOCK_V):
        y = y_next
        y_next = _load(Y, stride_v, v0 + BLOCK_V, rows, r_mask, cols, v_hi)
        ptrs, mask, v_mask = _strip(Y, stride_v, v0, rows, r_mask, cols, v_hi)
        z, x = _z(y, back, tanh_scale, cap, HAS_SOFTCAP)
        g = softmax_grad_tile(x, ref, log2_s, one, one, tgt, pt_m1, v0 + cols, V, smooth,
                              tanh_scale, cap, HAS_SOFTCAP)
        g = tl.where(valid[:, None], g, 0.0)
        g_used = g.to(Y.dtype.element_ty)
        tl.store(ptrs, g_used, mask=mask)
        if ROW_ROUND:  # what rounding g removed, for dE's correction (paths/three_matmul.py)
            rounded += tl.where(mask, g - g_used.to(tl.float32), 0.0)
    if ROW_ROUND:  # each split's share, summed by the launcher
        tl.store(Part + 3 * splits * R + split * R + rows, tl.sum(rounded, axis=1), mask=r_mask)


def target_shifted_to_grad(y: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor,
                           loss: torch.Tensor, *, ignore_index: int, softcap: float | None,
                           label_smoothing: float, block_r: int, block_v: int, num_warps: int,
                           splits: int, row_round: torch.Tensor | None = None,
                           scratch: torch.Tensor | None = None) -> None:
    """Over y (V x R, unit stride along R: the chunk's logits shifted by bias, the input-dtype
    value per row that the GEMM added), write their unweighted gradient, and each row's loss
    into loss (fp32, R); row_round (fp32, R, or None): what rounding each row's gradient
    removed, summed. targets: the R rows' targets. splits: vocabulary splits per strip (their
    columns a multiple of block_v). scratch (contiguous fp32, or None): room for the splits'
    partials (4 x splits x R) that nothing reads before this returns; where it is too small
    or None they get a buffer of their own."""
    v, rows = y.shape
    if rows == 0:
        return
    if y.stride(1) != 1:
        raise ValueError(f"y: expected unit stride along its rows (dim 1), got {y.stride()}")
    split_v = cdiv(cdiv(v, splits), block_v) * block_v
    splits = cdiv(v, split_v)
    need = 4 * splits * rows
    part = (scratch[:need].view(4, splits, rows) if scratch is not None
            and scratch.numel() >= need else
            torch.empty(4, splits, rows, device=y.device, dtype=torch.float32))
    tanh_scale, cap = softcap_scalars(softcap)
    grid = (cdiv(rows, block_r), splits)
    common = dict(HAS_SOFTCAP=softcap is not None, SMOOTH=label_smoothing > 0, BLOCK_R=block_r,
                  BLOCK_V=block_v, EVEN_R=rows % block_r == 0, num_warps=num_warps)
    _target_shifted_partials_kernel[grid](y, y.stride(0), bias, targets, part, rows, v,
                                          split_v, int(ignore_index), tanh_scale, cap, **common)
    _target_shifted_grad_kernel[grid](y, y.stride(0), bias, targets, part, loss, rows, v,
                                      split_v, int(ignore_index), float(label_smoothing),
                                      tanh_scale, cap, ROW_ROUND=row_round is not None,
                                      **common)
    if row_round is not None:
        torch.sum(part[3], dim=0, out=row_round)
