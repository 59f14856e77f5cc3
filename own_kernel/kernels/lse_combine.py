"""Forward, last step: each row's log-sum-exp from the vocabulary splits' partial (max, sum), its
largest probability and its loss, in one pass over the splits x N partials. (As a dozen torch
elementwise ops, this step cost more host time than the whole forward's GPU time at small
shapes.)

    M = max_k m_k,  S = sum_k s_k exp(m_k - M),  ln S = log2(S) ln 2   (m_k: the splits' max logits)
    lse = M + ln S rounded to fp32,  lse_lo = (M - lse) + ln S,  p_max = 1 / S
    nll = (M - z_target) + ln S, or ln(S) when that is below CONFIDENT_NLL
    loss = (1 - ls) nll + ls max((M - mean_v z_v) + ln S, 0),  0 where the target is ignore_index
    SKIP_IGNORED: lse = +inf, lse_lo = 0 and p_max = 0 where the target is ignore_index
    NEED_ENT: entropy = ln S - T / S,  T = sum_k exp(m_k - M) (t_k + (m_k - M) s_k)
              (t_k = sum exp(z - m_k) (z - m_k) over split k; 0 where ignored)

Why the entropy relative to the max: H = lse - sum p z is a difference of two logit-sized
values that agree to ~H on a confident row (H -> 0): computed so, fp32 rounding of the logits'
magnitude is all that is left. As ln S - T / S both terms are >= 0 and as small as H itself
(ln S ~ S - 1 and -T / S ~ the other columns' sum of p (m - z)): H's error is a few ulps of H
plus ln S's rounding near S = 1 (an ulp of 1), whatever the logits' magnitude.

Why lse_lo: at logits of magnitude 1e3 one ulp of lse is 6e-5, so exp(z - lse) in the backward
would carry that error in every probability (naive fp32 softmax subtracts the max first and
gets ~1e-7). lse + lse_lo is the exact sum to the precision of ln S: M - lse is exact (Sterbenz:
M and lse are within a factor 2 where rounding lse matters), and the backward forms
exp((z - lse) - lse_lo). The nll is formed the same way, from (M - z_target), never from lse.

Why ln(S): on a confident row (target probability near 1) lse and z_target agree to ~1e-7
relative, so lse - z_target is all rounding (fp32 losses came out negative). A row whose nll is
below ln 2 has its target as the arg-max (any other column at least as large gives nll >= ln 2),
so the row's max M is the target's own logit and nll = ln(S) exactly, from the forward's own
numbers: >= 0 (the max's term of S is exactly 1) and as accurate as a naive fp32 softmax. The
backward takes the target column's probability from nll too (tile.py).
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from own_kernel.policy.plan import cdiv
from own_kernel.kernels.tile import LOG2E


# Below ln 2 the target is the arg-max (see above); 0.5 leaves room for the rounding of lse - z_t.
CONFIDENT_NLL = tl.constexpr(0.5)


@dataclass(frozen=True)
class PartialSums:
    """What the forward's splits keep per row beside (max, sum): the sum of logits (zsum, label
    smoothing) and the entropy's t (entropy); the logits' temperature (z = softcap(x) / T)."""
    zsum: bool = False
    entropy: bool = False
    temperature: float = 1.0

    @property
    def planes(self) -> int:
        return 2 + self.zsum + self.entropy


@triton.jit
def cce_lse_combine_kernel(Part, ZTarget, Targets, Loss, Lse, PMax, Nll, LseLo, Ent, N, splits,
                           plane, ignore_index, smooth, inv_v,
                           NEED_ZSUM: tl.constexpr, NEED_ENT: tl.constexpr,
                           SKIP_IGNORED: tl.constexpr, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    big_m = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    for k in range(splits):
        big_m = tl.maximum(big_m, tl.load(Part + k * N + offs, mask=mask, other=0.0))
    # Rows that no split saw (skipped, SKIP_IGNORED: m -inf, s 0): finite values, no -inf - -inf.
    big_m = tl.where(big_m == float("-inf"), 0.0, big_m)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    t = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(splits):
        m = tl.load(Part + k * N + offs, mask=mask, other=0.0)
        s_k = tl.load(Part + plane + k * N + offs, mask=mask, other=0.0)
        scale = tl.exp2((m - big_m) * LOG2E)
        s += s_k * scale
        if NEED_ZSUM:
            z_sum += tl.load(Part + 2 * plane + k * N + offs, mask=mask, other=0.0)
        if NEED_ENT:  # a split that saw nothing (s_k 0, m_k -inf) adds nothing
            t_k = tl.load(Part + (2 + NEED_ZSUM) * plane + k * N + offs, mask=mask, other=0.0)
            t += scale * (t_k + tl.where(s_k > 0, m - big_m, 0.0) * s_k)
    s_ok = mask & (s > 0)
    ln_s = tl.log2(tl.where(s_ok, s, 1.0)) / LOG2E  # lanes past N: no log2(0) warning
    lse = big_m + ln_s
    lse_lo = (big_m - lse) + ln_s
    nll = (big_m - tl.load(ZTarget + offs, mask=mask, other=0.0)) + ln_s
    nll = tl.where(nll < CONFIDENT_NLL, ln_s, nll)
    loss = (1.0 - smooth) * nll
    if NEED_ZSUM:  # ls (lse - mean z): >= 0 exactly, kept so through rounding
        loss += smooth * tl.maximum((big_m - z_sum * inv_v) + ln_s, 0.0)
    tgt = tl.load(Targets + offs, mask=mask, other=0)
    used = tgt != ignore_index
    p_max = 1.0 / tl.where(s_ok, s, 1.0)
    if SKIP_IGNORED:  # the forward may have skipped these rows (forward.py); +inf keeps them inert
        lse = tl.where(used, lse, float("inf"))
        lse_lo = tl.where(used, lse_lo, 0.0)
        p_max = tl.where(used, p_max, 0.0)
    tl.store(Loss + offs, tl.where(used, loss, 0.0), mask=mask)
    tl.store(Lse + offs, lse, mask=mask)
    tl.store(PMax + offs, p_max, mask=mask)
    tl.store(Nll + offs, nll, mask=mask)
    tl.store(LseLo + offs, lse_lo, mask=mask)
    if NEED_ENT:  # both terms >= 0; clamped against rounding
        ent = tl.maximum(ln_s - t / tl.where(s_ok, s, 1.0), 0.0)
        tl.store(Ent + offs, tl.where(used & s_ok, ent, 0.0), mask=mask)


def combine(part, z_target, targets, ignore_index, label_smoothing, v, skip_ignored,
            sums: PartialSums):
    """(loss, lse, p_max, nll, lse_lo, entropy), each (N,) fp32 (entropy empty unless
    sums.entropy), from the splits' partials part (sums.planes x splits x N: running max, sum
    and, as sums says, the sum of logits and the entropy's t)."""
    n = part.shape[2]
    outs = tuple(torch.empty(n if i < 5 or sums.entropy else 0, device=part.device,
                             dtype=torch.float32) for i in range(6))
    # Each program loops over every split: thousands of them (batch_invariant's 64-column
    # partials) want more, shorter programs than the default's few hundred.
    block = 256 if part.shape[1] <= 1024 else 64
    cce_lse_combine_kernel[(cdiv(n, block),)](
        part, z_target, targets, *outs[:5], outs[5] if sums.entropy else outs[0], n,
        part.shape[1], part.shape[1] * n, int(ignore_index), float(label_smoothing),
        1.0 / max(v, 1), NEED_ZSUM=sums.zsum, NEED_ENT=sums.entropy,
        SKIP_IGNORED=skip_ignored, BLOCK_N=block)
    return outs
