"""Backward launcher: vocabulary chunks of (dlogits -> dE += W @ C -> dC = W^T @ E).

Memory: the gradients themselves (dE, dC, dbias), an fp32 accumulator for dE (N x D), one
workspace W of N x chunk values in the input dtype (chunk sized from the config's workspace
budget), and O(N + V) fp32 vectors. Nothing N x V.
"""
import os

import torch
import triton

from own_kernel.configs import config_for
from own_kernel.dlogits import cce_dlogits_kernel
from own_kernel.forward import dot_precision
from own_kernel.grad_c import cce_grad_c_kernel
from own_kernel.grad_e import cce_grad_e_kernel

# Rows sampled for the mean rows of C and E used by the corrections: any vector keeps the
# result exact (see dlogits.py); a good estimate of the shared component keeps the residual small.
MEAN_SAMPLE_ROWS = 4096


def sampled_mean(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1], device=x.device, dtype=torch.float32)
    rows = x[:: max(1, x.shape[0] // MEAN_SAMPLE_ROWS)]
    return torch.sum(rows, dim=0, dtype=torch.float32) / rows.shape[0]


def chunk_size(n: int, v: int, elt: int, cfg: dict) -> int:
    bv = cfg["dlogits"]["BLOCK_V"]
    budget = cfg["workspace_mib"] * 2**20
    chunk = budget // max(1, n * elt) // bv * bv
    return int(min(max(chunk, bv), triton.cdiv(v, bv) * bv))


def backward(e, c, bias, targets, lse, row_weight, row_weight_lse, softcap, smooth, filter_eps):
    """Gradients (dE, dC, dbias or None) of sum_n row_weight[n] * loss[n] + row_weight_lse[n] * lse[n].
    row_weight is already 0 on ignored rows."""
    n, d = e.shape
    v = c.shape[0]
    cfg = config_for(e.device, e.dtype)
    dlog, kde, kdc = cfg["dlogits"], cfg["de"], cfg["dc"]
    bn, bv = dlog["BLOCK_N"], dlog["BLOCK_V"]

    # Normalise the row weights so d is O(1) in the workspace (a mean over N tokens would push
    # fp16 values into subnormals); the scale comes back in dE's and dC's epilogues.
    scale = row_weight.abs().max() if n else torch.zeros((), device=e.device)
    if row_weight_lse is not None and n:
        scale = torch.maximum(scale, (row_weight + row_weight_lse).abs().max())
    scale_f = float(scale)
    dbias = torch.zeros_like(bias) if bias is not None else None
    if n == 0 or scale_f == 0.0 or not torch.isfinite(scale):
        return torch.zeros_like(e), torch.zeros_like(c), dbias
    row_weight = row_weight / scale
    if row_weight_lse is not None:
        row_weight_lse = row_weight_lse / scale

    filtered = filter_eps is not None
    chunk = chunk_size(n, v, e.element_size(), cfg)
    num_nb = triton.cdiv(n, bn)
    mask_stride = triton.cdiv(v, bv)
    work = torch.empty((n, chunk), device=e.device, dtype=e.dtype)
    mask = torch.empty((num_nb, mask_stride) if filtered else (1,), device=e.device, dtype=torch.int8)
    dc = torch.empty_like(c)  # every row is written by one chunk's grad_c
    de32 = torch.zeros((n, d), device=e.device, dtype=torch.float32)
    row_lost = torch.zeros(n, device=e.device, dtype=torch.float32)
    col_lost = torch.zeros(v, device=e.device, dtype=torch.float32)
    col_sum = torch.zeros(v, device=e.device, dtype=torch.float32) if bias is not None else col_lost
    e_mean, c_mean = sampled_mean(e), sampled_mean(c)
    hungry = None
    if os.environ.get("CCE_OWN_DEGRADE") == "hungry":
        hungry = torch.ones((v // 4, d), device=e.device, dtype=e.dtype)  # deliberate waste, for the gate
    precision = dot_precision(e.dtype)

    for v_start in range(0, v, chunk):
        width = min(chunk, v - v_start)
        cce_dlogits_kernel[(num_nb * triton.cdiv(width, bv),)](
            e, c, bias if bias is not None else e, targets, lse, row_weight,
            row_weight_lse if row_weight_lse is not None else row_weight,
            work, mask, row_lost, col_lost, col_sum,
            n, v, d, v_start, width, mask_stride, work.stride(0),
            e.stride(0), e.stride(1), c.stride(0), c.stride(1),
            float(softcap or 0.0), float(smooth), float(filter_eps or 0.0),
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None, FILTER=filtered,
            HAS_GRAD_LSE=row_weight_lse is not None, DOT_PRECISION=precision, **dlog)
        cce_grad_e_kernel[(num_nb * triton.cdiv(d, kde["BLOCK_D"]),)](
            work, c, mask, de32, n, d, v_start, width, mask_stride, work.stride(0),
            c.stride(0), c.stride(1), de32.stride(0),
            FILTER=filtered, MASK_BV=bv, BLOCK_N=bn, DOT_PRECISION=precision, **kde)
        cce_grad_c_kernel[(triton.cdiv(width, kdc["BLOCK_M"]) * triton.cdiv(d, kdc["BLOCK_D"]),)](
            work, e, mask, col_lost, e_mean, dc, scale_f,
            n, v, d, v_start, width, mask_stride, work.stride(0),
            e.stride(0), e.stride(1), dc.stride(0), dc.stride(1),
            FILTER=filtered, MASK_BN=bn, MASK_BV=bv, DOT_PRECISION=precision, **kdc)
    del work, hungry
    # dE = scale * (W @ C + (what W's rows missed) x mean(C)), in place to keep one N x D fp32.
    de32.addr_(row_lost, c_mean).mul_(scale_f)
    de = de32.to(e.dtype)
    if bias is not None:
        dbias.copy_(col_sum * scale_f)
    return de, dc, dbias
