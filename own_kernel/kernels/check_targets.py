"""Target check and count, one program: out[0] = 1 if any target is outside [0, V) and is not
ignore_index, else 0; out[1] = the number of targets that are not ignore_index (the mean's
divisor); out[2] = that number among the first ``split`` targets (the three-matmul path's first
chunk, paths/three_matmul.py). One launch instead of six elementwise ops and a reduction; N
int64 reads are microseconds even on one SM. check_count_and_prefix adds, for a check queued
before the split is known, each target's count of used targets up to it. paths/targets.py
holds what the calls do with it (the public ``queue_targets_check`` included)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from own_kernel.kernels.gemm import HostScalar


@triton.jit
def cce_check_targets_kernel(Targets, Out, N, V, ignore_index, split, BLOCK: tl.constexpr):
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    count = tl.zeros((BLOCK,), dtype=tl.int32)
    count_split = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        t = tl.load(Targets + offs, mask=mask, other=ignore_index)
        used = mask & (t != ignore_index)
        bad = tl.maximum(bad, (used & ((t < 0) | (t >= V))).to(tl.int32))
        count += used.to(tl.int32)
        count_split += (used & (offs < split)).to(tl.int32)
    tl.store(Out, tl.max(bad, axis=0).to(tl.float32))
    tl.store(Out + 1, tl.sum(count, axis=0).to(tl.float32))
    tl.store(Out + 2, tl.sum(count_split, axis=0).to(tl.float32))


def check_and_count_targets(targets, v: int, ignore_index: int, split: int = 0):
    """(check, count): [whether any target is outside [0, V) and not ignore_index, how many are
    not ignore_index, how many of the first ``split`` are not], copied to the host without
    waiting (HostScalar; the backward reads the count there), and that count as a 0-d fp32
    device tensor (the mean's divisor). The check is queued before the forward and read after
    it is queued (its kernels mask such targets): the host then waits for this small kernel
    only, not for the forward."""
    if torch.compiler.is_compiling() or not targets.numel():
        # A data-dependent check would break the graph; eager calls still check.
        return None, (targets != ignore_index).sum()
    out = torch.empty(3, device=targets.device, dtype=torch.float32)
    cce_check_targets_kernel[(1,)](targets, out, targets.numel(), v, int(ignore_index),
                                   int(split), BLOCK=1024)
    return HostScalar(out), out[1]


# fp32 counts are exact below 2^24: longer targets queue no prefix (a split then counts anew)
PREFIX_MAX_N = 2 ** 24


def check_count_and_prefix(targets, v: int, ignore_index: int):
    """check_and_count_targets' (check, count) without a split, and the used targets up to each
    target (prefix[i]: among targets[:i + 1]) copied to the host without waiting (HostScalar):
    any split's count, read later, waits for these kernels only. The prefix is two small torch
    launches (a compare, a cumsum), made once a step where a check is queued ahead. prefix None
    where check_and_count_targets makes no check, or past PREFIX_MAX_N targets."""
    check, count = check_and_count_targets(targets, v, ignore_index)
    n = targets.numel()
    if check is None or n >= PREFIX_MAX_N:
        return check, count, None
    prefix = torch.cumsum(targets != ignore_index, 0, dtype=torch.float32)
    return check, count, HostScalar(prefix)
