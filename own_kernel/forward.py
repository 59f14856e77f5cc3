"""Forward: per-row log-sum-exp of softcap(E @ C.T + b) without materialising N x V.

Grid = (row blocks) x (vocabulary splits). Each program streams its split of C in BLOCK_V
tiles and keeps an online log-sum-exp in fp32 (running max m, running sum s), plus the target's
logit and, for label smoothing, the sum of logits. Row blocks vary fastest in the program id, so
the programs resident at one time read the same C tiles and share them through L2. The splits'
partial (m, s) are combined on the host side in O(splits * N).
"""
import torch
import triton
import triton.language as tl

from own_kernel.tile import logit_tile


@triton.jit
def cce_fwd_kernel(E, C, Bias, Targets, Part,
                   N, V, D, v_per_split, plane,
                   stride_en, stride_ed, stride_cv, stride_cd,
                   softcap,
                   HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_nb = tl.cdiv(N, BLOCK_N)
    nb = pid % num_nb
    split = pid // num_nb
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    tgt = tl.load(Targets + offs_n, mask=n_mask, other=-1)
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)

    m = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z_tgt = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in range(v_start, v_end, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_mask = offs_v < v_end
        z = logit_tile(E, C, Bias, offs_n, offs_v, n_mask, v_mask, D,
                       stride_en, stride_ed, stride_cv, stride_cd, softcap,
                       HAS_BIAS, HAS_SOFTCAP, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION)
        # Online log-sum-exp: rescale the running sum to the new running max.
        z_inf = tl.where(v_mask[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z_inf, axis=1))
        s = s * tl.exp2((m - m_new) * 1.4426950408889634) \
            + tl.sum(tl.exp2((z_inf - m_new[:, None]) * 1.4426950408889634), axis=1)
        m = m_new
        z_tgt += tl.sum(tl.where(offs_v[None, :] == tgt[:, None], z, 0.0), axis=1)
        if NEED_ZSUM:
            z_sum += tl.sum(tl.where(v_mask[None, :], z, 0.0), axis=1)

    base = Part + split.to(tl.int64) * N + offs_n
    tl.store(base, m, mask=n_mask)
    tl.store(base + plane, s, mask=n_mask)
    tl.store(base + 2 * plane, z_tgt, mask=n_mask)
    if NEED_ZSUM:
        tl.store(base + 3 * plane, z_sum, mask=n_mask)


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs get true fp32 products (Triton's default for fp32 is tf32, ~3e-4 error).
    return "ieee" if dtype == torch.float32 else "tf32"


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def forward(e, c, bias, targets, softcap, need_zsum, cfg):
    """Returns (lse, z_target, z_sum or None), each (N,) fp32. `targets` outside [0, V) give
    z_target 0 (the caller masks those rows)."""
    n, d = e.shape
    v = c.shape[0]
    k = cfg["fwd"]
    bn, bv = k["BLOCK_N"], k["BLOCK_V"]
    num_nb = triton.cdiv(n, bn)
    # Enough splits to fill the GPU `waves` times, each a whole number of tiles.
    splits = max(1, min(triton.cdiv(cfg["waves"] * num_sms(e.device), num_nb), triton.cdiv(v, bv)))
    v_per_split = triton.cdiv(triton.cdiv(v, splits), bv) * bv
    splits = triton.cdiv(v, v_per_split)
    part = torch.empty((4 if need_zsum else 3, splits, n), device=e.device, dtype=torch.float32)
    if n > 0:
        cce_fwd_kernel[(num_nb * splits,)](
            e, c, bias if bias is not None else e, targets, part,
            n, v, d, v_per_split, splits * n,
            e.stride(0), e.stride(1), c.stride(0), c.stride(1),
            float(softcap or 0.0),
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None, NEED_ZSUM=need_zsum,
            DOT_PRECISION=dot_precision(e.dtype), **k)
    m, s, z_tgt = part[0], part[1], part[2]
    m_max = m.max(dim=0).values
    lse = m_max + torch.log((s * torch.exp(m - m_max)).sum(dim=0))
    z_sum = part[3].sum(dim=0) if need_zsum else None
    return lse, z_tgt.sum(dim=0), z_sum
