"""The cuBLAS forward off the three-matmul path (config.Forward.cublas_min_d; paths/forward.py,
kernels/logits_lse.py): where the route sends it, what it holds, and its losses, lse and
entropy against fp64 and the pointer forward, in row chunks with a shorter last one. With
CCE_TEST_DEVICE=cuda the calls run on the GPU (bf16; the interpreter's are fp16)."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import own_kernel
from own_kernel import linear_cross_entropy
from own_kernel.paths import forward as forward_pass
from own_kernel.policy.config import (HOPPER_16BIT, PORTABLE, Forward, Tiles,
                                      overridden, with_overrides)
from own_kernel.policy.plan import cdiv, cublas_forward_rows
from own_kernel.policy.route import Call, route
from tests.test_own_kernel import reference

BF16, FP32 = torch.bfloat16, torch.float32
DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
DTYPE = torch.bfloat16 if DEV.type == "cuda" else torch.float16  # the interpreter: no bf16
LLAMA = dict(n=8192, v=128256, d=4096)
# The test config's forward reads pointers (TMA would take precedence), in chunks of 8 rows.
TINY_CHUNKS = {"forward": {"tma": False, "cublas_min_d": 1, "cublas_min_rows": 1,
                           "cublas_max_rows": 8}}


# ---- the route -------------------------------------------------------------------------------

def test_a_forward_only_call_at_wide_d_holds_its_logits_in_the_budget():
    r = route(Call(**LLAMA, dtype=BF16, needs_grad=False), PORTABLE)
    # 1 GiB holds 2093 rows of 128256 fp32 logits: four chunks of 2048
    assert r.forward == "cublas" and r.forward_rows.rows == 2048
    assert r.budget_mib == 1024 and "fp32 logits, 2048 rows a chunk" in r.note
    assert r.peak_bytes >= 2048 * 128256 * 4


@pytest.mark.parametrize("change, why", [
    (dict(d=2304), "D under forward.cublas_min_d"),
    (dict(workspace_mib=0), "no budget"),
    (dict(workspace_mib=1), "a budget of fewer rows than forward.cublas_min_rows"),
    (dict(dtype=FP32), "fp32 inputs keep IEEE dots"),
    (dict(batch_invariant=True), "cuBLAS picks its GEMMs by N"),
    (dict(vocab_parallel=True), "a vocabulary shard's partials are gathered"),
    (dict(needs_grad=True, low_memory=True), "low_memory asked for the least memory"),
])
def test_the_pointer_forward_stays_where_the_cublas_one_does_not_apply(change, why):
    call = dataclasses.replace(Call(**LLAMA, dtype=BF16, needs_grad=False), **change)
    r = route(call, PORTABLE)
    assert r.forward == "pointer" and r.forward_rows is None, why


def test_the_cublas_forward_replaces_the_pointer_one_only():
    cfg = with_overrides(HOPPER_16BIT, {"forward": {"cublas_min_d": 3072}})
    assert route(Call(**LLAMA, dtype=BF16, needs_grad=False), cfg).forward in ("tma", "ws")
    # the three-matmul path's chunks keep their own logits: no second workspace
    trained = route(Call(n=8192, v=32000, d=2048, dtype=BF16), PORTABLE)
    assert trained.path == "three-matmul" and trained.forward_rows is None


def test_a_recompute_call_says_both_what_its_budget_holds_and_why_not_three_matmul():
    r = route(Call(**LLAMA, dtype=BF16, reduction="none", workspace_mib=1024), PORTABLE)
    assert r.path == "recompute" and r.forward == "cublas"
    assert 'reduction="none"' in r.note and "fp32 logits" in r.note


@pytest.mark.parametrize("n, budget_rows, expect", [
    (8192, 2093, 2048),  # four even chunks, a multiple of 128
    (1000, 5000, 1000),  # one chunk of every row
    (300, 200, 0),       # fewer than cublas_min_rows (256) fit: none
    (100, 100, 100),     # but all of a short call's rows fit: one chunk
])
def test_cublas_forward_rows(n, budget_rows, expect):
    plan = cublas_forward_rows(n, 1000, 4096, budget_rows * 1000 * 4, PORTABLE)
    assert (plan.rows if plan else 0) == expect


def test_forward_cublas_fields_are_checked():
    for field, value in (("cublas_min_d", -1), ("cublas_min_rows", 0), ("cublas_max_rows", -1)):
        with pytest.raises(ValueError, match=f"forward.{field}"):
            Forward(Tiles(16, 16, 16, num_warps=1, num_stages=1), **{field: value})


# ---- what it computes --------------------------------------------------------------------------

def _inputs(n=37, d=16, v=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g).to(DTYPE).to(DEV)
    c = torch.randn(v, d, generator=g).to(DTYPE).to(DEV)
    bias = torch.randn(v, generator=g).to(DTYPE).to(DEV)
    t = torch.randint(0, v, (n,), generator=g).to(DEV)
    t[::5] = -100
    return e, c, bias, t


def _counted_chunks(monkeypatch) -> list:
    seen = []
    real = forward_pass.logits_partials

    def spy(x, *args, **kwargs):
        seen.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(forward_pass, "logits_partials", spy)
    return seen


def _tolerance(e, c, bias) -> float:
    """fp32 sums of D products and of V exponentials: a few ulps of the largest logit per term."""
    z_max = float((e.double() @ c.double().T).abs().max() + bias.double().abs().max())
    return 8 * (e.shape[1] + c.shape[0]) * torch.finfo(torch.float32).eps * max(z_max, 1.0)


@pytest.mark.parametrize("kw", [dict(), dict(softcap=5.0, label_smoothing=0.1),
                                dict(bias=True, reduction="none"),
                                dict(bias=True, softcap=3.0, reduction="sum")])
def test_cublas_forward_matches_fp64_in_row_chunks(monkeypatch, kw):
    e, c, bias, t = _inputs()
    b = bias if kw.pop("bias", False) else None
    chunks = _counted_chunks(monkeypatch)
    with torch.no_grad(), overridden(TINY_CHUNKS):
        assert own_kernel.plan(e, c, t, bias=b, workspace_mib=1, **kw).forward == "cublas"
        got = linear_cross_entropy(e, c, t, bias=b, workspace_mib=1, **kw)
    # 37 rows in chunks of 8: four full ones and a shorter last (V 101: a GEMM over its last 5)
    assert chunks == [8, 8, 8, 8, 5]
    want = reference(e, c, t, bias=b, softcap=kw.get("softcap"),
                     reduction=kw.get("reduction", "mean"), ls=kw.get("label_smoothing", 0.0))[0]
    assert torch.allclose(got.double(), want, rtol=0, atol=_tolerance(e, c, bias))


def test_cublas_forward_lse_and_entropy_match_the_pointer_forward(monkeypatch):
    e, c, bias, t = _inputs(seed=1)
    kw = dict(bias=bias, temperature=0.7, return_entropy=True, return_lse=True,
              reduction="none")
    chunks = _counted_chunks(monkeypatch)
    with torch.no_grad():
        with overridden({"forward": {"tma": False}}):
            want = linear_cross_entropy(e, c, t, workspace_mib=1, **kw)
        assert not chunks
        with overridden(TINY_CHUNKS):
            got = linear_cross_entropy(e, c, t, workspace_mib=1, **kw)
    assert len(chunks) == cdiv(e.shape[0], 8)
    for name, g, w in zip(("loss", "lse", "entropy"), got, want):
        assert torch.allclose(g, w, rtol=0, atol=_tolerance(e, c, bias)), name


def test_recompute_gradients_after_the_cublas_forward_match_fp64(monkeypatch):
    e, c, bias, t = _inputs(seed=2)
    e, c = e.requires_grad_(), c.requires_grad_()
    chunks = _counted_chunks(monkeypatch)
    with overridden(TINY_CHUNKS):
        assert own_kernel.plan(e, c, t, workspace_mib=1, reduction="none").path == "recompute"
        loss = linear_cross_entropy(e, c, t, workspace_mib=1, reduction="none")
        de, dc = torch.autograd.grad(loss.sum(), (e, c))
    assert len(chunks) == cdiv(e.shape[0], 8)
    want, e2, c2, _ = reference(e, c, t, reduction="none")
    de2, dc2 = torch.autograd.grad(want.sum(), (e2, c2))
    # the gradients in the input dtype: a few of its roundings
    tol = 4 * torch.finfo(DTYPE).eps
    for g, w in ((de, de2), (dc, dc2)):
        assert float((g.double() - w).norm() / w.norm()) < tol


def test_the_cublas_forward_runs_inside_torch_compile(monkeypatch):
    """Under torch.compile the custom ops route their real tensors: the cuBLAS forward runs
    there too, forward-only and before the recompute path's backward, as the eager call does."""
    e, c, _, t = _inputs(seed=3)
    chunks = _counted_chunks(monkeypatch)

    def call(e, c, t):
        return linear_cross_entropy(e, c, t, workspace_mib=1, reduction="none")

    with overridden(TINY_CHUNKS):
        compiled = torch.compile(call)
        with torch.no_grad():
            got, want = compiled(e, c, t), call(e, c, t)
        assert len(chunks) == 2 * cdiv(e.shape[0], 8)
        e1, c1 = e.clone().requires_grad_(), c.clone().requires_grad_()
        de, dc = torch.autograd.grad(compiled(e1, c1, t).sum(), (e1, c1))
        e2, c2 = e.clone().requires_grad_(), c.clone().requires_grad_()
        de2, dc2 = torch.autograd.grad(call(e2, c2, t).sum(), (e2, c2))
    assert torch.allclose(got, want, rtol=0, atol=_tolerance(e, c, torch.zeros(1)))
    # the same kernels in the same order: the same bits up to the backward's atomics
    tol = 4 * torch.finfo(DTYPE).eps
    for g, w in ((de, de2), (dc, dc2)):
        assert float((g.float() - w.float()).norm() / w.float().norm()) < tol
