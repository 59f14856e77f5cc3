"""Deliberately worse variants of whatever provider a gate measures, to prove the gate fails.

Chosen by ``CCE_GATE_INJECT`` (suite.gates.spec.parse_injections); built in the suite around
the unchanged provider, never in the kernel:

- ``slow:F`` appends ``torch.cuda._sleep`` to every timed call, after the call's own work and
  before the synchronisation that ends it, worth F of the call's time: just before the
  benchmark, the call is timed as the benchmark times it, without and with the sleep (sized
  from its cycles per millisecond on this GPU, then corrected upwards if it added less).
  Appended rather than prepended, so that it cannot hide behind the CPU launching the call's
  kernels.
- ``mem:M`` allocates M MiB before the provider's call and holds them until the loss is freed:
  through the backward of a gradient phase, through the call of a forward.
- ``err:F`` replaces the measured call's gradients by ``ref + F * (grad - ref)`` (``ref``: the
  suite's fp32 reference), rounded to the gradient's dtype away from the reference: rounding to
  nearest would undo a deviation smaller than half a bf16 step, most of a bf16 gradient's error,
  while rounding away keeps every element's deviation at least F times its own, so each error
  grows at least F-fold (about 4-fold at F = 2 where bf16 rounding is all of it). Time and memory
  are measured before it and do not change.
- ``loss_err:F`` replaces the measured call's loss by ``ref + F * (loss - ref)`` (in fp64, as
  the error is computed), so the loss's error grows exactly F-fold.

Several, each on one benchmark (``slow:0.1@gemma2-2b-own-loss+grad,mem:100@small-own-fwd``),
prove several checks in one process (spec.parse_injections).
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from suite.gates.spec import Injection, injections_text

MIB = 2 ** 20
SLEEP_CALIBRATION_CYCLES = 2_000_000  # ~1 ms at an H100's clock
CALIBRATION_REPS = 5


class _HoldUntilFreed(torch.autograd.Function):
    """Identity on the loss whose node keeps ``held`` alive until the graph is freed."""

    @staticmethod
    def forward(ctx, loss, held):
        ctx.held = held
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def holding_memory(fn: Callable, mib: float) -> Callable:
    """``fn`` with ``mib`` MiB allocated before its call and held as long as its loss."""
    def call(e, c, targets, **kwargs):
        held = torch.empty(int(mib * MIB), dtype=torch.uint8, device=e.device)
        loss = fn(e, c, targets, **kwargs)
        return _HoldUntilFreed.apply(loss, held) if loss.requires_grad else loss

    return call


def sleep_cycles_per_ms(device) -> float:
    """How many ``torch.cuda._sleep`` cycles take one millisecond on this GPU now."""
    times = []
    for _ in range(CALIBRATION_REPS + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(SLEEP_CALIBRATION_CYCLES)
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    return SLEEP_CALIBRATION_CYCLES / statistics.median(times[1:])  # the first warms up


def sleep_worth(fraction: float, time_call: Callable, device) -> Callable[[], None]:
    """GPU work worth ``fraction`` of the call's time, to enqueue at the end of the call.
    ``time_call(extra)`` is the call's milliseconds with ``extra`` enqueued at its end, timed as
    the benchmark times it. The sleep is sized from its cycles per millisecond, then once more
    from what it added to the call, if that fell short (the clock can differ inside the call):
    only upwards, since a short call's noise could shrink it."""
    def sleep(cycles):
        return lambda: torch.cuda._sleep(cycles)

    call_ms = time_call(lambda: None)
    wanted_ms = fraction * call_ms
    cycles = int(wanted_ms * sleep_cycles_per_ms(device))
    added_ms = time_call(sleep(cycles)) - call_ms
    if 0 < added_ms < wanted_ms:
        cycles = int(cycles * wanted_ms / added_ms)
    return sleep(cycles)


# Sign-magnitude floats as integers of their width: +1 on the bit pattern is a step away from
# zero; the smallest negative subnormal's pattern (0x80..01).
_BITS = {2: (torch.int16, -(2 ** 15) + 1), 4: (torch.int32, -(2 ** 31) + 1)}


def step_away(near: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """The float next to ``near`` (bf16, fp16 or fp32) towards the sign of ``direction``."""
    int_dtype, smallest_negative = _BITS[near.element_size()]
    bits = near.view(int_dtype)
    away_from_zero = (near > 0) == (direction > 0)
    stepped = torch.where(away_from_zero, bits + 1, bits - 1)
    smallest = torch.where(direction > 0, torch.ones_like(bits),
                           torch.full_like(bits, smallest_negative))
    return torch.where(near == 0, smallest, stepped).view(near.dtype)


def round_away(t: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp64 ``t`` in ``dtype``, rounded so that it is at least as far from ``ref`` as ``t``."""
    near = t.to(dtype)
    short = (near.double() - ref).abs() < (t - ref).abs()
    return torch.where(short, step_away(near, t - ref), near)


def scale_error(grad: torch.Tensor, ref: torch.Tensor, factor: float,
                chunk_elems: int = 1 << 24) -> None:
    """``grad`` (in place) <- ``ref + factor * (grad - ref)`` (in fp64) rounded away from
    ``ref``, in row chunks (``ref`` may live on the CPU, as the suite's reference does)."""
    rows = max(1, chunk_elems // max(1, grad[0].numel() if grad.dim() > 1 else 1))
    with torch.no_grad():
        for s in range(0, grad.shape[0], rows):
            r = ref[s:s + rows].to(grad.device, torch.float64)
            g = grad[s:s + rows].double()
            grad[s:s + rows] = round_away(r + factor * (g - r), r, grad.dtype)


class Injected:
    """The measured provider, timed call, loss and gradients of one benchmark, as the
    injections that apply to it make them (none: unchanged)."""

    def __init__(self, injections=()):
        self.injections = tuple(injections)

    def for_benchmark(self, benchmark: str) -> "Injected":
        return Injected(i for i in self.injections if i.applies_to(benchmark))

    def amount(self, kind: str) -> float | None:
        return next((i.amount for i in self.injections if i.kind == kind), None)

    @property
    def text(self) -> str | None:
        return injections_text(self.injections)

    def provider(self, fn: Callable) -> Callable:
        mib = self.amount("mem")
        return fn if mib is None else holding_memory(fn, mib)

    def extra_work(self, time_call: Callable, device) -> Callable[[], None]:
        """What to enqueue at the end of each timed call; ``time_call(extra)`` times the call
        with ``extra`` at its end as the benchmark does (used only for ``slow``)."""
        fraction = self.amount("slow")
        if fraction is None:
            return lambda: None
        return sleep_worth(fraction, time_call, device)

    def loss(self, loss: float, ref_loss: float) -> float:
        """The measured loss, its deviation from ``ref_loss`` scaled for ``loss_err``."""
        factor = self.amount("loss_err")
        return loss if factor is None else ref_loss + factor * (loss - ref_loss)

    def gradients(self, leaves, ref: dict) -> None:
        """Scale the error of the gradients on ``leaves`` (``e``, ``c``, ``bias``) for ``err``."""
        factor = self.amount("err")
        if factor is None:
            return
        for key, leaf in (("de", leaves.e), ("dc", leaves.c), ("dbias", leaves.bias)):
            if leaf is not None and leaf.grad is not None and ref.get(key) is not None:
                scale_error(leaf.grad, ref[key], factor)
