"""Forward: per-row log-sum-exp of softcap(E @ C.T + b) without materialising N x V.

Grid = (row blocks) x (vocabulary splits). Each program streams its split of C in BLOCK_V tiles
and keeps an online log-sum-exp in fp32 (running max m of the logits, running sum s of
exp(z - m); tile.py). Row blocks vary fastest in the program id, so the programs resident at one
time read the same C tiles and share them through L2. FLATTEN lets the compiler pipeline loads across tile boundaries (the next tile's
first loads overlap this tile's epilogue). The splits' partial (m, s) are combined in O(splits*N),
with the target logit (target.py) and the sum of logits (label smoothing, from this loop) into
each row's loss (lse_combine.py).
"""
import functools

import torch
import triton
import triton.language as tl

from own_kernel.policy.autotune import shape_bucket, time_launch, tune_key, tuned_tiles
from own_kernel.policy.config import with_overrides
from own_kernel.kernels.forward_tma import forward_partials_tma
from own_kernel.kernels.lse_combine import PartialSums, combine
from own_kernel.policy.plan import cdiv, split_plan
from own_kernel.kernels.target import target_logit
from own_kernel.kernels.tile import (dot_precision, logit_tile, lse_ent_tile_update, num_sms,
                             row_block_and_split, skip_if_all_ignored, softcap_scalars,
                             store_split_partials, tma_ready)


@triton.jit
def cce_fwd_kernel(E, C, Bias, Targets, Part,
                   N, V, D, v_per_split, plane, splits, group_rows, ignore_index,
                   stride_en, stride_ed, stride_cv, stride_cd,
                   tanh_scale, cap,
                   HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                   NEED_ENT: tl.constexpr, SKIP_IGNORED: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                   FLATTEN: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_nb = tl.cdiv(N, BLOCK_N)
    nb, split = row_block_and_split(pid, num_nb, splits, group_rows)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    if SKIP_IGNORED:
        v_end = skip_if_all_ignored(Targets, offs_n, n_mask, ignore_index, v_start, v_end)

    m = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    t = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in tl.range(v_start, v_end, BLOCK_V, flatten=FLATTEN):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_mask = offs_v < v_end
        x = logit_tile(E, C, Bias, offs_n, offs_v, n_mask, v_mask, D,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION)
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
        n, v, d, grid.v_per_split, grid.splits * n, grid.splits, grid.group_rows,
        int(ignore_index), e.stride(0), e.stride(1), c.stride(0), c.stride(1),
        *softcap_scalars(softcap, sums.temperature), HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap is not None, NEED_ZSUM=sums.zsum, NEED_ENT=sums.entropy,
        SKIP_IGNORED=skip_ignored, FLATTEN=cfg.forward.flatten,
        DOT_PRECISION=dot_precision(e.dtype), **k.launch())


def forward(e, c, bias, targets, softcap, label_smoothing, ignore_index, cfg,
            skip_ignored=False, temperature=1.0, entropy=False, shifted=None):
    """Returns (loss, lse, p_max, nll, lse_lo, entropy), each (N,) fp32, natural log units:
    each row's loss (0 where the target is ignore_index), log-sum-exp, largest softmax probability (the
    gradient filter's flatness test), -log of the target's probability (the backward's target
    column; lse_combine.py says why it is kept apart), and what rounding lse to fp32 removed
    (lse + lse_lo is the lse to ~fp32 precision of its small part: the backward's softmax),
    and with ``entropy`` each row's softmax entropy (0 where ignored; else an empty tensor).
    The logits are softcap(x) / temperature. Rows whose target is outside [0, V) and
    not ignore_index get a loss without the target term (the caller raises on them).
    skip_ignored: rows whose target is ignore_index get lse +inf and p_max 0 (no gradient flows
    through them: the backward's softmax exp(z - lse) is 0 there), and row blocks with only
    such rows compute no logits. shifted: None, or (Y, M) for the TMA kernel to write the
    shifted logits into (forward_tma.py; the three-matmul path's)."""
    (n, d), v = e.shape, c.shape[0]
    if n == 0:  # distinct tensors: a custom op's outputs may not alias each other
        return tuple(torch.empty(0, device=e.device, dtype=torch.float32) for _ in range(6))
    sums = PartialSums(label_smoothing > 0, entropy, float(temperature))
    tma = cfg.forward.tma and v > 0 and tma_ready(e) and tma_ready(c)
    if shifted is not None and not tma:
        raise ValueError("shifted logits are written by the TMA forward only: needs "
                         "config.forward.tma and 16-byte aligned rows of e and c")
    if not tma and cfg.autotune and e.is_cuda:
        cfg = _tuned(e, c, bias, targets, sums, softcap, ignore_index, cfg, skip_ignored)
    grid = split_plan(n, v, d, e.element_size(), cfg, num_sms(e.device))
    part = torch.empty((sums.planes, grid.splits, n), device=e.device, dtype=torch.float32)
    if tma:
        forward_partials_tma(e, c, bias, targets, part, grid, softcap, ignore_index, cfg,
                             skip_ignored, sums, shifted)
    else:
        forward_partials(e, c, bias, targets, part, grid, softcap, ignore_index, cfg,
                         skip_ignored, sums)
    z_target = target_logit(e, c, bias, targets, softcap, temperature)
    return combine(part, z_target, targets, ignore_index, label_smoothing, v, skip_ignored,
                   sums)


def _tuned(e, c, bias, targets, sums, softcap, ignore_index, cfg, skip_ignored):
    """cfg with the pointer forward's tiles tuned on this GPU for this shape bucket
    (autotune.py): each candidate times the partials pass into a scratch buffer (the result is
    not used), once per bucket and machine."""
    (n, d), v = e.shape, c.shape[0]
    key = tune_key("forward", e.device, e.dtype, shape_bucket(n, v, d))

    def time_ms(tiles):
        trial = _with_forward_tiles(cfg, tiles)
        grid = split_plan(n, v, d, e.element_size(), trial, num_sms(e.device))
        part = torch.empty((sums.planes, grid.splits, n), device=e.device, dtype=torch.float32)
        return time_launch(lambda: forward_partials(e, c, bias, targets, part, grid, softcap,
                                                    ignore_index, trial, skip_ignored, sums))

    return _with_forward_tiles(cfg, tuned_tiles(key, cfg.forward_candidates, time_ms))


@functools.lru_cache(maxsize=64)
def _with_forward_tiles(cfg, tiles):
    return with_overrides(cfg, {"forward": {"tiles": tiles}})
