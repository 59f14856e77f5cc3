"""The route (own_kernel/policy/route.py): pure decisions at real shapes on every target's
config (no launch), own_kernel.plan against the path a call actually runs, options that cannot apply
refused or reported, and the providers calling the API as a user does."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import own_kernel  # noqa: E402
from own_kernel import linear_cross_entropy  # noqa: E402
from own_kernel.paths import entries as ops, three_matmul as fused  # noqa: E402
from own_kernel.policy.config import (HOPPER_16BIT, INTERPRETER, PORTABLE, overridden,  # noqa: E402
                               use_target, with_overrides)
from own_kernel.policy.options import FilterOptions  # noqa: E402
from own_kernel.policy.plan import fused_plan  # noqa: E402
from own_kernel.policy.route import Call, route  # noqa: E402

BF16, FP32 = torch.bfloat16, torch.float32
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GEMMA = dict(n=8192, v=256000, d=2304)
QWEN_SMALL = dict(n=8192, v=32000, d=2048)
# dC's chunk sums in an fp32 accumulator (4 V D bytes of the budget), not in dC itself
FP32_ACC = with_overrides(HOPPER_16BIT, {"fused": {"dc_accumulator": "fp32"}})


# ---- pure decisions ----------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, shape, dtype, path", [
    (PORTABLE, QWEN_SMALL, FP32, "three-matmul"),    # fp32: the default budget holds it
    (HOPPER_16BIT, QWEN_SMALL, BF16, "three-matmul"),
    (HOPPER_16BIT, GEMMA, BF16, "three-matmul"),     # dC sums in itself: the chunk alone
    (FP32_ACC, GEMMA, BF16, "recompute"),            # dC's fp32 buffer exceeds 1 GiB
])
def test_default_budget_decides_the_path(cfg, shape, dtype, path):
    r = route(Call(**shape, dtype=dtype), cfg)
    assert r.path == path and r.cfg is cfg
    fused = cfg.fused
    budget = fused.default_workspace_mib_fp32 if dtype == FP32 else fused.default_workspace_mib
    shift_ok = cfg.forward.tma and shape["d"] * dtype.itemsize % 16 == 0  # the TMA forward's rows
    plan, why = fused_plan(shape["n"], shape["v"], shape["d"], dtype.itemsize, budget * 2**20, cfg,
                           shift_ok=shift_ok)
    assert (r.fused == plan) and (plan is None) == (path == "recompute")
    if path == "recompute":  # the default budget went unused: the note says why
        assert r.note == f"workspace_mib={budget} unused: {why}"
    else:
        assert r.entry == "fused" and r.note == ""


@pytest.mark.parametrize("option, reason", [
    (dict(reduction="none"), 'reduction="none"'), (dict(return_lse=True), "return_lse=True"),
    (dict(low_memory=True), "low_memory=True"), (dict(vocab_parallel=True), "vocab_parallel"),
    (dict(compiling=True), "torch.compile"), (dict(needs_grad=False), "no gradient"),
])
def test_an_explicit_budget_the_call_cannot_use_is_reported(option, reason):
    r = route(Call(**QWEN_SMALL, dtype=BF16, workspace_mib=4096, **option), HOPPER_16BIT)
    assert r.path != "three-matmul" and r.fused is None
    assert r.note.startswith("workspace_mib=4096 unused: ") and reason in r.note


@pytest.mark.parametrize("option, path, entry", [
    (dict(), "three-matmul", "fused"), (dict(low_memory=True), "low-memory", "eager"),
    (dict(needs_grad=False), "forward-only", "eager"),
    (dict(reduction="none"), "recompute", "eager"),
    (dict(vocab_parallel=True), "recompute", "vocab-parallel"),
    (dict(vocab_parallel=True, low_memory=True), "low-memory", "vocab-parallel"),
    (dict(compiling=True), "recompute", "compiled"),
])
def test_path_and_entry(option, path, entry):
    r = route(Call(**QWEN_SMALL, dtype=BF16, **option), HOPPER_16BIT)
    assert (r.path, r.entry) == (path, entry)


def test_filtered_calls_on_hopper_keep_the_recompute_path_unless_given_a_budget():
    eps = FilterOptions(2.0**-12)  # a threshold the caller passed: it always filters
    r = route(Call(**QWEN_SMALL, dtype=BF16, filter=eps), HOPPER_16BIT)
    assert r.path == "recompute" and "filtered" in r.note
    assert route(Call(**QWEN_SMALL, dtype=BF16, filter=eps, workspace_mib=4096),
                 HOPPER_16BIT).path == "three-matmul"
    assert route(Call(**QWEN_SMALL, dtype=BF16, filtered=True), PORTABLE).path == "three-matmul"


def test_auto_filter_on_hopper_runs_exact_where_the_exact_call_takes_the_three_matmul_path():
    """results/notes/filter-auto.md: on an H100 the filtered recompute path was slower than the
    exact three-matmul path, or level, wherever the latter fit the default budget."""
    auto = route(Call(**QWEN_SMALL, dtype=BF16, filtered=True), HOPPER_16BIT)
    exact = route(Call(**QWEN_SMALL, dtype=BF16), HOPPER_16BIT)
    assert (auto.path, auto.filter, auto.fused) == ("three-matmul", None, exact.fused)
    assert '"auto" runs exact' in auto.note
    # where the exact call must recompute (Gemma 2's fp32 dC exceeds 1 GiB) the filter runs
    gemma = route(Call(**GEMMA, dtype=BF16, filtered=True), FP32_ACC)
    assert gemma.path == "recompute" and gemma.filter is not None and gemma.filter.auto
    # with dC summed in itself (the default) the exact call fits there too, but the line is
    # still where the fp32 sums fit: the filter was faster there (the frontier runs)
    gemma = route(Call(**GEMMA, dtype=BF16, filtered=True), HOPPER_16BIT)
    assert gemma.path == "recompute" and gemma.filter is not None and gemma.filter.auto
    assert route(Call(**GEMMA, dtype=BF16), HOPPER_16BIT).path == "three-matmul"
    # a budget the caller chose is theirs: no second guess
    given = route(Call(**QWEN_SMALL, dtype=BF16, filtered=True, workspace_mib=0), HOPPER_16BIT)
    assert given.path == "recompute" and given.note == ""


def test_auto_filter_on_hopper_runs_exact_below_its_hidden_size():
    """filter-auto.md (H200): at D 1152, V 262144 the filter was slower than the exact default
    at entropy 2.2 and 3, though dC's fp32 sums do not fit there; at D 2048, V 256000 faster."""
    narrow = dict(n=16384, v=262144, d=1152)
    assert HOPPER_16BIT.filter.auto_min_d > narrow["d"]
    auto = route(Call(**narrow, dtype=BF16, filtered=True), HOPPER_16BIT)
    exact = route(Call(**narrow, dtype=BF16), HOPPER_16BIT)
    assert (auto.path, auto.filter, auto.fused) == ("three-matmul", None, exact.fused)
    assert "D 1152" in auto.note and '"auto" runs exact' in auto.note
    wide = route(Call(n=8192, v=256000, d=2048, dtype=BF16, filtered=True), HOPPER_16BIT)
    assert wide.path == "recompute" and wide.filter is not None and wide.filter.auto
    # no bound (the field's default): the fp32 sums' fit alone decides, as before
    unbound = dataclasses.replace(HOPPER_16BIT, filter=dataclasses.replace(HOPPER_16BIT.filter,
                                                                           auto_min_d=0))
    assert route(Call(**narrow, dtype=BF16, filtered=True), unbound).filter is not None


def test_a_vocab_parallel_shard_filters_only_where_its_own_shape_pays():
    """results/notes/filter-sharded.md: at K = 4 (H200) Gemma 2 (2B)'s shard, 64000 columns,
    ran slower filtered than exact; Qwen 2.5 (7B)'s, 38016 columns at N 16384, faster. The
    same Gemma shard on one GPU is a call of its own, held to the single-GPU rule."""
    gemma_shard = dict(n=8192, v=64000, d=2304)
    sharded = route(Call(**gemma_shard, dtype=BF16, filtered=True, vocab_parallel=True,
                         filter=FilterOptions(2.0**-12)), HOPPER_16BIT)
    assert (sharded.path, sharded.filter) == ("recompute", None)
    alone = route(Call(**gemma_shard, dtype=BF16, filtered=True, workspace_mib=0,
                       filter=FilterOptions(2.0**-12)), HOPPER_16BIT)
    assert alone.filter is not None
    qwen_shard = route(Call(n=16384, v=38016, d=3584, dtype=BF16, filtered=True,
                            vocab_parallel=True, filter=FilterOptions(2.0**-12)), HOPPER_16BIT)
    assert qwen_shard.filter is not None


RECOMPUTE_AT_ZERO = with_overrides(HOPPER_16BIT, {"fused": {"zero_budget": "recompute"}})


def test_a_zero_budget_is_no_budget_and_no_note():
    call = Call(**QWEN_SMALL, dtype=BF16, workspace_mib=0)
    r = route(call, RECOMPUTE_AT_ZERO)
    assert (r.path, r.note, r.budget_mib) == ("recompute", "", 0)
    # Hopper's default: the chunks in the recompute path's memory, and the note says so. At
    # D 4096 (4 chunks of 2048 rows, measured faster than recomputing on an H200): at D 2048
    # each chunk would hold 4.0e11 flops, under fused.min_chunk_flops
    r = route(dataclasses.replace(call, d=4096), HOPPER_16BIT)
    assert (r.path, r.budget_mib) == ("three-matmul", 0) and "fused.zero_budget" in r.note
    assert route(call, HOPPER_16BIT).path == "recompute"


def test_describe_reports_the_plans_chunks_and_a_peak_above_the_gradients():
    grads = (QWEN_SMALL["n"] + QWEN_SMALL["v"]) * QWEN_SMALL["d"] * 2
    call = Call(**QWEN_SMALL, dtype=BF16)
    r = route(call, HOPPER_16BIT)
    p = r  # the route is the plan own_kernel.plan reports
    assert (p.path, p.chunks, p.chunk_size) == ("three-matmul", r.fused.chunks, r.fused.rows)
    assert p.peak_bytes >= grads + r.fused.extra_bytes
    rec = route(Call(**QWEN_SMALL, dtype=BF16, workspace_mib=0), RECOMPUTE_AT_ZERO)
    assert rec.path == "recompute" and rec.chunks > 1
    assert rec.peak_bytes >= grads + 4 * QWEN_SMALL["n"] * QWEN_SMALL["d"]  # dE's fp32 copy
    low = route(Call(**QWEN_SMALL, dtype=BF16, low_memory=True), HOPPER_16BIT)
    assert grads < low.peak_bytes < rec.peak_bytes
    fwd = route(Call(**QWEN_SMALL, dtype=BF16, needs_grad=False), HOPPER_16BIT)
    assert fwd.chunks == 0 and fwd.peak_bytes < grads // 100


# ---- the API asks the route once and runs what plan() reports ------------------------------------

def _inputs(n=12, d=16, v=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g).to(DEV).requires_grad_(),
            torch.randn(v, d, generator=g).to(DEV).requires_grad_(),
            torch.randint(0, v, (n,), generator=g).to(DEV))


@pytest.mark.parametrize("options", [dict(), dict(workspace_mib=8), dict(workspace_mib=0),
                                     dict(low_memory=True), dict(reduction="none",
                                                                 workspace_mib=8)])
def test_plan_reports_the_path_the_call_runs(monkeypatch, options):
    from own_kernel import api
    ran, routes = [], []
    real_fused, real_eager, real_route = fused.fused_loss_and_grads, ops.rows_backward, api.route
    monkeypatch.setattr(fused, "fused_loss_and_grads",
                        lambda *a: ran.append("three-matmul") or real_fused(*a))
    monkeypatch.setattr(ops, "rows_backward", lambda *a, **k: ran.append(
        "low-memory" if a[7].low_memory else "recompute") or real_eager(*a, **k))
    monkeypatch.setattr(api, "route", lambda *a: routes.append(a) or real_route(*a))
    e, c, t = _inputs()
    planned = own_kernel.plan(e, c, t, **options)
    assert len(routes) == 1
    loss = linear_cross_entropy(e, c, t, **options)
    assert len(routes) == 2  # asked once per call
    loss.sum().backward()
    assert ran == [planned.path], (ran, planned)
    assert isinstance(planned, own_kernel.Plan)


@pytest.mark.skipif(DEV.type == "cuda", reason="CPU tensors run only under TRITON_INTERPRET, "
                    "which a CUDA run leaves off")
def test_use_target_on_cpu_tensors_is_refused_by_name():
    e, c, t = _inputs()
    for name in ("hopper-16bit", "portable"):
        with use_target(name), pytest.raises(ValueError, match=rf"use_target\('{name}'\)"):
            linear_cross_entropy(e, c, t)
        with use_target(name), pytest.raises(ValueError, match=rf"use_target\('{name}'\)"):
            own_kernel.plan(e, c, t)


def test_an_unused_budget_is_reported_by_plan():
    e, c, t = _inputs()
    assert "unused" in own_kernel.plan(e, c, t, workspace_mib=512, reduction="none").note
    with overridden({"fused": {"max_rows": 2, "min_rows": 4}}):  # chunks too small to pay
        p = own_kernel.plan(e, c, t, workspace_mib=512)
    assert p.path == "recompute" and p.note.startswith("workspace_mib=512 unused")


# Which launcher writes W shows the backward's config only where the plan has chunks outside the
# tail: on the interpreter's config at these sizes. On a GPU's targets every chunk of so small a
# call is a tail chunk, written by the pointer kernel whatever chunks.recompute says (seen on an
# H200: ['pointer', 'pointer'] under both configs), so the writer cannot tell the configs apart.
_WRITER_SHOWS_CONFIG = pytest.mark.skipif(
    DEV.type == "cuda", reason="at this size a GPU target writes every chunk with the pointer "
    "kernel (tail chunks) under either config: the writer does not show which config ran")


@_WRITER_SHOWS_CONFIG
def test_vocab_parallels_backward_keeps_the_forwards_config(monkeypatch):
    """The vocab-parallel entry's backward used to resolve its config when it ran: with the
    forward's override ended, it took another route. One process (world 1, gloo)."""
    import torch.distributed as dist

    from own_kernel import VocabParallel
    from tests.test_own_kernel import _spy_w_writers

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        writers = _spy_w_writers(monkeypatch)
        e, c, t = _inputs(n=20, v=90)
        with overridden({"chunks": {"recompute": "cublas"}}):
            loss = linear_cross_entropy(e, c, t, vocab_parallel=VocabParallel(None, 0, 90))
        loss.backward()
        assert writers and set(writers) <= {"cublas", "pointer"} and writers[0] == "cublas", writers
    finally:
        dist.destroy_process_group()


@_WRITER_SHOWS_CONFIG
def test_the_compiled_backward_keeps_the_forwards_config(monkeypatch):
    from tests.test_own_kernel import _spy_w_writers

    writers = _spy_w_writers(monkeypatch)
    e, c, t = _inputs(n=20, v=90)
    torch._dynamo.reset()
    fn = torch.compile(lambda e, c, t: linear_cross_entropy(e, c, t), backend="aot_eager")
    with overridden({"chunks": {"recompute": "cublas"}}):
        loss = fn(e, c, t)
    loss.backward()
    assert writers and writers[0] == "cublas", writers


# ---- the providers measure the API as a user calls it -------------------------------------------

@pytest.mark.parametrize("provider, budget", [("own", "absent"), ("own_filter", "absent"),
                                              ("own_low_memory", "absent"),
                                              ("own_recompute", 0), ("own_ws0", 0)])
def test_providers_call_the_api_as_a_user_does(monkeypatch, provider, budget):
    import suite.providers.own as own_providers

    seen = []
    monkeypatch.setattr(own_kernel, "linear_cross_entropy", lambda *a, **k: seen.append(k))
    e, c, t = _inputs()
    getattr(own_providers, provider)(e, c, t)
    assert seen and seen[0].get("workspace_mib", "absent") == budget, seen


def test_interpreter_config_is_the_cpu_route():
    assert route(Call(12, 40, 16, FP32), INTERPRETER).path == "recompute"  # default budget 0


def test_tile_maxima_in_de_rows_take_no_budget_where_they_fit_there():
    """config.Fused.tile_max_in_de (on in the Hopper config): at N 8192, D 5120, V 131072 the
    maxima (4 bytes a row and 256 columns) tip 1 GiB of shifted logits into a third chunk; in
    the chunk's dE rows (D 2 bytes a row) they cost no budget. At D 1152, V 262144 they do not
    fit a dE row: beside."""
    in_de = HOPPER_16BIT
    assert in_de.fused.tile_max_in_de
    args = (8192, 131072, 5120, 2, 2**30)
    beside, _ = fused_plan(*args, with_overrides(in_de, {"fused": {"tile_max_in_de": False}}),
                           shift_ok=True)
    inside, _ = fused_plan(*args, in_de, shift_ok=True)
    assert (beside.chunks, beside.tile_max_in_de) == (3, False)
    assert (inside.chunks, inside.tile_max_in_de) == (2, True) and inside.shifted
    assert inside.extra_bytes == inside.rows * inside.row_stride * 2  # the logits alone
    narrow, _ = fused_plan(16384, 262144, 1152, 2, 2**30, in_de, shift_ok=True)
    assert narrow.shifted and not narrow.tile_max_in_de


def test_layouts_of_reads_each_tensor_as_it_is_and_none_for_a_copy():
    # route.layouts_of, the one place the call's layouts are read (api.py, the custom ops)
    from own_kernel.policy.route import layouts_of

    base = torch.zeros(4, 17, dtype=torch.float16)
    aligned, offset = torch.zeros(4, 16, dtype=torch.float16), base[:, 1:]
    assert layouts_of(aligned, None) == (True, None)
    assert layouts_of(offset, aligned) == (False, True)  # base not 16-byte aligned
    assert layouts_of(None, base) == (None, False)       # 34-byte rows
