"""Target check and count, one program: out[0] = 1 if any target is outside [0, V) and is not
ignore_index, else 0; out[1] = the number of targets that are not ignore_index (the mean's
divisor); out[2] = that number among the first ``split`` targets (the three-matmul path's first
chunk, paths/three_matmul.py). One launch instead of six elementwise ops and a reduction; N
int64 reads are microseconds even on one SM. paths/targets.py holds what the calls do with it
(the public ``queue_targets_check`` included)."""
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
