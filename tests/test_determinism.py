"""Deterministic mode (torch.use_deterministic_algorithms(True)): the kernels store each tile's
partial sums apart and the host adds them in a fixed order. On the CPU (the interpreter adds
sequentially) the result must equal the atomics' bit for bit, on every route: a partial stored
at the wrong place or summed twice shows. On a GPU (CCE_TEST_DEVICE=cuda) two calls must agree
bit for bit."""
import os

import pytest
import torch

from own_kernel import linear_cross_entropy
from own_kernel.policy.config import overridden

DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
ROUTES = {
    "tma": {},
    "cublas": {"chunks": {"recompute": "cublas"}},
}


def _grads(e0, c0, b0, t, deterministic, **kw):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        e, c, b = (x.detach().clone().requires_grad_() for x in (e0, c0, b0))
        loss = linear_cross_entropy(e, c, t, bias=b, **kw)
        loss.backward()
        return loss.detach(), e.grad, c.grad, b.grad
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("aligned", [True, False])  # misaligned e: the pointer kernels
@pytest.mark.parametrize("kw", [{}, {"filter_eps": "auto"}, {"low_memory": True},
                                {"softcap": 5.0, "reduction": "sum"}])
def test_deterministic_sums_match_the_atomics(route, aligned, kw):
    g = torch.Generator().manual_seed(7)
    n, d, v = 37, 24, 101
    e = torch.randn(n * d + 1, generator=g)
    e = (e[:n * d] if aligned else e[1:]).view(n, d).to(DEV)
    c = torch.randn(v, d, generator=g).to(DEV)
    b = (0.1 * torch.randn(v, generator=g)).to(DEV)
    t = torch.randint(0, v, (n,), generator=g).to(DEV)
    t[::5] = -100
    with overridden(ROUTES[route]):
        first = _grads(e, c, b, t, True, **kw)
        again = _grads(e, c, b, t, True, **kw)
        atomics = _grads(e, c, b, t, False, **kw)
    for x, y in zip(first, again):
        assert torch.equal(x, y)
    for x, y in zip(first, atomics):
        if DEV.type == "cpu":
            assert torch.equal(x, y)
        else:  # the atomics' order differs: the same up to rounding
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
