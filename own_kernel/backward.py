"""Backward launcher: vocabulary chunks of (dlogits -> dE += W @ C -> dC = W^T @ E).

Memory: the gradients themselves (dE, dC, dbias), an fp32 accumulator for dE (N x D), one
workspace W of N x chunk values in the input dtype (chunk sized from the config's workspace
budget), and O(N + V) fp32 vectors. Nothing N x V.

Exact mode runs the two GEMMs on cuBLAS where it can accumulate dE in fp32 (addmm with
out_dtype); the filtered mode runs block-sparse Triton GEMMs that skip masked-out tiles.
"""
import os

import torch
import triton

from own_kernel.configs import config_for
from own_kernel.dlogits import cce_dlogits_kernel
from own_kernel.finalize_de import cce_finalize_de_kernel
from own_kernel.forward import LAST_COMPILED, dot_precision
from own_kernel.grad_c import cce_grad_c_kernel
from own_kernel.grad_e import cce_grad_e_kernel
from own_kernel.tile import softcap_scalars

# Rows sampled for the plain mean rows of C and E used by the rounding corrections: any vector
# keeps the result exact (see dlogits.py); a good estimate of the shared component keeps the
# residual small.
MEAN_SAMPLE_ROWS = 4096
_CUBLAS_FP32_ACC: dict = {}


def sampled_mean(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1], device=x.device, dtype=torch.float32)
    rows = x[:: max(1, x.shape[0] // MEAN_SAMPLE_ROWS)]
    return torch.sum(rows, dim=0, dtype=torch.float32) / rows.shape[0]


def weighted_mean(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum_i weights[i] x[i] / sum_i weights[i] (0 when nothing was weighted)."""
    total = weights.sum()
    mean = (weights.to(x.dtype) @ x).float()
    return torch.where(total != 0, mean / total, 0.0)


def chunk_size(n: int, v: int, elt: int, cfg: dict) -> int:
    """Vocabulary columns per chunk: the workspace budget's worth, but at least min_chunk (the
    GEMMs' reduction / row count; with many tokens a fixed budget makes them too thin to run
    near peak, and each chunk also re-reads and re-writes the fp32 dE accumulator)."""
    bv = cfg["dlogits"]["BLOCK_V"]
    budget = cfg["workspace_mib"] * 2**20
    chunk = max(budget // max(1, n * elt), cfg.get("min_chunk", 0)) // bv * bv
    return int(min(max(chunk, bv), triton.cdiv(v, bv) * bv))


def cublas_accumulates_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch.addmm can add a 16-bit product into an fp32 matrix in place on this device."""
    key = (str(device), dtype)
    if key not in _CUBLAS_FP32_ACC:
        try:
            a = torch.ones(8, 8, device=device, dtype=dtype)
            acc = torch.ones(8, 8, device=device, dtype=torch.float32)
            torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
            _CUBLAS_FP32_ACC[key] = bool((acc == 9).all())
        except (RuntimeError, TypeError):
            _CUBLAS_FP32_ACC[key] = False
    return _CUBLAS_FP32_ACC[key]


def backward(e, c, bias, targets, lse, p_max, row_weight, row_weight_lse, softcap, smooth,
             filter_eps, filter_min_p_max=0.0):
    """Gradients (dE, dC, dbias or None) of sum_n row_weight[n] * loss[n] + row_weight_lse[n] * lse[n].
    row_weight is already 0 on ignored rows. With filter_eps, rows whose largest probability
    p_max is below filter_min_p_max are never skipped (their threshold is 0)."""
    n, d = e.shape
    v = c.shape[0]
    cfg = config_for(e.device, e.dtype)
    dlog, kde, kdc = dict(cfg["dlogits"]), cfg["de"], cfg["dc"]
    dlog.setdefault("TILES", 1)
    dlog.setdefault("FLATTEN", False)
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

    row_eps = None
    if filter_eps is not None:
        row_eps = torch.where(p_max >= filter_min_p_max, float(filter_eps), 0.0)
        # No row may skip anything (all flat, or eps 0): the exact path is the same result, faster.
        if not bool((row_eps > 0).any()):
            filter_eps = None
    filtered = filter_eps is not None
    # Exact mode may hand its GEMMs to cuBLAS: dC = W^T @ E always can (bf16 out, one chunk per
    # row block of dC); dE += W @ C only where addmm accumulates a 16-bit product into fp32.
    cublas_dc = (not filtered and e.device.type == "cuda" and cfg.get("exact_gemm") == "cublas")
    cublas_de = (cublas_dc and cfg.get("exact_de", "cublas") == "cublas"
                 and (e.dtype == torch.float32 or cublas_accumulates_fp32(e.device, e.dtype)))
    # The sampled means first: their fp32 temporaries (MEAN_SAMPLE_ROWS x D) must not add to the
    # peak that dC, the dE accumulator and the workspace make together.
    e_mean, c_mean = sampled_mean(e), sampled_mean(c)
    e_skip_mean = e_mean
    chunk = chunk_size(n, v, e.element_size(), cfg)
    num_nb = triton.cdiv(n, bn)
    mask_stride = triton.cdiv(v, bv)
    f32 = dict(device=e.device, dtype=torch.float32)
    work = torch.empty((n, chunk), device=e.device, dtype=e.dtype)
    mask = torch.empty((num_nb, mask_stride) if filtered else (1,), device=e.device, dtype=torch.int8)
    row_eps = row_eps if filtered else row_weight  # (unused without the filter)
    dc = torch.empty_like(c)  # every row is written by one chunk's GEMM
    de32 = torch.zeros((n, d), **f32)
    row_round, col_round = torch.zeros(n, **f32), torch.zeros(v, **f32)
    row_skip, col_skip = (torch.zeros(n, **f32), torch.zeros(v, **f32)) if filtered else (row_round, col_round)
    row_skip_chunk = torch.zeros(n, **f32) if filtered else row_round
    col_sum = torch.zeros(v, **f32) if bias is not None else col_round
    hungry = None
    if os.environ.get("CCE_OWN_DEGRADE") == "hungry":
        hungry = torch.ones((v // 4, d), device=e.device, dtype=e.dtype)  # deliberate waste, for the gate
    precision = dot_precision(e.dtype)

    for v_start in range(0, v, chunk):
        width = min(chunk, v - v_start)
        if filtered:
            row_skip_chunk.zero_()
        groups = triton.cdiv(triton.cdiv(width, bv), dlog["TILES"])
        LAST_COMPILED["dlogits"] = cce_dlogits_kernel[(num_nb * groups,)](
            e, c, bias if bias is not None else e, targets, lse, row_weight,
            row_weight_lse if row_weight_lse is not None else row_weight,
            work, mask, row_eps, row_round, col_round, row_skip_chunk, col_skip, col_sum,
            n, v, d, v_start, width, mask_stride, work.stride(0),
            e.stride(0), e.stride(1), c.stride(0), c.stride(1),
            *softcap_scalars(softcap), float(smooth),
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None, FILTER=filtered,
            HAS_GRAD_LSE=row_weight_lse is not None, DOT_PRECISION=precision, **dlog)
        if cublas_de:
            w_chunk, c_chunk = work[:, :width], c[v_start:v_start + width]
            if e.dtype == torch.float32:
                de32.addmm_(w_chunk, c_chunk)
            else:
                torch.addmm(de32, w_chunk, c_chunk, out_dtype=torch.float32, out=de32)
            del w_chunk  # a view keeps the workspace alive past `del work` below
        else:
            LAST_COMPILED["grad_e"] = cce_grad_e_kernel[(num_nb * triton.cdiv(d, kde["BLOCK_D"]),)](
                work, c, mask, de32, n, d, v_start, width, mask_stride, work.stride(0),
                c.stride(0), c.stride(1), de32.stride(0),
                FILTER=filtered, MASK_BV=bv, BLOCK_N=bn, DOT_PRECISION=precision, **kde)
        if cublas_dc:
            dc_chunk = dc[v_start:v_start + width]
            torch.addmm(dc_chunk, work[:, :width].t(), e, beta=0, alpha=scale_f, out=dc_chunk)
            dc_chunk.addr_((col_round[v_start:v_start + width] * scale_f).to(e.dtype), e_mean.to(e.dtype))
            continue
        if filtered:
            e_skip_mean = weighted_mean(row_skip_chunk, e)
            row_skip += row_skip_chunk
        LAST_COMPILED["grad_c"] = cce_grad_c_kernel[(triton.cdiv(width, kdc["BLOCK_M"]) * triton.cdiv(d, kdc["BLOCK_D"]),)](
            work, e, mask, col_round, e_mean, col_skip, e_skip_mean, dc, scale_f,
            n, v, d, v_start, width, mask_stride, work.stride(0),
            e.stride(0), e.stride(1), dc.stride(0), dc.stride(1),
            FILTER=filtered, MASK_BN=bn, MASK_BV=bv, DOT_PRECISION=precision, **kdc)
    del work
    c_skip_mean = weighted_mean(col_skip, c) if filtered else c_mean
    de = torch.empty_like(e)
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    cce_finalize_de_kernel[(triton.cdiv(n, 32), triton.cdiv(d, block_d))](
        de32, row_round, c_mean, row_skip, c_skip_mean, de, n, d,
        de32.stride(0), de.stride(0), de.stride(1), scale_f,
        FILTER=filtered, BLOCK_N=32, BLOCK_D=block_d)
    if bias is not None:
        dbias.copy_(col_sum * scale_f)
    del hungry  # held to the end, so it raises the backward's peak whatever phase peaks
    return de, dc, dbias
