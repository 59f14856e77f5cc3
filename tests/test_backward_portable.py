"""The portable backward's writers under the interpreter: softmax_grad.py's pointer variant (tma
False, the portable target's: GPUs before Hopper have no TMA) against its descriptor variant and
fp64, on X and W whose rows are wider than the chunk, and through whole calls. With
CCE_TEST_DEVICE=cuda the cases that do not compare two variants bit for bit run on the GPU."""
import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings

from own_kernel import linear_cross_entropy
from own_kernel.policy.config import INTERPRETER, overridden, with_overrides
from own_kernel.kernels.rows import Rows, Sums
from tests.test_own_kernel import (LOW_MEMORY_SMALL, _calls, _check_call, reference, rel,
                                   spy_kernel_args)

CUBLAS = {"chunks": {"recompute": "cublas"}}
# The interpreter's chunks on any device: a GPU's config sends chunks under 1024 columns to the
# tail's pointer writer, so a tiny call there would launch no softmax_grad
CUBLAS_TINY_CHUNKS = {"chunks": {**dataclasses.asdict(INTERPRETER.chunks),
                                  "recompute": "cublas"}}
DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
# The interpreter adds a tile's sums in one order whichever variant runs; a GPU's atomics add
# them in the order the tiles finish, so two variants agree there only to rounding.
BIT_FOR_BIT = pytest.mark.skipif(
    DEV.type != "cpu", reason="compares two variants' sums bit for bit, which only the "
                              f"interpreter's sequential adds give (CCE_TEST_DEVICE={DEV.type})")


def chunk_case(dtype, *, n=19, d=24, v=53, v_start=8, width=40, pad=8, softcap=20.0, ls=0.1,
               bias=True, lse_weight=True, filters=False, seed=0, device="cpu"):
    """One backward chunk: E (n x d) and C (v x d) in dtype, their fp32 logits X (n x width at
    columns [v_start, v_start + width), as cuBLAS writes them) and W (n x width, dtype), each a
    view `pad` columns into a buffer 2 * pad columns wider (row stride != width; the buffers'
    other entries NaN), the Rows of the whole problem, zeroed Sums, and the softmax gradient in
    fp64. device: where E, C, X, W, the rows and sums live (the fp64 reference on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g).to(dtype)
    c = (3 / d**0.5 * torch.randn(v, d, generator=g)).to(dtype)
    logits = e.float() @ c.float().T
    b = 0.1 * torch.randn(v, generator=g) if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    weight = torch.rand(n, generator=g) + 0.5
    weight[::4] = 0.0  # ignored rows
    weight_lse = 0.3 * torch.rand(n, generator=g) if lse_weight else None
    z = logits.double() + (b.double() if bias else 0)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    lse = torch.logsumexp(z, 1)
    nll = lse - z.gather(1, t[:, None]).squeeze(1)
    onehot = torch.nn.functional.one_hot(t, v).double()
    wp = weight.double() + (weight_lse.double() if lse_weight else 0)
    p = torch.exp(z - lse[:, None])
    d = wp[:, None] * p - weight.double()[:, None] * ((1 - ls) * onehot + ls / v)
    # The size of d's two terms before they cancel, and the growth of a relative rounding error
    # in the kernel's fp32 z (its argument to exp is z - lse, off by eps (|z| + |lse|)): an
    # entry of the kernel's fp32 d is within eps32 * grow * (its row's largest term) of the
    # fp64 one (row-relative: the target column comes from nll, not from z - lse).
    mag = wp[:, None] * p + weight.double()[:, None] * ((1 - ls) * onehot + ls / v)
    grow = 4 + z.abs().max().item() + lse.abs().max().item()
    if softcap:
        d = d * (1 - (z / softcap) ** 2)
    eps = torch.full((n,), 0.02)
    eps[1::3] = 0.0  # rows that never skip (flat)
    x_buf = torch.full((n, width + 2 * pad), float("nan"))
    w_buf = torch.full((n, width + 2 * pad), float("nan")).to(dtype)
    x_buf[:, pad:pad + width] = logits[:, v_start:v_start + width]
    rows = Rows(*(None if a is None else a.to(device) for a in
                  (t, lse.float(), nll.float(), weight, weight_lse, eps if filters else None)))
    sums = Sums.zeros(n, v, torch.device(device), 1 if filters else None)
    e, c, x_buf, w_buf = (a.to(device) for a in (e, c, x_buf, w_buf))
    b = b.to(device) if bias else None
    x, w = x_buf[:, pad:pad + width], w_buf[:, pad:pad + width]
    return SimpleNamespace(e=e, c=c, x=x, w=w, w_buf=w_buf, bias=b, rows=rows, sums=sums, v=v,
                           v_start=v_start, softcap=softcap, ls=ls, filters=filters,
                           d=d[:, v_start:v_start + width], eps=eps, pad=pad,
                           mag=mag.amax(1, keepdim=True),
                           d_err=(EPS32 * grow * mag.amax(1, keepdim=True)).expand(n, width))


EPS32 = torch.finfo(torch.float32).eps


def sum_tol(d_err, terms, dim):
    """How far an fp32 sum along ``dim`` of entries each within ``d_err`` of the fp64 ones may
    be from the fp64 sum: their errors, plus the summation's worst case (length x eps32 x the
    sum of the terms' magnitudes)."""
    return d_err.sum(dim) + terms.shape[dim] * EPS32 * terms.abs().sum(dim)


def write_chunk(case, cfg, deterministic=False):
    """The case's W and sums from X (softmax_grad.py), tuned where the route would tune."""
    from own_kernel.kernels.softmax_grad import write_w_from_logits
    from own_kernel.policy import autotune

    tuned = not cfg.softmax_grad.tma and autotune.tunes(case.x, cfg, cfg.softmax_grad_candidates)
    write_w_from_logits(case.x, case.w, case.bias, case.rows, case.sums, case.v_start,
                        case.softcap, case.ls, cfg, v=case.v, tuned=tuned, filters=case.filters,
                        kept_count=case.sums.kept_count, deterministic=deterministic)


def recompute_chunk(case, cfg):
    """The case's W and sums from E and C (the pointer dlogits.py), tuned where the route
    would tune."""
    from own_kernel.kernels.dlogits import write_w_pointer
    from own_kernel.policy import autotune

    write_w_pointer(case.e, case.c, case.w, case.bias, case.rows, case.sums, case.v_start,
                    case.softcap, case.ls, cfg,
                    tuned=autotune.tunes(case.e, cfg, cfg.dlogits_candidates))


@BIT_FOR_BIT
@pytest.mark.parametrize("filters", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_pointer_softmax_grad_matches_tma_and_fp64_on_strided_views(dtype, filters):
    # X and W are views whose rows are wider than the chunk: the pointer variant must index rows
    # by their stride, store inside the view only, and give the descriptor variant's W and sums
    # (the interpreter runs both in the same order: bit for bit).
    cases = {}
    for tma in (False, True):
        case = cases[tma] = chunk_case(dtype, filters=filters)
        write_chunk(case, with_overrides(INTERPRETER, {"softmax_grad": {"tma": tma}}))
        assert torch.isnan(case.w_buf[:, :case.pad].float()).all()
        assert torch.isnan(case.w_buf[:, case.pad + case.x.shape[1]:].float()).all()
    got, desc = cases[False], cases[True]
    assert torch.equal(got.w, desc.w)
    for name in ("row_round", "col_round", "col_sum", "row_skip", "col_wsum", "col_keep",
                 "kept_count"):
        a, b = getattr(got.sums, name), getattr(desc.sums, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    d, w, d_err = got.d, got.w.double(), got.d_err
    # W is the kernel's fp32 d rounded to dtype (half an ulp, or the subnormal spacing)
    fin = torch.finfo(dtype)
    assert ((w - d).abs() <= (fin.eps / 2) * (d.abs() + d_err) + fin.tiny * fin.eps
            + d_err).all()
    cols = slice(got.v_start, got.v_start + d.shape[1])
    # what rounding W removed, per row and per column; dbias's column sums
    assert ((got.sums.row_round.double() - (d - w).sum(1)).abs()
            <= sum_tol(d_err, d - w, 1)).all()
    assert ((got.sums.col_round[cols].double() - (d - w).sum(0)).abs()
            <= sum_tol(d_err, d - w, 0)).all()
    assert ((got.sums.col_sum[cols].double() - d.sum(0)).abs() <= sum_tol(d_err, d, 0)).all()
    assert not got.sums.col_round[:cols.start].any() and not got.sums.col_round[cols.stop:].any()
    if filters:  # columns kept where a row that may skip (eps > 0) has an entry above its eps
        may_skip = got.eps > 0
        keep = ((d.abs() > got.eps[:, None]) & may_skip[:, None]).any(0)
        assert torch.equal(got.sums.col_keep[cols].bool(), keep)
        assert int(got.sums.kept_count[0]) == int(keep.sum())
        kept_w = w * may_skip[:, None]  # W's entries are exact; only their fp32 sum rounds
        assert ((got.sums.col_wsum[cols].double() - kept_w.sum(0)).abs()
                <= sum_tol(torch.zeros_like(kept_w), kept_w, 0)).all()


@BIT_FOR_BIT
def test_pointer_softmax_grad_deterministic_partials_match_the_atomics():
    case, again = chunk_case(torch.float16), chunk_case(torch.float16)
    cfg = with_overrides(INTERPRETER, {"softmax_grad": {"tma": False}})
    write_chunk(case, cfg)
    write_chunk(again, cfg, deterministic=True)
    assert torch.equal(case.w, again.w)
    for name in ("row_round", "col_round", "col_sum"):
        assert torch.equal(getattr(case.sums, name), getattr(again.sums, name)), name


def _spy_tma_flags(monkeypatch):
    from own_kernel.kernels import softmax_grad

    return spy_kernel_args(monkeypatch, softmax_grad, "cce_softmax_grad_kernel", "TMA")


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("dtype, softcap, has_bias", [(torch.float32, 30.0, True),
                                                      (torch.float16, None, False)])
def test_cublas_route_matches_fp64_with_either_softmax_grad(monkeypatch, tma, dtype, softcap,
                                                            has_bias):
    flags = _spy_tma_flags(monkeypatch)
    g = torch.Generator().manual_seed(11)
    n, d, v = 29, 24, 113  # cuBLAS chunks and a pointer tail
    e = torch.randn(n, d, generator=g).to(DEV, dtype).requires_grad_()
    c = torch.randn(v, d, generator=g).to(DEV, dtype).requires_grad_()
    bias = ((0.1 * torch.randn(v, generator=g)).to(DEV, dtype).requires_grad_() if has_bias
            else None)
    t = torch.randint(0, v, (n,), generator=g).to(DEV)
    t[::6] = -100
    ref, e2, c2, b2 = reference(e, c, t, bias, softcap)
    ref.backward()
    # Two roundings to the input dtype (W before the GEMMs, the gradients after them), each at
    # most one eps relative in norm, plus fp32 sums over the longest reduction (N + D + V terms).
    tol = 2 * torch.finfo(dtype).eps + EPS32 * (n + d + v)
    for filter_eps in (None, 1e-9):  # an eps below every entry skips nothing: still exact
        for x in (e, c, bias):
            if x is not None:
                x.grad = None
        flags.clear()
        # a zero budget on the recompute path: the route a GPU's config takes for a small
        # call (the three-matmul path) has no softmax_grad
        with overridden({**CUBLAS_TINY_CHUNKS, "softmax_grad": {"tma": tma}, "poison": True,
                         "fused": {"zero_budget": "recompute"}}):
            linear_cross_entropy(e, c, t, bias=bias, softcap=softcap, filter_eps=filter_eps,
                                 workspace_mib=0).backward()
        assert flags and set(flags) == {(tma,)}
        assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol
        if has_bias:
            assert rel(bias.grad, b2.grad) < tol


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_calls())
def test_random_calls_on_the_pointer_cublas_route_match_fp64(call):
    # The property test's calls (shapes, options, layouts, ignore patterns), on the cuBLAS route
    # with the pointer softmax_grad.
    with overridden({**CUBLAS, "softmax_grad": {"tma": False}, **LOW_MEMORY_SMALL}):
        _check_call(call)


def test_pointer_dlogits_writes_a_strided_w():
    # The builder's E and C give the same gradient when dlogits.py recomputes the logits.
    case = chunk_case(torch.float32, device=DEV)
    recompute_chunk(case, INTERPRETER)
    # Beyond d_err (W written from given fp32 logits), the recomputed logits carry the fp32
    # dot's rounding over D, at most D * eps32 * sum_k |e_k c_k|, in exp's argument.
    dot = (case.e.abs().double() @ case.c.abs().double().T).max().item()
    bound = case.d_err + EPS32 * case.e.shape[1] * dot * case.mag
    assert ((case.w.double().cpu() - case.d).abs() <= bound).all()
    assert torch.isnan(case.w_buf[:, :case.pad]).all()
    assert torch.isnan(case.w_buf[:, case.pad + case.x.shape[1]:]).all()
