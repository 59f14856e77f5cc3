"""own_kernel against an fp64 reference under the Triton interpreter (fp32 / fp16, tiny shapes)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from own_kernel import LinearCrossEntropy, linear_cross_entropy
from own_kernel.kernels.tile import row_block_and_split
from own_kernel.policy.config import HOPPER_16BIT, INTERPRETER, overridden, with_overrides


def reference(e, c, t, bias=None, softcap=None, reduction="mean", ls=0.0, ignore_index=-100, shift=0):
    e2 = e.detach().double().requires_grad_()
    c2 = c.detach().double().requires_grad_()
    b2 = bias.detach().double().requires_grad_() if bias is not None else None
    ee, tt = (e2[..., :-shift, :], t[..., shift:]) if shift else (e2, t)
    z = ee @ c2.T
    if b2 is not None:
        z = z + b2
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), tt.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=ls)
    if reduction == "none":
        loss = loss.view(tt.shape)
    return loss, e2, c2, b2


def rel(a, b):
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))


def peaked_inputs(n, d, v, seed):
    """Hidden states near their target's classifier row: peaked softmax rows, many columns the
    gradient filter skips."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    return c[t] + 0.3 * torch.randn(n, d, generator=g), c, t


CASES = [  # dtype, shape of e, V, softcap, reduction, label smoothing, bias, shift, ignore_index
    (torch.float32, (37, 24), 101, None, "mean", 0.0, False, 0, -100),
    (torch.float32, (3, 13, 20), 97, 30.0, "none", 0.0, True, 2, -100),
    (torch.float32, (2, 9, 16), 53, 5.0, "sum", 0.2, True, 1, 7),
    (torch.float16, (33, 40), 67, 20.0, "mean", 0.1, True, 0, -1),
    (torch.float16, (1, 24), 31, None, "mean", 0.0, False, 0, -100),
]


@pytest.mark.parametrize("dtype, shape, v, softcap, reduction, ls, has_bias, shift, ii", CASES)
def test_matches_reference(dtype, shape, v, softcap, reduction, ls, has_bias, shift, ii):
    g = torch.Generator().manual_seed(hash((shape, v)) % 2**31)
    d = shape[-1]
    e = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    c = torch.randn(v, d, generator=g).to(dtype).requires_grad_()
    bias = (0.1 * torch.randn(v, generator=g)).to(dtype).requires_grad_() if has_bias else None
    t = torch.randint(0, v, shape[:-1], generator=g)
    t.view(-1)[1::5] = ii  # N = 1 keeps its one target
    loss = linear_cross_entropy(e, c, t, bias=bias, softcap=softcap, reduction=reduction,
                                label_smoothing=ls, shift=shift, ignore_index=ii)
    ref, e2, c2, b2 = reference(e, c, t, bias, softcap, reduction, ls, ii, shift)
    assert loss.shape == ref.shape
    w = torch.randn(loss.shape, generator=g) if reduction == "none" else torch.tensor(1.0)
    (loss * w).sum().backward()
    (ref * w.double()).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert rel(loss.detach(), ref.detach()) < tol
    assert rel(e.grad, e2.grad) < tol
    assert rel(c.grad, c2.grad) < tol
    if has_bias:
        assert rel(bias.grad, b2.grad) < tol


def test_large_logits_and_noncontiguous():
    g = torch.Generator().manual_seed(1)
    e = (torch.randn(24, 40, generator=g) * 30)[:, ::2].requires_grad_()  # non-contiguous
    c = torch.randn(20, 40, generator=g)[:, 1::2].detach().requires_grad_()  # strided view
    t = torch.randint(0, 20, (24,), generator=g)
    loss = linear_cross_entropy(e, c, t)
    loss.backward()
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    assert torch.isfinite(loss)
    assert rel(loss.detach(), ref.detach()) < 1e-5
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5


@pytest.mark.parametrize("zloss", [lambda lse: 1e-2 * (lse**2).mean(),
                                   # its gradient reaches the backward as one value expanded over
                                   # N (stride 0): the kernels index it per row
                                   lambda lse: 0.5 * lse.sum()])
def test_lse_gradient_and_module(zloss):
    g = torch.Generator().manual_seed(2)
    e = torch.randn(20, 16, generator=g).requires_grad_()
    c = torch.randn(50, 16, generator=g).requires_grad_()
    t = torch.randint(0, 50, (20,), generator=g)
    loss, lse = LinearCrossEntropy(softcap=20.0, return_lse=True)(e, c, t)
    (loss + zloss(lse)).backward()
    e2, c2 = e.detach().double().requires_grad_(), c.detach().double().requires_grad_()
    z = 20 * torch.tanh(e2 @ c2.T / 20)
    (F.cross_entropy(z, t) + zloss(torch.logsumexp(z, -1))).backward()
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5


@pytest.mark.parametrize("used", ["lse", "loss"])
def test_gradient_of_one_output_only(used):
    # The other output gets no gradient (None in the backward), which must count as zero.
    g = torch.Generator().manual_seed(12)
    e = torch.randn(11, 16, generator=g).requires_grad_()
    c = torch.randn(37, 16, generator=g).requires_grad_()
    t = torch.randint(0, 37, (11,), generator=g)
    loss, lse = linear_cross_entropy(e, c, t, return_lse=True)
    (lse.square().mean() if used == "lse" else loss).backward()
    e2, c2 = e.detach().double().requires_grad_(), c.detach().double().requires_grad_()
    z = e2 @ c2.T
    (torch.logsumexp(z, -1).square().mean() if used == "lse" else F.cross_entropy(z, t)).backward()
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5


def test_filter_skips_tiles_and_stays_close():
    # Flat softmax: every non-target entry is ~1/V, below eps, so most tiles are skipped; the
    # rank-1 compensation keeps the gradient close, the exact path must be exact.
    g = torch.Generator().manual_seed(3)
    e = (0.01 * torch.randn(48, 16, generator=g)).requires_grad_()
    c = torch.randn(200, 16, generator=g).requires_grad_()
    t = torch.randint(0, 200, (48,), generator=g)
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    linear_cross_entropy(e, c, t, filter_eps=0.02).backward()
    err_filtered = rel(e.grad, e2.grad), rel(c.grad, c2.grad)
    e.grad = c.grad = None
    linear_cross_entropy(e, c, t).backward()
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5
    assert all(0 < err < 0.05 for err in err_filtered)


def test_auto_filter_keeps_flat_rows_exact(monkeypatch):
    # "auto" filters only rows whose largest probability reaches AUTO_FLAT_P_MAX. Rows 0-15 (one
    # row block of the interpreter's tiles) are peaked (a large target logit), the rest flat
    # (p ~ 1/V < AUTO_FLAT_P_MAX); an eps above every flat entry would skip all of their tiles
    # without the guard.
    from own_kernel.policy import options

    g = torch.Generator().manual_seed(5)
    n, v = 32, 1024
    e = 0.01 * torch.randn(n, 16, generator=g)
    c = torch.randn(v, 16, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    e[:16] = 3.0 * c[t[:16]] / c[t[:16]].norm(dim=1, keepdim=True)  # p(target) >> 1/V
    e.requires_grad_(), c.requires_grad_()

    def grad_e(filter_eps):
        e.grad = c.grad = None
        linear_cross_entropy(e, c, t, filter_eps=filter_eps).backward()
        return e.grad.clone()

    monkeypatch.setitem(options.AUTO_EPS, torch.float32, 5e-3)
    exact, auto = grad_e(None), grad_e("auto")
    assert rel(auto[16:], exact[16:].double()) < 1e-6, "flat rows must not be filtered"
    assert rel(auto[:16], exact[:16].double()) > 1e-6, "peaked rows must be filtered"
    monkeypatch.setattr(options, "AUTO_FLAT_P_MAX", 0.0)  # no guard: the flat rows lose their tail
    assert rel(grad_e("auto")[16:], exact[16:].double()) > 1e-3


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_all_ignored_and_empty(reduction):
    e = torch.randn(5, 8).requires_grad_()
    c = torch.randn(11, 8).requires_grad_()
    t = torch.full((5,), -100)
    loss = linear_cross_entropy(e, c, t, reduction=reduction)
    ref = F.cross_entropy(e.detach() @ c.detach().T, t, reduction=reduction)
    assert torch.equal(torch.isnan(loss), torch.isnan(ref))
    if reduction == "sum":
        assert loss.item() == 0.0
        loss.backward()
        assert not e.grad.any() and not c.grad.any()
    empty = linear_cross_entropy(torch.randn(0, 8), torch.randn(11, 8), torch.zeros(0, dtype=torch.long),
                                 reduction="sum")
    assert empty.item() == 0.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(targets=torch.tensor([0, 11, 1])), "targets: value 11"),
    (dict(targets=torch.tensor([0.0, 1.0, 2.0])), "targets: expected an integer"),
    (dict(targets=torch.tensor([0, 1])), "targets: shape"),
    (dict(c=torch.randn(11, 7)), "c: hidden size"),
    (dict(c=torch.randn(11, 8, dtype=torch.float64)), "c: dtype"),
    (dict(e=torch.randn(3, 8, dtype=torch.float64)), "e: dtype"),
    (dict(bias=torch.randn(10)), "bias: expected shape"),
    (dict(reduction="avg"), "reduction"),
    (dict(shift=-1), "shift"),
    (dict(softcap=0.0), "softcap"),
    (dict(label_smoothing=1.5), "label_smoothing"),
    (dict(filter_eps="high"), "filter_eps"),
])
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(e=torch.randn(3, 8), c=torch.randn(11, 8), targets=torch.tensor([0, 1, 2]))
    for k in ("e", "c", "targets"):
        if k in kwargs:
            args[k] = kwargs.pop(k)
    with pytest.raises((ValueError, TypeError), match=match):
        linear_cross_entropy(args["e"], args["c"], args["targets"], **kwargs)


@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("drop", ["forward", "backward", "none"])
@pytest.mark.parametrize("filter_eps", [None, "auto"])
def test_ignored_rows_skipped_forward_and_dropped_backward(monkeypatch, tma, drop, filter_eps):
    # Prompt-style masking: whole row blocks ignored plus scattered ignored rows. Ignored rows
    # are dropped before the forward (gathered), before the backward only, or not at all: then
    # the forward computes no logits for the all-ignored blocks and the backward runs on every
    # row, the ignored ones inert through their +inf lse. All must match fp64.
    import own_kernel.paths.entries as ops
    from own_kernel.policy.config import config_for
    from own_kernel.policy.options import Options

    compaction = {"fwd_min_flops": 0 if drop == "forward" else 1e30}
    if drop == "none":
        compaction["max_used"] = 0.0
    override = {"forward": {"tma": tma}, "compaction": compaction}
    with overridden(override):
        _ignored_rows_case(monkeypatch, ops, config_for, Options, filter_eps, drop)


def _ignored_rows_case(monkeypatch, ops, config_for, Options, filter_eps, drop):
    bn = config_for(torch.device("cpu"), torch.float32).forward.tiles.block_n
    seen, fwd_rows = [], []
    real, real_fwd = ops.backward, ops.forward
    monkeypatch.setattr(ops, "backward", lambda e, *a, **k: seen.append(e.shape[0]) or real(e, *a, **k))
    monkeypatch.setattr(ops, "forward", lambda e, *a, **k: fwd_rows.append(e.shape[0]) or real_fwd(e, *a, **k))
    g = torch.Generator().manual_seed(11)
    n, d, v = 5 * bn + 3, 24, 61
    e, c, t = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g) / 3, torch.randint(0, v, (n,), generator=g)
    t[: 2 * bn] = -100       # two whole blocks
    t[3 * bn + 1::4] = -100  # and every fourth row of the rest but one block
    e = e.requires_grad_()
    c = c.requires_grad_()
    loss, lse = linear_cross_entropy(e, c, t, filter_eps=filter_eps, return_lse=True)
    z = e.detach().double() @ c.detach().double().T
    assert torch.allclose(lse.double(), torch.logsumexp(z, 1), atol=1e-4)  # asked for: every row
    assert seen == [] and fwd_rows == [t.numel()]  # lse asked for: no row dropped
    loss = linear_cross_entropy(e, c, t, filter_eps=filter_eps)
    ref, e2, c2, _ = reference(e, c, t)
    assert abs(loss.item() - ref.item()) < 1e-5
    loss.backward(retain_graph=True)
    ref.backward()
    used = int((t != -100).sum())
    assert fwd_rows[1:] == [used if drop == "forward" else t.numel()]
    assert seen == [t.numel() if drop == "none" else used]
    bound = 1e-5 if filter_eps is None else 0.05
    assert rel(e.grad, e2.grad) < bound and rel(c.grad, c2.grad) < bound
    assert not e.grad[t == -100].any()
    first = e.grad.clone(), c.grad.clone()
    loss.backward()  # a second backward reads what the first left (the gathered rows intact)
    assert torch.allclose(e.grad, 2 * first[0], rtol=1e-6) and torch.allclose(c.grad, 2 * first[1], rtol=1e-6)
    # lse of ignored rows, not asked for: +inf, inert in the backward
    _, lse_rows, p_max, *_ = ops.lce_rows(e.detach(), c.detach(), t, None,
                                            *Options(ignore_index=-100).op_args())
    assert torch.isinf(lse_rows[t == -100]).all() and not p_max[t == -100].any()
    assert torch.allclose(lse_rows[t != -100].double(), torch.logsumexp(z, 1)[t != -100], atol=1e-4)


def test_forward_gathers_used_rows_by_this_call_alone(monkeypatch):
    # Calls large enough (compact_fwd_min_flops) read the count before the forward and gather
    # the used rows when that pays, whatever the previous call did; without gradients, never.
    import own_kernel.paths.entries as ops

    fwd_rows = []
    real_fwd = ops.forward
    monkeypatch.setattr(ops, "forward", lambda e, *a, **k: fwd_rows.append(e.shape[0]) or real_fwd(e, *a, **k))
    g = torch.Generator().manual_seed(12)
    e, c = torch.randn(40, 16, generator=g).requires_grad_(), torch.randn(23, 16, generator=g)
    t = torch.randint(0, 23, (40,), generator=g)
    masked = t.clone()
    masked[::2] = -100
    with overridden({"compaction": {"fwd_min_flops": 0}}):
        losses = [linear_cross_entropy(e, c, tt).item() for tt in (t, masked, masked, t, masked)]
        with torch.no_grad():  # no backward to feed: no gathered copy (the loss keeps its few floats)
            losses.append(linear_cross_entropy(e, c, masked).item())
    assert fwd_rows == [40, 20, 20, 40, 20, 40]
    assert losses[1] == pytest.approx(losses[2], rel=1e-6)
    assert losses[0] == pytest.approx(losses[3], rel=1e-6)
    assert losses[5] == pytest.approx(losses[2], rel=1e-6)


@pytest.mark.parametrize("n, used, v, d, in_de, expect", [
    (1000, 0, 100, 64, False, True),             # nothing to compute
    (1000, 1000, 100, 64, False, False),         # nothing to drop
    (1000, 950, 100, 64, False, False),          # too few dropped to pay for the gather
    (2048, 1800, 32000, 2304, False, True),      # dE into the gathered E: peak below the full call's
    (32768, 24576, 32000, 2304, True, True),     # dE separate: 3/4 of the rows at most
    (32768, 24577, 32000, 2304, True, False),
])
def test_compaction_only_where_it_pays(n, used, v, d, in_de, expect):
    from own_kernel.policy.plan import compaction_pays, tail_width

    assert compaction_pays(n, used, v, d, 2, HOPPER_16BIT) is expect
    if used:
        assert tail_width(used, v, d, 2, HOPPER_16BIT).in_de is in_de


def test_forward_programs_per_sm_plans_waves_of_that_many_programs():
    # Two programs per SM: the grid's waves are twice the SMs' programs. At N 16384, D 2048,
    # V 49152 on 132 SMs, 128 row blocks in three splits fill about three waves; with 264
    # resident programs the plan must split the vocabulary further to fill them.
    from own_kernel.policy.plan import split_plan

    two = with_overrides(HOPPER_16BIT, {"forward": {"programs_per_sm": 2}})
    n, d, v = 16384, 2048, 49152
    assert split_plan(n, v, d, 2, two, 132) == split_plan(n, v, d, 2, HOPPER_16BIT, 264)
    assert split_plan(n, v, d, 2, two, 132).splits > split_plan(n, v, d, 2, HOPPER_16BIT,
                                                                  132).splits
    with pytest.raises(ValueError, match="forward.programs_per_sm"):
        with_overrides(HOPPER_16BIT, {"forward": {"programs_per_sm": 0}})
    with pytest.raises(ValueError, match="forward.l2_group"):
        with_overrides(HOPPER_16BIT, {"forward": {"l2_group": "rows"}})


def test_a_larger_per_program_overhead_plans_fewer_splits_where_waves_barely_differ():
    # N 2048, D 8192, V 152064 on 132 SMs: 16 row blocks over the L2 budget. At one tile of
    # overhead a program, 33 splits in groups of 4 fill exactly four waves; at two, 528
    # programs' overhead outweighs the ragged tail of 16 splits in groups of 9. Where the waves
    # decide clearly (Gemma 2 (2B)'s 64 row blocks) the count stays.
    from own_kernel.policy.plan import split_plan

    two = with_overrides(HOPPER_16BIT, {"forward": {"program_overhead_tiles": 2}})
    grid = split_plan(2048, 152064, 8192, 2, HOPPER_16BIT, 132)
    assert (grid.splits, grid.group_rows) == (33, 4)
    grid = split_plan(2048, 152064, 8192, 2, two, 132)
    assert (grid.splits, grid.group_rows) == (16, 9)
    assert (split_plan(8192, 256000, 2304, 2, two, 132)
            == split_plan(8192, 256000, 2304, 2, HOPPER_16BIT, 132))
    with pytest.raises(ValueError, match="forward.program_overhead_tiles"):
        with_overrides(HOPPER_16BIT, {"forward": {"program_overhead_tiles": -1}})
    with pytest.raises(ValueError, match="forward.makespan_order"):
        with_overrides(HOPPER_16BIT, {"forward": {"makespan_order": "rows"}})
    with pytest.raises(ValueError, match="forward.short_split_last"):
        with_overrides(HOPPER_16BIT, {"forward": {"short_split_last": "yes"}})


@triton.jit
def _launch_order_kernel(out, num_nb, splits, group_rows, grouped_splits):
    pid = tl.program_id(0)
    nb, split = row_block_and_split(pid, num_nb, splits, group_rows, grouped_splits)
    tl.store(out + 2 * pid, nb)
    tl.store(out + 2 * pid + 1, split)


@pytest.mark.parametrize("num_nb,splits,group_rows,short_last", [
    (5, 3, 2, False), (7, 4, 3, False), (4, 5, 4, False), (6, 1, 6, False),
    (5, 3, 2, True), (7, 4, 3, True), (4, 5, 4, True), (6, 2, 6, True), (3, 2, 1, True)])
def test_the_plans_launch_order_is_the_kernels(num_nb, splits, group_rows, short_last):
    # plan.launch_order, which the split count's makespan simulation runs the programs in, must
    # be tile.py's row_block_and_split program by program: the last group partial, and with
    # short_last every row block's last split after the groups.
    from own_kernel.policy.plan import ForwardGrid, launch_order

    grid = ForwardGrid(splits, 64, group_rows, short_last=short_last)
    out = torch.full((num_nb * splits, 2), -1, dtype=torch.int32)
    _launch_order_kernel[(num_nb * splits,)](out, num_nb, splits, group_rows,
                                             grid.grouped_splits)
    order = launch_order(num_nb, splits, group_rows, short_last)
    assert [tuple(p) for p in out.tolist()] == order
    assert sorted(order) == [(r, k) for r in range(num_nb) for k in range(splits)]


HEADS_IN_L2_GROUPS = [(4096, 3584, 152064), (4096, 7168, 129280), (4096, 8192, 152064),
                      (5120, 3584, 32000), (5120, 4096, 131072), (8192, 5120, 131072),
                      (2048, 8192, 152064), (12288, 4096, 32000), (16384, 6144, 256000),
                      (32768, 2304, 256000), (8192, 2304, 256000)]


@pytest.mark.parametrize("short_split_last", [False, True])
@pytest.mark.parametrize("n,d,v", HEADS_IN_L2_GROUPS)
def test_the_forward_grid_has_the_least_makespan_in_launch_order(n, d, v, short_split_last):
    # Every grid the plan considers, run in the kernels' launch order (launch groups of the
    # resident programs over the splits, the short last split closing each group or, where
    # forward.short_split_last allows, after all of them) by list scheduling on 132 SMs: the
    # grid taken is within 1 % of the least makespan. Simulated in split order instead, the
    # plan took grids whose last wave is ragged (N 4096, D 3584, V 152064: 21 splits closing
    # each group, 6 % over the least; ncu measured the launch 11 % past the SMs' mean busy
    # time).
    import heapq
    from own_kernel.policy.plan import cdiv, launch_order, split_plan

    cfg = with_overrides(HOPPER_16BIT, {"forward": {"short_split_last": short_split_last}})
    tiles, slots = cfg.forward.tiles, 132
    num_nb, num_tiles = cdiv(n, tiles.block_n), cdiv(v, tiles.block_v)
    rows_fit = cfg.forward.l2_mib * 2**20 // (tiles.block_n * d * 2)
    fewest = cdiv(slots, rows_fit)  # splits the L2 budget asks for at least

    def makespan(splits, short_last):
        per = cdiv(num_tiles, splits)
        programs = cdiv(num_tiles, per)
        group = min(num_nb, cdiv(slots, programs))
        free = [0] * slots
        for _, k in launch_order(num_nb, programs, group, short_last and programs > 1):
            heapq.heappush(free, heapq.heappop(free) + min(per, num_tiles - k * per) + 1)
        return max(free)

    grid = split_plan(n, v, d, 2, cfg, slots)
    assert grid.group_rows < num_nb, "not a grouped grid: the head tests nothing here"
    assert grid.group_rows == min(num_nb, cdiv(slots, grid.splits))
    assert short_split_last or not grid.short_last
    orders = (False, True) if short_split_last else (False,)
    least = min(makespan(s, last) for s in range(fewest, 8 * slots // num_nb + 3)
                for last in orders)
    assert makespan(grid.splits, grid.short_last) <= 1.01 * least


def test_balanced_splits_skips_only_grids_that_cannot_win():
    # balanced_splits does not simulate a grid whose longest program or evenly spread work
    # already comes within 0.5 % of the best so far: it must take the grid that simulating
    # every candidate takes, at one row block and many (the skip's reason: a thousand split
    # counts at N 128, V 256000), grouped or not, in every order.
    import itertools
    from own_kernel.policy.plan import (balanced_splits, cdiv, group_rows, launch_lengths,
                                        makespan)

    def every_candidate(num_nb, num_tiles, slots, min_splits, overhead, fixed, order, short):
        lo = max(1, min(min_splits, num_tiles))
        best, best_time = (lo, False), None
        for splits in range(lo, max(lo, min(num_tiles, max(1, 8 * slots // num_nb + 2))) + 1):
            programs = cdiv(num_tiles, cdiv(num_tiles, splits))
            group = group_rows(num_nb, programs, slots, fixed) if order else num_nb
            for last in (False, True) if short and programs > 1 and group < num_nb else (False,):
                time = makespan(launch_lengths(num_nb, num_tiles, splits, group, overhead, last),
                                slots)
                if best_time is None or time < best_time * 0.995:
                    best, best_time = (splits, last), time
        return best

    for num_nb, num_tiles, slots, min_splits, overhead, order, short in itertools.product(
            (1, 3, 17, 40), (5, 64, 300), (8, 132), (1, 4), (0, 2), (True, False),
            (False, True)):
        for fixed in {0, num_nb}:
            args = (num_nb, num_tiles, slots, min_splits, overhead, fixed, order, short)
            assert balanced_splits(*args) == every_candidate(*args), args


@pytest.mark.parametrize("short_last", [False, True])
@pytest.mark.parametrize("l2_group", ["splits", "budget"])
@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("l2_rows", [1, 2, 3])
def test_forward_grouped_launch_order_covers_every_tile(monkeypatch, tma, l2_rows, l2_group,
                                                        short_last):
    # forward.l2_mib sized for l2_rows of E's row blocks: more splits, launched in groups of row
    # blocks (the last group partial), and with short_last every row block's last split after
    # the groups; every (row block, split) must still run exactly once.
    from own_kernel.paths import forward
    from own_kernel.policy.config import config_for
    from own_kernel.policy.plan import split_plan
    from own_kernel.kernels.tile import num_sms

    n, d, v = 100, 24, 300
    cfg = config_for(torch.device("cpu"), torch.float32)
    e_block = cfg.forward.tiles.block_n * d * 4
    override = {"forward": {"l2_mib": l2_rows * e_block / 2**20, "tma": tma,
                            "l2_group": l2_group}}
    slots = num_sms(torch.device("cpu"))
    with overridden(override):
        cfg = config_for(torch.device("cpu"), torch.float32)
    grid = split_plan(n, v, d, 4, cfg, slots)
    splits, group_rows = grid.splits, grid.group_rows
    # a group: the resident programs over the splits, or as many row blocks as the budget
    # holds; either way a wave of resident programs spans at most one group's blocks
    assert splits >= -(-slots // l2_rows)
    assert group_rows == (-(-slots // splits) if l2_group == "splits" else l2_rows)
    assert l2_rows >= group_rows and group_rows * splits >= slots
    assert group_rows < -(-n // cfg.forward.tiles.block_n)  # the grouped order is what runs
    assert splits > 1  # a last split to launch after the groups
    grid = dataclasses.replace(grid, short_last=short_last)
    grids = []  # the forward launches with this grid, on the route asked for
    real_plan = forward.split_plan
    monkeypatch.setattr(forward, "split_plan", lambda *a: grids.append(
        dataclasses.replace(real_plan(*a), short_last=short_last)) or grids[-1])
    routes = []
    for name in ("forward_partials", "forward_partials_tma"):
        real_partials = getattr(forward, name)
        monkeypatch.setattr(forward, name, lambda *a, _real=real_partials, _name=name:
                            routes.append(_name) or _real(*a))
    g = torch.Generator().manual_seed(5)
    e, c = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    with overridden(override):
        loss, lse = linear_cross_entropy(e, c, t, reduction="none", return_lse=True)
    assert grids == [grid]
    assert routes == ["forward_partials_tma" if tma else "forward_partials"]
    z = e.double() @ c.double().T
    assert torch.allclose(lse.double(), torch.logsumexp(z, 1), atol=1e-4)
    assert torch.allclose(loss.double(), F.cross_entropy(z, t, reduction="none"), atol=1e-4)


def spy_kernel_args(monkeypatch, module, name: str, *keys: str) -> list:
    """The keyword arguments `keys` of each launch of module.name (a Triton kernel launched as
    kernel[grid](...)), as tuples in launch order."""
    seen, real = [], getattr(module, name)

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(tuple(kwargs[k] for k in keys))
                return real[grid](*args, **kwargs)
            return launch
    monkeypatch.setattr(module, name, Spy())
    return seen


@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("v", [300, 37])
def test_forward_softcap_halves_fold_each_tiles_two_halves_in_turn(monkeypatch, v, tma):
    # forward.softcap_halves: with a softcap either forward folds a tile's column halves one
    # after the other (at V 37 the last tile's second half lies wholly past V): the lse, the
    # loss with label smoothing, log p and the entropy are the whole tile's, to fp32 sums over
    # D + V terms. Without a softcap the tile folds whole.
    from own_kernel import token_logprobs
    from own_kernel.kernels import forward as pointer, forward_tma

    kernel = (forward_tma, "cce_fwd_tma_kernel") if tma else (pointer, "cce_fwd_kernel")
    launches = spy_kernel_args(monkeypatch, *kernel, "HALVES")
    n, d, cap = 50, 24, 3.0
    g = torch.Generator().manual_seed(7)
    e, c = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    with overridden({"forward": {"tma": tma, "softcap_halves": True}}), torch.no_grad():
        loss, lse = linear_cross_entropy(e, c, t, softcap=cap, label_smoothing=0.1,
                                         reduction="none", return_lse=True)
        logp, ent = token_logprobs(e, c, t, softcap=cap, return_entropy=True)
        linear_cross_entropy(e, c, t)
    assert launches == [(True,), (True,), (False,)]
    z = cap * torch.tanh((e.double() @ c.double().T) / cap)
    logp_all = torch.log_softmax(z, 1)
    tol = 8 * torch.finfo(torch.float32).eps * (d + v) * cap
    assert torch.allclose(lse.double(), torch.logsumexp(z, 1), atol=tol)
    assert torch.allclose(loss.double(), F.cross_entropy(z, t, reduction="none",
                                                         label_smoothing=0.1), atol=tol)
    assert torch.allclose(logp.double(), logp_all.gather(1, t[:, None])[:, 0], atol=tol)
    assert torch.allclose(ent.double(), -(logp_all.exp() * logp_all).sum(1), atol=tol)


# Every chunk in the tail (no chunk's W in dC): chunks.max_width 0 leaves dC's unwritten rows
# unused, filtered or not.
ALL_IN_TAIL = {"chunks": {"max_width": 0}, "filter": {"max_width": 0}}
RECOMPUTE_ROUTES = {
    "tma": {"chunks": {"recompute": "tma"}},
    "cublas": {"chunks": {"recompute": "cublas"}},
    # the pointer dlogits kernel (dlogits.py) for the whole vocabulary
    "pointer": {"chunks": {"recompute": "cublas", "max_width": 0}, "filter": {"max_width": 0}},
}


def _spy_w_writers(monkeypatch):
    """Which launcher wrote each chunk's W: ["tma" | "cublas" | "pointer", ...]."""
    from own_kernel.paths import writers as w

    writers = []
    for kind, cls in (("tma", w.TmaWriter), ("pointer", w.PointerWriter),
                      ("cublas", w.CublasWriter)):
        monkeypatch.setattr(cls, "write", lambda self, *a, _real=cls.write, _kind=kind, **k:
                            writers.append(_kind) or _real(self, *a, **k))
    return writers


@pytest.mark.parametrize("recompute", ["tma", "cublas", "pointer"])
@pytest.mark.parametrize("dtype, softcap, has_bias", [(torch.float32, 30.0, True), (torch.float16, None, False)])
def test_both_recompute_paths_match_reference(monkeypatch, recompute, dtype, softcap, has_bias):
    # "cublas": logits recomputed by torch.mm into dC's unwritten tail, then softmax_grad.py;
    # "pointer": the dlogits kernel (pointer loads) for the whole vocabulary, every chunk in the
    # tail's buffer. Exact and filtered.
    writers = _spy_w_writers(monkeypatch)
    g = torch.Generator().manual_seed(11)
    e = torch.randn(29, 24, generator=g).to(dtype).requires_grad_()
    c = torch.randn(113, 24, generator=g).to(dtype).requires_grad_()
    bias = (0.1 * torch.randn(113, generator=g)).to(dtype).requires_grad_() if has_bias else None
    t = torch.randint(0, 113, (29,), generator=g)
    ref, e2, c2, b2 = reference(e, c, t, bias, softcap)
    ref.backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for filter_eps in (None, 1e-9):  # an eps below every entry skips nothing: still exact
        e.grad = c.grad = None
        if bias is not None:
            bias.grad = None
        writers.clear()
        with overridden(RECOMPUTE_ROUTES[recompute]):
            linear_cross_entropy(e, c, t, bias=bias, softcap=softcap, filter_eps=filter_eps).backward()
        # the route asked for wrote W (with cuBLAS, the tail's chunks on the pointer kernel)
        assert writers and writers[0] == recompute, writers
        assert set(writers) <= ({"tma"} if recompute == "tma" else {recompute, "pointer"}), writers
        assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol
        if has_bias:
            assert rel(bias.grad, b2.grad) < tol


def test_the_backward_keeps_the_forward_config_after_its_block_ends(monkeypatch):
    # use_target("portable") and overridden() are left when the call returns, before autograd
    # runs the backward: an eager call's backward must still take the forward's route.
    writers = _spy_w_writers(monkeypatch)
    g = torch.Generator().manual_seed(5)
    e = torch.randn(20, 16, generator=g).requires_grad_()
    c = torch.randn(90, 16, generator=g).requires_grad_()
    t = torch.randint(0, 90, (20,), generator=g)
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    with overridden({"chunks": {"recompute": "cublas"}}):
        loss = linear_cross_entropy(e, c, t, workspace_mib=0)
    loss.backward()
    assert writers and writers[0] == "cublas", writers
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5


# Small chunks for the low-memory backward: several pass-1 row chunks, pass-2 row groups.
LOW_MEMORY_SMALL = {"low_memory": {"frac": 0.0, "row_align": 4, "min_entries": 300, "max_k": 16}}


@pytest.mark.parametrize("recompute", ["tma", "pointer"])
@pytest.mark.parametrize("chunks", ["default", "small", "groups"])
@pytest.mark.parametrize("dtype, softcap, has_bias, ls", [(torch.float32, 30.0, True, 0.1),
                                                          (torch.float16, None, False, 0.0)])
def test_low_memory_backward_matches_reference(monkeypatch, recompute, chunks, dtype, softcap,
                                               has_bias, ls):
    # backward_low_memory.py: dE by row chunks, dC by column chunks (over row groups with
    # "small"); dC's buffer and the workspace start as NaN, so a read before a write shows. With
    # a z-loss on the lse and ignored rows.
    from own_kernel.policy import route as route_module

    # "groups": chunks of pass 1 must be so tall that dC's buffer holds only part of their W
    override = {"chunks": {"recompute": "tma" if recompute == "tma" else "cublas"},
                "poison": True}
    if chunks == "small":
        override.update(LOW_MEMORY_SMALL)
    if chunks == "groups":
        override["low_memory"] = {**LOW_MEMORY_SMALL["low_memory"], "min_entries": 24 * 64}
    plans = []
    real_plan = route_module.low_memory_plan
    monkeypatch.setattr(route_module, "low_memory_plan",
                        lambda *a: plans.append(real_plan(*a)) or plans[-1])
    writers = _spy_w_writers(monkeypatch)
    g = torch.Generator().manual_seed(23)
    n, d, v = 150, 24, 61  # n > 2 d: row groups need less workspace than every row at once
    e = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    c = torch.randn(v, d, generator=g).to(dtype).requires_grad_()
    bias = (0.1 * torch.randn(v, generator=g)).to(dtype).requires_grad_() if has_bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[::4] = -100
    with overridden(override):
        loss, lse = linear_cross_entropy(e, c, t, bias=bias, softcap=softcap, label_smoothing=ls,
                                         return_lse=True, low_memory=True)
        (loss + 0.01 * (lse ** 2).mean()).backward()
    assert len(plans) == 1
    plan = plans[0]
    assert writers and set(writers) == {recompute}, writers
    if chunks == "small":  # the paths this case is for
        assert plan.rows_1 < n and plan.rows_2 < n and plan.width_2 < v
    if chunks == "groups":
        assert plan.width_1 < v
    ref, e2, c2, b2 = reference(e, c, t, bias, softcap, ls=ls)
    z = e2 @ c2.T + (b2 if b2 is not None else 0)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    (ref + 0.01 * (torch.logsumexp(z, 1) ** 2).mean()).backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert rel(loss.detach(), ref.detach()) < tol
    assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol
    if has_bias:
        assert rel(bias.grad, b2.grad) < tol


@pytest.mark.parametrize("n, v, d, elt", [(8192, 256000, 2304, 2), (32768, 32000, 2304, 2),
                                          (65536, 151936, 512, 2), (2048, 20000, 4096, 2),
                                          (37, 61, 24, 4), (1, 7, 16, 2), (300, 3, 8, 4),
                                          (8192, 50257, 2304, 2), (8192, 20000, 2304, 2)])
def test_low_memory_plan_fits_its_buffers(n, v, d, elt):
    # Pass 1's W and fp32 result fit the larger of dC's buffer and pass 2's; pass 2's fit its
    # buffer; that buffer is low_memory.frac of the gradients wherever that holds one row block.
    from own_kernel.policy.plan import low_memory_plan, tile_bytes

    cfg = HOPPER_16BIT
    plan = low_memory_plan(n, v, d, elt, cfg)
    rows_1, width_2, rows_2, ws = plan.rows_1, plan.width_2, plan.rows_2, plan.workspace_2
    assert 1 <= rows_1 <= n and 1 <= rows_2 <= n and 1 <= width_2 <= v
    width_1 = plan.width_1
    assert tile_bytes(rows_1, width_1, rows_1, d, elt) <= max(v * d * elt, ws)
    assert rows_1 * d >= min(n, 2**21 // d) * d or rows_1 == n
    assert tile_bytes(rows_2, width_2, 0 if rows_2 == n else width_2, d, elt) <= ws
    for rows in (rows_1, rows_2):
        assert rows == n or rows % 128 == 0
    grads = (n + v) * d * elt
    if n >= 2048:
        assert ws <= grads / 16 + 1
    # Pass 2's chunks cover the vocabulary in order, aligned but for the last few columns; a W
    # in dC's tail lies above the chunk's own rows; a W in the workspace fits it.
    chunks, at = plan.chunks_2, 0
    for k, (v0, width, rows, in_dc) in enumerate(chunks):
        assert v0 == at and width > 0 and (width % 8 == 0 or (k == len(chunks) - 1 and width < 8))
        if in_dc:
            assert rows == n and (v0 + width) * d * elt + n * width * elt <= v * d * elt - 256
        else:
            assert tile_bytes(rows, width, 0 if rows >= n else width, d, elt) <= ws
        at += width
    assert at == v


@pytest.mark.parametrize("low_memory", [False, True])
def test_de_keeps_the_component_all_rows_of_c_share(low_memory):
    # Every row of C near one large shared vector u: dE = sum_v d[n, v] C[v] cancels along u
    # (sum_v d[n, v] = 0), and rounding W to fp16 leaves a residual there unless RowRound
    # puts it back (dlogits.py). The naive fp16 baseline keeps it; both backwards must not.
    g = torch.Generator().manual_seed(3)
    n, d, v = 64, 32, 97
    u = torch.randn(d, generator=g)
    c = (8 * u + 0.2 * torch.randn(v, d, generator=g)).half().requires_grad_()
    e = (0.3 * torch.randn(n, d, generator=g)).half().requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    linear_cross_entropy(e, c, t, low_memory=low_memory).backward()
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    e3, c3 = e.detach().clone().requires_grad_(), c.detach().clone().requires_grad_()
    F.cross_entropy((e3 @ c3.T).float(), t).backward()
    assert rel(e.grad, e2.grad) < 0.2 * rel(e3.grad, e2.grad)
    assert rel(c.grad, c2.grad) < 1e-3


def test_low_memory_rejects_the_filter_and_non_bools():
    e, c, t = torch.randn(4, 8), torch.randn(5, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="low_memory.*filter_eps"):
        linear_cross_entropy(e, c, t, filter_eps="auto", low_memory=True)
    with pytest.raises(TypeError, match="low_memory"):
        linear_cross_entropy(e, c, t, low_memory=1)


@pytest.mark.parametrize("n, v, d, elt", [(37, 101, 24, 4), (8192, 256000, 2304, 2), (65536, 151936, 512, 2),
                                          (8192, 32000, 4096, 2), (1, 7, 16, 2)])
def test_chunk_plan_keeps_workspace_off_unwritten_rows(n, v, d, elt):
    # The cuBLAS route (tma False): X and W at dC's end, above the chunk's own rows.
    from own_kernel.policy.plan import chunk_plan, x_and_w_slots

    for cfg in (INTERPRETER, HOPPER_16BIT):
        plan = chunk_plan(n, v, d, elt, cfg, tma=False)
        starts = [ch.v_start for ch in plan]
        assert starts[0] == 0 and all(ch.width > 0 for ch in plan)
        assert [ch.v_start + ch.width for ch in plan] == starts[1:] + [v], "chunks tile the vocabulary"
        kinds = [ch.in_tail for ch in plan]
        assert kinds == sorted(kinds), "chunks in dC first, then the tail"
        assert all(ch.width % 8 == 0 for ch in plan[:-1]) and plan[-1].width % 8 == v % 8, \
            "unaligned widths (slow cuBLAS kernels) only for the last V mod 8 columns"
        dc_bytes = v * d * elt
        widths = [ch.width for ch in plan if not ch.in_tail]
        assert widths == sorted(widths, reverse=True), "never wider: the look-ahead's X stays off W"
        for ch in plan:
            if not ch.in_tail:
                s, w = ch.v_start, ch.width
                w_start, x_start, end = x_and_w_slots(dc_bytes, n, w, elt)
                assert (s + w) * d * elt <= w_start, "X and W must not overlap the chunk's own dC rows"
                assert w_start + n * w * elt <= x_start and end - x_start == 4 * n * w <= end
                assert w <= max(cfg.chunks.max_width, cfg.chunks.max_entries // n)


@pytest.mark.parametrize("n, v, d, elt", [(37, 101, 24, 4), (8192, 256000, 2304, 2), (65536, 151936, 512, 2),
                                          (8192, 32000, 4096, 2), (1, 7, 16, 2), (4096, 50257, 768, 2)])
def test_tma_chunk_plan_keeps_live_w_slots_apart(n, v, d, elt):
    # With recompute "tma" and the filter's look-ahead, chunk k's W is written before chunk
    # k-1's GEMMs, which write dC[chunk k-1] and read W[k-1]: W[k-1] and W[k] must be disjoint,
    # and no chunk's dC rows may reach a W slot that is still to be read. Exact calls have no
    # look-ahead: one W at a time, and twice the width for the same bytes.
    import itertools

    from own_kernel.policy.plan import chunk_plan, looks_ahead, w_slots

    # HOPPER_16BIT sends chunks narrower than the tail's to the tail (chunks.tail_min_width);
    # without that rule, what fits in dC alone decides the chunks.
    hopper_all_in_dc = with_overrides(HOPPER_16BIT, {"chunks": {"tail_min_width": False}})
    for cfg, filtered in itertools.product((INTERPRETER, HOPPER_16BIT, hopper_all_in_dc),
                                           (False, True)):
        plan = chunk_plan(n, v, d, elt, cfg, tma=True, filtered=filtered)
        assert [ch.v_start + ch.width for ch in plan] == [ch.v_start for ch in plan][1:] + [v]
        assert all(ch.width % 8 == 0 for ch in plan[:-1]) and plan[-1].width % 8 == v % 8
        chunks = [(ch.v_start, ch.width) for ch in plan if not ch.in_tail]
        widths = [w for _, w in chunks]
        assert widths == sorted(widths, reverse=True)
        assert all(w % 8 == 0 for w in widths), "TMA row strides are 16-byte multiples"
        lookahead = looks_ahead(n, cfg, filtered)
        slots = w_slots(widths, v * d * elt, n, elt, lookahead)
        span = [(a, a + n * w * elt) for a, w in zip(slots, widths)]
        assert all(b <= v * d * elt for _, b in span)
        for k, (s, w) in enumerate(chunks):
            dc_end = (s + w) * d * elt
            live = span[k:k + 2] if lookahead else span[k:k + 1]  # its own W and the look-ahead's
            assert all(dc_end <= a for a, _ in live), f"chunk {k}'s dC rows reach a live W"
            if k and lookahead:
                (a0, b0), (a1, b1) = span[k - 1], span[k]
                assert b1 <= a0 or b0 <= a1, f"chunks {k - 1} and {k} share W bytes"
        if cfg.chunks.tail_min_width:
            continue  # the chunks' widths below follow the tail's, not dC's space
        if not filtered:
            two_slots = chunk_plan(n, v, d, elt, cfg, tma=True, filtered=True)
            assert sum(widths) >= sum(ch.width for ch in two_slots if not ch.in_tail)
        # W alone (2 of the 6 bytes per entry) covers at least what X and W did
        x_and_w = chunk_plan(n, v, d, elt, cfg, tma=False, filtered=filtered)
        assert sum(widths) >= sum(ch.width for ch in x_and_w if not ch.in_tail)


def test_filtered_cublas_chunks_and_pointer_tail_read_only_what_they_wrote(monkeypatch):
    # cuBLAS-route chunks filter (gathered kept columns); the tail's chunks start wherever they
    # end (a multiple of 8 here, not of dlogits' 32-wide tiles) and run the pointer kernel into
    # the tail's buffer. Workspaces and dC start as NaN (poison), so a GEMM reading W the
    # kernels never wrote shows as NaN, and poisoning must change nothing at all.
    from own_kernel.paths import recompute as backward
    from own_kernel.policy.config import config_for
    from own_kernel.policy.plan import chunk_plan

    override = {"dlogits": {"block_v": 32},
                "chunks": {"max_width": 40, "min_width": 8, "align": 8, "recompute": "cublas"},
                "filter": {"max_width": 40}}
    n, d, v = 64, 16, 294  # cuBLAS chunks end at column 216 = 6 * 32 + 24
    e, c, t = peaked_inputs(n, d, v, seed=0)  # peaked rows: many columns skipped
    with overridden(override):
        cfg = config_for(e.device, e.dtype)
    plan = chunk_plan(n, v, d, 4, cfg, tma=False, filtered=True)
    tail_starts = [ch.v_start for ch in plan if ch.in_tail]
    assert tail_starts and tail_starts[0] % 32, "the test needs a tail off the tile grid"
    writers = _spy_w_writers(monkeypatch)
    runs = []
    real_run = backward.FilteredRun.run
    monkeypatch.setattr(backward.FilteredRun, "run",
                        lambda self, *a: runs.append(real_run(self, *a)) or runs[-1])

    def grads(poison):
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        with overridden({**override, "poison": poison}):
            linear_cross_entropy(ee, cc, t, filter_eps=0.03).backward()
        return ee.grad, cc.grad

    clean, poisoned = grads(False), grads(True)
    assert runs == [True, True], "the cuBLAS chunks must filter"
    assert writers.count("pointer") == 2 * len(tail_starts), writers
    assert all(torch.isfinite(x).all() for x in poisoned)
    assert all(torch.equal(a, b) for a, b in zip(clean, poisoned))
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()  # a large eps (3 % of the target's O(1) entry) skips a lot: a loose bound
    assert rel(clean[0], e2.grad) < 0.15 and rel(clean[1], c2.grad) < 0.15


@pytest.mark.parametrize("filter_eps, subtiles, persistent, lookahead, col_round",
                         [(None, 1, False, True, True), (0.03, 2, False, True, True),
                          (None, 4, True, True, True), (0.03, 4, True, True, True),
                          (0.03, 2, True, False, True), (None, 4, True, True, False),
                          (0.03, 4, True, True, False)])
def test_tma_chunks_read_only_what_they_wrote(monkeypatch, filter_eps, subtiles, persistent,
                                              lookahead, col_round):
    # Many narrow tma chunks: their W slots alternate inside dC's unwritten tail while dC fills
    # up (w_slots). dC and the workspaces start as NaN (poison): a GEMM reading a W slot that a
    # later chunk's dC rows or the look-ahead's W overwrote shows as NaN or as a difference.
    from own_kernel.kernels import dlogits, dlogits_tma, softmax_grad
    from own_kernel.paths import recompute as backward
    from own_kernel.policy.config import config_for
    from own_kernel.policy.plan import chunk_plan

    override = {
        "chunks": {"recompute": "tma", "max_width": 24, "min_width": 8, "align": 8},
        "filter": {"max_width": 24, "lookahead_max_n": 2**62 if lookahead else 0},
        "recompute": {"col_round": col_round, "tiles": {"block_n": 8, "block_v": 32},
                      "subtiles": subtiles, "persistent": persistent, "flatten": persistent}}
    n, d, v = 40, 16, 203
    e, c, t = peaked_inputs(n, d, v, seed=1)
    with overridden(override):
        cfg = config_for(e.device, e.dtype)
    plan = chunk_plan(n, v, d, 4, cfg, tma=True, filtered=filter_eps is not None)
    assert sum(not ch.in_tail for ch in plan) >= 4, "the test needs several tma chunks"
    assert plan[-1].in_tail and plan[-1].width % 8, "and a tail (odd width) past dC's space"
    calls, col_rounds = [], []
    # With tma, the tail runs dlogits_tma.py too, its W in the tail's buffer.
    monkeypatch.setattr(softmax_grad, "cce_softmax_grad_kernel", None)  # must not be used
    monkeypatch.setattr(dlogits, "cce_dlogits_kernel", None)
    real = dlogits_tma.cce_dlogits_tma_kernel
    monkeypatch.setattr(dlogits_tma, "cce_dlogits_tma_kernel", type("Spy", (), {"__getitem__": lambda self, grid: (
        calls.append(grid) or (lambda *a, **k: col_rounds.append(k["COL_ROUND"]) or real[grid](*a, **k)))})())
    # Without the column rounding sums an exact call adds no rank-1 correction to dC.
    real_rank1 = backward.rank1_dc
    rank1 = []
    monkeypatch.setattr(backward, "rank1_dc", lambda *a, **k: rank1.append(a) or real_rank1(*a, **k))

    def grads(poison):
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        with overridden({**override, "poison": poison}):
            linear_cross_entropy(ee, cc, t, filter_eps=filter_eps).backward()
        return ee.grad, cc.grad

    clean, poisoned = grads(False), grads(True)
    assert len(calls) == 2 * len(plan), "every chunk, the tail's too, runs the tma kernel"
    assert set(col_rounds) == {col_round}
    assert len(rank1) == 2 * (col_round or filter_eps is not None)
    assert all(torch.isfinite(x).all() for x in poisoned)
    assert all(torch.equal(a, b) for a, b in zip(clean, poisoned))
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    tol = 1e-5 if filter_eps is None else 0.15
    assert rel(clean[0], e2.grad) < tol and rel(clean[1], c2.grad) < tol


@pytest.mark.parametrize("recompute", ["cublas", "tma"])
def test_tail_runs_exact_in_a_filtered_call(recompute):
    # The tail's chunks do not filter: their dC rows match the exact mode's, while the chunks
    # in dC still skip columns (a large eps: visible there).
    from own_kernel.policy.config import config_for
    from own_kernel.policy.plan import chunk_plan

    override = {"dlogits": {"block_v": 32},
                "chunks": {"max_width": 40, "min_width": 8, "align": 8, "recompute": recompute},
                "filter": {"max_width": 40}}
    n, d, v = 64, 16, 294
    e, c, t = peaked_inputs(n, d, v, seed=0)
    with overridden(override):
        cfg = config_for(e.device, e.dtype)
    plan = chunk_plan(n, v, d, 4, cfg, tma=recompute == "tma", filtered=True)
    tail = min(ch.v_start for ch in plan if ch.in_tail)
    assert 0 < tail < v, "the test needs chunks in dC and a tail"

    def grad_c(filter_eps):
        cc = c.clone().requires_grad_()
        with overridden(override):
            linear_cross_entropy(e, cc, t, filter_eps=filter_eps).backward()
        return cc.grad

    exact, filtered = grad_c(None), grad_c(0.03)
    assert rel(filtered[:tail], exact[:tail]) > 1e-3, "the chunks in dC must filter"
    tail_err = rel(filtered[tail:], exact[tail:])
    assert tail_err < 1e-5, tail_err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gather_kept_matches_torch(dtype):
    # The filtered chunks' gather: kept columns of W, zero padding past num_kept, zero flat rows
    # (eps 0), and the gathered row sums taken off row_skip.
    import triton

    from own_kernel.kernels.gather_kept import cce_gather_kept_kernel

    g = torch.Generator().manual_seed(3)
    n, width, num_kept, size = 45, 200, 37, 72
    w_full = torch.randn(n, 256, generator=g).to(dtype)
    w = w_full[:, :width]  # a slot with a wider row stride, as in the tail workspace
    kept = torch.sort(torch.randperm(width, generator=g)[:num_kept]).values
    kept = torch.cat([kept, torch.zeros(size - num_kept, dtype=torch.int64)])  # padded with column 0
    row_eps = torch.full((n,), 1e-3)
    row_eps[[0, 7, 44]] = 0.0  # flat rows
    row_skip = torch.randn(n, generator=g)
    out = torch.full((n, size), float("nan"), dtype=dtype)
    got_skip = row_skip.clone()
    cce_gather_kept_kernel[(triton.cdiv(n, 32),)](w, kept, row_eps, out, got_skip, n, num_kept, size,
                                                 w.stride(0), out.stride(0), BLOCK_N=32, BLOCK_K=16)
    want = w[:, kept].clone()
    want[:, num_kept:] = 0
    want[row_eps == 0] = 0
    assert torch.equal(out, want)
    torch.testing.assert_close(got_skip, row_skip - want.float().sum(dim=1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("min_flops, exact", [(float("inf"), True), (50000, False)])
def test_filter_min_flops_runs_narrow_chunks_exact(monkeypatch, min_flops, exact):
    # tma chunks narrower than filter_min_flops (4 N width D) and the tail run exact inside a
    # filtered backward: with every chunk below it the result is exact mode's; with some above
    # (the 24-wide chunks here: 4 * 40 * 24 * 16 = 61440 flops) they filter, poison-safe.
    from own_kernel.paths import recompute as backward

    override = {"chunks": {"recompute": "tma", "max_width": 24, "min_width": 8, "align": 8},
                "filter": {"max_width": 24, "min_flops": min_flops}}
    n, d, v = 40, 16, 203
    e, c, t = peaked_inputs(n, d, v, seed=1)
    can_skip, decisions, runs = [], [], []
    from own_kernel.policy import route as route_module

    real_can_skip, real_filter_rows = route_module.filter_can_skip, backward.filter_rows
    monkeypatch.setattr(route_module, "filter_can_skip",
                        lambda *a, **k: can_skip.append(real_can_skip(*a, **k)) or can_skip[-1])
    monkeypatch.setattr(backward, "filter_rows",
                        lambda *a: decisions.append(1) or real_filter_rows(*a))
    real_run = backward.FilteredRun.run
    monkeypatch.setattr(backward.FilteredRun, "run",
                        lambda self, *a: runs.append(real_run(self, *a)) or runs[-1])

    def grads(filter_eps, poison=False):
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        with overridden({**override, "poison": poison}):
            linear_cross_entropy(ee, cc, t, filter_eps=filter_eps).backward()
        return ee.grad, cc.grad

    ref = grads(None)
    filtered, poisoned = grads(0.03), grads(0.03, poison=True)
    assert all(torch.equal(a, b) for a, b in zip(filtered, poisoned))
    errs = [rel(a, b) for a, b in zip(filtered, ref)]
    if exact:
        assert max(errs) < 1e-6, errs
        # decided from the shape alone: no host wait for the filter's reductions
        assert can_skip == [False, False] and decisions == [] and runs == []
    else:
        assert 1e-4 < max(errs) < 0.15, errs  # some chunks filtered, within the filter's bound
        assert can_skip == [True, True] and runs == [True, True]


@pytest.mark.parametrize("low_memory", [False, True])
def test_custom_ops_pass_opcheck(low_memory):
    # Schema, fake (meta) implementation and autograd registration of both ops, as
    # torch.compile uses them.
    from own_kernel.paths.entries import lce_rows, lce_rows_backward
    from own_kernel.policy.options import Options

    g = torch.Generator().manual_seed(5)
    e = torch.randn(9, 16, generator=g, requires_grad=True)
    c = torch.randn(23, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 23, (9,), generator=g)
    t[2] = -100
    options = Options(ignore_index=-100, low_memory=low_memory).op_args()
    args = (e, c, t, None, *options)
    torch.library.opcheck(lce_rows, args, test_utils=("test_schema", "test_faketensor",
                                                       "test_autograd_registration"))
    loss, lse, p_max, nll, lse_lo, _ = lce_rows(*args)
    torch.library.opcheck(lce_rows_backward, (e.detach(), c.detach(), t, None, lse, nll, p_max,
                                              lse_lo, torch.ones(9), None, *options),
                          test_utils=("test_schema", "test_faketensor"))


def test_works_inside_torch_compile():
    # aot_autograd traces the graph through the ops' fake implementations and runs the real
    # ones: no code generation, so it runs on the interpreter's CPU. Eager calls take another
    # route (ops.LceRowsEager); both must agree.
    g = torch.Generator().manual_seed(6)
    e = torch.randn(2, 7, 16, generator=g)
    c = torch.randn(31, 16, generator=g)
    t = torch.randint(0, 31, (2, 7), generator=g)
    t[0, 3] = -100

    def step(e, c):
        return linear_cross_entropy(e, c, t, shift=1, softcap=20.0)

    e1, c1 = e.clone().requires_grad_(), c.clone().requires_grad_()
    step(e1, c1).backward()
    e2, c2 = e.clone().requires_grad_(), c.clone().requires_grad_()
    traced = []
    from torch._dynamo.backends.common import aot_autograd

    def backend(gm, example_inputs):  # what dynamo hands the compiler: the custom op, opaque
        traced.extend(node.target for node in gm.graph.nodes)
        from functorch.compile import make_boxed_func
        run = aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))
        return run(gm, example_inputs)

    loss = torch.compile(step, backend=backend, fullgraph=True)(e2, c2)
    loss.backward()
    assert torch.ops.own_kernel.lce_rows.default in traced
    ref, er, cr, _ = reference(e, c, t, softcap=20.0, shift=1)
    assert abs(loss.item() - ref.item()) < 1e-5
    assert torch.allclose(e2.grad, e1.grad, atol=1e-6) and torch.allclose(c2.grad, c1.grad, atol=1e-6)


def test_autocast_casts_inputs_to_its_dtype():
    g = torch.Generator().manual_seed(7)
    e = torch.randn(13, 16, generator=g, requires_grad=True)
    c = torch.randn(29, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 29, (13,), generator=g)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = linear_cross_entropy(e, c, t)
    loss.backward()
    assert e.grad.dtype == torch.float32 and c.grad.dtype == torch.float32  # leaves stay fp32
    ref, e2, c2, _ = reference(e.half(), c.half(), t)
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-3
    assert rel(e.grad, e2.grad) < 3e-3 and rel(c.grad, c2.grad) < 3e-3


@pytest.mark.parametrize("peaked_rows, filters", [(30, True), (10, False), (0, False)])
def test_filter_decision_read_after_the_first_chunk(monkeypatch, peaked_rows, filters):
    # The filter's decision (how many rows may skip, how many are flat) is read on the host only
    # after the first tma chunk's kernel is queued, that chunk running as if filtering. When the
    # answer is no (too many flat rows, or none peaked), what it added for the filter must be
    # dropped: the gradients are exact mode's, poison-safe, and the later chunks run unfiltered.
    from own_kernel.kernels import dlogits_tma
    from own_kernel.paths import recompute as backward
    from own_kernel.policy import options
    from own_kernel.policy.config import config_for
    from own_kernel.policy.plan import chunk_plan

    override = {"chunks": {"recompute": "tma", "max_width": 24, "min_width": 8, "align": 8},
                "filter": {"max_width": 24}}
    monkeypatch.setitem(options.AUTO_EPS, torch.float32, 5e-3)
    monkeypatch.setattr(options, "AUTO_FLAT_P_MAX", 0.01)
    n, d, v = 40, 16, 203
    e, c, t = peaked_inputs(n, d, v, seed=1)
    e[peaked_rows:] *= 0.001  # flat softmax: p_max ~ 1/V, below AUTO_FLAT_P_MAX
    flags = []
    real = dlogits_tma.cce_dlogits_tma_kernel
    monkeypatch.setattr(dlogits_tma, "cce_dlogits_tma_kernel", type("Spy", (), {"__getitem__": lambda self, grid: (
        lambda *a, **k: flags.append(k["FILTER"]) or real[grid](*a, **k))})())
    # The filtered run's plan, whether it filtered, and the plan of what ran exact after it.
    runs, exact_plans = [], []
    real_run, real_exact = backward.FilteredRun.run, backward.exact_chunks

    def run(self, plan, replan):
        runs.append([plan, real_run(self, plan, replan)])
        return runs[-1][1]

    monkeypatch.setattr(backward.FilteredRun, "run", run)
    monkeypatch.setattr(backward, "exact_chunks",
                        lambda writer, plan, scale: exact_plans.append(plan) or real_exact(writer, plan, scale))

    def grads(filter_eps, poison=False):
        flags.clear()
        runs.clear()
        exact_plans.clear()
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        with overridden({**override, "poison": poison}):
            linear_cross_entropy(ee, cc, t, filter_eps=filter_eps).backward()
        return ee.grad, cc.grad

    exact = grads(None)
    auto, poisoned = grads("auto"), grads("auto", poison=True)
    assert len(flags) >= 4 and flags[0], "the first chunk runs as if filtering"
    assert any(flags[1:]) == filters, flags
    assert all(torch.equal(a, b) for a, b in zip(auto, poisoned))
    errs = [rel(a, b) for a, b in zip(auto, exact)]
    assert (max(errs) > 1e-6) == filters, errs
    assert len(runs) == 1 and runs[0][1] == filters, "the filter ran only where it could skip"
    if not filters:
        assert max(errs) < 1e-6
        # past the first chunk, the plan an exact call has from there: one W slot, no look-ahead
        with overridden(override):
            cfg = config_for(e.device, e.dtype)
        first = runs[0][0][0]
        assert len(exact_plans) == 1
        plan = [first] + exact_plans[0]
        assert plan[1:] == chunk_plan(n, v, d, 4, cfg, tma=True, lookahead=False,
                                      v_first=first.v_start + first.width)
        assert plan != chunk_plan(n, v, d, 4, cfg, tma=True, filtered=True), \
            "the test needs a different plan"
    else:
        assert exact_plans == []


def test_narrow_chunks_go_to_the_tail_and_small_filters_run_exact():
    # Plans of the H200's config, without a GPU. chunks.tail_min_width: with many tokens dC's
    # free tail holds only chunks narrower than the tail's (dE's buffer), so they all go to the
    # tail. filter.min_total_flops: a filter whose chunks carry too little GEMM work is not run.
    from own_kernel.policy.plan import TailPlan, chunk_plan, filter_can_skip, looks_ahead, tail_width

    cfg = HOPPER_16BIT
    no_tail_min = with_overrides(cfg, {"chunks": {"tail_min_width": False}})
    n, d, v = 32768, 2304, 32000
    width, in_de = tail_width(n, v, d, 2, cfg).width, tail_width(n, v, d, 2, cfg).in_de
    assert in_de and width == 2304  # all of dE's buffer (tail_mib alone would give 2048)
    assert tail_width(n, v, 4096, 2, cfg) == TailPlan(4096, True)
    assert tail_width(n, 1000, d, 2, cfg) == TailPlan(1024, True)  # never much wider than V
    plan = chunk_plan(n, v, d, 2, cfg, tma=True)
    assert all(ch.width >= width for ch in plan if not ch.in_tail)
    assert sum(ch.width for ch in plan) == v and plan[-1].in_tail
    narrow = chunk_plan(n, v, d, 2, no_tail_min, tma=True)
    assert any(not ch.in_tail and ch.width < width for ch in narrow)
    # filtered, chunks wide enough to filter stay in dC (the tail does not filter)
    filtered = chunk_plan(n, v, d, 2, cfg, tma=True, filtered=True)
    assert filtered == chunk_plan(n, v, d, 2, no_tail_min, tma=True, filtered=True)
    assert any(not ch.in_tail for ch in filtered)
    for n, d, v in [(2048, 2304, 128256), (8192, 4096, 256000)]:
        width = tail_width(n, v, d, 2, cfg).width
        plan = chunk_plan(n, v, d, 2, cfg, tma=True)
        assert all(ch.width >= width for ch in plan if not ch.in_tail) and not plan[0].in_tail
        assert sum(ch.width for ch in plan) == v
    # Filtered calls look ahead (two W slots) up to filter.lookahead_max_n tokens; beyond, one
    # slot and wider chunks.
    for n, looks in [(8192, True), (32768, False)]:
        plan = chunk_plan(n, 128256, d, 2, cfg, tma=True, filtered=True)
        two = chunk_plan(n, 128256, d, 2, cfg, tma=True, filtered=True, lookahead=True)
        assert looks_ahead(n, cfg, True) == looks and (plan == two) == looks
        if not looks:
            assert plan[0].width > two[0].width
    assert not looks_ahead(8192, cfg, False)
    assert not filter_can_skip(2048, 32000, 4096, 2, cfg, True)
    assert filter_can_skip(2048, 32000, 4096, 2, with_overrides(cfg, {"filter": {"min_total_flops": 0}}),
                           True)
    assert filter_can_skip(8192, 256000, 2304, 2, cfg, True)
    # A vocab-parallel shard needs more: Gemma 2 (2B)'s quarter shard filters alone, not sharded.
    assert filter_can_skip(8192, 64000, 2304, 2, cfg, True)
    assert not filter_can_skip(8192, 64000, 2304, 2, cfg, True, vocab_parallel=True)
    assert filter_can_skip(16384, 38016, 3584, 2, cfg, True, vocab_parallel=True)


# ---- property-based: random shapes and options against fp64 -----------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402


# bf16 only where the kernels are compiled: the interpreter's bf16 arithmetic is wrong.
_TEST_DEVICE = __import__("os").environ.get("CCE_TEST_DEVICE", "cpu")
_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if _TEST_DEVICE != "cpu" else [])
_TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
_FLOOR = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}  # absolute, near 0


@st.composite
def _calls(draw):
    batch = draw(st.sampled_from([(), (2,), (1, 3)]))
    seq = draw(st.integers(0, 23))
    d = draw(st.integers(1, 40))
    v = draw(st.sampled_from([1, 2, 13, 31, 61, 97]))  # primes: no block divides them
    shift = draw(st.integers(0, 2)) if batch and seq > 2 else 0
    return dict(
        shape=batch + (seq, d), v=v, shift=shift,
        softcap=draw(st.sampled_from([None, 2.0, 30.0])),
        reduction=draw(st.sampled_from(["mean", "sum", "none"])),
        ls=draw(st.sampled_from([0.0, 0.15])),
        bias=draw(st.booleans()),
        ignore=draw(st.sampled_from(["none", "random", "prefix", "all"])),
        ignore_index=draw(st.sampled_from([-100, 0, 5])),
        filter_eps=draw(st.sampled_from([None, None, "auto"])),
        lse_weight=draw(st.sampled_from([0.0, 0.5])),  # z-loss on the lse: needs every row's lse
        scale=draw(st.sampled_from([1.0, 8.0])),  # 8: large logits
        # where ignored rows are dropped: before the forward, before the backward, never
        drop=draw(st.sampled_from(["forward", "backward", "none"])),
        low_memory=draw(st.booleans()),  # backward_low_memory.py, in small chunks (exact only)
        dtype=draw(st.sampled_from(_DTYPES)),
        seed=draw(st.integers(0, 2**16)),
        # a layout per tensor argument: the result must be its contiguous copy's
        layouts={name: draw(st.sampled_from(LAYOUTS)) for name in ("e", "c", "bias", "targets",
                                                                    "grad", "grad_lse")},
    )


LAYOUTS = ["contiguous", "contiguous", "strided", "offset", "expanded", "transposed", "permuted"]


def laid_out(x, layout):
    """x's values (or, "expanded", its first element's along dim 0) in the given memory layout:
    strided (every other element of a larger tensor's last dim), offset (3 elements into a
    larger storage), expanded (stride 0 along dim 0), transposed (a matrix stored column-major)
    or permuted (a 3-D view whose first two dims are swapped in memory). Layouts that the shape
    does not allow give x itself."""
    if x.numel() == 0 or x.dim() == 0 or layout == "contiguous":
        return x
    if layout == "strided":
        wide = torch.empty(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "offset":
        flat = torch.empty(x.numel() + 3, dtype=x.dtype, device=x.device)
        flat[3:] = x.reshape(-1)
        return flat[3:].view(x.shape)
    if layout == "expanded":
        return x[:1].expand(x.shape)
    if layout == "transposed" and x.dim() == 2:
        return x.t().contiguous().t()
    if layout == "permuted" and x.dim() == 3:
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    return x


DROP_CONFIGS = {"forward": {"compaction": {"fwd_min_flops": 0}},
                "backward": {"compaction": {"fwd_min_flops": 1e30}},
                "none": {"compaction": {"fwd_min_flops": 1e30, "max_used": 0.0}}}


@settings(max_examples=120, deadline=None, derandomize=True)
@given(_calls())
def test_random_calls_match_fp64(call):
    with overridden({**DROP_CONFIGS[call["drop"]], **LOW_MEMORY_SMALL}):
        _check_call(call)


def _check_call(call):
    import os

    # CCE_TEST_DEVICE=cuda runs these calls on a GPU (without TRITON_INTERPRET): the compiled
    # kernels and the GPU's configs, on the same inputs.
    dev, dt = torch.device(_TEST_DEVICE), call["dtype"]
    g = torch.Generator().manual_seed(call["seed"])
    shape, v = call["shape"], call["v"]
    lay = call["layouts"]
    # Leaves hold the values; the kernel sees them in the drawn layouts (views of the leaves,
    # or of copies, so the gradients reach the leaves through autograd).
    e = (call["scale"] * torch.randn(shape, generator=g) / max(1, shape[-1]) ** 0.5).to(dev, dt)
    e = laid_out(e, lay["e"]).detach().requires_grad_()
    c = laid_out(torch.randn(v, shape[-1], generator=g).to(dev, dt), lay["c"])
    c = c.detach().requires_grad_()
    bias = (laid_out((0.3 * torch.randn(v, generator=g)).to(dev, dt), lay["bias"]).detach()
            .requires_grad_() if call["bias"] else None)
    ii = call["ignore_index"]
    t = torch.randint(0, v, shape[:-1], generator=g)
    flat = t.view(-1)
    if ii >= 0:
        flat[flat == ii] = (ii + 1) % v if v > 1 else -100  # ii must only mark ignored targets
        ii = ii if v > 1 else -100
    if call["ignore"] == "random":
        flat[torch.rand(flat.shape, generator=g) < 0.5] = ii
    elif call["ignore"] == "prefix":
        flat[: flat.numel() * 2 // 3] = ii
    elif call["ignore"] == "all":
        flat[:] = ii
    t = laid_out(t.to(dev), lay["targets"])
    kw = dict(bias=bias, softcap=call["softcap"], reduction=call["reduction"],
              label_smoothing=call["ls"], shift=call["shift"], ignore_index=ii,
              filter_eps=None if call["low_memory"] else call["filter_eps"],
              low_memory=call["low_memory"])
    zw = call["lse_weight"]
    if zw:
        loss, lse = linear_cross_entropy(e, c, t, return_lse=True, **kw)
    else:
        loss, lse = linear_cross_entropy(e, c, t, **kw), None
    ref, e2, c2, b2 = reference(e, c, t, bias, call["softcap"], call["reduction"], call["ls"], ii,
                                call["shift"])
    assert loss.shape == ref.shape
    if call["reduction"] == "mean" and not (ref == ref).all():  # nothing to average: NaN both
        assert torch.isnan(loss).all()
        return
    w = torch.randn(loss.shape, generator=g) if call["reduction"] == "none" else torch.tensor(1.0)
    w = laid_out(w.to(dev), lay["grad"])
    # The upstream gradients handed to the kernel as they are (any layout): backward(grad).
    outputs, grads = [loss], [w.expand(loss.shape) if loss.dim() == 0 else w]
    ref_total = (ref * w.double()).sum()
    if zw:  # lse of every position that predicts a target, against fp64
        z = e2 @ c2.T + (b2 if b2 is not None else 0)
        if call["softcap"]:
            z = call["softcap"] * torch.tanh(z / call["softcap"])
        ref_lse = torch.logsumexp(z, -1)
        if call["shift"]:  # the positions that predict a target, as the loss's
            ref_lse = ref_lse[..., :-call["shift"]]
        assert lse.shape == ref_lse.shape
        assert rel(lse.detach(), ref_lse.detach()) < min(_TOL[dt], 1e-4)
        w_lse = laid_out(zw * torch.randn(lse.shape, generator=g).to(dev), lay["grad_lse"])
        outputs.append(lse)
        grads.append(w_lse)
        ref_total = ref_total + (w_lse.double() * ref_lse).sum()
    if not loss.requires_grad:  # empty input: a constant 0
        assert not loss.any()
        return
    torch.autograd.backward(outputs, grads)
    ref_total.backward()
    tol = _TOL[dt] if kw["filter_eps"] is None else 0.1
    # relative error, with an absolute floor for rounding where the reference is (near) 0
    # (V = 1: loss and gradients exactly 0); the loss is fp32 whatever the inputs
    assert (loss.detach().double() - ref.detach()).norm() <= 1e-4 * ref.detach().norm() + 1e-5
    pairs = [(e.grad, e2.grad), (c.grad, c2.grad)] + ([(bias.grad, b2.grad)] if bias is not None else [])
    for got, want in pairs:
        assert (got.double() - want).norm() <= tol * want.norm() + _FLOOR[dt]
