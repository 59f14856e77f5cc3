"""batch_invariant=True: each row's loss, lse, entropy and dE row are the same bits whatever else
is in the call (other rows, N, their order, ignored rows, workspace_mib), compared with
torch.equal; dC is the same bits run to run. Each property has a sibling showing that the
default call differs on the same inputs (so the property is not one the kernel meets anyway).

On the CPU the kernels run under the interpreter (fp32 and fp16: its bf16 arithmetic is wrong);
CCE_TEST_DEVICE=cuda runs the same tests with the compiled kernels, bf16 included, at shapes
where the default's splits and chunks change with N.
"""
import os

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import own_kernel
from own_kernel import linear_cross_entropy

DEVICE = os.environ.get("CCE_TEST_DEVICE", "cpu")
ON_GPU = DEVICE == "cuda" and torch.cuda.is_available()
DTYPES = [torch.bfloat16, torch.float32] if ON_GPU else [torch.float32, torch.float16]
# (D, V): the interpreter's tiles are 16 wide, so V 100 is 7 forward blocks and 4 backward chunks
D, V = (512, 4096) if ON_GPU else (32, 100)
MAX_ROWS = 3000 if ON_GPU else 48
IGNORE = -100


@pytest.fixture(autouse=True)
def row_independent_interpreter_dots(monkeypatch):
    """The interpreter's tl.dot is numpy's matmul, whose BLAS kernels round a row's products
    differently by its position in the tile (a 16 x 16 @ 16 x 16 fp32 matmul: 6 of 16
    positions differ from the same row alone). A GPU's MMA does not: each output element is
    the same instruction sequence over its own row and column. np.einsum (no BLAS) sums each
    element's products in k order, which is what the kernels' invariance rests on."""
    if ON_GPU:
        return
    import numpy as np
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        product = np.einsum("...ik,...kj->...ij", a.data.astype(d.data.dtype),
                            b.data.astype(d.data.dtype))
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


def _inputs(rows: int, dtype, seed: int = 0):
    """(e, c, targets, per-row weights of loss and entropy) of `rows` rows; a few targets
    ignored. Row i is the same whatever `rows` is (one generator, the rows drawn in order)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(rows, D, generator=g) * 0.5
    c = torch.randn(V, D, generator=torch.Generator().manual_seed(1234)) * 0.5
    t = torch.randint(0, V, (rows,), generator=g)
    t[torch.rand(rows, generator=g) < 0.1] = IGNORE
    w = torch.rand(rows, 2, generator=g) + 0.5
    return (e.to(DEVICE, dtype), c.to(DEVICE, dtype), t.to(DEVICE), w.to(DEVICE))


def _per_row(e, c, t, w, invariant=True, **kw):
    """(loss, entropy, lse, dE) per row, and dC, of sum w0 loss + w1 entropy."""
    e = e.detach().clone().requires_grad_()
    c = c.detach().clone().requires_grad_()
    out = linear_cross_entropy(e, c, t, reduction="none", return_lse=True, return_entropy=True,
                               batch_invariant=invariant, **kw)
    (out.loss * w[:, 0] + out.entropy * w[:, 1]).sum().backward()
    return (out.loss.detach(), out.entropy.detach(), out.lse.detach(), e.grad), c.grad


def _same_rows(a, b, rows_a, rows_b) -> bool:
    return all(torch.equal(x[rows_a], y[rows_b]) for x, y in zip(a, b))


def _embedded(n_alone, n_total, dtype, seed):
    """The first n_alone rows alone, and the same rows scattered (a seeded permutation) into a
    batch of n_total: (alone, batch, where the alone rows sit in the batch)."""
    e, c, t, w = _inputs(n_total, dtype, seed)
    perm = torch.randperm(n_total, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    sub = slice(0, n_alone)
    alone = (e[sub], c, t[sub], w[sub])
    batch = (e[perm], c, t[perm], w[perm])
    where = torch.argsort(perm)[:n_alone]  # batch[where[i]] is row i
    return alone, batch, where


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# No shrinking: a failing case is printed as drawn (shrinking re-runs kernels for minutes)
@settings(max_examples=3 if not ON_GPU else 20, derandomize=True, deadline=None,
          phases=(Phase.explicit, Phase.generate))
@given(n_alone=st.integers(1, 8), extra=st.integers(1, MAX_ROWS), seed=st.integers(0, 99),
       budget=st.sampled_from([None, 0, 64]))
def test_rows_are_the_same_bits_inside_any_batch(dtype, n_alone, extra, seed, budget):
    alone, batch, where = _embedded(n_alone, n_alone + extra, dtype, seed)
    kw = {} if budget is None else dict(workspace_mib=budget)
    got_alone, _ = _per_row(*alone)
    got_batch, _ = _per_row(*batch, **kw)
    rows = torch.arange(n_alone, device=DEVICE)
    assert _same_rows(got_alone, got_batch, rows, where)


@pytest.mark.parametrize("dtype", DTYPES[:1], ids=str)
def test_the_default_call_differs_where_the_invariant_one_does_not(dtype):
    """The sibling of the property above, on one batch where the default's vocabulary splits
    and backward chunks change with N: the default's rows differ, the invariant ones' do not."""
    n_alone, n_total = (256, 8192) if ON_GPU else (5, 70)
    alone, batch, where = _embedded(n_alone, n_total, dtype, seed=3)
    rows = torch.arange(n_alone, device=DEVICE)
    default = _same_rows(_per_row(*alone, invariant=False)[0],
                         _per_row(*batch, invariant=False)[0], rows, where)
    assert not default, "the default call was batch-invariant here: the test guards nothing"
    assert _same_rows(_per_row(*alone)[0], _per_row(*batch)[0], rows, where)


def _sum_de(e, c, t, invariant, **kw):
    e = e.detach().clone().requires_grad_()
    linear_cross_entropy(e, c, t, reduction="sum", batch_invariant=invariant, **kw).backward()
    return e.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_sum_with_a_workspace_budget_keeps_each_rows_de(dtype):
    """reduction="sum" (every row weighs 1): dE's rows alone, without a budget, and inside a
    permuted batch given a three-matmul budget (which the default call takes there)."""
    alone, batch, where = _embedded(4, 36 if not ON_GPU else 4100, dtype, seed=9)
    de_alone = _sum_de(*alone[:3], True)
    assert torch.equal(de_alone, _sum_de(*batch[:3], True, workspace_mib=64)[where])
    if dtype == torch.float32:  # 16-bit dE can round the default's difference away
        default = _sum_de(*batch[:3], False, workspace_mib=64)[where]
        assert not torch.equal(_sum_de(*alone[:3], False), default), "the test guards nothing"


@pytest.mark.skipif(ON_GPU, reason="the pointer kernels are the portable target's; a GPU "
                    "runs its own target's (the other tests)")
def test_the_pointer_kernels_are_invariant_too():
    """The portable target's kernels (pointer forward, pointer W writer), forced by override
    on the interpreter's config: the same property as the TMA ones'."""
    from own_kernel.policy.config import overridden

    alone, batch, where = _embedded(3, 30, torch.float32, seed=13)
    with overridden({"forward": {"tma": False}, "chunks": {"recompute": "cublas"}}):
        p = own_kernel.plan(batch[0].requires_grad_(), batch[1], batch[2], reduction="none",
                            batch_invariant=True)
        assert (p.forward, p.writer) == ("pointer", "pointer")
        got_alone, got_batch = _per_row(*alone)[0], _per_row(*batch)[0]
    assert _same_rows(got_alone, got_batch, torch.arange(3), where)


@pytest.mark.parametrize("tma", [False, True], ids=["pointer", "tma"])
def test_the_de_gemm_gives_each_row_its_bits_whatever_the_rows(tma):
    """addmm_rows, both loaders: a row's sums are its bits alone and inside a permuted batch.
    Within a dtype's rounding of an fp64 product (K terms, each fp32)."""
    from own_kernel.kernels.gemm_rows import addmm_rows
    from own_kernel.policy.config import config_for, with_overrides
    from own_kernel.policy.route import rows_gemm_reads_tma

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    cfg = with_overrides(config_for(torch.device(DEVICE), dtype), {"rows_gemm": {"tma": tma}})
    m, k, d = (1500, 1000, 384) if ON_GPU else (37, 72, 40)  # K, D: not whole tiles
    g = torch.Generator().manual_seed(21)
    a = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    b = (torch.randn(k, d, generator=g) * k ** -0.5).to(DEVICE, dtype)
    start = torch.randn(m, d, generator=g).to(DEVICE)
    assert rows_gemm_reads_tma(cfg.rows_gemm, a, b) == tma  # the route's choice is the case's

    def run(rows):
        out = start[rows].clone()
        addmm_rows(out, a[rows], b, cfg.rows_gemm, tma)
        return out

    full = run(slice(None))
    perm = torch.randperm(m, generator=g).to(DEVICE)
    assert torch.equal(run(slice(0, 5)), full[:5])
    assert torch.equal(run(perm), full[perm])
    exact = start.double() + a.double() @ b.double()
    tol = k * torch.finfo(torch.float32).eps * 4
    assert ((full.double() - exact).abs().max() / exact.abs().max()).item() < tol


def test_the_invariant_de_is_as_accurate_as_the_default():
    """dE against an fp64 reference: the invariant call's error within 5 % of the default's on
    the same path.
    Both round W and dE to the input dtype alike and differ only in how fp32 sums are ordered
    (errors of order sqrt(V) fp32 ulps, far below one 16-bit rounding); on a GPU, folding dE's
    running sums through the tensor cores' accumulation (the rows GEMM's first version) was
    18 % worse at Llama 3 (8B)."""
    n, d, v = (2048, 1024, 32768) if ON_GPU else (24, 32, 100)
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    g = torch.Generator().manual_seed(3)
    e = (torch.randn(n, d, generator=g) * 0.5).to(DEVICE, dtype)
    c = (torch.randn(v, d, generator=g) * d ** -0.5 * 4).to(DEVICE, dtype)
    t = torch.randint(0, v, (n,), generator=g).to(DEVICE)
    e64 = e.double().requires_grad_()
    torch.nn.functional.cross_entropy(e64 @ c.double().T, t).backward()

    def err(**kw):
        x = e.clone().requires_grad_()
        linear_cross_entropy(x, c, t, **kw).backward()
        return ((x.grad.double() - e64.grad).norm() / e64.grad.norm()).item()

    # the default call on the path the invariant one pins (recompute: workspace_mib=0, and on
    # Hopper fused.zero_budget "recompute")
    from own_kernel.policy.config import overridden

    with overridden({"fused": {"zero_budget": "recompute"}}):
        assert err(batch_invariant=True) <= 1.05 * err(workspace_mib=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_label_smoothing_bias_and_softcap_keep_the_bits_and_the_values(dtype):
    """The forward's per-block partials with their optional sums (the sum of logits for label
    smoothing, a bias, a softcap): the rows are their bits alone and inside a permuted batch,
    and the values are the default call's to the dtype's rounding over V's sums."""
    alone, batch, where = _embedded(5, 40 if not ON_GPU else 1500, dtype, seed=11)
    bias = (torch.randn(V, generator=torch.Generator().manual_seed(7)) * 0.3).to(DEVICE, dtype)
    kw = dict(label_smoothing=0.1, bias=bias, softcap=15.0)
    got_alone, _ = _per_row(*alone, **kw)
    got_batch, _ = _per_row(*batch, **kw)
    assert _same_rows(got_alone, got_batch, torch.arange(5, device=DEVICE), where)
    ref, _ = _per_row(*alone, invariant=False, **kw)
    tol = 8 * V * torch.finfo(torch.float32).eps  # fp32 sums over V columns, either order
    for got, want in zip(got_alone[:3], ref[:3]):  # loss, entropy, lse
        assert torch.allclose(got, want, rtol=tol, atol=tol), (got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padding_rows_change_nothing(dtype):
    """Rows padded with ignored targets (zero hidden states, as a padded micro-batch has):
    the real rows' bits do not move; padded rows have loss and entropy 0 and dE 0."""
    e, c, t, w = _inputs(11, dtype, seed=5)
    pad = 37 if not ON_GPU else 1013
    e_pad = torch.cat([e, torch.zeros(pad, D, device=DEVICE, dtype=dtype)])
    t_pad = torch.cat([t, torch.full((pad,), IGNORE, device=DEVICE)])
    w_pad = torch.cat([w, torch.ones(pad, 2, device=DEVICE)])
    got, _ = _per_row(e, c, t, w)
    got_pad, _ = _per_row(e_pad, c, t_pad, w_pad)
    rows = torch.arange(11, device=DEVICE)
    assert _same_rows(got, got_pad, rows, rows)
    loss, ent, _, de = got_pad
    assert not loss[11:].any() and not ent[11:].any() and not de[11:].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dc_is_the_same_bits_run_to_run(dtype):
    e, c, t, w = _inputs(20 if not ON_GPU else 2048, dtype, seed=7)
    (_, dc1), (_, dc2) = _per_row(e, c, t, w), _per_row(e, c, t, w)
    assert torch.equal(dc1, dc2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_token_logprobs_and_the_module_take_the_option(dtype):
    e, c, t, _ = _inputs(9, dtype, seed=11)
    alone = own_kernel.token_logprobs(e[:3], c, t[:3], batch_invariant=True)
    inside = own_kernel.token_logprobs(e, c, t, batch_invariant=True)
    assert torch.equal(alone, inside[:3])
    module = own_kernel.LinearCrossEntropy(reduction="none", batch_invariant=True)
    assert torch.equal(module(e[:3], c, t[:3]), -alone)
    assert "batch_invariant=True" in module.extra_repr()


def test_the_route_pins_every_choice_that_depends_on_the_batch():
    from own_kernel.policy.config import HOPPER_16BIT, INTERPRETER, PORTABLE
    from own_kernel.policy.route import Call, route

    for cfg in (HOPPER_16BIT, PORTABLE, INTERPRETER):
        routes = [route(Call(n, 128256, 4096, torch.bfloat16, reduction=reduction,
                             batch_invariant=True, e_tma_ready=True, c_tma_ready=True), cfg)
                  for n in (1, 257, 8192, 65536) for reduction in ("none", "sum")]
        for r in routes:
            assert r.path == "recompute" and r.fused is None and r.filter is None
            assert not r.forward_tuned and not r.pointer_tuned and not r.softmax_grad_tuned
            assert not r.reads_count_before_forward and not r.gathers(1)
            assert "batch_invariant=True" in repr(r)
        for prop in ("forward", "writer", "tail_writer", "tail"):
            assert len({getattr(r, prop) for r in routes}) == 1, prop
        assert len({r.vocab_chunks(False) for r in routes}) == 1
        grids = {(g.splits, g.v_per_split) for g in (r.forward_grid(132) for r in routes)}
        assert len(grids) == 1
        default = [route(Call(n, 128256, 4096, torch.bfloat16, reduction="none"), cfg)
                   for n in (257, 65536)]
        assert default[0].vocab_chunks(False) != default[1].vocab_chunks(False)


def test_plan_reports_it_and_unhonourable_combinations_name_their_argument():
    e, c, t, _ = _inputs(4, torch.float32)
    e.requires_grad_()
    p = own_kernel.plan(e, c, t, reduction="sum", batch_invariant=True, workspace_mib=64)
    assert p.path == "recompute" and "batch_invariant" in p.note
    assert "batch_invariant=True" in repr(p)
    for kw, name in ((dict(filter_eps="auto"), "filter_eps"), (dict(low_memory=True), "low_memory"),
                     (dict(batch_invariant=1), "batch_invariant")):
        kw.setdefault("batch_invariant", True)
        with pytest.raises((ValueError, TypeError), match=name):
            linear_cross_entropy(e, c, t, **kw)


def test_the_gpu_check_tool_writes_its_tables(tmp_path):
    """`python -m suite kernel invariance` (the bf16 check on a GPU) at tiny shapes: every
    invariant comparison equal, its JSON, markdown and env written."""
    import json

    from suite.cli import main

    rc = main(["kernel", "invariance", "--out", str(tmp_path), "--device", DEVICE,
               "--models", "llama3-8b", "--d", str(D), "--v", str(V), "--rows", "3",
               "--ns", "9", "--pad-rows", "4"])
    report = json.loads((tmp_path / "invariance.json").read_text())
    assert rc == 0 and report["all_invariant_equal"], report
    assert "dc_run_to_run" in (tmp_path / "invariance.md").read_text()
    assert (tmp_path / "env.json").exists()


@pytest.mark.skipif(ON_GPU, reason="runs the tool's gloo world on the CPU (interpreter); on GPUs "
                    "its NCCL run is `python -m suite kernel invariance --ranks K`, logged")
def test_the_ranks_check_splits_as_torch_chunk_and_writes_its_tables(tmp_path):
    """`kernel invariance --ranks 2` (gloo on the CPU): V 100 splits as torch.chunk does, 50
    columns each, off the interpreter's 8-column block; the invariant call takes it (a block
    over both ranks), both modes' rows are compared and written as JSON, CSV and env. (Its
    bits are the GPU run's to check: the tool's ranks run numpy's matmul, not the tests'
    row-independent dot.)"""
    import json

    from suite.cli import main
    from suite.kernel.invariance_ranks import even_bounds

    assert even_bounds(128256, 4) == [(0, 32064), (32064, 64128), (64128, 96192), (96192, 128256)]
    assert even_bounds(10, 3) == [(0, 4), (4, 8), (8, 10)]
    main(["kernel", "invariance", "--ranks", "2", "--device", "cpu", "--out", str(tmp_path),
          "--models", "llama3-8b", "--d", "16", "--v", "100", "--rows", "4"])
    report = json.loads((tmp_path / "ranks2.json").read_text())
    model = report["models"]["llama3-8b"]
    assert report["refused"] == [] and model["bounds"] == [[0, 50], [50, 100]]
    for mode in ("batch_invariant", "default"):
        assert model[mode]["loss"]["rel"] < 1e-5, model[mode]
    assert (tmp_path / "env-ranks2.json").exists()
    table = (tmp_path / "ranks2.csv").read_text()
    assert "batch_invariant" in table and "0-50 50-100" in table


def test_the_ranks_check_shards_on_whole_blocks():
    from suite.kernel.invariance_ranks import aligned_bounds

    for v, world, block in ((128256, 2, 256), (128256, 4, 256), (152064, 4, 128), (100, 3, 16)):
        bounds = aligned_bounds(v, world, block)
        assert bounds[0][0] == 0 and bounds[-1][1] == v and len(bounds) == world
        assert all(a[1] == b[0] and b[0] % block == 0 for a, b in zip(bounds, bounds[1:]))
        sizes = [b - a for a, b in bounds]
        assert max(sizes) - min(sizes) < 2 * block  # whole blocks, the last one short


def test_under_torch_compile_the_rows_are_the_eager_calls_bits():
    """The custom ops carry the option (their schema's batch_invariant) and pin the same route."""
    e, c, t, _ = _inputs(20, torch.float32, seed=17)
    compiled = torch.compile(lambda e, c, t: own_kernel.token_logprobs(
        e, c, t, batch_invariant=True), backend="eager")
    assert torch.equal(compiled(e, c, t)[:4],
                       own_kernel.token_logprobs(e[:4], c, t[:4], batch_invariant=True))
