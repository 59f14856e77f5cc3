"""Every path of linear_cross_entropy under what autograd allows, against an fp64 reference:
retain_graph and repeated backwards, gradients accumulated into existing .grad, c tied to the
input embedding (it gets gradients from two places), no_grad and inference_mode, and
torch.compile; a double backward (create_graph=True) is refused by name.

A property test (hypothesis) draws the call sequence, the options and the path; the paths are
reached through the public options (workspace_mib, low_memory, filter_eps) and checked with
own_kernel.plan, so each example runs the path it names. On the CPU the kernels run under the
Triton interpreter (fp32, fp16: its bf16 arithmetic is wrong); on a CUDA GPU (no
TRITON_INTERPRET) bf16 is drawn too.

Tolerances: norm-wise relative errors within ``8 eps sqrt(V + D)`` of the dtype (the rounding
of W's entries and of the outputs, summed over a reduction of V or D terms), plus, filtered,
the filter's eps times V (every skipped entry at most eps of its row's weight).
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import own_kernel  # noqa: E402
from own_kernel import linear_cross_entropy  # noqa: E402
from own_kernel.policy.options import AUTO_EPS  # noqa: E402
from own_kernel.policy.config import overridden  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV.type == "cuda" else [])
BIG_BUDGET = 64  # MiB: every tiny call's chunks fit

# path name -> (the options that select it, the path own_kernel.plan must report for a call
# with gradients; None: whichever the route picks, e.g. the default budget)
PATHS = {
    "default": (dict(), None),
    "recompute": (dict(workspace_mib=0), "recompute"),  # fused.zero_budget "recompute" (PINNED)
    "zero-budget": (dict(workspace_mib=0), None),  # on Hopper 16-bit: chunks in its memory
    "three-matmul": (dict(workspace_mib=BIG_BUDGET), "three-matmul"),
    "three-matmul-chunks": (dict(workspace_mib=BIG_BUDGET), "three-matmul"),  # max_rows 5
    "low-memory": (dict(low_memory=True), "low-memory"),
    "filter": (dict(filter_eps="auto", workspace_mib=0), "recompute"),
    "filter-three-matmul": (dict(filter_eps="auto", workspace_mib=BIG_BUDGET), "three-matmul"),
}
CHUNKED = {"fused": {"max_rows": 5, "min_rows": 1, "min_chunk_flops": 0}}  # several chunks, tiny N
# the config each path runs under: several chunks at tiny N, any target; the recompute path
# pinned at a 0 MiB budget (Hopper's 16-bit calls take the three-matmul path there where it fits)
PINNED = {"three-matmul-chunks": CHUNKED, "recompute": {"fused": {"zero_budget": "recompute"}}}


def tolerance(dtype, v, d, filtered):
    eps = torch.finfo(dtype).eps
    return 8 * eps * math.sqrt(v + d) + (AUTO_EPS[dtype] * v if filtered else 0.0)


def rel(a, b):
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))


class Problem:
    """Leaves x (N x D) and c (V x D) (and bias); e = x, or with c tied, x + c[ids] / 4 (c is
    also the input embedding, so its gradient has two sources). The objective weights a
    reduction "none" by g, so that each row's upstream gradient differs."""

    def __init__(self, n, d, v, dtype, seed, tie, has_bias, ignored):
        g = torch.Generator().manual_seed(seed)
        self.x = (0.5 * torch.randn(n, d, generator=g)).to(dtype)
        self.c = (0.5 * torch.randn(v, d, generator=g)).to(dtype)
        self.bias = (0.3 * torch.randn(v, generator=g)).to(dtype) if has_bias else None
        self.t = torch.randint(0, v, (n,), generator=g)
        if ignored:
            self.t[::3] = -100
        self.ids = torch.randint(0, v, (n,), generator=g)
        self.g = torch.randn(n, generator=g)
        self.grad0 = [torch.randn(p.shape, generator=g, dtype=torch.float64) / 8
                      for p in self.leaves(dtype=torch.float64, device="cpu")]
        self.tie = tie

    def leaves(self, dtype=None, device=DEV):
        out = [self.x, self.c] + ([self.bias] if self.bias is not None else [])
        return [p.to(device=device, dtype=dtype or p.dtype).clone().requires_grad_()
                for p in out]

    def objective(self, leaves, lce, reduction):
        x, c, bias = leaves[0], leaves[1], leaves[2] if len(leaves) > 2 else None
        ids, t, g = (a.to(x.device) for a in (self.ids, self.t, self.g))
        e = x + c[ids] / 4 if self.tie else x
        loss = lce(e, c, t, bias, reduction)
        return (loss * g.to(loss.dtype)).sum() if reduction == "none" else loss


def reference_lce(e, c, t, bias, reduction):
    z = e @ c.T + (bias if bias is not None else 0)
    return F.cross_entropy(z, t, reduction=reduction)


def run_sequence(problem, leaves, lce, reduction, steps, accumulate):
    """The call once, then its backwards (retain_graph on all but the last), into .grad
    pre-filled with problem.grad0 when accumulate."""
    if accumulate:
        for p, g0 in zip(leaves, problem.grad0):
            p.grad = g0.to(p.device, p.dtype).clone()
    out = problem.objective(leaves, lce, reduction)
    for k in range(steps):
        out.backward(retain_graph=k < steps - 1)
    return out


def check_sequence(problem, opts, reduction, steps, accumulate, dtype, tol, compile_=False):
    ref_leaves = problem.leaves(torch.float64, device="cpu")
    ref = run_sequence(problem, ref_leaves, reference_lce, reduction, steps, accumulate)

    def lce(e, c, t, bias, reduction):
        return linear_cross_entropy(e, c, t, bias=bias, reduction=reduction, **opts)

    leaves = problem.leaves()
    fn = torch.compile(lce, backend="aot_eager", dynamic=False) if compile_ else lce
    out = run_sequence(problem, leaves, fn, reduction, steps, accumulate)
    assert abs(float(out) - float(ref)) <= tol * max(1.0, abs(float(ref))), (float(out), float(ref))
    for name, p, r in zip(("x", "c", "bias"), leaves, ref_leaves):
        assert p.grad is not None and p.grad.dtype == dtype, name
        err = rel(p.grad.cpu(), r.grad)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g}"


# One test per path (xdist spreads them; on a GPU each example compiles kernels for its
# specialisations, so one test over every path outlived any per-test timeout).
@pytest.mark.parametrize("path", sorted(PATHS))
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(reduction=st.sampled_from(["mean", "sum", "none"]),
       dtype=st.sampled_from(DTYPES), n=st.integers(1, 24), d=st.sampled_from([8, 16, 32]),
       v=st.integers(2, 80), steps=st.integers(1, 3), accumulate=st.booleans(),
       tie=st.booleans(), has_bias=st.booleans(), ignored=st.booleans(),
       seed=st.integers(0, 2**16))
def test_every_path_under_autograd_sequences(path, reduction, dtype, n, d, v, steps, accumulate,
                                             tie, has_bias, ignored, seed):
    opts, expect = PATHS[path]
    problem = Problem(n, d, v, dtype, seed, tie, has_bias, ignored)
    if reduction == "mean" and ignored and n == 1:
        ignored = False  # a mean over no target is NaN, as in torch: not this test's subject
        problem.t[:] = problem.t.clamp_min(0)
    tol = tolerance(dtype, v, d, "filter_eps" in opts)
    with overridden(PINNED.get(path, {})):
        leaves = problem.leaves()
        planned = own_kernel.plan(leaves[0], leaves[1], problem.t.to(DEV), bias=None if
                                  not has_bias else leaves[2], reduction=reduction, **opts)
        if expect is not None:  # reduction "none" takes the recompute path whatever the budget
            assert planned.path == (expect if reduction != "none" or expect == "low-memory"
                                    else "recompute"), planned
        check_sequence(problem, opts, reduction, steps, accumulate, dtype, tol)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode_return_the_loss_without_a_graph(path, mode):
    problem = Problem(10, 16, 30, torch.float32, 3, tie=False, has_bias=True, ignored=True)
    opts = PATHS[path][0]
    x, c, bias = problem.leaves()
    ref = reference_lce(*(a.detach().double().cpu() for a in (x, c)), problem.t,
                        bias.detach().double().cpu(), "mean")
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with context:
        assert own_kernel.plan(x, c, problem.t.to(DEV), bias=bias, **opts).path == "forward-only"
        loss = linear_cross_entropy(x, c, problem.t.to(DEV), bias=bias, **opts)
    assert not loss.requires_grad
    tol = tolerance(torch.float32, 30, 16, False)
    assert abs(float(loss) - float(ref)) <= tol * abs(float(ref))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_double_backward_is_refused_by_name(path):
    problem = Problem(9, 16, 24, torch.float32, 4, tie=False, has_bias=False, ignored=False)
    x, c = problem.leaves()
    loss = linear_cross_entropy(x, c, problem.t.to(DEV), **PATHS[path][0])
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(loss, (x, c), create_graph=True)


def test_a_second_backward_without_retain_graph_says_so():
    problem = Problem(9, 16, 24, torch.float32, 4, tie=False, has_bias=False, ignored=False)
    x, c = problem.leaves()
    loss = linear_cross_entropy(x, c, problem.t.to(DEV), workspace_mib=BIG_BUDGET)
    loss.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_retains_accumulates_and_ties(reduction):
    """The compiled entry (custom ops) under the same sequence: two backwards (retain_graph),
    into pre-filled .grad, c tied to the input embedding."""
    problem = Problem(12, 16, 40, torch.float32, 6, tie=True, has_bias=True, ignored=True)
    torch._dynamo.reset()
    check_sequence(problem, {}, reduction, 2, True, torch.float32,
                   tolerance(torch.float32, 40, 16, False), compile_=True)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_retain_graph_then_a_second_backward_doubles_the_gradients(path):
    """The default call's first reported failure: a second backward through a kept graph."""
    problem = Problem(11, 16, 33, torch.float32, 8, tie=False, has_bias=True, ignored=True)
    check_sequence(problem, PATHS[path][0], "mean", 2, False, torch.float32,
                   tolerance(torch.float32, 33, 16, "filter_eps" in PATHS[path][0]))
