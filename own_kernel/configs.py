"""Block shapes per device, chosen by measurement on the GPU (see own_kernel/tune.py).

The interpreter (TRITON_INTERPRET=1) gets one small fixed config: it runs on numpy, and more than
one autotune config fails there. Override any field for experiments with CCE_OWN_CONFIG='{"fwd":
{"BLOCK_V": 128}}'. CCE_OWN_DEGRADE=slow|hungry deliberately worsens the kernel so that the
regression gate (suite/gate.py) can be shown to fail. CCE_OWN_POISON=1 fills the backward's
workspaces and dC with NaN before use, so a read of anything not written first shows (tests).
"""
from __future__ import annotations

import json
import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
POISON = os.environ.get("CCE_OWN_POISON") == "1"

# Mask granularity of the gradient filter = the dlogits kernel's tile (BLOCK_N x BLOCK_V).
# dE's BLOCK_M must equal BLOCK_N, dC's BLOCK_M must divide BLOCK_V, and the GEMMs' BLOCK_K
# must divide the mask tile along their reduction axis.
# exact_gemm: "cublas" runs exact mode's dC GEMM on cuBLAS, "triton" on this package's kernels
# (always used by the filtered mode); exact_de picks dE's: "cublas" (addmm into the fp32
# accumulator with out_dtype) or "triton" (grad_e.py, accumulates in place).
# workspace_mib sizes the fused path's chunk of d held between the kernels, min_chunk its least
# width. recompute: "tma" recomputes logits and writes the softmax gradient in one kernel
# (dlogits_tma.py), "cublas" recomputes them with cuBLAS into dC's unwritten tail (backward.py);
# both in chunks of cublas_min_width..cublas_max_width columns (multiples of cublas_align; with few
# tokens up to cublas_max_entries / N columns, the same workspace bytes; filtered chunks up to
# filter_max_width or filter_max_entries / N), "triton" only uses the fused dlogits kernel. filter_max_kept: a filtered cuBLAS chunk whose kept columns
# exceed this fraction runs dense; filter_kept_align: the gathered GEMMs' column count is padded to
# a multiple of it (an aligned count keeps cuBLAS on its Hopper kernels, and few distinct shapes
# keep its per-shape heuristics warm across calls); filter_max_flat: above this fraction of flat rows (which keep
# every column) the cuBLAS chunks do not filter at all.
# filter_min_flops (tma): narrower chunks than 4 N width D = this run exact instead of filtered;
# filter_min_total_flops: a call whose filtering chunks' dense GEMMs add up to less runs exact.
# tail_min_width (tma): cuBLAS chunks narrower than the tail's chunk go to the tail instead.
# filter_lookahead (tma, default True): filtered calls queue chunk k+1's kernel before chunk k's
# GEMMs (two W slots, so narrower chunks) to hide the wait for chunk k's kept-column count;
# filter_lookahead_max_n: not with more tokens than this (their chunks are narrow, and wide ones
# carry enough GPU work to absorb the wait).
# fwd_l2_mib (default 0 = off): L2 bytes for E's row blocks in the forward; see split_plan.
# col_round (tma, default True): whether dlogits_tma.py sums per column what rounding W removed,
# for dC's correction through E's mean row (the row sums, for dE's, stay).
# compact_max_used (default 15/16): the backward runs on the used rows only (gathered) when at
# most this fraction of targets is not ignore_index, and the peak allows (api.compaction_pays);
# compact_fwd_min_flops (default 0): from this many forward flops on, the forward does too.
# low_memory_* (backward_low_memory.py, low_memory=True): low_memory_frac, pass 2's workspace as a
# fraction of the gradients' bytes (default 1/16); low_memory_min_entries, the least rows x D
# (pass 1) or columns x D (pass 2) of a chunk's output (default 2^21); low_memory_row_align, row
# counts' multiple (default 128); low_memory_max_k, the longest reduction per GEMM (default 8192).
# filter_fused: whether the fused chunks behind cuBLAS chunks filter (block-sparse Triton GEMMs) or
# run exact on cuBLAS (faster on an H200 at Gemma 2 (2B) and V 32000: tune-v10-filter-fused;
# measured before the tail moved to dlogits_tma.py, it now matters with recompute="cublas" only).
_INTERPRETER = {
    "fwd": dict(BLOCK_N=16, BLOCK_V=16, BLOCK_D=16, num_warps=1, num_stages=1, TMA=True),
    "dlogits": dict(BLOCK_N=16, BLOCK_V=16, BLOCK_D=16, TILES=2, num_warps=1, num_stages=1),  # TILES>1 keeps that path tested
    "dlogits_tma": dict(BLOCK_N=16, BLOCK_V=32, BLOCK_D=16, SUBTILES=2, GROUP_N=2, num_warps=1, num_stages=1),
    "de": dict(BLOCK_D=16, BLOCK_K=16, num_warps=1, num_stages=1),
    "dc": dict(BLOCK_M=16, BLOCK_D=16, BLOCK_K=16, num_warps=1, num_stages=1),
    "waves": 2,
    "workspace_mib": 1,
    "exact_gemm": "triton",
    "softmax_grad": dict(BLOCK_N=8, BLOCK_V=16, num_warps=1, STAGES=1, WAVES=2),
    "softmax_grad_filter": dict(BLOCK_N=8, BLOCK_V=16, num_warps=1, STAGES=1, WAVES=2),
    "recompute": "tma",
    "cublas_max_width": 48,
    "cublas_min_width": 8,
    "cublas_align": 8,
    "filter_max_kept": 0.5,
    "filter_kept_align": 8,
    "filter_max_flat": 0.5,
}

# The backward's cuBLAS path, on every CUDA device.
_CUBLAS_BACKWARD = {
    "waves": 2,
    "min_chunk": 1024,
    "exact_gemm": "cublas",
    "exact_de": "cublas",
    # 16 x 128 tiles: 58 (80 filtered) registers, so 3-4 programs share an SM; at 2 per SM
    # (32 x 256) ncu saw 25 % occupancy and 40 % of the DRAM bandwidth (ncu-softmax_grad-v7).
    "softmax_grad": dict(BLOCK_N=16, BLOCK_V=128, num_warps=8, STAGES=4, WAVES=8),
    "softmax_grad_filter": dict(BLOCK_N=16, BLOCK_V=128, num_warps=8, STAGES=4, WAVES=8),
    "recompute": "cublas",
    "cublas_max_width": 4096,
    "cublas_max_entries": 4096 * 8192,
    "cublas_min_width": 1024,
    "cublas_align": 64,
    "filter_max_kept": 0.5,
    "filter_kept_align": 256,
    "filter_max_flat": 0.25,
    "filter_fused": False,
    # Calls with targets to ignore gather the used rows before the forward when it does at
    # least this many flops (2 N V D): the count's read idles the GPU for the host's next
    # launches (api._rows_to_gather); smaller calls drop ignored rows in the backward only.
    "compact_fwd_min_flops": 4e12,
}

# Hopper (sm90), 16-bit inputs.
_SM90_16BIT = {
    # Measured on an H200 (own_kernel/tune.py, outputs in own_kernel/measurements/): flattening the
    # nested tile loops and several tiles per dlogits program were slower (and the latter does
    # not compile with the filter on triton 3.6).
    "fwd": dict(BLOCK_N=128, BLOCK_V=256, BLOCK_D=64, num_warps=8, num_stages=3, FLATTEN=False,
                TMA=True),
    "dlogits": dict(BLOCK_N=128, BLOCK_V=128, BLOCK_D=64, num_warps=8, num_stages=4, TILES=1,
                    FLATTEN=False),
    "de": dict(BLOCK_D=256, BLOCK_K=64, num_warps=8, num_stages=4),
    "dc": dict(BLOCK_M=128, BLOCK_D=256, BLOCK_K=64, num_warps=8, num_stages=4),
    "workspace_mib": 40,
    **_CUBLAS_BACKWARD,
    "recompute": "tma",
    # persistent + flattened tile loop: the next tile's loads overlap this one's epilogue
    "dlogits_tma": dict(BLOCK_N=128, BLOCK_V=256, BLOCK_D=64, SUBTILES=4, GROUP_N=8, num_warps=8,
                        num_stages=3, PERSISTENT=True, FLATTEN=True),
    "cublas_max_width": 8192,
    "filter_max_width": 16384,
    # With few tokens a 16384-column chunk is too little GPU work to hide the host's per-chunk
    # wait and launches (~0.3 ms of GPU at N 2048, D 2304): up to 2^28 / N columns, i.e. 131072 at
    # N 2048, 32768 at N 8192 where dC's tail allows (tune-v12: N 2048, 2^26..2^28).
    "filter_max_entries": 2**28,
    # A filtered chunk costs the host ~0.5 ms (its count's wait, the gather's launches): about
    # the dense GEMMs of 4 N width D = 3e11 flops (tune-v10: V 32000, 15 narrow chunks, 6.7 ms idle).
    # 6e11 was slower or even at five more shapes (tune-v11: N 2048 / 8192, D 2304 / 4096).
    "filter_min_flops": 3e11,
    # Filtered calls whose filtering chunks add up to less than this (one to two chunks at
    # N 2048 and V <= 50257, N 32768 at V 32000) were slower than exact in every suite row at
    # 4065e0d (results/grid-h200*): the filter's fixed host costs exceed what it skips.
    "filter_min_total_flops": 1e12,
    # With many tokens dC's free tail holds only narrow chunks (1024 columns at N 32768, V 32000):
    # the tail's chunks in dE's buffer are wider, and 2048 wide were faster than 1024 there
    # (own_kernel/measurements/host-v14/tune-n32768-v32000.txt).
    "min_chunk": 2048,
    "tail_min_width": True,
    # Filtered lm calls without the look-ahead were faster at N 32768 (V 32000, 128256) and
    # slower at N 2048 and 8192 (measurements/tune-v15).
    "filter_lookahead_max_n": 16384,
    # The column sum is the epilogue's most expensive part (measurements/epilogue-v16/
    # epilogue-*.txt), and it barely changes dC: the final rounding to bf16 dominates dC's error
    # (epilogue-v16/colround.txt: fp64 simulation on lm inputs, against the naive baseline's).
    "col_round": False,
    # The forward's resident programs read at most this many MiB of E's row blocks (forward.py's
    # split_plan): at N 32768 all-row-blocks order read 19 GB from DRAM per call against 1.7 GB
    # with 24 (measurements/fwd-l2-v17: ncu); 24 was the fastest of 16..40 at six of seven
    # shapes from N 2048 to 32768, 3 % behind 32 at the seventh.
    "fwd_l2_mib": 24,
}

# Any other CUDA device, and fp32 inputs (IEEE fp32 dots use far more registers/shared memory).
_GENERIC = {
    "fwd": dict(BLOCK_N=64, BLOCK_V=128, BLOCK_D=32, num_warps=4, num_stages=3),
    "dlogits": dict(BLOCK_N=64, BLOCK_V=128, BLOCK_D=32, num_warps=4, num_stages=3),
    "de": dict(BLOCK_D=128, BLOCK_K=32, num_warps=4, num_stages=3),
    "dc": dict(BLOCK_M=64, BLOCK_D=128, BLOCK_K=32, num_warps=4, num_stages=3),
    "workspace_mib": 48,
    **_CUBLAS_BACKWARD,
}


def _merge(base: dict, override: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in override.items():
        if isinstance(v, dict):
            out.setdefault(k, {}).update(v)
        else:
            out[k] = v
    return out


def config_for(device: torch.device, dtype: torch.dtype) -> dict:
    if INTERPRET or device.type != "cuda":
        cfg = _INTERPRETER
    elif torch.cuda.get_device_capability(device)[0] == 9 and dtype != torch.float32:
        cfg = _SM90_16BIT
    else:
        cfg = _GENERIC
    override = os.environ.get("CCE_OWN_CONFIG")
    if override:
        cfg = _merge(cfg, json.loads(override))
    degrade = os.environ.get("CCE_OWN_DEGRADE", "")
    if degrade == "slow" and not INTERPRET:
        # Tiny tiles starve the tensor cores: a deliberate, large slowdown.
        cfg = _merge(cfg, {"fwd": dict(BLOCK_N=32, BLOCK_V=32, BLOCK_D=32, num_warps=4, num_stages=1)})
    elif degrade not in ("", "slow", "hungry"):
        raise ValueError(f"CCE_OWN_DEGRADE must be 'slow' or 'hungry', got {degrade!r}")
    _check(cfg)
    return cfg


def _check(cfg: dict) -> None:
    bn, bv = cfg["dlogits"]["BLOCK_N"], cfg["dlogits"]["BLOCK_V"]
    if bv % cfg["de"]["BLOCK_K"]:
        raise ValueError("de.BLOCK_K must divide dlogits.BLOCK_V")
    if bv % cfg["dc"]["BLOCK_M"] or bn % cfg["dc"]["BLOCK_K"]:
        raise ValueError("dc.BLOCK_M must divide dlogits.BLOCK_V and dc.BLOCK_K dlogits.BLOCK_N")
