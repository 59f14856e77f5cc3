"""Backward, the portable W writer: recompute a chunk of logits with pointer loads (any strides,
any CUDA GPU, the interpreter) and write the softmax gradient W.

For the vocabulary chunk [v_start, v_start + width) and each row block, recompute z and

    d[n, v] = (w_n + w'_n) p[n, v] - w_n ((1 - ls) [v == t_n] + ls / V),   times softcap'(z)

where w_n is the row's loss weight (0 for ignored rows), w'_n the weight of a gradient flowing
into lse (z-loss), p = softmax(z) and softcap'(z) = 1 - tanh^2(x / s); with an entropy
gradient (weight w_H,n) d also has - w_H,n p (z - mu), mu = sum p z (tile.py). W (N x width, the input
dtype) feeds tensor-core GEMMs: dE += W @ C, dC = W^T @ E. Each program handles TILES
consecutive vocabulary tiles of one row block.

What rounding d to the input dtype removes is summed per row and per column in fp32 (RowRound,
ColRound); the backward adds it back through the mean rows of C (dE) and E (dC): otherwise
rounding leaks into the component that all rows of C (or E) share, where the true
contributions cancel, and that is where accumulating in 16 bits loses dE. ColSum (dbias) sums d.

The portable target tunes the tiles on the user's GPU (policy/autotune.py: per shape bucket of the
launch's rows, width and D), each candidate timed into scratch sums.
"""
import triton
import triton.language as tl

from own_kernel.policy.autotune import shape_bucket, tune_key, tuned_launch
from own_kernel.policy.plan import cdiv
from own_kernel.kernels.rows import Partials
from own_kernel.kernels.tile import (accumulate, dot_precision, entropy_terms, logit_tile, row_terms,
                             softcap_scalars, softmax_ent_grad_tile)


@triton.jit
def cce_dlogits_kernel(E, C, Bias, Targets, Lse, LseLo, Nll, RowWeight, RowWeightLse, Ent,
                       RowWeightEnt, W,
                       RowRound, ColRound, ColSum, Part,
                       N, V, D, v_start, width, stride_wn,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       tanh_scale, cap, smooth,
                       HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                       HAS_GRAD_LSE: tl.constexpr, HAS_ENTROPY: tl.constexpr,
                       COL_ROUND: tl.constexpr,
                       DETERMINISTIC: tl.constexpr, TILES: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, IN_BOUNDS: tl.constexpr,
                       EVEN_D: tl.constexpr, FIXED_BASE: tl.constexpr):
    pid = tl.program_id(0)
    num_vb = tl.cdiv(width, BLOCK_V)
    num_groups = tl.cdiv(num_vb, TILES)
    # Vocabulary groups vary fastest: the chunk of C stays in L2 while E row blocks stream.
    group = pid % num_groups
    nb = pid // num_groups
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # IN_BOUNDS (config.Config.dlogits_in_bounds_loads): the logits' loads read clamped rows and
    # columns unmasked (tile.logit_tile); what lies past N or the chunk is masked below as before.
    rows = tl.minimum(offs_n, N - 1) if IN_BOUNDS else offs_n
    v_last = tl.minimum(v_start + width, V) - 1
    lse, lo2, w, wp, tgt, pt_m1 = row_terms(Lse, LseLo, Nll, RowWeight, RowWeightLse, Targets,
                                            offs_n, n_mask, HAS_GRAD_LSE)
    ent, pz_t, wh = entropy_terms(Ent, RowWeightEnt, Nll, offs_n, n_mask, HAS_ENTROPY)
    row_round = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # DETERMINISTIC partials (rows.Partials): per vocabulary group, rows (RowRound); then per
    # row block, columns (ColRound, ColSum).
    num_nb = tl.cdiv(N, BLOCK_N)
    col_part = Part + 2 * num_groups * N + nb * width
    for vb in range(group * TILES, tl.minimum(group * TILES + TILES, num_vb)):
        offs_w = vb * BLOCK_V + tl.arange(0, BLOCK_V)  # column inside the chunk
        offs_v = v_start + offs_w
        v_mask = (offs_w < width) & (offs_v < V)
        cols = tl.minimum(offs_v, v_last) if IN_BOUNDS else offs_v
        x = logit_tile(E, C, Bias, rows, cols, n_mask, v_mask, D,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION, IN_BOUNDS, EVEN_D,
                       FIXED_BASE)
        d = softmax_ent_grad_tile(x, lse, lo2, w, wp, tgt, pt_m1, ent, pz_t, wh, offs_v, V,
                                  smooth, tanh_scale, cap, HAS_SOFTCAP, HAS_ENTROPY)
        d = tl.where(v_mask[None, :], d, 0.0)
        d_used = d.to(W.dtype.element_ty)
        w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_w[None, :]
        tl.store(w_ptrs, d_used, mask=n_mask[:, None] & (offs_w < width)[None, :])
        r = d - d_used.to(tl.float32)
        row_round += tl.sum(r, axis=1)
        if COL_ROUND:
            accumulate(ColRound + offs_v, col_part + offs_w, tl.sum(r, axis=0), v_mask,
                       DETERMINISTIC)
        if HAS_BIAS:
            accumulate(ColSum + offs_v, col_part + num_nb * width + offs_w, tl.sum(d, axis=0),
                       v_mask, DETERMINISTIC)
    accumulate(RowRound + offs_n, Part + group * N + offs_n, row_round, n_mask, DETERMINISTIC)


def write_w_pointer(e, c, w, bias, rows, sums, v_start, softcap, smooth, cfg, *, tuned=False,
                    col_round=True, deterministic=False, temperature=1.0):
    """W (e's rows x w.shape[1], any row stride) = the softmax gradient of e's rows (rows: their
    Rows) at columns [v_start, v_start + width); RowRound, ColRound (col_round) and ColSum added
    into sums. cfg: the Config (its dlogits tiles); tuned: the tiles timed on this GPU among
    cfg.dlogits_candidates instead (the route's pointer_tuned)."""
    tiles = cfg.dlogits
    args = (e, c, w, bias, rows, v_start, softcap, smooth, cfg, col_round, deterministic,
            temperature)
    if tuned:
        n, width = w.shape
        variant = (("tiles_per_program", cfg.dlogits_tiles_per_program),
                   ("in_bounds", cfg.dlogits_in_bounds_loads),
                   ("fixed_base", cfg.dlogits_fixed_base_loads))
        key = tune_key("dlogits", e.device, e.dtype, shape_bucket(n, width, e.shape[1]),
                       candidates=cfg.dlogits_candidates, variant=variant)
        tiles = tuned_launch(key, cfg.dlogits_candidates,
                             lambda trial, scratch: _launch(trial, *args, scratch),
                             n, sums.col_round.numel(), e.device)
    _launch(tiles, *args, sums)


def _launch(tiles, e, c, w, bias, rows, v_start, softcap, smooth, cfg, col_round, deterministic,
            temperature, sums):
    """One launch of cce_dlogits_kernel with these tiles (a config.Tiles)."""
    n, width = w.shape
    groups = cdiv(cdiv(width, tiles.block_v), cfg.dlogits_tiles_per_program)
    part = Partials(deterministic, groups, n, cdiv(n, tiles.block_n), width, e.device)
    stand_in = sums.col_sum  # for pointers whose flag is off: never read
    cce_dlogits_kernel[(cdiv(n, tiles.block_n) * groups,)](
        e, c, bias if bias is not None else stand_in, rows.targets, rows.lse, rows.lse_lo_or_zeros(), rows.nll,
        rows.weight, rows.weight_lse if rows.weight_lse is not None else rows.weight,
        *rows.entropy_args(), w,
        sums.row_round, sums.col_round, sums.col_sum, part.buffer,
        n, c.shape[0], e.shape[1], v_start, width, w.stride(0),
        e.stride(0), e.stride(1), c.stride(0), c.stride(1),
        *softcap_scalars(softcap, temperature), float(smooth),
        HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
        HAS_GRAD_LSE=rows.weight_lse is not None, HAS_ENTROPY=rows.weight_ent is not None,
        COL_ROUND=col_round,
        DETERMINISTIC=deterministic, TILES=cfg.dlogits_tiles_per_program,
        DOT_PRECISION=dot_precision(e.dtype), IN_BOUNDS=cfg.dlogits_in_bounds_loads,
        EVEN_D=e.shape[1] % tiles.block_d == 0, FIXED_BASE=cfg.dlogits_fixed_base_loads,
        **tiles.launch())
    part.add_to(sums, v_start, {"row_round"} | ({"col_round"} if col_round else set())
                | ({"col_sum"} if bias is not None else set()))
