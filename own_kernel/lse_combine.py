"""Forward, last step: each row's log-sum-exp from the vocabulary splits' partial (max, sum), its
largest probability and its loss, in one pass over the splits x N partials. (As a dozen torch
elementwise ops, this step cost more host time than the whole forward's GPU time at small
shapes.)

    M = max_k m2_k,  lse2 = M + log2(sum_k s_k 2^(m2_k - M))      (base 2, as the splits keep it)
    lse = lse2 ln 2,  p_max = 2^(M - lse2)
    loss = lse - (1 - ls) z_target - ls / V sum_v z_v,  0 where the target is ignore_index
    SKIP_IGNORED: lse = +inf and p_max = 0 where the target is ignore_index
"""
import triton
import triton.language as tl

from own_kernel.tile import LOG2E


@triton.jit
def cce_lse_combine_kernel(Part, ZTarget, Targets, Loss, Lse, PMax, N, splits, plane,
                           ignore_index, keep_target, smooth_per_v,
                           NEED_ZSUM: tl.constexpr, SKIP_IGNORED: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    big_m = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    for k in range(splits):
        big_m = tl.maximum(big_m, tl.load(Part + k * N + offs, mask=mask, other=0.0))
    # Rows that no split saw (skipped, SKIP_IGNORED: m2 -inf, s 0): finite values, no -inf - -inf.
    big_m = tl.where(big_m == float("-inf"), 0.0, big_m)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z2_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(splits):
        m2 = tl.load(Part + k * N + offs, mask=mask, other=0.0)
        s += tl.load(Part + plane + k * N + offs, mask=mask, other=0.0) * tl.exp2(m2 - big_m)
        if NEED_ZSUM:
            z2_sum += tl.load(Part + 2 * plane + k * N + offs, mask=mask, other=0.0)
    lse2 = big_m + tl.log2(tl.where(mask & (s > 0), s, 1.0))  # lanes past N: no log2(0) warning
    lse = lse2 / LOG2E
    loss = lse - keep_target * tl.load(ZTarget + offs, mask=mask, other=0.0)
    if NEED_ZSUM:
        loss -= smooth_per_v * (z2_sum / LOG2E)
    tgt = tl.load(Targets + offs, mask=mask, other=0)
    used = tgt != ignore_index
    p_max = tl.exp2(big_m - lse2)
    if SKIP_IGNORED:  # the forward may have skipped these rows (forward.py); +inf keeps them inert
        lse = tl.where(used, lse, float("inf"))
        p_max = tl.where(used, p_max, 0.0)
    tl.store(Loss + offs, tl.where(used, loss, 0.0), mask=mask)
    tl.store(Lse + offs, lse, mask=mask)
    tl.store(PMax + offs, p_max, mask=mask)
