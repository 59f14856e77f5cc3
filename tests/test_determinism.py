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


# ---- the atomics' memory order (CPU: compiled for sm90) ---------------------------------------

_ACCUMULATE_PTX = '''
import importlib.util, json, os, tempfile
from triton import compile as triton_compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# a kernel of one tile.accumulate, in a file (Triton reads a kernel's source)
SOURCE = """
import triton
import triton.language as tl
from own_kernel.kernels.tile import accumulate

@triton.jit
def add_rows(Sums, Part, Val, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    accumulate(Sums + offs, Part + offs, tl.load(Val + offs), offs < BLOCK, False)
"""
path = os.path.join(tempfile.mkdtemp(), "accumulate_probe.py")
open(path, "w").write(SOURCE)
spec = importlib.util.spec_from_file_location("accumulate_probe", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
src = ASTSource(mod.add_rows, {"Sums": "*fp32", "Part": "*fp32", "Val": "*fp32",
                               "BLOCK": "constexpr"}, {"BLOCK": 128})
print(json.dumps({"ptx": triton_compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]}))
'''


def test_tile_sums_are_relaxed_atomics():
    """The kernels' sums (tile.accumulate) are relaxed atomics: Triton's default, acq_rel,
    returns the old value, and each tile waited on that round trip to L2
    (results/notes/relaxed-atomics.md)."""
    from tests.gluon_sm90 import compiled_for_sm90, global_atomic_orders
    orders = global_atomic_orders(compiled_for_sm90(_ACCUMULATE_PTX)["ptx"])
    assert orders and set(orders) == {"relaxed"}
