"""The targets' check and counts a call reads (kernels/check_targets.py launches the check).

Reading the check waits for its kernel: queued right before the loss, that is a wait for
everything queued before it (a model's whole forward), and under FSDP2 the host then no longer
runs ahead to queue the backward's collectives. ``queue_targets_check`` queues it earlier (the
Hugging Face patch: before the model's trunk), so the read finds it done. A queued check
depends on the targets alone, not on how the call will chunk them: it also keeps each target's
count of used targets up to it (a prefix, copied to the host with the check), from which the
three-matmul path reads its first chunk's count. Without the prefix, that count would be a
second, small launch queued at the call, after the forward, and its read a wait for it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from own_kernel.kernels import check_targets
from own_kernel.kernels.gemm import HostScalar


def raise_on_bad_targets(check, targets: torch.Tensor, v: int, ignore_index: int) -> None:
    """ValueError naming the first target outside [0, V) that is not ignore_index, if any
    (check: the targets' check, or None where none was made)."""
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
    modified since), vocabulary size and ignore_index are the same, else checks anew. split:
    how many first targets it also counted (0: none); prefix: the used targets up to each
    target, on the host when read (None: not kept)."""
    check: HostScalar | None
    count: torch.Tensor
    key: tuple
    split: int = 0
    prefix: HostScalar | None = None


def targets_check_key(targets: torch.Tensor, v: int, ignore_index: int) -> tuple:
    """What a check depends on: the targets as the kernels read them (flat int64, contiguous:
    api._kernel_layouts' view of contiguous int64 targets shares their memory)."""
    return (targets.device, targets.data_ptr(), targets.dtype, tuple(targets.shape),
            targets.stride(), targets._version, int(v), int(ignore_index))


def queue_targets_check(targets: torch.Tensor, v: int, ignore_index: int,
                        split: int = 0) -> TargetsCheck | None:
    """The check of contiguous int64 ``targets`` (any shape), queued now; ``split``: also count
    the targets among the first split (a call whose three-matmul chunks hold that many rows
    then reads it from here; any other call uses the check all the same). None under
    torch.compile (the call checks nothing there) or for targets the call would copy."""
    if (torch.compiler.is_compiling() or targets.dtype != torch.int64
            or not targets.is_contiguous()):
        return None
    flat = targets.reshape(-1)
    key = targets_check_key(flat, v, ignore_index)
    if split:
        check, count = check_targets.check_and_count_targets(flat, v, ignore_index, split)
        return TargetsCheck(check, count, key, int(split))
    check, count, prefix = check_targets.check_count_and_prefix(flat, v, ignore_index)
    return TargetsCheck(check, count, key, 0, prefix)


class _FirstCounted:
    """A queued check's values [bad, used, used among the first `split` targets], that last
    count for a split the check was not queued with: 0 (no split), all of them (a split past
    the end), the queued prefix's entry, or a small launch of its own over the first targets
    (``first``)."""

    def __init__(self, check: HostScalar, first: HostScalar | None, split: int,
                 prefix: HostScalar | None = None):
        self.check, self.first, self.split, self.prefix = check, first, split, prefix

    def values(self) -> list[float]:
        bad, used = self.check.values()[:2]
        if self.first is not None:
            return [bad, used, self.first.values()[1]]
        if self.prefix is not None:
            return [bad, used, self.prefix.at(self.split - 1)]
        return [bad, used, used if self.split else 0.0]


def queued_or_new_check(queued: TargetsCheck | None, targets: torch.Tensor, v: int,
                        ignore_index: int, split: int):
    """(check, count) of the kernels' flat ``targets``: ``queued``'s where it was computed for
    exactly these (no new check, and its read does not wait for the kernels queued since),
    else check_and_count_targets' now. check.values(): [whether a target is bad, how many are
    used, how many of the first ``split``]."""
    if (queued is None or torch.compiler.is_compiling()
            or queued.key != targets_check_key(targets, v, ignore_index)):
        return check_targets.check_and_count_targets(targets, v, ignore_index, split=split)
    if queued.check is None or queued.split == split:
        return queued.check, queued.count
    if not 0 < split < targets.numel():  # no split, or past the end: no count of its own
        return _FirstCounted(queued.check, None, split), queued.count
    if queued.prefix is not None:
        return _FirstCounted(queued.check, None, split, queued.prefix), queued.count
    first, _ = check_targets.check_and_count_targets(targets[:split], v, ignore_index)
    return _FirstCounted(queued.check, first, split), queued.count
