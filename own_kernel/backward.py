"""Backward launcher: vocabulary chunks of (softmax gradient W -> dE += W @ C -> dC = W^T @ E).

Ways to produce a chunk's W (N x width, input dtype):
- cuBLAS path: chunks whose dE and dC GEMMs run on cuBLAS, and whose workspace lives in the part
  of dC that no chunk has written yet (its tail), so the wide chunks that keep the GEMMs near
  peak, and the fp32 dE accumulator's re-reads few, cost no memory beyond the gradients. W comes
  from dlogits_tma.py (config recompute="tma": logits recomputed on the tensor cores, W written
  directly) or, recompute="cublas" (or inputs TMA cannot read), from cuBLAS recomputing the
  logits in fp32 into X and softmax_grad.py turning X into W. Chunks shrink as dC fills up; below
  cublas_min_width the rest of the vocabulary (the tail) goes to the fused path's workspace: with
  tma the same way (dlogits_tma.py, then cuBLAS), otherwise the fused path.
- fused path: dlogits.py recomputes the logits inside a Triton GEMM and writes W directly (2
  bytes per entry instead of 6); its workspace is dE's own output buffer when that is wide enough,
  else a workspace_mib allocation.
dE accumulates in fp32 (cuBLAS addmm with out_dtype, or grad_e.py); dC = W^T @ E once per chunk.

Filtering: the cuBLAS path skips whole columns (vocabulary entries) where every |d| of the rows
that may skip is below their eps, and runs the GEMMs on the kept columns only, gathered; rows
that may not skip (flat softmax) get their own exact GEMMs. The fused path skips
BLOCK_N x BLOCK_V tiles in block-sparse Triton GEMMs. Both add back what they skip through a
rank-1 model (skip-weighted mean rows of C and E), and what rounding to the input dtype removes
through the plain mean rows (see dlogits.py for why: the component that all rows of C share).

Memory: dE, dC, dbias, an fp32 accumulator for dE (N x D), O(N + V) fp32 vectors; on the fused
path without a wide enough dE buffer one workspace. Nothing N x V.
"""
import math
import os
from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.configs import POISON, config_for
from own_kernel.dlogits import cce_dlogits_kernel
from own_kernel.dlogits_tma import cce_dlogits_tma_kernel
from own_kernel.finalize_de import cce_finalize_de_kernel
from own_kernel.gather_kept import cce_gather_kept_kernel
from own_kernel.forward import LAST_COMPILED, dot_precision, num_sms, tma_ready
from own_kernel.grad_c import cce_grad_c_kernel
from own_kernel.grad_e import cce_grad_e_kernel
from own_kernel.rank1_dc import cce_rank1_dc_kernel
from own_kernel.softmax_grad import cce_softmax_grad_kernel
from own_kernel.tile import softcap_scalars

# Rows sampled for the plain mean rows of C and E used by the rounding corrections: any vector
# keeps the result exact (see dlogits.py); a good estimate of the shared component keeps the
# residual small.
MEAN_SAMPLE_ROWS = 4096
WORKSPACE_ALIGN = 256  # bytes; X and W start on this boundary inside dC
_CUBLAS_FP32_ACC: dict = {}
LAST_PLAN: dict = {}


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
    """Fused-path vocabulary columns per chunk: the workspace budget's worth, but at least
    min_chunk (the GEMMs' reduction / row count; with many tokens a fixed budget makes them too
    thin to run near peak, and each chunk also re-reads and re-writes the fp32 dE accumulator)."""
    bv = cfg["dlogits"]["BLOCK_V"]
    budget = cfg["workspace_mib"] * 2**20
    chunk = max(budget // max(1, n * elt), cfg.get("min_chunk", 0)) // bv * bv
    return int(min(max(chunk, bv), triton.cdiv(v, bv) * bv))


def chunk_plan(n: int, v: int, d: int, elt: int, cfg: dict, cublas: bool, fused_width: int,
               tma: bool = False, filtered: bool = False, lookahead: bool | None = None,
               v_first: int = 0):
    """[(v_start, width, "cublas" | "fused")]. A cuBLAS chunk's workspace sits at the end of dC,
    its own dC rows at the front of what is unwritten: as wide as both fit (up to
    cublas_max_width columns, or cublas_max_entries / n when that is more), until that falls
    below cublas_min_width. The workspace is X and W (n * (4 + elt) bytes per column, see
    slot_offsets) when cuBLAS recomputes the logits; with tma (dlogits_tma.py) it is W alone, and
    filtered, two chunks' W are live at once (the look-ahead; see w_slots). Filtered chunks may be wider
    (filter_max_width, or filter_max_entries / n): the host waits on each one's kept-column
    count and then queues a dozen operations, so each chunk must carry enough GPU work to hide
    that, or the GPU idles. lookahead (tma; default: looks_ahead): whether W takes two slots
    (see w_slots). v_first: plan the columns from there on (dC's rows before it are written).
    The last chunk is split at a multiple of 8 columns: with an unaligned width (V 50257) cuBLAS
    runs that chunk's GEMMs on pre-Hopper kernels, several times slower
    (measurements/epilogue-v16/host-n2048v50257.txt)."""
    if lookahead is None:
        lookahead = looks_ahead(n, cfg, filtered)
    plan, v_start = [], v_first
    if cublas and n > 0:
        align, row, col = cfg["cublas_align"], d * elt, n * elt
        # Few tokens: wider chunks for the same workspace bytes (fewer launches per call).
        if filtered:
            widest = max(cfg.get("filter_max_width", cfg["cublas_max_width"]),
                         cfg.get("filter_max_entries", 0) // n)
        else:
            widest = cfg["cublas_max_width"]
        max_width = max(widest, cfg.get("cublas_max_entries", 0) // n) // align * align
        end = v * row // WORKSPACE_ALIGN * WORKSPACE_ALIGN
        below = end  # tma: where the previous chunk's W slot starts
        # tail_min_width (tma): a chunk narrower than the tail's goes to the tail, which runs the
        # same kernels in fewer, wider chunks; the look-ahead it loses only hides the filter's
        # waits. Filtered, chunks wide enough to filter (filter_min_flops) stay: the tail does
        # not filter (slower with them in the tail at N 32768, V 128256: measurements/tune-v14).
        min_width = cfg["cublas_min_width"]
        if tma and cfg.get("tail_min_width"):
            min_width = max(min_width, fused_width)
            if filtered:
                filters = math.ceil(cfg.get("filter_min_flops", 0) / (4 * n * d))
                min_width = min(min_width, max(cfg["cublas_min_width"], filters))
        while v_start < v:
            if not tma:
                fit = (end - 2 * WORKSPACE_ALIGN - v_start * row) // (n * (4 + elt) + row)
            elif not lookahead:  # every chunk's W at the top, one at a time
                fit = (end - WORKSPACE_ALIGN - v_start * row) // (col + row)
            elif len(plan) % 2 == 0:  # top slot; the next chunk's (no wider) goes right below
                fit = (end - 2 * WORKSPACE_ALIGN - v_start * row) // (2 * col + row)
            else:  # below the previous chunk's slot
                fit = (below - WORKSPACE_ALIGN - v_start * row) // (col + row)
            # Multiples of 8 (the rest goes the fused path): the TMA descriptors need 16-byte
            # row strides.
            width = min(max_width, fit // align * align, (v - v_start) // 8 * 8)
            if tma and plan:
                width = min(width, plan[-1][1])  # never wider: see w_slots
            if width <= 0 or (width < min_width and width < v - v_start):
                break
            plan.append((v_start, width, "cublas"))
            below = _slot_start(end if len(plan) % 2 else below, n * width * elt)
            v_start += width
    aligned_end = v_start + (v - v_start) // 8 * 8
    for start in range(v_start, aligned_end, fused_width):
        plan.append((start, min(fused_width, aligned_end - start), "fused"))
    if aligned_end < v:
        plan.append((aligned_end, v - aligned_end, "fused"))
    return plan


def looks_ahead(n: int, cfg: dict, filtered: bool) -> bool:
    """Whether a call's tma chunks look ahead (cublas_chunks): filtered calls, unless the config
    turns it off (filter_lookahead) or the call has more than filter_lookahead_max_n tokens."""
    return (filtered and cfg.get("filter_lookahead", True)
            and n <= cfg.get("filter_lookahead_max_n", n))


def filter_can_skip(n: int, v: int, d: int, elt: int, cfg: dict, cublas: bool, tma: bool) -> bool:
    """Whether a filtered backward of this shape would skip anything at all. With tma only the
    cuBLAS chunks of at least filter_min_flops filter (cublas_chunks), and only when those
    chunks' dense GEMMs add up to filter_min_total_flops: below that the filter's fixed host
    costs (its reductions, a wait per chunk, the gathers' launches) exceed what it can save."""
    if not tma:
        return True
    min_flops = cfg.get("filter_min_flops", 0)
    plan = chunk_plan(n, v, d, elt, cfg, cublas, tail_width(n, v, d, elt, cfg)[0], tma,
                      filtered=True)
    flops = [4 * n * width * d for _, width, kind in plan if kind == "cublas"]
    filtering = sum(f for f in flops if f >= min_flops)
    return any(f >= min_flops for f in flops) and filtering >= cfg.get("filter_min_total_flops", 0)


def tail_width(n: int, v: int, d: int, elt: int, cfg: dict) -> tuple[int, bool]:
    """The fused path's (with tma: the tail's) chunk width, and whether its workspace is dE's
    output buffer (free until the end): it is when that holds at least 3/4 of chunk_size;
    narrower chunks would re-read the fp32 accumulator too often. In dE's buffer the chunks take
    all of it, even past chunk_size (many tokens: N 32768, D 2304 gives 2304 columns against
    2048), since each chunk reads and writes the whole fp32 accumulator once."""
    bv = cfg["dlogits"]["BLOCK_V"]
    width = chunk_size(n, v, elt, cfg)
    de_width = min(d // bv * bv, triton.cdiv(v, bv) * bv)
    if de_width >= max(bv, 3 * width // 4):
        return de_width, True
    return width, False


def w_slots(widths, dc_bytes: int, n: int, elt: int, lookahead: bool = True) -> list[int]:
    """Byte offsets inside dC of the tma chunks' W (n x width each). With the look-ahead
    (filtered calls), chunk k's W is written before chunk k-1's GEMMs run, so consecutive chunks
    alternate between a slot ending at dC's end and one right below the previous slot; with
    widths that never grow, a top slot lies above every slot but the previous one's. Without
    it, every chunk's W ends at dC's end (the stream orders each chunk after the last one's
    GEMMs), so chunks are twice as wide for the same bytes."""
    end = dc_bytes // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    starts = []
    for k, width in enumerate(widths):
        top = end if k % 2 == 0 or not lookahead else starts[-1]
        starts.append(_slot_start(top, n * width * elt))
    return starts


def _slot_start(top: int, size: int) -> int:
    return (top - size) // WORKSPACE_ALIGN * WORKSPACE_ALIGN


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


# ---- GEMMs in torch: cuBLAS on CUDA; fp32 math on the CPU (interpreter tests) -----------------

def mm_fp32(a, b, out):
    """out (fp32) = a @ b, products of 16-bit inputs accumulated in fp32."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
    elif a.is_cuda:
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        torch.mm(a.float(), b.float(), out=out)


def addmm_fp32(acc, a, b):
    """acc (fp32) += a @ b."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif a.is_cuda:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())


def mm_scaled(out, a, b, scale, accumulate=False):
    """out (input dtype) (+)= scale * a @ b."""
    if a.is_cuda:
        torch.addmm(out, a, b, beta=1 if accumulate else 0, alpha=scale, out=out)
    else:
        res = torch.mm(a.float(), b.float()) * scale
        out.copy_(res + out.float() if accumulate else res)


def rank1_dc(dc, a, x, scale, a2=None, x2=None):
    """dc[v, :] += scale * (a[v] * x + a2[v] * x2)."""
    v, d = dc.shape
    if v == 0:
        return
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    cce_rank1_dc_kernel[(triton.cdiv(v, 32), triton.cdiv(d, block_d))](
        dc, a, x, a2 if a2 is not None else a, x2 if x2 is not None else x,
        v, d, dc.stride(0), dc.stride(1), float(scale),
        RANK2=a2 is not None, BLOCK_V=32, BLOCK_D=block_d)


class HostScalar:
    """A small device tensor read on the host once, when first needed: the copy is queued
    (pinned, non-blocking) when it is made, so the read waits for that copy, not for the kernels
    queued after it (a plain .item() waits for the whole stream and idles the GPU while the
    host catches up)."""

    def __init__(self, tensor: torch.Tensor | None = None, value: float | None = None):
        self.value, self.ready = value, None
        if value is None:
            if tensor.is_cuda:
                self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                self.host.copy_(tensor, non_blocking=True)
                self.ready = torch.cuda.Event()
                self.ready.record()
            else:
                self.host = tensor

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None

    def __float__(self) -> float:
        if self.value is None:
            self.wait()
            self.value = float(self.host)
        return self.value

    def values(self) -> list[float]:
        """All of the tensor's values (for a tensor of several)."""
        self.wait()
        return self.host.tolist()


class FilterDecision:
    """Whether this call's filter skips anything, from three reductions read on the host: the
    scale of the row weights, how many rows may skip (peaked), how many never do (flat). The
    read is queued when this is made and waited for as late as possible (resolve): with the
    cuBLAS path after its first chunk's kernel is queued, so the GPU never idles on it. Used as
    the scale (float) once resolved."""

    def __init__(self, scale_dev, peaked, row_eps, cfg, cublas):
        self.is_flat = row_eps == 0
        self.values = HostScalar(torch.stack([scale_dev, peaked.sum().float(),
                                              self.is_flat.sum().float()]))
        self.row_eps, self.cfg, self.cublas = row_eps, cfg, cublas
        self.result = None

    def resolve(self):
        """(cublas_eps, fused_eps, flat): the row thresholds for the cuBLAS chunks (column
        skipping) and for the fused ones (block-sparse Triton GEMMs; behind cuBLAS chunks,
        filter_fused False runs them exact on cuBLAS instead: faster on an H200 at both shapes
        measured, tune-v10-filter-fused; with tma there are no fused chunks), None = exact; the
        rows that never skip."""
        if self.result is None:
            self.values.wait()
            self.scale, num_peaked, num_flat = self.values.host.tolist()
            cublas_eps = fused_eps = flat = None
            n = self.row_eps.shape[0]
            if num_peaked > 0:  # else no row may skip anything: exact is the same result
                if not self.cublas or self.cfg.get("filter_fused", True):
                    fused_eps = self.row_eps
                # Too many rows keep every column: column skipping would skip nothing.
                if self.cublas and num_flat <= self.cfg["filter_max_flat"] * n:
                    cublas_eps = self.row_eps
                    flat = torch.nonzero_static(self.is_flat, size=int(num_flat)).squeeze(1)
            self.result = cublas_eps, fused_eps, flat
        return self.result

    def __float__(self) -> float:
        self.resolve()
        return self.scale


@dataclass
class Grads:
    """What the chunks accumulate into."""
    dc: torch.Tensor             # (V, D), input dtype; its unwritten tail is the cuBLAS workspace
    de32: torch.Tensor           # (N, D) fp32
    row_round: torch.Tensor      # (N,) what rounding W removed, per row / per column
    col_round: torch.Tensor      # (V,)
    row_skip: torch.Tensor       # (N,) what the filter skipped, per row / per column
    col_skip: torch.Tensor       # (V,)
    col_sum: torch.Tensor        # (V,) sum of d per column (dbias)
    # Filtered cuBLAS chunks (None otherwise): per column, the rounded d of the rows that may
    # skip, and whether any of their entries was kept; per chunk, how many columns were kept.
    col_wsum: torch.Tensor = None     # (V,) fp32
    row_eps: torch.Tensor = None      # (N,) fp32, each row's threshold (0: flat, never skips)
    col_keep: torch.Tensor = None     # (V,) int32
    kept_count: torch.Tensor = None   # (chunks,) int32
    row_scale: torch.Tensor = None    # (N,) fp32: per-row scaled W (normalise_weights), or None


def zeros_like(t: torch.Tensor | None) -> torch.Tensor | None:
    return torch.zeros_like(t) if t is not None else None


def normalise_weights(e, row_weight, row_weight_lse, filtering, uniform=True):
    """(row_weight, row_weight_lse, scale_dev, row_scale): the weights divided by their largest
    magnitude scale_dev (a device scalar) for fp16 inputs or a filtered call; else unchanged,
    scale None. fp16 needs it (a mean over N tokens would push W into subnormals), and the
    filter's eps is relative to it.

    Exact fp16 calls whose weights differ from row to row (uniform False: reduction "none", an
    lse gradient) divide each row by its own largest weight instead: by the call's largest, a
    row weighted 1e-4 beside one weighted 1e4 underflows to 0 in fp16. row_scale[n] is then
    that row's scale over scale_dev (else None): it multiplies the row's dE (finalize_de.py)
    and its W row before dC's GEMM (rescale_rows), where a tiny row's share of dC may underflow
    without harm (it is below dC's rounding)."""
    if e.dtype != torch.float16 and not filtering:
        return row_weight, row_weight_lse, None, None
    row_abs = row_weight.abs()
    if row_weight_lse is not None:
        row_abs = torch.maximum(row_abs, (row_weight + row_weight_lse).abs())
    scale_dev = row_abs.max()
    overall = torch.where(scale_dev > 0, scale_dev, 1.0)  # all weights 0: W = 0, gradients 0
    row_scale = None
    if e.dtype == torch.float16 and not filtering and not uniform:
        divisor = torch.where(row_abs > 0, row_abs, 1.0)
        row_scale = divisor / overall
    else:
        divisor = overall
    row_weight = row_weight / divisor
    if row_weight_lse is not None:
        row_weight_lse = row_weight_lse / divisor
    return row_weight, row_weight_lse, scale_dev, row_scale


def rescale_rows(g, w, v_start):
    """A per-row scaled W's rows times row_scale, as dC's GEMM needs them (normalise_weights).
    The column sums the epilogue took of the unscaled rows no longer describe W: dbias's are
    taken again, the rounding ones dropped."""
    w.mul_(g.row_scale[:, None])
    width = w.shape[1]
    torch.sum(w, dim=0, dtype=torch.float32, out=g.col_sum[v_start:v_start + width])
    g.col_round[v_start:v_start + width] = 0


def backward(e, c, bias, targets, lse, nll, p_max, row_weight, row_weight_lse, softcap, smooth,
             filter_eps, filter_min_p_max=0.0, de_out=None, uniform=True):
    """Gradients (dE, dC, dbias or None) of sum_n row_weight[n] * loss[n] + row_weight_lse[n] * lse[n].
    row_weight is already 0 on ignored rows. With filter_eps, rows whose largest probability
    p_max is below filter_min_p_max are never skipped (their threshold is 0). de_out: an (N, D)
    buffer that dE may be written into, e.g. e itself when the caller no longer needs it (e is
    not read after the chunks). uniform: every row with a gradient has the same weight (a mean
    or sum; see normalise_weights)."""
    (n, d), v, cfg, dbias = e.shape, c.shape[0], config_for(e.device, e.dtype), zeros_like(bias)
    if n == 0:
        return torch.zeros_like(e), torch.zeros_like(c), dbias
    cuda = e.device.type == "cuda"
    fp32_acc = e.dtype == torch.float32 or not cuda or cublas_accumulates_fp32(e.device, e.dtype)
    # recompute "tma": dlogits_tma.py writes each chunk's W (needs TMA-readable E and C);
    # "cublas": cuBLAS writes fp32 logits, softmax_grad.py turns them into W.
    tma = cfg.get("recompute") == "tma" and fp32_acc and tma_ready(e) and tma_ready(c)
    cublas = (tma or cfg.get("recompute") == "cublas") and fp32_acc

    cublas_eps = fused_eps = flat = None
    filter_off = None
    if filter_eps is not None and e.dtype == torch.float16 and not uniform:
        # Filtered W shares one scale across rows; with weights far apart the small rows'
        # entries underflow fp16. Exact per-row scaling keeps every row's gradient instead.
        filter_eps, filter_off = None, "fp16 with per-row weights: exact, rows scaled apart"
    if filter_eps is not None and filter_eps > 0 and not filter_can_skip(
            n, v, d, e.element_size(), cfg, cublas, tma):
        filter_eps = None  # same result as exact, without the filter's host wait and launches
        filter_off = "too few GEMM flops to filter (filter_min_flops, filter_min_total_flops)"
    filtering = filter_eps is not None and filter_eps > 0

    # Normalise the row weights so d is O(1) in the workspace: fp16 needs it (a mean over N
    # tokens would push its values into subnormals), and the filter's eps is relative to it. The
    # scale comes back in dE's and dC's epilogues; exact mode reads it on the host only when a
    # GEMM first needs it (HostScalar): a sync here would idle the GPU for the host's whole
    # setup. Exact bf16 and fp32 (fp32's exponent range) store d unscaled: the host knows the
    # scale (1) without reading it, five launches and a copy fewer per call.
    row_weight, row_weight_lse, scale_dev, row_scale = normalise_weights(
        e, row_weight, row_weight_lse, filtering, uniform)

    # Filtering: cublas_eps for the cuBLAS chunks (column skipping), fused_eps for the fused ones
    # (block-sparse Triton GEMMs; behind cuBLAS chunks, filter_fused False runs them exact on
    # cuBLAS instead: faster on an H200 at both shapes measured, tune-v10-filter-fused). With
    # tma there are no fused chunks (the tail runs dlogits_tma.py). None = exact.
    decision = None
    if filtering:
        # Rows with no gradient never keep anything (eps inf); rows with a flat softmax keep
        # everything (eps 0); the rest skip entries below filter_eps.
        active = row_weight != 0
        if row_weight_lse is not None:
            active |= row_weight_lse != 0
        peaked = active & (p_max >= filter_min_p_max)
        # eps relative to each row's own weight (1 for every used row of a mean or sum).
        row_rel = row_weight.abs()
        if row_weight_lse is not None:
            row_rel = torch.maximum(row_rel, (row_weight + row_weight_lse).abs())
        row_eps = torch.where(peaked, float(filter_eps) * row_rel,
                              torch.where(active, 0.0, float("inf")))
        decision = FilterDecision(scale_dev, peaked, row_eps, cfg, cublas)
        scale = decision
        if not cublas:
            cublas_eps, fused_eps, flat = decision.resolve()
    else:
        scale = HostScalar(scale_dev) if scale_dev is not None else HostScalar(value=1.0)
    # With the cuBLAS path the decision is read after its first chunk's kernel is queued
    # (cublas_chunks): until then the chunks are planned and run as if filtering.
    speculative = decision is not None and cublas
    # The sampled means first: their fp32 temporaries (MEAN_SAMPLE_ROWS x D) must not add to the
    # peak that dC and the dE accumulator make together.
    e_mean, c_mean = sampled_mean(e), sampled_mean(c)
    fused_width, in_de = tail_width(n, v, d, e.element_size(), cfg)
    plan = chunk_plan(n, v, d, e.element_size(), cfg, cublas, fused_width, tma,
                      speculative or cublas_eps is not None)
    cublas_plan = [(v0, w) for v0, w, kind in plan if kind == "cublas"]
    fused_plan = [(v0, w) for v0, w, kind in plan if kind == "fused"]
    # With tma, the chunks past what dC's tail can hold run the same way, W in the fused path's
    # workspace (one chunk at a time): dlogits_tma.py recomputes faster than dlogits.py.
    tail = fused_plan if tma else []
    # The O(N + V) sums in one zero-filled buffer (one launch); with the filter on the cuBLAS
    # chunks also ColWSum, ColKeep and the kept counts (int32 views: zero bits are 0 either way).
    filter_buffers = speculative and bool(cublas_plan + tail)
    chunks = len(cublas_plan) + len(tail)
    f32 = dict(device=e.device, dtype=torch.float32)
    sizes = [n, n, v, v, v] + ([v, v, chunks] if filter_buffers else [])
    sums = torch.zeros(sum(sizes), **f32).split(sizes)
    g = Grads(dc=torch.empty((v, d), device=e.device, dtype=e.dtype), de32=torch.zeros((n, d), **f32),
              row_round=sums[0], row_skip=sums[1], col_round=sums[2], col_skip=sums[3],
              col_sum=sums[4], row_scale=row_scale)
    if filter_buffers:
        g.col_wsum, g.col_keep, g.kept_count = sums[5], sums[6].view(torch.int32), sums[7].view(torch.int32)
        g.row_eps = row_eps

    de = work = None
    if in_de:
        de = torch.empty((n, d), device=e.device, dtype=e.dtype)
        work = de.view(-1)[: n * fused_width].view(n, fused_width)
    if POISON:  # every read of these must follow a write (tests)
        g.dc.fill_(float("nan"))
        if work is not None:
            work.fill_(float("nan"))
    hungry = None
    if os.environ.get("CCE_OWN_DEGRADE") == "hungry":
        hungry = torch.ones((v // 4, d), device=e.device, dtype=e.dtype)  # deliberate waste, for the gate

    # For own_kernel.tune: the last call's chunks and what its filter kept (device tensors).
    LAST_PLAN.clear()
    LAST_PLAN.update(plan=plan, filter_off=filter_off)
    args = (e, c, bias, targets, (lse, nll), row_weight, row_weight_lse, softcap, smooth, cfg, g,
            scale)
    if fused_plan and work is None:
        work = torch.empty((n, fused_width), device=e.device, dtype=e.dtype)
        if POISON:
            work.fill_(float("nan"))
    def replan(v_next):
        # The filter turned out off after the first chunk: plan the rest as an exact call would
        # (one W slot, so wider chunks; see cublas_chunks).
        nonlocal work
        rest = chunk_plan(n, v, d, e.element_size(), cfg, cublas, fused_width, tma,
                          lookahead=False, v_first=v_next)
        LAST_PLAN["plan"] = plan[:1] + rest
        rest_tail = [(v0, w) for v0, w, kind in rest if kind == "fused"]
        if rest_tail and work is None:
            work = torch.empty((n, fused_width), device=e.device, dtype=e.dtype)
        return [(v0, w) for v0, w, kind in rest if kind == "cublas"], rest_tail, work

    cublas_chunks(cublas_plan, *args, decision if filter_buffers else None, tma, tail, work,
                  lookahead=looks_ahead(n, cfg, speculative), replan=replan if tma else None)
    if speculative:
        cublas_eps, fused_eps, flat = decision.resolve()
        if cublas_eps is None:
            g.col_keep = None  # what the first chunk added for the filter is not used
    filtered = cublas_eps is not None or fused_eps is not None
    LAST_PLAN.update(num_flat=flat.numel() if flat is not None else None,
                     kept_count=g.kept_count if g.col_keep is not None else None)
    for v_start, width in ([] if tma else fused_plan):
        fused_chunk(*args, fused_eps, work, e_mean, v_start, width)
    del work

    e_skip_mean = None
    if g.col_keep is not None:
        # The filtered cuBLAS chunks' skipped columns, through one rank-1 model for the whole
        # vocabulary (their dC rows are zero so far; see sparse_chunk).
        cublas_skip = torch.where(g.col_keep > 0, 0.0, g.col_wsum)
        g.col_skip += cublas_skip
        e_skip_mean = weighted_mean(g.row_skip, e)
    c_skip_mean = weighted_mean(g.col_skip, c) if filtered else c_mean
    scale_f = float(scale)
    if scale_f == 0.0 or not math.isfinite(scale_f):
        return torch.zeros_like(e), torch.zeros_like(c), dbias
    if de is None:
        de = de_out if de_out is not None else torch.empty((n, d), device=e.device, dtype=e.dtype)
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    cce_finalize_de_kernel[(triton.cdiv(n, 32), triton.cdiv(d, block_d))](
        g.de32, g.row_round, c_mean, g.row_skip, c_skip_mean,
        row_scale if row_scale is not None else g.row_round, de, n, d,
        g.de32.stride(0), de.stride(0), de.stride(1), scale_f,
        FILTER=filtered, ROW_SCALE=row_scale is not None, BLOCK_N=32, BLOCK_D=block_d)
    # What rounding W removed from each column of dC (the chunks that grad_c.py wrote have added
    # theirs already and zeroed it; with tma and col_round off nothing was summed), and the skip
    # model of the filtered cuBLAS chunks.
    col_round = not tma or cfg.get("col_round", True)
    if e_skip_mean is None:
        if col_round:
            rank1_dc(g.dc, g.col_round, e_mean, scale_f)
    elif col_round:
        rank1_dc(g.dc, g.col_round, e_mean, scale_f, a2=cublas_skip, x2=e_skip_mean)
    else:
        rank1_dc(g.dc, cublas_skip, e_skip_mean, scale_f)
    if bias is not None:
        dbias.copy_(g.col_sum * scale_f)
    del hungry  # held to the end, so it raises the backward's peak whatever phase peaks
    return de, g.dc, dbias


def slot_offsets(dc_bytes: int, n: int, width: int, elt: int) -> tuple[int, int, int]:
    """Byte offsets (w_start, x_start, end) of a cuBLAS chunk's W and X inside dC. X ends at dC's
    end, W lies just below it: a later chunk (never wider) writes its X only over this chunk's X,
    so this chunk's W survives until the look-ahead has read it."""
    end = dc_bytes // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    x_start = end - 4 * n * width
    w_start = (x_start - elt * n * width) // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    return w_start, x_start, end


@dataclass
class Chunk:
    """A cuBLAS chunk whose softmax gradient is launched and whose GEMMs are not yet."""
    index: int
    v_start: int
    w: torch.Tensor
    c_chunk: torch.Tensor
    num_kept: torch.Tensor = None    # pinned host copy of g.kept_count[index] (filtered chunks)
    copied: object = None            # CUDA event after that copy


def cublas_chunks(chunks, e, c, bias, targets, lse_nll, row_weight, row_weight_lse, softcap, smooth,
                  cfg, g, scale, decision=None, tma=False, tail=(), tail_work=None,
                  lookahead=False, replan=None):
    """The cuBLAS path over its chunks. lookahead (filtered calls, by default): chunk k+1's
    logits are queued before chunk k's GEMMs, so the GPU keeps working while the host waits for
    the number of columns the filter kept (it sizes the gathered GEMMs); the plan gave W two
    slots. Otherwise (exact calls: nothing to wait for) each chunk's GEMMs run right after its
    kernel, and with tma the chunks are wider. The filter's sums go straight into
    whole-vocabulary buffers (g.col_wsum, g.col_keep, g.row_skip): few launches per chunk, since
    with gradient filtering the host's launches, not the GPU, set the pace. With tma, one
    kernel (dlogits_tma.py) recomputes the logits and writes W; otherwise cuBLAS writes fp32 X
    and softmax_grad.py turns it into W. tail (tma only): chunks after those, their W in
    tail_work, without look-ahead (they share it). decision (a FilterDecision, None = exact):
    the first chunk runs as if filtering, then the host reads whether the rest do; when they do
    not, replan(v_next) -> (chunks, tail, tail_work) gives the rest of the vocabulary's chunks
    without look-ahead (tma), and the first chunk's GEMMs run at once."""
    n = e.shape[0]
    elt = e.element_size()
    filtered = decision is not None
    lookahead = lookahead and tma
    row_eps, flat = g.row_eps, None
    dc_bytes = g.dc.view(-1).view(torch.uint8)
    pinned = ([torch.empty(1, dtype=torch.int32, pin_memory=True) for _ in range(2)]
              if e.is_cuda and filtered else None)
    if tma:
        k = dict(cfg["dlogits_tma"])
        k.setdefault("SUBTILES", 1)
        k.setdefault("GROUP_N", 8)
        k.setdefault("FLATTEN", False)
        persistent = k.pop("PERSISTENT", False)  # one program per SM, looping over the tiles
        col_round = cfg.get("col_round", True)
        slots = w_slots([w for _, w in chunks], dc_bytes.numel(), n, elt, lookahead)
        e_desc = TensorDescriptor.from_tensor(e, [k["BLOCK_N"], k["BLOCK_D"]])
        c_desc = TensorDescriptor.from_tensor(c, [k["BLOCK_V"], k["BLOCK_D"]])
    else:
        k = dict(cfg["softmax_grad_filter" if filtered else "softmax_grad"])
        waves = k.pop("WAVES")
    # Arguments after the kernels' workspace ones; unused pointers get any tensor.
    def kernel_args(filters):
        sums = (bias if bias is not None else g.col_sum, targets, *lse_nll, row_weight,
                row_weight_lse if row_weight_lse is not None else row_weight,
                row_eps if filters else row_weight, g.row_round, g.col_round, g.row_skip,
                g.col_wsum if filters else g.col_round, g.col_keep if filters else g.col_round)
        return sums, dict(HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
                          FILTER=filters, HAS_GRAD_LSE=row_weight_lse is not None)

    # With tma, a chunk filters only when its dense GEMMs (4 N width D flops) would cost more
    # than the host's wait for its kept-column count and its extra launches (filter_min_flops),
    # and never in the tail, which has no look-ahead to hide that wait.
    d = e.shape[1]
    min_flops = cfg.get("filter_min_flops", 0)

    todo, num_cublas = list(chunks) + list(tail), len(chunks)

    def chunk_filters(i, width):
        return filtered and (not tma or (i < num_cublas and 4 * n * width * d >= min_flops))

    def decide(ch):
        # The first chunk's kernel is queued: the host may wait for the decision now.
        nonlocal filtered, flat
        cublas_eps, _, flat = decision.resolve()
        if cublas_eps is None:  # nothing skips: the first chunk runs dense
            filtered, ch.num_kept, ch.copied = False, None, None
    pending, i = None, -1
    while i + 1 < len(todo):
        i += 1
        v_start, width = todo[i]
        if tma:
            if i < num_cublas:
                w = dc_bytes[slots[i]:slots[i] + elt * n * width].view(e.dtype).view(n, width)
            else:
                if pending is not None:  # its W may be in tail_work too
                    finish_chunk(e, g, scale, flat, cfg, pending)
                    pending = None
                w = tail_work[:, :width]
            ch = Chunk(i, v_start, w, c[v_start:v_start + width])
            bn, bv = k["BLOCK_N"], k["BLOCK_V"]
            w_desc = TensorDescriptor.from_tensor(w, [bn, bv // k["SUBTILES"]])  # stored by slices
            tiles = triton.cdiv(n, bn) * triton.cdiv(width, bv)
            grid = (min(tiles, num_sms(e.device)) if persistent else tiles,)
            sums, flags = kernel_args(chunk_filters(i, width))
            LAST_COMPILED["dlogits_tma"] = cce_dlogits_tma_kernel[grid](
                e_desc, c_desc, w_desc, *sums, g.col_sum, n, c.shape[0], v_start, width,
                *softcap_scalars(softcap), float(smooth), D=e.shape[1],
                DOT_PRECISION=dot_precision(e.dtype), COL_ROUND=col_round, **flags, **k)
            if flags["FILTER"]:
                torch.sum(g.col_keep[v_start:v_start + width], dim=0, keepdim=True,
                          dtype=torch.int32, out=g.kept_count[i:i + 1])
                # Copied before the previous chunk's GEMMs are queued: the host then waits
                # for this kernel only, with those GEMMs still queued behind it (its W lives in
                # the other slot).
                count_to_host(ch, g, pinned)
            if i == 0 and filtered:
                decide(ch)
                if not filtered and lookahead and replan is not None:
                    finish_chunk(e, g, scale, flat, cfg, ch)
                    rest, rest_tail, tail_work = replan(v_start + width)
                    todo, num_cublas, lookahead = todo[:1] + rest + rest_tail, 1 + len(rest), False
                    slots = slots[:1] + w_slots([w for _, w in rest], dc_bytes.numel(), n, elt,
                                                lookahead=False)
                    continue
            if pending is not None:
                finish_chunk(e, g, scale, flat, cfg, pending)
            if not lookahead:
                finish_chunk(e, g, scale, flat, cfg, ch)
                continue
        else:
            w_start, x_start, end = slot_offsets(dc_bytes.numel(), n, width, elt)
            x = dc_bytes[x_start:end].view(torch.float32).view(n, width)
            w = dc_bytes[w_start:w_start + elt * n * width].view(e.dtype).view(n, width)
            ch = Chunk(i, v_start, w, c[v_start:v_start + width])
            mm_fp32(e, ch.c_chunk.t(), x)
            if pending is not None:
                finish_chunk(e, g, scale, flat, cfg, pending)
            strips = triton.cdiv(width, k["BLOCK_V"])
            splits = max(1, min(triton.cdiv(n, k["BLOCK_N"]), triton.cdiv(waves * num_sms(e.device), strips)))
            rows = triton.cdiv(triton.cdiv(n, splits), k["BLOCK_N"]) * k["BLOCK_N"]
            sums, flags = kernel_args(filtered)
            LAST_COMPILED["softmax_grad"] = cce_softmax_grad_kernel[(strips * triton.cdiv(n, rows),)](
                TensorDescriptor.from_tensor(x, [k["BLOCK_N"], k["BLOCK_V"]]),
                TensorDescriptor.from_tensor(w, [k["BLOCK_N"], k["BLOCK_V"]]),
                *sums, g.kept_count[i:] if filtered else g.col_round, g.col_sum,
                n, c.shape[0], v_start, width, rows,
                *softcap_scalars(softcap), float(smooth), **flags, **k)
            if filtered:
                count_to_host(ch, g, pinned)
                if i == 0:
                    decide(ch)
        pending = ch
    if pending is not None:
        finish_chunk(e, g, scale, flat, cfg, pending)


def count_to_host(ch, g, pinned):
    """Queue the copy of chunk ch's kept-column count to the host (a pinned buffer per look-ahead
    slot; on the CPU the count is read directly)."""
    ch.num_kept = g.kept_count[ch.index]
    if pinned is not None:
        host = pinned[ch.index % 2]
        host.copy_(g.kept_count[ch.index:ch.index + 1], non_blocking=True)
        ch.num_kept, ch.copied = host, torch.cuda.Event()
        ch.copied.record()


def finish_chunk(e, g, scale, flat, cfg, ch):
    """A cuBLAS chunk's GEMMs: dense, or on the filter's kept columns only."""
    width = ch.w.shape[1]
    dc_chunk = g.dc[ch.v_start:ch.v_start + width]
    if ch.num_kept is not None:
        if ch.copied is not None:
            ch.copied.synchronize()
        num_kept = int(ch.num_kept.item())
        col_keep = g.col_keep[ch.v_start:ch.v_start + width]
        if num_kept <= cfg["filter_max_kept"] * width:
            # Padded (with column 0, zeroed in W's copy): an unaligned count sends cuBLAS to its
            # pre-Hopper kernels, and every new count costs a heuristics query on the host.
            align = cfg["filter_kept_align"]
            size = min(width, triton.cdiv(num_kept, align) * align)
            kept = torch.nonzero_static(col_keep, size=size, fill_value=0).squeeze(1)
            sparse_chunk(e, g, scale, flat, ch, dc_chunk, kept, num_kept)
            return
        # Dense after all: nothing of this chunk is skipped. Take back the row sums that the
        # softmax-gradient kernel added to row_skip (rows that may skip: not the flat ones).
        col_keep.fill_(1)
        row_sums = ch.w.sum(dim=1, dtype=torch.float32)
        if flat.numel():
            row_sums.index_fill_(0, flat, 0.0)
        g.row_skip -= row_sums
    addmm_fp32(g.de32, ch.w, ch.c_chunk)
    if g.row_scale is not None:
        rescale_rows(g, ch.w, ch.v_start)
    mm_scaled(dc_chunk, ch.w.t(), e, float(scale))


def sparse_chunk(e, g, scale, flat, ch, dc_chunk, kept, num_kept):
    """GEMMs on the kept columns of W only (kept[:num_kept]; the rest of kept is padding). The
    skipped columns' dC rows stay zero here; the rank-1 model of what they skipped is added at the
    end (backward). Rows that may not skip (flat) get their own exact GEMMs over every column."""
    n, d = e.shape
    w = ch.w
    # W's kept columns, zero in the padding and the flat rows; their share comes off row_skip.
    wk = torch.empty((n, kept.numel()), device=e.device, dtype=e.dtype)
    LAST_COMPILED["gather_kept"] = cce_gather_kept_kernel[(triton.cdiv(n, 32),)](
        w, kept, g.row_eps, wk, g.row_skip, n, num_kept, kept.numel(), w.stride(0), wk.stride(0),
        BLOCK_N=32, BLOCK_K=64)
    dc_chunk.zero_()
    if num_kept:
        addmm_fp32(g.de32, wk, ch.c_chunk.index_select(0, kept))
        dc_kept = torch.empty((kept.numel(), d), device=e.device, dtype=e.dtype)
        mm_scaled(dc_kept, wk.t(), e, float(scale))
        dc_chunk.index_copy_(0, kept[:num_kept], dc_kept[:num_kept])
    if flat.numel():
        wf = w.index_select(0, flat)
        de_flat = torch.empty((flat.numel(), d), device=e.device, dtype=torch.float32)
        mm_fp32(wf, ch.c_chunk, de_flat)
        g.de32.index_add_(0, flat, de_flat)
        mm_scaled(dc_chunk, wf.t(), e.index_select(0, flat), float(scale), accumulate=True)


def fused_chunk(e, c, bias, targets, lse_nll, row_weight, row_weight_lse, softcap, smooth, cfg, g,
                scale, row_eps, work, e_mean, v_start, width):
    """One chunk on the fused path (dlogits.py); row_eps None = exact."""
    n, d = e.shape
    v = c.shape[0]
    dlog, kde, kdc = dict(cfg["dlogits"]), cfg["de"], cfg["dc"]
    dlog.setdefault("TILES", 1)
    dlog.setdefault("FLATTEN", False)
    bn, bv = dlog["BLOCK_N"], dlog["BLOCK_V"]
    filtered = row_eps is not None
    num_nb = triton.cdiv(n, bn)
    mask_stride = triton.cdiv(width, bv)  # the chunk's tiles, counted from v_start
    mask = torch.empty((num_nb, mask_stride) if filtered else (1,), device=e.device, dtype=torch.int8)
    row_skip_chunk = torch.zeros(n, device=e.device, dtype=torch.float32) if filtered else g.row_round
    precision = dot_precision(e.dtype)
    cublas_dc = (not filtered and e.is_cuda and cfg.get("exact_gemm") == "cublas")
    cublas_de = cublas_dc and cfg.get("exact_de", "cublas") == "cublas" and (
        e.dtype == torch.float32 or cublas_accumulates_fp32(e.device, e.dtype))

    groups = triton.cdiv(triton.cdiv(width, bv), dlog["TILES"])
    LAST_COMPILED["dlogits"] = cce_dlogits_kernel[(num_nb * groups,)](
        e, c, bias if bias is not None else e, targets, *lse_nll, row_weight,
        row_weight_lse if row_weight_lse is not None else row_weight,
        work, mask, row_eps if filtered else row_weight, g.row_round, g.col_round,
        row_skip_chunk, g.col_skip, g.col_sum,
        n, v, d, v_start, width, mask_stride, work.stride(0),
        e.stride(0), e.stride(1), c.stride(0), c.stride(1),
        *softcap_scalars(softcap), float(smooth),
        HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None, FILTER=filtered,
        HAS_GRAD_LSE=row_weight_lse is not None, DOT_PRECISION=precision, **dlog)
    w_chunk, c_chunk = work[:, :width], c[v_start:v_start + width]
    if cublas_de:
        addmm_fp32(g.de32, w_chunk, c_chunk)
    else:
        LAST_COMPILED["grad_e"] = cce_grad_e_kernel[(num_nb * triton.cdiv(d, kde["BLOCK_D"]),)](
            work, c, mask, g.de32, n, d, v_start, width, mask_stride, work.stride(0),
            c.stride(0), c.stride(1), g.de32.stride(0),
            FILTER=filtered, MASK_BV=bv, BLOCK_N=bn, DOT_PRECISION=precision, **kde)
    if g.row_scale is not None:
        rescale_rows(g, w_chunk, v_start)
    if cublas_dc:
        mm_scaled(g.dc[v_start:v_start + width], w_chunk.t(), e, float(scale))
        return  # the rounding correction comes at the end (rank1_dc)
    e_skip_mean = e_mean
    if filtered:
        e_skip_mean = weighted_mean(row_skip_chunk, e)
        g.row_skip += row_skip_chunk
    LAST_COMPILED["grad_c"] = cce_grad_c_kernel[(triton.cdiv(width, kdc["BLOCK_M"]) * triton.cdiv(d, kdc["BLOCK_D"]),)](
        work, e, mask, g.col_round, e_mean, g.col_skip, e_skip_mean, g.dc, float(scale),
        n, v, d, v_start, width, mask_stride, work.stride(0),
        e.stride(0), e.stride(1), g.dc.stride(0), g.dc.stride(1),
        FILTER=filtered, MASK_BN=bn, MASK_BV=bv, DOT_PRECISION=precision, **kdc)
    g.col_round[v_start:v_start + width] = 0  # grad_c.py has added it
