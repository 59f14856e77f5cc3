"""The math both passes share: a (BLOCK_N x BLOCK_V) tile of logits, and the softcap.

Every exponential is one exp2 of (z - ref) * log2(e), with the reference (a row's max, or its
lse) subtracted in natural units first: z - ref is exact where it matters (z near ref), while
z * log2(e) or an lse rounded at the logits' magnitude (one ulp of 1e3 is 6e-5) would put that
rounding into every probability (results: tests/test_numerics.py).
"""
import functools

import torch
import triton
import triton.language as tl

LOG2E_F = 1.4426950408889634
LOG2E = tl.constexpr(LOG2E_F)  # a global read inside @triton.jit must be a constexpr


@triton.jit
def logit_tile(E, C, Bias, offs_n, offs_v, n_mask, v_mask, D,
               stride_en, stride_ed, stride_cv, stride_cd,
               HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
               BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
               IN_BOUNDS: tl.constexpr = False, EVEN_D: tl.constexpr = False,
               FIXED_BASE: tl.constexpr = False):
    # x[n, v] = sum_d E[n, d] C[v, d] + bias[v], accumulated in fp32 over D.
    # IN_BOUNDS: every offs_n and offs_v is a valid row (the caller clamped them), so the loads
    # need no row or column mask; EVEN_D (D a multiple of BLOCK_D) drops the depth mask too.
    # A masked pointer load costs a compare and a select per 16 bytes each k-step, which issued
    # more than the loads and products themselves (ncu: portable-forward-loads.md).
    # FIXED_BASE: each k-step loads base + d0 from pointers fixed before the loop, instead of
    # stepping every pointer by BLOCK_D: the step cost a 64-bit add per 16-byte load (SASS).
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    offs_d = tl.arange(0, BLOCK_D)
    # 64-bit row offsets: N*D and V*D can pass 2^31 elements.
    e_base = E + offs_n[:, None].to(tl.int64) * stride_en + offs_d[None, :] * stride_ed
    c_base = C + offs_v[:, None].to(tl.int64) * stride_cv + offs_d[None, :] * stride_cd
    e_ptrs = e_base
    c_ptrs = c_base
    for d0 in range(0, D, BLOCK_D):
        if FIXED_BASE:
            e_ptrs = e_base + d0 * stride_ed
            c_ptrs = c_base + d0 * stride_cd
        if IN_BOUNDS and EVEN_D:
            e = tl.load(e_ptrs)
            c = tl.load(c_ptrs)
        elif IN_BOUNDS:
            d_mask = (offs_d < D - d0)[None, :]
            e = tl.load(e_ptrs, mask=d_mask, other=0.0)
            c = tl.load(c_ptrs, mask=d_mask, other=0.0)
        else:
            d_mask = offs_d < D - d0
            e = tl.load(e_ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)
            c = tl.load(c_ptrs, mask=v_mask[:, None] & d_mask[None, :], other=0.0)
        acc = tl.dot(e, tl.trans(c), acc, input_precision=DOT_PRECISION)
        if not FIXED_BASE:
            e_ptrs += BLOCK_D * stride_ed
            c_ptrs += BLOCK_D * stride_cd
    if HAS_BIAS:
        acc += tl.load(Bias + offs_v, mask=v_mask, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def row_block_and_split(pid, num_nb, splits, group_rows, grouped_splits):
    # Launch order (plan.launch_order): groups of group_rows row blocks, each group's first
    # grouped_splits splits before the next group, row blocks fastest. The programs resident
    # at once then share C tiles (same split) and E blocks (same group) through L2;
    # group_rows = num_nb is plain row-blocks-fastest order. grouped_splits = splits - 1: the
    # last split (the short one where the splits do not divide the tiles) of every row block
    # runs after all the groups, where its programs fill the last wave.
    grouped = num_nb * grouped_splits
    g = tl.minimum(pid, grouped - 1)  # a last-split program's grouped slot: computed, unused
    in_group = group_rows * grouped_splits
    first = (g // in_group) * group_rows
    rows = tl.minimum(num_nb - first, group_rows)
    local = g % in_group
    last = pid >= grouped
    return (tl.where(last, pid - grouped, first + local % rows),
            tl.where(last, splits - 1, local // rows))


@triton.jit
def skip_if_all_ignored(Targets, offs_n, n_mask, ignore_index, v_start, v_end):
    # The split's end, or its start (no tiles) when every row of the block is ignored: their
    # loss is 0 and, when the caller does not ask for their lse, nothing else needs their logits.
    t = tl.load(Targets + offs_n, mask=n_mask, other=ignore_index)
    any_used = tl.max((t != ignore_index).to(tl.int32), axis=0)
    return tl.where(any_used > 0, v_end, v_start)


@triton.jit
def lse_tile_update(x, m, s, z_sum, v_mask, tanh_scale, cap,
                    HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr):
    # lse_ent_tile_update without the entropy's sum.
    m, s, z_sum, _ = lse_ent_tile_update(x, m, s, z_sum, s, v_mask, tanh_scale, cap,
                                         HAS_SOFTCAP, NEED_ZSUM, False)
    return m, s, z_sum


@triton.jit
def lse_init(BLOCK_N: tl.constexpr):
    # The empty online state of lse_ent_tile_update: (m, s, z_sum, t) per row.
    zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
    return tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32), zero, zero, zero


@triton.jit
def lse_ent_tile_update(x, m, s, z_sum, t, v_mask, tanh_scale, cap,
                        HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                        NEED_ENT: tl.constexpr):
    # Fold a tile of raw logits x (BLOCK_N x BLOCK_V; columns outside v_mask excluded) into the
    # rows' online log-sum-exp: running max m of z = softcap(x) (natural units, an exact logit)
    # and running sum s of exp(z - m), rescaled to each new max. Every tile has at least one
    # column inside v_mask.
    z = masked_logits(x, v_mask, tanh_scale, cap, HAS_SOFTCAP)
    return lse_ent_fold(z, tl.max(z, axis=1), m, s, z_sum, t, v_mask, NEED_ZSUM, NEED_ENT)


@triton.jit
def lse_halves_update(x, v0, v_end, m, s, z_sum, t, tanh_scale, cap,
                      HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr, NEED_ENT: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    # lse_ent_tile_update of the tile starting at v0 as its two column halves in turn
    # (config.Forward.softcap_halves): the epilogue's fp32 temporaries hold half the tile at
    # once. The first half holds a column inside v_end (v0 < v_end); the second may hold none.
    # Each half's mask is made just before its fold: with both made first the pointer forward
    # took 6 % longer at Gemma 2 (2B) (portable-forward-softcap.md).
    x0, x1 = halves(x, BLOCK_N, BLOCK_V // 2)
    half = tl.arange(0, BLOCK_V // 2)
    m, s, z_sum, t = lse_ent_tile_update(x0, m, s, z_sum, t, v0 + half < v_end, tanh_scale, cap,
                                         HAS_SOFTCAP, NEED_ZSUM, NEED_ENT)
    return lse_ent_tile_update(x1, m, s, z_sum, t, v0 + BLOCK_V // 2 + half < v_end, tanh_scale,
                               cap, HAS_SOFTCAP, NEED_ZSUM, NEED_ENT)


@triton.jit
def masked_logits(x, v_mask, tanh_scale, cap, HAS_SOFTCAP: tl.constexpr):
    # Outside v_mask a finite stand-in far below any logit: its exp2 is 0 and, unlike -inf,
    # so is its product with that 0 (the entropy's sum needs no select).
    return tl.where(v_mask[None, :], logits(x, tanh_scale, cap, HAS_SOFTCAP), -1e30)


@triton.jit
def lse_ent_fold(z, z_max, m, s, z_sum, t, v_mask, NEED_ZSUM: tl.constexpr,
                 NEED_ENT: tl.constexpr):
    # lse_ent_tile_update given the tile's masked z and its row maxima z_max (a caller that
    # already has the raw maxima passes logits(x_max): softcap and 1 / T keep the order).
    # NEED_ENT: also t = sum exp(z - m) (z - m) (<= 0), relative to the same max (the entropy
    # is ln s - t / s: two non-negative terms, no cancellation on confident rows); a new max
    # m' turns t into exp(m - m') (t + (m - m') s).
    m_new = tl.maximum(m, z_max)
    alpha = tl.exp2((m - m_new) * LOG2E)
    z_rel = z - m_new[:, None]
    ez = tl.exp2(z_rel * LOG2E)
    if NEED_ENT:  # no inf * 0: m is -inf while s is 0
        shift = tl.where(s > 0, m - m_new, 0.0) * s
        t = alpha * (t + shift) + tl.sum(ez * z_rel, axis=1)
    s = s * alpha + tl.sum(ez, axis=1)
    if NEED_ZSUM:
        z_sum += tl.sum(tl.where(v_mask[None, :], z, 0.0), axis=1)
    return m_new, s, z_sum, t


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get true fp32 products (Triton's default for fp32 is tf32, ~3e-4 error)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (4 for the interpreter's grids)."""
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@triton.jit
def store_split_partials(Part, split, N, plane, offs_n, n_mask, m2, s, z2_sum, t,
                         NEED_ZSUM: tl.constexpr, NEED_ENT: tl.constexpr):
    # The forward's partials of one vocabulary split, planes `plane` apart, for lse_combine.py:
    # running max, sum, then the sum of logits (NEED_ZSUM), then the entropy's t (NEED_ENT).
    base = Part + split.to(tl.int64) * N + offs_n
    tl.store(base, m2, mask=n_mask)
    tl.store(base + plane, s, mask=n_mask)
    if NEED_ZSUM:
        tl.store(base + 2 * plane, z2_sum, mask=n_mask)
    if NEED_ENT:
        tl.store(base + (2 + NEED_ZSUM) * plane, t, mask=n_mask)


@triton.jit
def store_block_partials(x, Part, v0, N, V, v_end, plane, offs_n, n_mask, tanh_scale, cap,
                         HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                         NEED_ENT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                         PARTS: tl.constexpr):
    # batch_invariant: the partials of one tile of raw logits x (the split's only tile, its
    # columns from v0, a multiple of BLOCK_V; those from v_end on excluded) per block of
    # BLOCK_V / PARTS columns, each stored as partial v0 / (BLOCK_V / PARTS) + j, as
    # store_split_partials stores a split's.
    # A block's sums do not depend on where the tile starts, so a shard that starts on a block
    # boundary gives the single-process call's partials. A block with no column gets (-inf, 0).
    WIDTH: tl.constexpr = BLOCK_V // PARTS
    v_mask = (v0 + tl.arange(0, BLOCK_V)) < v_end
    z = tl.where(v_mask[None, :], logits(x, tanh_scale, cap, HAS_SOFTCAP), -1e30)
    z3 = tl.reshape(z, (BLOCK_N, PARTS, WIDTH))
    block = v0 // WIDTH + tl.arange(0, PARTS)
    seen = (block * WIDTH < v_end)[None, :]
    m = tl.max(z3, axis=2)
    z_rel = z3 - m[:, :, None]
    ez = tl.exp2(z_rel * LOG2E)
    base = Part + block[None, :].to(tl.int64) * N + offs_n[:, None]
    mask = n_mask[:, None] & (block < tl.cdiv(V, WIDTH))[None, :]
    tl.store(base, tl.where(seen, m, float("-inf")), mask=mask)
    tl.store(base + plane, tl.where(seen, tl.sum(ez, axis=2), 0.0), mask=mask)
    if NEED_ZSUM:
        z_in = tl.reshape(tl.where(v_mask[None, :], z, 0.0), (BLOCK_N, PARTS, WIDTH))
        tl.store(base + 2 * plane, tl.sum(z_in, axis=2), mask=mask)
    if NEED_ENT:
        t = tl.where(seen, tl.sum(ez * z_rel, axis=2), 0.0)
        tl.store(base + (2 + NEED_ZSUM) * plane, t, mask=mask)


def softcap_scalars(softcap, temperature=1.0):
    """Host-side constants of z = softcap(x) / temperature, for logits(): (2 log2(e) / s,
    s / T), or (1, 1 / T) without a softcap. The derivative's 1 / T is not in them: the
    backward puts it on the row weights (paths/entries.rows_backward)."""
    if softcap is None:
        return 1.0, 1.0 / temperature
    return 2.0 * LOG2E_F / softcap, float(softcap) / temperature


@triton.jit
def softcap_tanh(x, tanh_scale):
    # tanh(x / s) = 1 - 2 / (exp(2x / s) + 1), via exp2 with tanh_scale = 2 log2(e) / s
    # (libdevice is unavailable under the interpreter). Saturates correctly: exp2 -> inf
    # gives 1, exp2 -> 0 gives -1.
    return 1.0 - 2.0 / (tl.exp2(x * tanh_scale) + 1.0)


@triton.jit
def logits(x, tanh_scale, cap, HAS_SOFTCAP: tl.constexpr):
    # z = cap tanh(x / s) (softcap s, cap = s / T), or cap x (cap = 1 / T; softcap_scalars)
    if HAS_SOFTCAP:
        return softcap_tanh(x, tanh_scale) * cap
    else:
        return x * cap


@triton.jit
def halves(x, BLOCK_N: tl.constexpr, HALF: tl.constexpr):
    # columns [0, HALF) and [HALF, 2 HALF) of x as two tensors
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_N, 2, HALF)), (0, 2, 1)))


@triton.jit
def accumulate(sum_ptrs, part_ptrs, val, mask, DETERMINISTIC: tl.constexpr):
    # sum += val by atomics (tiles add in whatever order they finish: the last bits vary run
    # to run), or, DETERMINISTIC, this tile's partial stored apart for the host to sum in a
    # fixed order (rows.py's Partials). Relaxed: only later kernels read the sums, and
    # Triton's default (acq_rel) returns each add's old value, so the warp waits on L2 every
    # tile (results/notes/relaxed-atomics.md).
    if DETERMINISTIC:
        tl.store(part_ptrs, val, mask=mask)
    else:
        tl.atomic_add(sum_ptrs, val, mask=mask, sem="relaxed")


@triton.jit
def expm1(x):
    # exp(x) - 1 without the cancellation near 0 (libdevice is unavailable under the
    # interpreter): a Taylor series where |x| < 1/64 (next term < 2e-10 relative).
    series = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0))))
    return tl.where(tl.abs(x) < 0.015625, series, tl.exp(x) - 1.0)


@triton.jit
def row_terms(Lse, LseLo, Nll, RowWeight, RowWeightLse, Targets, offs_n, n_mask,
              HAS_GRAD_LSE: tl.constexpr):
    # Per row: the lse as the pair (lse, lse_lo * log2(e)) (lse_combine.py: lse_lo is what
    # rounding lse to fp32 removed), the loss weight w, w + the lse weight w' (z-loss), the
    # target, and p_t - 1 = expm1(-nll) for the target column (see softmax_grad_tile).
    # The target as int32: it is compared per element with the column (an ignored row's weight
    # is 0, so a wrapped ignore_index cannot matter).
    # rows past N: lse +inf, as an ignored row's (p = 0, no exp2 overflow in their lanes)
    lse = tl.load(Lse + offs_n, mask=n_mask, other=float("inf"))
    lo2 = tl.load(LseLo + offs_n, mask=n_mask, other=0.0) * LOG2E
    w = tl.load(RowWeight + offs_n, mask=n_mask, other=0.0)
    wp = w
    if HAS_GRAD_LSE:
        wp = w + tl.load(RowWeightLse + offs_n, mask=n_mask, other=0.0)
    tgt = tl.load(Targets + offs_n, mask=n_mask, other=-1).to(tl.int32)
    pt_m1 = expm1(-tl.load(Nll + offs_n, mask=n_mask, other=float("inf")))
    return lse, lo2, w, wp, tgt, pt_m1


@triton.jit
def entropy_terms(Ent, RowWeightEnt, Nll, offs_n, n_mask, HAS_ENTROPY: tl.constexpr):
    # Per row, for the entropy's gradient: H (the forward's), the target column's
    # p_t (z_t - mu) = exp(-nll) (H - nll) (mu = sum p z; from the forward's numbers, as pt_m1
    # is: p_t as 1 + pt_m1 would lose eps / p_t of it) and the weight w_H of a gradient into
    # H. Zeros without HAS_ENTROPY (never read then).
    ent = tl.zeros(offs_n.shape, tl.float32)
    pz_t = ent
    wh = ent
    if HAS_ENTROPY:
        ent = tl.load(Ent + offs_n, mask=n_mask, other=0.0)
        wh = tl.load(RowWeightEnt + offs_n, mask=n_mask, other=0.0)
        nll = tl.load(Nll + offs_n, mask=n_mask, other=0.0)
        pz_t = tl.exp2(-nll * LOG2E) * (ent - nll)
    return ent, pz_t, wh


@triton.jit
def softmax_grad_tile(x, ref, off2, w, wp, tgt, pt_m1, offs_v, V, smooth, tanh_scale, cap,
                      HAS_SOFTCAP: tl.constexpr):
    # softmax_ent_grad_tile without an entropy gradient.
    return softmax_ent_grad_tile(x, ref, off2, w, wp, tgt, pt_m1, pt_m1, pt_m1, pt_m1, offs_v,
                                 V, smooth, tanh_scale, cap, HAS_SOFTCAP, False)


@triton.jit
def softmax_ent_grad_tile(x, ref, off2, w, wp, tgt, pt_m1, ent, pz_t, wh, offs_v, V, smooth,
                          tanh_scale, cap, HAS_SOFTCAP: tl.constexpr,
                          HAS_ENTROPY: tl.constexpr):
    # d = (w + w') p - w ((1 - ls) [v == t] + ls / V), times softcap'(z) = 1 - tanh^2(x / s),
    # from a tile of raw logits x and the rows' lse as ref + off2 / log2(e) (ref: a logit-sized
    # value subtracted first, off2 a small base-2 remainder; see the module docstring).
    # At the target column p_t - 1 comes from the forward's nll (pt_m1): exp(z_t - lse) - 1
    # from the recomputed logit cancels to rounding on confident rows (p_t near 1), where the
    # whole row's gradient is that small difference. There d = w (p_t - 1) + w' p_t
    # + w ls (1 - 1 / V).
    # HAS_ENTROPY: plus w_H dH/dz = -w_H p (z - mu), mu = sum p z, with z - mu = (z - lse) + H:
    # z - lse is the probability's own exponent (exact near the max), so no logit-sized value
    # is subtracted; at the target column p_t (z_t - mu) is the forward's (pz_t).
    if HAS_SOFTCAP:
        th = softcap_tanh(x, tanh_scale)
        z = th * cap
    else:
        z = x * cap
    log2_p = (z - ref[:, None]) * LOG2E - off2[:, None]
    p = tl.exp2(log2_p)
    d = wp[:, None] * p - (w * (smooth / V))[:, None]
    d_target = w * pt_m1 + (wp - w) * (1.0 + pt_m1) + w * (smooth * (1.0 - 1.0 / V))
    if HAS_ENTROPY:
        # p = 0 where lse is +inf (an ignored row) or far below: no 0 * inf
        z_mu = tl.where(p > 0, log2_p, 0.0) / LOG2E + ent[:, None]
        d -= wh[:, None] * p * z_mu
        d_target -= wh * pz_t
    d = tl.where(offs_v[None, :] == tgt[:, None], d_target[:, None], d)
    if HAS_SOFTCAP:
        d = d * (1.0 - th * th)
    return d
