"""Target check and count, one program: out[0] = 1 if any target is outside [0, V) and is not
ignore_index, else 0; out[1] = the number of targets that are not ignore_index (the mean's
divisor); out[2] = that number among the first ``split`` targets (the three-matmul path's first
chunk, fused.py). One launch instead of six elementwise ops and a reduction; N int64 reads are
microseconds even on one SM.

Reading the check waits for its kernel: queued right before the loss, that is a wait for
everything queued before it (a model's whole forward), and under FSDP2 the host then no longer
runs ahead to queue the backward's collectives. ``queue_targets_check`` queues it earlier (the
Hugging Face patch: before the model's trunk), so the read finds it done."""
from __future__ import annotations

from dataclasses import dataclass

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


def raise_on_bad_targets(check: HostScalar | None, targets: torch.Tensor, v: int,
                         ignore_index: int) -> None:
    """ValueError naming the first target outside [0, V) that is not ignore_index, if any."""
    if check is not None and check.values()[0]:
        bad = (targets != ignore_index) & ((targets < 0) | (targets >= v))
        first = targets[bad][0].item()
        raise ValueError(f"targets: value {first} is outside [0, {v}) and is not "
                         f"ignore_index={ignore_index}")


@dataclass(frozen=True)
class TargetsCheck:
    """check_and_count_targets' (check, count) of some targets, queued ahead of the call that
    reads them (``linear_cross_entropy(..., targets_check=)``), with what it was computed for:
    the call uses it only where its own targets (their memory, layout and version: not
    modified since), vocabulary size, ignore_index and split are the same, else checks anew."""
    check: HostScalar | None
    count: torch.Tensor
    key: tuple


def targets_check_key(targets: torch.Tensor, v: int, ignore_index: int, split: int) -> tuple:
    """What a check depends on: the targets as the kernels read them (flat int64, contiguous:
    api._kernel_layouts' view of contiguous int64 targets shares their memory)."""
    return (targets.device, targets.data_ptr(), targets.dtype, tuple(targets.shape),
            targets.stride(), targets._version, int(v), int(ignore_index), int(split))


def queue_targets_check(targets: torch.Tensor, v: int, ignore_index: int,
                        split: int = 0) -> TargetsCheck | None:
    """The check of contiguous int64 ``targets`` (any shape), queued now. None under
    torch.compile (the call checks nothing there) or for targets the call would copy."""
    if (torch.compiler.is_compiling() or targets.dtype != torch.int64
            or not targets.is_contiguous()):
        return None
    flat = targets.reshape(-1)
    check, count = check_and_count_targets(flat, v, ignore_index, split)
    return TargetsCheck(check, count, targets_check_key(flat, v, ignore_index, split))


def queued_or_new_check(queued: TargetsCheck | None, targets: torch.Tensor, v: int,
                        ignore_index: int, split: int):
    """(check, count) of the kernels' flat ``targets``: ``queued``'s where it was computed for
    exactly these (no new launch, and its read does not wait for the kernels queued since),
    else check_and_count_targets' now."""
    if (queued is not None and not torch.compiler.is_compiling()
            and queued.key == targets_check_key(targets, v, ignore_index, split)):
        return queued.check, queued.count
    return check_and_count_targets(targets, v, ignore_index, split=split)
