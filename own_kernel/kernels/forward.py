"""Forward, the pointer kernel: per-row log-sum-exp of softcap(E @ C.T + b) without
materialising N x V (any strides; forward_tma.py is its TMA twin, paths/forward.py the pass
that picks between them as the route says and combines the splits).

Grid = (row blocks) x (vocabulary splits). Each program streams its split of C in BLOCK_V tiles
and keeps an online log-sum-exp in fp32 (running max m of the logits, running sum s of
exp(z - m); tile.py). Row blocks vary fastest in the program id, so the programs resident at one
time read the same C tiles and share them through L2. FLATTEN lets the compiler pipeline loads
across tile boundaries (the next tile's first loads overlap this tile's epilogue). HALVES
(config.Forward.softcap_halves, with a softcap) folds each tile into the online state as two
column halves, one after the other, so the epilogue's fp32 temporaries (softcap, exp) hold half
the tile at a time beside the accumulator. The splits' partial (m, s) are combined in
O(splits*N), with the target logit (target.py) and the sum of logits (label smoothing, from
this loop) into each row's loss (lse_combine.py).
"""
import triton
import triton.language as tl

from own_kernel.kernels.tile import (dot_precision, logit_tile, lse_ent_tile_update,
                                     lse_halves_update, lse_init, row_block_and_split,
                                     skip_if_all_ignored, softcap_scalars, store_block_partials,
                                     store_split_partials)
from own_kernel.policy.plan import cdiv


@triton.jit
def cce_fwd_kernel(E, C, Bias, Targets, Part,
                   N, V, D, v_per_split, plane, splits, group_rows, grouped_splits,
                   ignore_index,
                   stride_en, stride_ed, stride_cv, stride_cd,
                   tanh_scale, cap,
                   HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                   NEED_ENT: tl.constexpr, SKIP_IGNORED: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                   FLATTEN: tl.constexpr, DOT_PRECISION: tl.constexpr, PARTS: tl.constexpr,
                   HALVES: tl.constexpr, IN_BOUNDS: tl.constexpr, EVEN_D: tl.constexpr,
                   FIXED_BASE: tl.constexpr):
    pid = tl.program_id(0)
    num_nb = tl.cdiv(N, BLOCK_N)
    nb, split = row_block_and_split(pid, num_nb, splits, group_rows, grouped_splits)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    if SKIP_IGNORED:
        v_end = skip_if_all_ignored(Targets, offs_n, n_mask, ignore_index, v_start, v_end)
    # IN_BOUNDS (config.Forward.in_bounds_loads): rows past N read row N - 1 and columns past
    # the split its last column, unmasked; their logits are masked out of the sums below and
    # their rows' partials are not stored, so the results are the masked loads' bit for bit.
    rows = tl.minimum(offs_n, N - 1) if IN_BOUNDS else offs_n

    if PARTS > 1:  # batch_invariant: one tile per split, its blocks' partials (tile.py)
        offs_v = v_start + tl.arange(0, BLOCK_V)
        x = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
        if v_end > v_start:  # else every row is ignored: no logits, empty partials
            x = logit_tile(E, C, Bias, offs_n, offs_v, n_mask, offs_v < v_end, D,
                           stride_en, stride_ed, stride_cv, stride_cd,
                           HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION)
        store_block_partials(x, Part, v_start, N, V, v_end, plane, offs_n, n_mask, tanh_scale,
                             cap, HAS_SOFTCAP, NEED_ZSUM, NEED_ENT, BLOCK_N, BLOCK_V, PARTS)
    else:
        m, s, z_sum, t = lse_init(BLOCK_N)
        for v0 in tl.range(v_start, v_end, BLOCK_V, flatten=FLATTEN):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            v_mask = offs_v < v_end
            cols = tl.minimum(offs_v, v_end - 1) if IN_BOUNDS else offs_v
            x = logit_tile(E, C, Bias, rows, cols, n_mask, v_mask, D,
                           stride_en, stride_ed, stride_cv, stride_cd,
                           HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION, IN_BOUNDS, EVEN_D,
                           FIXED_BASE)
            if HALVES:
                m, s, z_sum, t = lse_halves_update(x, v0, v_end, m, s, z_sum, t, tanh_scale,
                                                   cap, HAS_SOFTCAP, NEED_ZSUM, NEED_ENT,
                                                   BLOCK_N, BLOCK_V)
            else:
                m, s, z_sum, t = lse_ent_tile_update(x, m, s, z_sum, t, v_mask, tanh_scale, cap,
                                                     HAS_SOFTCAP, NEED_ZSUM, NEED_ENT)
        store_split_partials(Part, split, N, plane, offs_n, n_mask, m, s, z_sum, t, NEED_ZSUM,
                             NEED_ENT)


def forward_partials(e, c, bias, targets, part, grid, softcap, ignore_index, cfg, skip_ignored,
                     sums):
    """Each split's (running max, sum[, sum of logits][, entropy's t]) per row into part,
    pointer loads (any strides). grid: plan.ForwardGrid; cfg: the Config; sums: PartialSums."""
    (n, d), v = e.shape, c.shape[0]
    k = cfg.forward.tiles
    cce_fwd_kernel[(cdiv(n, k.block_n) * grid.splits,)](
        e, c, bias if bias is not None else part, targets, part,
        n, v, d, grid.v_per_split, grid.parts(v) * n, grid.splits, grid.group_rows,
        grid.grouped_splits, int(ignore_index), e.stride(0), e.stride(1), c.stride(0), c.stride(1),
        *softcap_scalars(softcap, sums.temperature), HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap is not None, NEED_ZSUM=sums.zsum, NEED_ENT=sums.entropy,
        SKIP_IGNORED=skip_ignored, FLATTEN=cfg.forward.flatten,
        DOT_PRECISION=dot_precision(e.dtype), PARTS=grid.parts_per_split,
        HALVES=cfg.forward.softcap_halves and softcap is not None,
        IN_BOUNDS=cfg.forward.in_bounds_loads, EVEN_D=d % k.block_d == 0,
        FIXED_BASE=cfg.forward.fixed_base_loads, **k.launch())
