"""The target's logit per row: z[n, t_n] = softcap(e_n . c_{t_n} + bias[t_n]) (0 where t_n is out of
range, e.g. ignore_index). One gathered row of C per token: O(N * D), no N x V work, and it keeps
the forward's inner loop free of a per-element compare-and-select."""
import torch
import triton
import triton.language as tl

from own_kernel.policy.plan import cdiv
from own_kernel.kernels.tile import logits, softcap_scalars


@triton.jit
def cce_target_logit_kernel(E, C, Bias, Targets, Out, N, V, D,
                            stride_en, stride_ed, stride_cv, stride_cd, tanh_scale, cap,
                            HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    tgt = tl.load(Targets + offs_n, mask=n_mask, other=-1)
    valid = n_mask & (tgt >= 0) & (tgt < V)
    tgt = tl.where(valid, tgt, 0)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        m = valid[:, None] & (offs_d[None, :] < D - d0)
        e = tl.load(E + offs_n[:, None].to(tl.int64) * stride_en + (d0 + offs_d)[None, :] * stride_ed,
                    mask=m, other=0.0).to(tl.float32)
        c = tl.load(C + tgt[:, None].to(tl.int64) * stride_cv + (d0 + offs_d)[None, :] * stride_cd,
                    mask=m, other=0.0).to(tl.float32)
        acc += tl.sum(e * c, axis=1)
    if HAS_BIAS:
        acc += tl.load(Bias + tgt, mask=valid, other=0.0).to(tl.float32)
    acc = logits(acc, tanh_scale, cap, HAS_SOFTCAP)
    tl.store(Out + offs_n, tl.where(valid, acc, 0.0), mask=n_mask)


def target_logit(e, c, bias, targets, softcap, temperature=1.0):
    """(N,) fp32: each row's target logit softcap(x_t) / temperature (0 where the target is out
    of range)."""
    n, d = e.shape
    out = torch.empty(n, device=e.device, dtype=torch.float32)
    if n:
        block_n = 16
        cce_target_logit_kernel[(cdiv(n, block_n),)](
            e, c, bias if bias is not None else e, targets, out, n, c.shape[0], d,
            e.stride(0), e.stride(1), c.stride(0), c.stride(1),
            *softcap_scalars(softcap, temperature),
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
            BLOCK_N=block_n, BLOCK_D=min(128, triton.next_power_of_2(max(d, 16))))
    return out
