"""What the paths' autograd entries share: the rows with a target by index, the refusal of a
double backward, zero gradients."""
from __future__ import annotations

import torch
from torch import Tensor


def used_rows(used: Tensor, num_used: int, offset: int = 0) -> Tensor:
    """The indices (+ offset) of the num_used rows whose mask ``used`` is set, in order, with
    no host read (nonzero_static's size is known)."""
    index = torch.nonzero_static(used, size=num_used).squeeze(1)
    return index + offset if offset else index


def refuse_create_graph() -> None:
    """The gradients are not differentiable: a backward under create_graph=True (which runs
    with grad mode on) raises instead of returning gradients without a graph."""
    if torch.is_grad_enabled():
        raise RuntimeError("linear_cross_entropy: create_graph=True (a double backward) is not "
                           "supported: its gradients are not differentiable")


def zeros_or_none(t):
    """Zeros like t, or None for no t (no bias: no dbias)."""
    return torch.zeros_like(t) if t is not None else None
