"""Forward: per-row log-sum-exp of softcap(E @ C.T + b) without materialising N x V.

Grid = (row blocks) x (vocabulary splits). Each program streams its split of C in BLOCK_V tiles
and keeps an online log-sum-exp in fp32, base 2 (running max m2, running sum s). Row blocks vary
fastest in the program id, so the programs resident at one time read the same C tiles and share
them through L2. FLATTEN lets the compiler pipeline loads across tile boundaries (the next tile's
first loads overlap this tile's epilogue). The splits' partial (m2, s) are combined in O(splits*N),
with the target logit (target.py) and the sum of logits (label smoothing, from this loop) into
each row's loss (lse_combine.py).
"""
import functools
import heapq

import torch
import triton
import triton.language as tl

from own_kernel.forward_tma import cce_fwd_tma_kernel
from own_kernel.lse_combine import cce_lse_combine_kernel
from own_kernel.target import cce_target_logit_kernel
from own_kernel.tile import (logit_tile, lse_tile_update, row_block_and_split, skip_if_all_ignored,
                             softcap_scalars)


@triton.jit
def cce_fwd_kernel(E, C, Bias, Targets, Part,
                   N, V, D, v_per_split, plane, splits, group_rows, ignore_index,
                   stride_en, stride_ed, stride_cv, stride_cd,
                   tanh_scale, softcap_log2e,
                   HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                   SKIP_IGNORED: tl.constexpr,
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

    m2 = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z2_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in tl.range(v_start, v_end, BLOCK_V, flatten=FLATTEN):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_mask = offs_v < v_end
        x = logit_tile(E, C, Bias, offs_n, offs_v, n_mask, v_mask, D,
                       stride_en, stride_ed, stride_cv, stride_cd,
                       HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION)
        m2, s, z2_sum = lse_tile_update(x, m2, s, z2_sum, v_mask, tanh_scale, softcap_log2e,
                                        HAS_SOFTCAP, NEED_ZSUM)

    base = Part + split.to(tl.int64) * N + offs_n
    tl.store(base, m2, mask=n_mask)
    tl.store(base + plane, s, mask=n_mask)
    if NEED_ZSUM:
        tl.store(base + 2 * plane, z2_sum, mask=n_mask)


# The last compiled kernel of each launch site, for own_kernel.tune's resource report.
LAST_COMPILED: dict = {}


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs get true fp32 products (Triton's default for fp32 is tf32, ~3e-4 error).
    return "ieee" if dtype == torch.float32 else "tf32"


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def target_logit(e, c, bias, targets, softcap):
    n, d = e.shape
    out = torch.empty(n, device=e.device, dtype=torch.float32)
    if n:
        block_n = 16
        cce_target_logit_kernel[(triton.cdiv(n, block_n),)](
            e, c, bias if bias is not None else e, targets, out, n, c.shape[0], d,
            e.stride(0), e.stride(1), c.stride(0), c.stride(1),
            float(softcap or 1.0), softcap_scalars(softcap)[0],
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
            BLOCK_N=block_n, BLOCK_D=min(128, triton.next_power_of_2(max(d, 16))))
    return out


@functools.lru_cache(maxsize=256)
def balanced_splits(num_nb: int, num_tiles: int, slots: int, min_splits: int = 1) -> int:
    """Vocabulary splits per row block (at least min_splits). Every program of a split streams
    the same number of tiles, so the GPU runs them in waves of `slots` (resident programs); a
    last wave that is partly empty idles the rest of the GPU for a whole program's time (Gemma 2
    (2B) on 132 SMs: 64 row blocks x 5 splits = 2.4 waves, 19 % idle). Pick the split count whose
    simulated makespan (tiles, plus one tile of per-program overhead) is least; fewer splits on
    ties."""
    lo = max(1, min(min_splits, num_tiles))
    hi = max(lo, min(num_tiles, max(1, 8 * slots // num_nb + 2)))
    best, best_time = lo, None
    for splits in range(lo, hi + 1):
        per = triton.cdiv(num_tiles, splits)
        lengths = [min(per, num_tiles - k * per) + 1 for k in range(triton.cdiv(num_tiles, per))]
        free = [0] * slots  # list scheduling in launch order, as the hardware dispatches
        heapq.heapify(free)
        for length in lengths:
            for _ in range(num_nb):
                heapq.heappush(free, heapq.heappop(free) + length)
        time = max(free)
        if best_time is None or time < best_time * 0.995:
            best, best_time = splits, time
    return best


def split_plan(n: int, v: int, d: int, elt: int, cfg: dict, slots: int) -> tuple[int, int]:
    """(vocabulary splits, row blocks per launch group) of the forward's grid. Each program
    re-reads its E block (BLOCK_N x D) for every C tile. With many row blocks resident at once
    (N 32768: 132 blocks of 128 x 2304 = 78 MB) those blocks do not fit in L2 and come from DRAM
    on every tile; fwd_l2_mib bounds the E bytes the resident programs share: at least enough
    splits that slots / splits row blocks fit, launched in groups of that many row blocks
    (tile.py's row_block_and_split)."""
    k = cfg["fwd"]
    num_nb, num_tiles = triton.cdiv(n, k["BLOCK_N"]), max(1, triton.cdiv(v, k["BLOCK_V"]))
    e_block = k["BLOCK_N"] * d * elt
    budget = cfg.get("fwd_l2_mib", 0) * 2**20
    min_splits = 1
    if budget and min(num_nb, slots) * e_block > budget:
        min_splits = triton.cdiv(slots, max(1, int(budget // e_block)))
    if cfg.get("fwd_balance", True):
        splits = balanced_splits(num_nb, num_tiles, slots, min_splits)
    else:  # enough splits to fill the GPU `waves` times
        splits = max(1, min(triton.cdiv(cfg["waves"] * slots, num_nb), num_tiles))
    v_per_split = triton.cdiv(num_tiles, splits) * k["BLOCK_V"]
    splits = max(1, triton.cdiv(v, v_per_split))  # no empty split
    group_rows = num_nb if min_splits == 1 else min(num_nb, triton.cdiv(slots, splits))
    return splits, group_rows


def tma_ready(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor can be read through a TMA descriptor (forward_tma.py)."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0)


def forward(e, c, bias, targets, softcap, label_smoothing, ignore_index, cfg, skip_ignored=False):
    """Returns (loss, lse, p_max, nll), each (N,) fp32, natural log units: each row's loss (0
    where the target is ignore_index), log-sum-exp, largest softmax probability (the gradient
    filter's flatness test), and -log of the target's probability (the backward's target
    column; lse_combine.py says why it is kept apart). Rows whose target is outside [0, V) and not ignore_index get a
    loss without the target term (the caller raises on them). skip_ignored: rows whose target
    is ignore_index get lse +inf and p_max 0 (no gradient flows through them: the backward's
    softmax exp(z - lse) is 0 there), and row blocks with only such rows compute no logits."""
    n, d = e.shape
    v = c.shape[0]
    need_zsum = label_smoothing > 0
    outs = [torch.empty(n, device=e.device, dtype=torch.float32) for _ in range(4)]
    if n == 0:
        return tuple(outs)  # distinct tensors: a custom op's outputs may not alias each other
    k = dict(cfg["fwd"])
    bn, bv = k["BLOCK_N"], k["BLOCK_V"]
    k.setdefault("FLATTEN", False)
    tma = k.pop("TMA", False) and v > 0 and tma_ready(e) and tma_ready(c)
    slots = k.pop("SLOTS_PER_SM", 1) * num_sms(e.device)
    num_nb, num_tiles = triton.cdiv(n, bn), max(1, triton.cdiv(v, bv))
    splits, group_rows = split_plan(n, v, d, e.element_size(), cfg, slots)
    v_per_split = triton.cdiv(num_tiles, splits) * bv
    part = torch.empty((3 if need_zsum else 2, splits, n), device=e.device, dtype=torch.float32)
    common = dict(HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
                  NEED_ZSUM=need_zsum, SKIP_IGNORED=skip_ignored,
                  DOT_PRECISION=dot_precision(e.dtype), **k)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bd = k["BLOCK_D"]
        LAST_COMPILED["fwd"] = cce_fwd_tma_kernel[(num_nb * splits,)](
            TensorDescriptor.from_tensor(e, [bn, bd]), TensorDescriptor.from_tensor(c, [bv, bd]),
            bias if bias is not None else e, targets, part, n, v, v_per_split, splits * n, splits,
            group_rows, int(ignore_index), *softcap_scalars(softcap), D=d, **common)
    else:
        LAST_COMPILED["fwd"] = cce_fwd_kernel[(num_nb * splits,)](
            e, c, bias if bias is not None else e, targets, part,
            n, v, d, v_per_split, splits * n, splits, group_rows, int(ignore_index),
            e.stride(0), e.stride(1), c.stride(0), c.stride(1),
            *softcap_scalars(softcap), **common)
    z_target = target_logit(e, c, bias, targets, softcap)
    block = 256
    cce_lse_combine_kernel[(triton.cdiv(n, block),)](
        part, z_target, targets, *outs, n, splits, splits * n, int(ignore_index),
        float(label_smoothing), float(label_smoothing) / max(v, 1),
        NEED_ZSUM=need_zsum, SKIP_IGNORED=skip_ignored, BLOCK_N=block)
    return tuple(outs)
