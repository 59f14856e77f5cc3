"""Target-shifted 16-bit logits on the three-matmul path (config.Fused.target_shift,
kernels/target_shifted_grad.py) under the Triton interpreter (fp16, tiny shapes): the pass
against an fp64 reference (splits, ragged row blocks, rows of loss above its GUARD), the API's
calls in chunks, and where the route takes them. CCE_TEST_DEVICE=cuda runs the pass and the
calls with the compiled kernels, in bf16 too."""
import contextlib
import os

import pytest
import torch
import torch.nn.functional as F

import own_kernel
from own_kernel import linear_cross_entropy
from own_kernel.kernels.target import target_logit
from own_kernel.kernels.target_shifted_grad import GUARD, target_shifted_to_grad
from own_kernel.paths import three_matmul as fused
from own_kernel.policy.config import (HOPPER_16BIT, PORTABLE, overridden, use_target,
                                      with_overrides)
from own_kernel.policy.plan import fused_plan, target_shift_splits
from own_kernel.policy.route import Call, route
from tests.test_fused import TARGET_SHIFT  # Hopper's config would take shifted logits first
from tests.test_own_kernel import reference, rel

ON = with_overrides(PORTABLE, {"fused": {"target_shift": True}})
F16 = torch.float16
DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
# The interpreter's bf16 arithmetic is wrong (the kernel refuses it there): fp16 on the CPU,
# both 16-bit dtypes on a GPU
DTYPES = [F16] + ([torch.bfloat16] if DEV.type == "cuda" else [])


def _pass(e, c, t, softcap, ls, block_r, splits):
    """The pass over the chunk's target-shifted logits (e's dtype), as the path writes them:
    (loss, gradient rows x V, row_round)."""
    shift = target_logit(e, c, None, t, None).neg_().to(e.dtype)
    y = (c.float() @ e.float().T + shift.float()).to(e.dtype)  # V x rows, rounded once
    loss = torch.empty(e.shape[0], device=e.device)
    row_round = torch.empty(e.shape[0], device=e.device)
    target_shifted_to_grad(y, shift, t, loss, ignore_index=-100, softcap=softcap,
                           label_smoothing=ls, block_r=block_r, block_v=16, num_warps=4,
                           splits=splits, row_round=row_round)
    return loss, y.t().float(), row_round


def _want(e, c, t, softcap, ls):
    """(per-row losses, dloss/dx) in fp64, rows without a valid target 0."""
    x = (e.double() @ c.double().T).requires_grad_()
    z = x if softcap is None else softcap * torch.tanh(x / softcap)
    valid = torch.where((t >= 0) & (t < c.shape[0]), t, -100)
    loss = F.cross_entropy(z, valid, reduction="none", label_smoothing=ls)
    loss.sum().backward()
    return loss.detach(), x.grad


def _random(rows, v, d, dtype, seed):
    """E (rows x d) and C (v x d) in dtype, targets, on DEV."""
    g = torch.Generator().manual_seed(seed)
    e = (0.5 * torch.randn(rows, d, generator=g)).to(dtype)
    c = (0.5 * torch.randn(v, d, generator=g)).to(dtype)
    t = torch.randint(0, v, (rows,), generator=g)
    return e.to(DEV), c.to(DEV), t.to(DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, block_r, splits", [(37, 16, 3), (32, 16, 1), (32, 8, 5)])
@pytest.mark.parametrize("softcap, ls", [(None, 0.0), (20.0, 0.1)])
def test_the_pass_matches_fp64(rows, block_r, splits, softcap, ls, dtype):
    # ragged (37 rows: masked row blocks) and whole row blocks (unmasked loads); one or several
    # vocabulary splits, their last one short (V 101 over 16-column steps)
    v = 101
    e, c, t = _random(rows, v, 16, dtype, rows + splits)
    t[3], t[5] = -100, v + 2  # ignored, and out of range
    loss, grad, row_round = _pass(e, c, t, softcap, ls, block_r, splits)
    want_loss, want_grad = _want(e, c, t, softcap, ls)
    eps = torch.finfo(dtype).eps
    # y's 16-bit rounding, relative to the logits' spread, is the error's source
    assert (loss.double() - want_loss).abs().max() <= 4 * eps
    assert loss[3] == 0 and loss[5] == 0 and (grad[[3, 5]] == 0).all()
    assert rel(grad, want_grad) <= 4 * eps
    # what rounding the fp16 gradient removed, per row (dE's correction), against the fp64
    # gradient's row sums less the fp16 gradient's
    assert (row_round.double() - (want_grad.sum(1) - grad.double().sum(1))).abs().max() <= 8 * eps


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_far_below_its_largest_logit_is_summed_relative_to_that(dtype):
    # loss > GUARD: exp(z - z_t) would overflow; the split sums again relative to its max
    e, c, t = _random(16, 64, 16, dtype, 1)
    e[2] = (40 * c[7].float() / c[7].float().norm() ** 2 * 10).to(dtype)  # logit 7 far above
    t[2] = int((e[2].float() @ c.float().T).argmin())
    loss, grad, _ = _pass(e, c, t, None, 0.0, 8, 2)
    want_loss, want_grad = _want(e, c, t, None, 0.0)
    eps = torch.finfo(dtype).eps
    assert want_loss[2] > GUARD.value
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert abs(float(loss[2]) - float(want_loss[2])) <= 4 * eps * want_loss[2]
    assert rel(grad[2], want_grad[2]) <= 4 * eps


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("softcap, reduction, max_rows", [(30.0, "mean", 5), (None, "sum", 0)])
def test_calls_in_chunks_match_the_reference(monkeypatch, softcap, reduction, max_rows, dtype):
    seen = []
    real = fused._target_shifted_logits_and_grad

    def spy(y, e_rows, *args):
        seen.append((e_rows.shape[0], y.shape[1]))
        return real(y, e_rows, *args)

    monkeypatch.setattr(fused, "_target_shifted_logits_and_grad", spy)
    e, c, t = _random(23, 67, 24, dtype, 2)
    e.requires_grad_()
    c.requires_grad_()
    t[[1, 2, 9]] = -100
    ref, e2, c2, _ = reference(e, c, t, None, softcap, reduction, 0.0)
    ref.backward()
    with overridden({"fused": {**TARGET_SHIFT, "max_rows": max_rows, "min_rows": 1,
                               "min_chunk_flops": 0}}):
        loss = linear_cross_entropy(e, c, t, softcap=softcap, reduction=reduction,
                                    workspace_mib=16)
    loss.backward()
    # the first 5 rows as they are, then the other 17 with a target gathered into 4 chunks
    # (rows, the logits' padded rows: cuBLAS's leading dimension a multiple of 8)
    assert seen == ([(5, 8)] * 4 + [(2, 8)] if max_rows else [(23, 24)])
    tol = 3 * torch.finfo(dtype).eps  # the logits' and the gradients' roundings
    assert abs(float(loss.detach()) - float(ref)) <= tol * max(1.0, abs(float(ref)))
    assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol


def test_the_pass_keeps_its_partials_in_the_chunks_de_rows(monkeypatch):
    # The pass's partials (4 x splits x rows fp32) live in the chunk's dE rows, which dE's GEMM
    # writes only after the pass: a buffer of their own took a call at N 4096, D 7168 2 MiB
    # past torch.compile's peak. The gradients stay the reference's.
    seen = []
    real = fused.target_shifted_to_grad

    def spy(y, *args, splits, scratch=None, **kw):
        seen.append((y.shape[1], splits, scratch))
        return real(y, *args, splits=splits, scratch=scratch, **kw)

    monkeypatch.setattr(fused, "target_shifted_to_grad", spy)
    e, c, t = _random(23, 67, 64, F16, 4)
    e.requires_grad_()
    c.requires_grad_()
    ref, e2, c2, _ = reference(e, c, t, None, None, "mean", 0.0)
    ref.backward()
    with overridden({"fused": {**TARGET_SHIFT, "min_rows": 1, "min_chunk_flops": 0}}):
        linear_cross_entropy(e, c, t, workspace_mib=16).backward()
    (rows, splits, scratch), = seen
    assert scratch is not None and scratch.numel() >= 4 * splits * rows
    start, end = e.grad.data_ptr(), e.grad.data_ptr() + e.grad.nbytes
    assert start <= scratch.data_ptr() < end  # dE's bytes (scaled in place into e.grad)
    tol = 3 * torch.finfo(F16).eps
    assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_causal_shift_over_a_batch_matches_the_reference(dtype):
    # (batch, sequence) rows, each sequence's targets one step ahead (shift=1), an ignored
    # target, label smoothing: the rows the path gathers feed the same pass
    e, c, t = _random(27, 67, 24, dtype, 5)
    e = e.view(3, 9, 24).requires_grad_()
    c.requires_grad_()
    t = t.view(3, 9) % 67
    t[0, 2] = -100
    ref, e2, c2, _ = reference(e, c, t, None, None, "mean", 0.1, shift=1)
    ref.backward()
    with overridden({"fused": {**TARGET_SHIFT, "max_rows": 7, "min_rows": 1,
                               "min_chunk_flops": 0}}):
        r = own_kernel.plan(e, c, t, shift=1, label_smoothing=0.1, workspace_mib=16)
        loss = linear_cross_entropy(e, c, t, shift=1, label_smoothing=0.1, workspace_mib=16)
    loss.backward()
    assert (r.path, r.logits, r.fused.chunks) == ("three-matmul", "target-shifted", 4)
    tol = 3 * torch.finfo(dtype).eps  # the logits' and the gradients' roundings
    assert abs(float(loss.detach()) - float(ref)) <= tol * max(1.0, abs(float(ref)))
    assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol


@pytest.mark.parametrize("cfg, option, logits", [
    (ON, {}, "target-shifted"),
    (PORTABLE, {}, "target-shifted"),                # the portable config's default
    (with_overrides(PORTABLE, {"fused": {"target_shift": False}}), {}, "fp32"),
    (ON, {"has_bias": True}, "fp32"),                # cuBLAS's bias is the shift's
    (ON, {"filtered": True}, "fp32"),                # the filter marks row-major blocks
    (with_overrides(HOPPER_16BIT, {"fused": {"target_shift": True}}), {}, "shifted"),
])
def test_the_route_takes_target_shifted_logits_where_asked_and_possible(cfg, option, logits):
    r = route(Call(n=8192, v=151936, d=1536, dtype=torch.bfloat16, workspace_mib=3072,
                   **option), cfg)
    assert r.path == "three-matmul" and r.logits == logits


def test_two_bytes_a_logit_hold_the_chunk_fp32_logits_split():
    # N 8192, V 151936 at 3 GiB: 2.3 GiB of 16-bit logits (and a 16-bit shift a row) fit one
    # chunk, fp32 logits take two
    args = (8192, 151936, 1536, 2, 3072 * 2**20)
    shifted, _ = fused_plan(*args, ON, target_shift_ok=True)
    plain, _ = fused_plan(*args, ON, target_shift_ok=False)
    assert shifted.target_shifted and shifted.chunks == 1 and shifted.row_stride == 151936
    assert shifted.extra_bytes == 8192 * (151936 * 2 + 2)
    assert not plain.target_shifted and plain.logits_fp32 and plain.chunks == 2


def test_chunks_of_target_shifted_logits_are_multiples_of_8_rows():
    # V x rows: cuBLAS's fast kernels need the rows (the leading dimension) a multiple of 8;
    # 1 GiB holds 3533 rows at V 151936
    plan, _ = fused_plan(8192, 151936, 1536, 2, 1024 * 2**20, ON, target_shift_ok=True)
    assert plan.rows % 8 == 0 and plan.rows <= 3533 and plan.chunks == 3
    one, _ = fused_plan(1001, 151936, 1536, 2, 1024 * 2**20, ON, target_shift_ok=True)
    assert one.chunks == 1 and one.extra_bytes == 1008 * (151936 * 2 + 2)  # room for 1008


def test_the_portable_default_aligns_target_shifted_chunks_to_128_rows():
    # config.Fused.target_shift_row_align: at 1 GiB, N 8192, V 151936 makes three chunks of
    # 2736 rows (a partial 128-row tile each); the portable config's 128 makes them 2816 (the
    # last 2560), as many chunks, still within the budget. Aligned shapes keep their chunks.
    args = (8192, 151936, 1536, 2, 1024 * 2**20)
    eight = with_overrides(PORTABLE, {"fused": {"target_shift_row_align": 8}})
    ragged, _ = fused_plan(*args, eight, target_shift_ok=True)
    aligned, _ = fused_plan(*args, PORTABLE, target_shift_ok=True)
    assert (ragged.rows, ragged.chunks) == (2736, 3) and (aligned.rows, aligned.chunks) == (2816, 3)
    assert aligned.extra_bytes <= 1024 * 2**20 and aligned.row_align == 128
    # fp32 logits (no target shift) keep the config's row_align (1)
    plain, _ = fused_plan(*args, PORTABLE, target_shift_ok=False)
    assert plain.row_align == 1 and plain.rows % 128 != 0
    gemma = (8192, 256000, 2304, 2, 1024 * 2**20)
    assert (fused_plan(*gemma, eight, target_shift_ok=True)[0].rows
            == fused_plan(*gemma, PORTABLE, target_shift_ok=True)[0].rows == 2048)
    for bad in (4, 12, 0):
        with pytest.raises(ValueError, match="fused.target_shift_row_align"):
            with_overrides(PORTABLE, {"fused": {"target_shift_row_align": bad}})


def test_target_shift_tiles_are_validated():
    with pytest.raises(ValueError, match="target_shift_tiles' rows"):
        with_overrides(PORTABLE, {"fused": {"target_shift_tiles": (48, 64, 8, 4)}})
    with pytest.raises(ValueError, match="target_shift_tiles' programs per SM"):
        with_overrides(PORTABLE, {"fused": {"target_shift_tiles": (64, 64, 8, 0)}})


@pytest.mark.parametrize("rows, v, programs, splits", [
    (8192, 151936, 1056, 17),   # 64 row blocks of 128
    (2736, 151936, 1056, 48),   # 22 row blocks: more splits fill the grid
    (8192, 151936, 64, 1),      # the row blocks alone hold the programs
    (128, 1000, 1056, 4),       # each split at least 8 steps of 32 columns
])
def test_the_pass_splits_the_vocabulary_until_the_grid_holds_its_programs(rows, v, programs,
                                                                          splits):
    assert target_shift_splits(rows, v, 128, 32, programs) == splits



def test_an_fp32_weight_under_autocast_takes_them_and_keeps_its_fp32_gradient():
    # The GEMMs read autocast's 16-bit copy of C (its target rows too); dC's fp32 sums over
    # the chunks are C's gradient. Errors within fp16's over reductions of V or D terms
    # (tests/test_autocast.py's tolerance).
    g = torch.Generator().manual_seed(3)
    n, d, v = 48, 40, 1024
    x = torch.randn(n, d, generator=g).to(DEV).requires_grad_()
    c = (0.3 * torch.randn(v, d, generator=g)).to(DEV).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g).to(DEV)
    x64, c64 = (p.detach().half().double().requires_grad_() for p in (x, c))
    ref = F.cross_entropy(x64 @ c64.T, t)
    ref.backward()
    # the portable config's three-matmul path (a Hopper GPU would take its own path for fp16)
    portable = use_target("portable") if DEV.type == "cuda" else contextlib.nullcontext()
    with portable, overridden({"fused": {**TARGET_SHIFT, "min_rows": 1, "max_rows": 16}}), \
            torch.autocast(DEV.type, dtype=F16):
        r = own_kernel.plan(x, c, t, workspace_mib=64)
        loss = linear_cross_entropy(x, c, t, workspace_mib=64)
    loss.backward()
    assert (r.path, r.logits, r.fused.chunks) == ("three-matmul", "target-shifted", 3)
    assert c.grad.dtype == torch.float32
    tol = 8 * torch.finfo(F16).eps * (v + d) ** 0.5
    assert abs(float(loss.detach()) - float(ref)) <= tol * float(ref)
    assert rel(x.grad, x64.grad) <= tol and rel(c.grad, c64.grad) <= tol
