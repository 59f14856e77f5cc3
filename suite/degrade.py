"""Deliberately worse variants of the own kernel's providers, to prove that the gate fails.

The kernel is not touched: each variant wraps a registered provider's call.

- ``slow``: one extra forward pass of the same provider under ``torch.no_grad()``, its result
  dropped, before the real call. The forward phase takes about twice as long, the forward +
  backward about one forward longer (~+20 % or more); the extra pass keeps only a few floats, so
  memory and errors stay as they were.
- ``hungry``: with autograd on, an extra (V/4, D) buffer of the classifier's dtype is allocated
  before the call and held until the backward has run through the classifier (by a pass-through
  autograd node on ``c``). The peak memory of forward + backward grows by V*D/2 bytes (281 MiB at
  Gemma 2 (2B)); the buffer is never written, so time and errors stay as they were. Forwards
  under ``no_grad`` are left as they are.

:func:`register_degraded` registers ``<provider>_<mode>`` (``own_slow``, ``own_filter_hungry``,
...), so a run's rows name what was measured; the gate compares them with the baseline of the
provider they degrade.
"""
from __future__ import annotations

import dataclasses

import torch

from suite import registry

from suite import catalog

DEGRADE_MODES = ("slow", "hungry")
DEGRADABLE = ("own", "own_filter")


def degraded_name(provider: str, mode: str) -> str:
    if mode not in DEGRADE_MODES:
        raise ValueError(f"degrade mode must be one of {', '.join(DEGRADE_MODES)}, got {mode!r}")
    return f"{provider}_{mode}"


def base_provider(name: str) -> str:
    """``own_slow`` -> ``own``; names that are no degraded variant come back unchanged."""
    for provider in DEGRADABLE:
        for mode in DEGRADE_MODES:
            if name == degraded_name(provider, mode):
                return provider
    return name


def slow(fn):
    def call(e, c, targets, **kwargs):
        with torch.no_grad():
            fn(e, c, targets, **kwargs)  # the extra forward pass: the deliberate waste
        return fn(e, c, targets, **kwargs)

    return call


class _HoldUntilBackward(torch.autograd.Function):
    """Identity on a tensor whose autograd node keeps ``buffer`` alive until its backward."""

    @staticmethod
    def forward(ctx, x, buffer):
        ctx.buffer = buffer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        del ctx.buffer
        return grad, None


def hungry_buffer_shape(v: int, d: int) -> tuple[int, int]:
    return (max(v // 4, 1), d)


def hungry(fn):
    def call(e, c, targets, **kwargs):
        if not (torch.is_grad_enabled() and (c.requires_grad or e.requires_grad)):
            return fn(e, c, targets, **kwargs)
        buffer = torch.empty(hungry_buffer_shape(*c.shape), dtype=c.dtype, device=c.device)
        if c.requires_grad:
            c = _HoldUntilBackward.apply(c, buffer)
        else:
            e = _HoldUntilBackward.apply(e, buffer)
        del buffer  # only the autograd node holds it now
        return fn(e, c, targets, **kwargs)

    return call


WRAPPERS = {"slow": slow, "hungry": hungry}


def register_degraded(mode: str, providers=DEGRADABLE) -> list[str]:
    """Register the ``mode`` variant of each of ``providers``; returns the variants' names.
    Registering again returns the same names."""
    names = []
    for provider in providers:
        base = catalog.get(provider)
        name = degraded_name(base.name, mode)
        if name not in registry.PROVIDERS:
            registry.PROVIDERS[name] = dataclasses.replace(
                base, name=name, fn=WRAPPERS[mode](base.fn), label=f"{base.label} ({mode})",
                summary=f"{base.summary}; deliberately degraded ({mode}, suite/degrade.py)")
        names.append(name)
    return names
