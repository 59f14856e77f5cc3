"""No silent wrong result: views of every layout, confident fp32 rows, per-row weights far apart,
and results that depend on a call's inputs alone. Each test here failed on the kernel before its
fix (CPU, Triton interpreter; fp32 / fp16: the interpreter's bf16 arithmetic is wrong).
CCE_TEST_DEVICE=cuda runs them with the compiled kernels on a GPU."""
import os

import pytest
import torch
import torch.nn.functional as F

from own_kernel import linear_cross_entropy
from own_kernel.policy.config import overridden

DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))


def fp64_loss(e, c, t, bias=None, reduction="mean"):
    """Reference loss of leaf copies in fp64; returns (loss, e64, c64, bias64)."""
    e64 = e.detach().double().requires_grad_()
    c64 = c.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    z = e64 @ c64.T + (b64 if b64 is not None else 0)
    loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), reduction=reduction)
    return loss, e64, c64, b64


def rel(got, want):
    return float((got.double() - want).norm() / want.norm())


def grads_of(e, c, t, bias=None, **kw):
    e, c = e.detach().requires_grad_(), c.detach().requires_grad_()
    bias = bias.detach().requires_grad_() if bias is not None else None
    loss = linear_cross_entropy(e, c, t, bias=bias, **kw)
    loss.backward()
    return loss.detach(), e.grad, c.grad, (bias.grad if bias is not None else None)


# ---- layouts ------------------------------------------------------------------------------------

def _inputs(n=24, d=16, v=37, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g).to(dtype)
    c = torch.randn(v, d, generator=g).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    return e.to(DEV), c.to(DEV), t.to(DEV)


def test_strided_and_expanded_bias_match_their_contiguous_copy():
    e, c, t = _inputs()
    v = c.shape[0]
    wide = torch.randn(2 * v, generator=torch.Generator().manual_seed(1)).to(DEV)
    for bias in (wide[::2], torch.tensor([0.7], device=DEV).expand(v)):
        got = grads_of(e, c, t, bias)
        want = grads_of(e, c, t, bias.contiguous())
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_strided_targets_match_their_contiguous_copy():
    e, c, t = _inputs()
    labels = torch.stack([t, torch.randint(0, c.shape[0], t.shape, device=DEV)], dim=1)  # (N, 2)
    strided = labels[:, 0]
    assert strided.stride(0) == 2
    got = grads_of(e, c, strided)
    want = grads_of(e, c, strided.contiguous())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_transposed_and_expanded_matrices_match_their_contiguous_copies():
    e, c, t = _inputs()
    c_t = c.t().contiguous().t()  # (V, D) with strides (1, V)
    e_rows = e[:1].expand_as(e)  # every row the same storage (stride 0)
    for ee, cc in ((e, c_t), (e_rows, c)):
        got = grads_of(ee, cc, t)
        want = grads_of(ee.contiguous(), cc.contiguous(), t)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---- confident fp32 rows --------------------------------------------------------------------

def _confident(n=64, d=32, v=61, seed=0):
    """Hidden states on their target's classifier row, scaled: target probability ~ 1 - 1e-7."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    e = 3.0 * c[t] + 0.05 * torch.randn(n, d, generator=g)
    return e.to(DEV), c.to(DEV), t.to(DEV)


def test_fp32_confident_rows_losses_nonnegative_and_as_accurate_as_naive():
    e, c, t = _confident()
    rows = linear_cross_entropy(e, c, t, reduction="none")
    assert (rows >= 0).all(), f"negative per-token losses: {rows[rows < 0].tolist()}"
    ref, e64, c64, _ = fp64_loss(e, c, t)
    ref.backward()
    loss, de, dc, _ = grads_of(e, c, t)
    # naive fp32: the logits in fp32, then torch's cross-entropy
    naive, ne, nc, _ = (lambda e_, c_: (F.cross_entropy(e_ @ c_.T, t), e_, c_, None))(
        e.clone().requires_grad_(), c.clone().requires_grad_())
    naive.backward()
    assert 0 < ref.item() < 1e-4  # the rows are confident: the case under test
    for ours, theirs, want in ((loss, naive.detach(), ref.detach()), (de, ne.grad, e64.grad),
                               (dc, nc.grad, c64.grad)):
        assert rel(ours, want) <= 3 * rel(theirs, want) + 1e-12


# ---- per-row weights far apart (reduction "none") --------------------------------------------

def test_fp16_rows_keep_their_gradient_whatever_their_weight():
    e, c, t = _inputs(n=32, d=32, v=53, dtype=torch.float16, seed=3)
    weights = torch.where(torch.arange(32, device=DEV) % 2 == 0, 1e4, 1e-4)
    e_, c_ = e.clone().requires_grad_(), c.clone().requires_grad_()
    (linear_cross_entropy(e_, c_, t, reduction="none") * weights).sum().backward()
    ref, e64, c64, _ = fp64_loss(e, c, t, reduction="none")
    (ref * weights.double()).sum().backward()
    ne, nc = e.clone().requires_grad_(), c.clone().requires_grad_()
    (F.cross_entropy((ne @ nc.T).float(), t, reduction="none") * weights).sum().backward()
    for row in range(32):
        want = e64.grad[row]
        ours, naive = rel(e_.grad[row], want), rel(ne.grad[row], want)
        assert ours <= 3 * naive + 1e-3, (row, weights[row].item(), ours, naive)


# ---- a call's result depends on its inputs alone -----------------------------------------------

def test_results_do_not_depend_on_the_previous_call(monkeypatch):
    # Let the forward gather used rows at any size, so its decision is live, and record how
    # many rows each forward sees: the decision must not depend on earlier calls. No
    # workspace: the rows' route on every device (a GPU's default takes the fused path).
    import own_kernel.paths.entries as ops

    seen = []
    apply = ops.LceRowsEager.apply
    monkeypatch.setattr(ops.LceRowsEager, "apply",
                        lambda e, *rest: seen.append(e.shape[0]) or apply(e, *rest))
    e, c, t = _inputs(n=48, d=16, v=29, seed=5)
    t_masked = t.clone()
    t_masked[::3] = -100

    with overridden({"compaction": {"fwd_min_flops": 0}}):
        grads_of(e, c, t, workspace_mib=0)  # a previous call with nothing to drop
        after_full = grads_of(e, c, t_masked, workspace_mib=0)
        grads_of(e, c, t_masked, workspace_mib=0)  # a previous call with rows to drop
        after_masked = grads_of(e, c, t_masked, workspace_mib=0)
    assert len(seen) == 4 and seen[1] == seen[3], f"rows in each forward: {seen}"
    assert torch.equal(after_full[0], after_masked[0])  # the forward has no atomics
    for a, b in zip(after_full[1:3], after_masked[1:3]):  # the backward's sums do (on a GPU)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        if DEV.type == "cpu":
            assert torch.equal(a, b)


# ---- documented conventions ----------------------------------------------------------------

def test_none_with_shift_returns_the_positions_that_predict_and_mean_of_nothing_is_nan():
    e, c, t = _inputs(n=2 * 9, d=8, v=11)
    e3, t3 = e.view(2, 9, 8), t.view(2, 9)
    assert linear_cross_entropy(e3, c, t3, reduction="none", shift=1).shape == (2, 8)
    assert torch.isnan(linear_cross_entropy(e, c, torch.full_like(t, -100)))


@pytest.mark.skipif(DEV.type == "cuda", reason="compiled kernels run bf16 (the property test "
                                                "covers it there)")
def test_bf16_under_the_interpreter_is_refused_not_silently_wrong():
    # The interpreter's bf16 arithmetic is wrong: an error naming the argument, never a loss.
    e, c, t = _inputs()
    with pytest.raises(TypeError, match="e: bfloat16 does not run under the Triton interpreter"):
        linear_cross_entropy(e.bfloat16(), c.bfloat16(), t)
    with pytest.raises(TypeError, match="bfloat16"), torch.autocast("cpu", dtype=torch.bfloat16):
        linear_cross_entropy(e, c, t)
