"""Deliberately worse variants of whatever provider a gate measures, to prove the gate fails.

Chosen by ``CCE_GATE_INJECT`` (suite.gates.spec.parse_injection); built in the suite around
the unchanged provider, never in the kernel:

- ``slow:F`` appends ``torch.cuda._sleep`` to every timed call, after the call's own work and
  before the synchronisation that ends it, worth F of the call's time: the call is timed
  (untimed, as the benchmark times it) just before the benchmark, and the sleep's cycles per
  millisecond are measured on this GPU. Appended rather than prepended, so that it cannot hide
  behind the CPU launching the call's kernels.
- ``mem:M`` allocates M MiB before the provider's call and holds them until the loss is freed:
  through the backward of a gradient phase, through the call of a forward.
- ``err:F`` replaces the measured call's gradients by ``ref + F * (grad - ref)`` (``ref``: the
  suite's fp32 reference), rounded stochastically to the gradient's dtype: plain rounding back
  to bf16 would undo a deviation smaller than half a bf16 step, most of a bf16 gradient's error,
  while stochastic rounding is unbiased, so the error grows by at least F. Time and memory are
  measured before it and do not change.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from suite.gates.spec import Injection

MIB = 2 ** 20
SLEEP_CALIBRATION_CYCLES = 2_000_000  # ~1 ms at an H100's clock
CALIBRATION_REPS = 5
ROUNDING_SEED = 0


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


def sleep_worth(fraction: float, call_ms: float, device) -> Callable[[], None]:
    """GPU work of ``fraction`` x ``call_ms`` milliseconds, to enqueue at the end of a call."""
    cycles = int(fraction * call_ms * sleep_cycles_per_ms(device))
    return lambda: torch.cuda._sleep(cycles)


def round_stochastic(t: torch.Tensor, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """fp32 ``t`` in ``dtype``; bf16 rounded stochastically (unbiased: a random 16-bit integer
    added to the fp32 bits below bf16's mantissa, then truncated), others to nearest."""
    if dtype != torch.bfloat16:
        return t.to(dtype)
    bits = t.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, t.shape, dtype=torch.int32, device=t.device, generator=gen)
    return ((bits + noise) & -(1 << 16)).view(torch.float32).to(torch.bfloat16)


def scale_error(grad: torch.Tensor, ref: torch.Tensor, factor: float, gen: torch.Generator,
                chunk_elems: int = 1 << 24) -> None:
    """``grad`` (in place) <- ``ref + factor * (grad - ref)``, in row chunks (``ref`` may live
    on the CPU, as the suite's reference does)."""
    rows = max(1, chunk_elems // max(1, grad[0].numel() if grad.dim() > 1 else 1))
    with torch.no_grad():
        for s in range(0, grad.shape[0], rows):
            r = ref[s:s + rows].to(grad.device, torch.float32)
            g = grad[s:s + rows].float()
            grad[s:s + rows] = round_stochastic(r + factor * (g - r), grad.dtype, gen)


class Injected:
    """The measured provider, timed call and gradients of one benchmark, as the injection
    (None: none) makes them."""

    def __init__(self, injection: Injection | None):
        self.injection = injection

    @property
    def kind(self) -> str | None:
        return self.injection.kind if self.injection else None

    @property
    def text(self) -> str | None:
        return self.injection.text if self.injection else None

    def provider(self, fn: Callable) -> Callable:
        return holding_memory(fn, self.injection.amount) if self.kind == "mem" else fn

    def extra_work(self, call_ms: Callable[[], float], device) -> Callable[[], None]:
        """What to enqueue at the end of each timed call; ``call_ms()`` times the call as the
        benchmark does (asked only for ``slow``)."""
        if self.kind != "slow":
            return lambda: None
        return sleep_worth(self.injection.amount, call_ms(), device)

    def gradients(self, leaves, ref: dict) -> None:
        """Scale the error of the gradients on ``leaves`` (``e``, ``c``, ``bias``) for ``err``."""
        if self.kind != "err":
            return
        gen = torch.Generator(device=leaves.e.device).manual_seed(ROUNDING_SEED)
        for key, leaf in (("de", leaves.e), ("dc", leaves.c), ("dbias", leaves.bias)):
            if leaf is not None and leaf.grad is not None and ref.get(key) is not None:
                scale_error(leaf.grad, ref[key], self.injection.amount, gen)
