"""Vocab-parallel CCE (own_kernel/paths/vocab_parallel.py) over gloo, 2 and 3 CPU processes, kernels
under the Triton interpreter, fp32: the loss, lse and gradients of the sharded call equal the
single-process kernel's on the gathered problem and fp64's, with uneven shards, ignored targets,
softcap, label smoothing, bias, every reduction, return_lse, shift and low_memory; FSDP2's
fully_shard with the kernel on lm_head.weight, also passed resharded (a DTensor, Shard(0)).

Each world size is spawned once (a module-scoped fixture) and runs every case inside; ranks
never assert (a rank that stopped would leave the others waiting in a collective): each writes
its measured errors to a JSON file and the tests here check them. Two deliberately broken
combines (the MAX all-reduce left out, dE's SUM left out) run through the same comparison, to
show that it catches a wrong combine.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before anything imports triton, here and in the children
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from own_kernel import LinearCrossEntropy, VocabParallel, linear_cross_entropy  # noqa: E402
from own_kernel.paths import vocab_parallel  # noqa: E402
from tests.gloo_world import gloo_rank, spawn_world  # noqa: E402

N, D, V = 14, 16, 37
TOL_FP64 = 1e-5     # against fp64, relative to the largest entry of each result
TOL_KERNEL = 2e-5   # against the single-process kernel: two fp32 results, each within TOL_FP64
BROKEN_MIN = 1e-2   # a broken combine must be off by at least this

# name -> linear_cross_entropy options (and the case's input twists: "ignored", "confident",
# "one_shard", "grad" = the upstream gradient of a reduction "none").
CASES = {
    "mean": dict(),
    "sum_ignored_bias": dict(reduction="sum", bias=True, ignored=True),
    "none_softcap_smooth": dict(reduction="none", softcap=3.0, label_smoothing=0.1, ignored=True),
    "mean_smooth_bias_softcap_lse": dict(label_smoothing=0.2, bias=True, softcap=5.0,
                                         return_lse=True, ignored=True),
    "none_lse_ignore_index_0": dict(reduction="none", ignore_index=0, return_lse=True,
                                    ignored=True),
    "confident_none": dict(confident=True, reduction="none"),
    "confident_smooth": dict(confident=True, label_smoothing=0.05),
    "targets_on_one_shard": dict(one_shard=True, reduction="sum", bias=True),
    "shift_none": dict(shift=1, reduction="none", softcap=4.0),
    "low_memory_smooth": dict(low_memory=True, label_smoothing=0.3, bias=True),
    "filter_auto": dict(filter_eps="auto", ignored=True),
}
TWISTS = ("bias", "ignored", "confident", "one_shard")


def _inputs(name, case, world, seed):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(N, D, generator=g)
    c = torch.randn(V, D, generator=g) / 2
    t = torch.randint(0, V, (N,), generator=g)
    if case.get("confident"):  # p_t near 1, nll ~1e-7..1e-3: lse - z_t alone is all rounding
        c[t] = e / e.norm(dim=1, keepdim=True) * torch.linspace(3.5, 5.0, N)[:, None]
    if case.get("one_shard"):
        t = t % 3  # every target on the first shard
    if case.get("ignored"):
        t[::3] = case.get("ignore_index", -100)
    bias = torch.randn(V, generator=g) if case.get("bias") else None
    grad = torch.randn(N, generator=g)
    return e, c, t, bias, grad


def _objective(out, grad, case):
    """A scalar whose gradient exercises every output: loss (weighted where "none") and lse."""
    loss, lse = out if case.get("return_lse") else (out, None)
    total = (loss * grad[:loss.numel()].view(loss.shape)).sum() if loss.dim() else loss
    if lse is not None:
        total = total + 0.3 * (lse * grad.flip(0)[:lse.numel()].view(lse.shape)).sum()
    return total, loss, lse


def _run(e, c, t, bias, grad, case, vp=None, dtype=torch.float32):
    """(loss, lse, dE, dC, dbias) of the own kernel (vp: sharded) or, dtype float64, of torch."""
    def leaf(x):  # a fresh leaf: the caller's tensors are shared between the runs
        return x.detach().to(dtype, copy=True).requires_grad_() if x is not None else None
    e, c, b = leaf(e), leaf(c), leaf(bias)
    opts = {k: v for k, v in case.items() if k not in TWISTS}
    if dtype == torch.float64:
        out = _reference(e, c, t, b, **opts)
    else:
        out = linear_cross_entropy(e, c, t, bias=b, vocab_parallel=vp, **opts)
    total, loss, lse = _objective(out, grad, case)
    total.backward()
    return loss.detach(), lse, e.grad, c.grad, b.grad if b is not None else None


def _reference(e, c, t, bias, reduction="mean", softcap=None, ignore_index=-100, shift=0,
               label_smoothing=0.0, return_lse=False, **_):
    z = e @ c.T + (bias if bias is not None else 0)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    if shift:
        t = torch.cat([t[shift:], torch.full((shift,), ignore_index)])
    loss = F.cross_entropy(z, t, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    if shift and reduction == "none":
        loss = loss[:-shift]
    lse = torch.logsumexp(z, dim=1)
    return (loss, lse[:-shift] if shift else lse) if return_lse else loss


def _err(got, want):
    if got is None and want is None:
        return 0.0
    got, want = got.double(), want.double()
    fin = torch.isfinite(want)
    if not torch.equal(fin, torch.isfinite(got)):
        return float("inf")
    scale = want[fin].abs().max().item() if fin.any() else 1.0
    return ((got[fin] - want[fin]).abs().max().item() / max(scale, 1e-30)) if fin.any() else 0.0


def _compare(name, got, single, ref, shard):
    """The errors of the sharded result against the single-process kernel's and fp64's."""
    start, stop = shard
    cut = lambda r: (r[0], r[1], r[2], r[3][start:stop],  # noqa: E731
                     r[4][start:stop] if r[4] is not None else None)
    single, ref = cut(single), cut(ref)
    fields = ("loss", "lse", "dE", "dC", "dbias")
    # Confident rows' (loss < 1e-2) absolute error against fp64: where lse - z_t cancels.
    small = ref[0] < 1e-2 if ref[0].dim() else ref[0].new_zeros(1, dtype=torch.bool)
    loss_abs = {k: (r[0].double() - ref[0]).abs().reshape(-1)[small.reshape(-1)].max().item()
                if small.any() else 0.0 for k, r in (("sharded", got), ("single", single))}
    return {"kernel": {f: _err(g, w) for f, g, w in zip(fields, got, single)},
            "fp64": {f: _err(g, w) for f, g, w in zip(fields, got, ref)},
            "loss_abs": loss_abs, "min_loss": float(got[0].min()) if got[0].numel() else 0.0}


def _shards(world):
    """Uneven shards (V = 37 is divisible by neither 2 nor 3), the last rank's the largest."""
    cuts = {2: [0, 16, V], 3: [0, 5, 20, V]}[world]
    return [(cuts[r], cuts[r + 1]) for r in range(world)]


def _case_result(name, case, rank, world, seed):
    e, c, t, bias, grad = _inputs(name, case, world, seed)
    start, stop = _shards(world)[rank]
    vp = VocabParallel(None, start, stop)
    got = _run(e, c[start:stop], t, bias[start:stop] if bias is not None else None, grad, case,
               vp=vp)
    single = _run(e, c, t, bias, grad, case)
    ref = _run(e, c, t, bias, grad, case, dtype=torch.float64)
    return _compare(name, got, single, ref, (start, stop))


class _Broken:
    """dist.all_reduce with one kind of call left out: a deliberately wrong combine."""

    def __init__(self, skip, real):
        self.skip, self.real = skip, real

    def __call__(self, tensor, op=dist.ReduceOp.SUM, group=None, **kw):
        if self.skip(tensor, op):
            return None
        return self.real(tensor, op=op, group=group, **kw)


BROKEN = {  # name -> which all-reduce is left out
    "no_max": lambda t, op: op == dist.ReduceOp.MAX and t.dim() == 1,
    "no_de_sum": lambda t, op: t.dim() == 2 and t.shape[1] == D,  # not the forward's (k, N)
}


def _naive_nll_combine(real):
    """combine_shards with nll = lse - z_t (the rounding that lse_combine.py's confident-row
    rule avoids): a deliberately less accurate combine."""
    def combine(shard, t_local, call, checksum):
        loss, lse, nll, p_max, z_t, agree = real(shard, t_local, call, checksum)
        z_target = z_t.clone()
        dist.all_reduce(z_target, group=call.vp.group)
        nll = lse - z_target
        return torch.where(t_local != -1, nll, 0.0), lse, nll, p_max, z_t, agree
    return combine


def _errors_raised(rank, world):
    """The messages of the errors each misuse raises (every rank raises alike)."""
    out = {}
    e, c, t, _, _ = _inputs("err", {}, world, 1)
    start, stop = _shards(world)[rank]
    calls = {
        "bad_target": lambda: linear_cross_entropy(e, c[start:stop], torch.full_like(t, V),
                                                   vocab_parallel=VocabParallel(None, start, stop)),
        "targets_differ": lambda: linear_cross_entropy(
            e, c[start:stop], (t + rank) % V, vocab_parallel=VocabParallel(None, start, stop)),
        "wrong_rows": lambda: linear_cross_entropy(e, c[start:stop - 1], t,
                                                   vocab_parallel=VocabParallel(None, start, stop)),
        "overlap": lambda: linear_cross_entropy(e, c[0:stop], t,
                                                vocab_parallel=VocabParallel(None, 0, stop)),
        "not_vp": lambda: linear_cross_entropy(e, c, t, vocab_parallel=(start, stop)),
    }
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except (ValueError, TypeError, RuntimeError) as err:
            out[name] = f"{type(err).__name__}: {err}"
    return out


def _fsdp2(rank, world):
    """lm_head.weight of a fully_shard-wrapped model (unsharded during forward, its gradient
    reduce-scattered by FSDP) against an unwrapped copy; a DTensor passed directly."""
    from torch.distributed.fsdp import fully_shard

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(D, D)
            self.lm_head = torch.nn.Linear(D, V, bias=False)

        def forward(self, x, t):
            return linear_cross_entropy(torch.tanh(self.body(x)), self.lm_head.weight, t,
                                        softcap=5.0)

    torch.manual_seed(3)
    model, plain = Tiny(), Tiny()
    plain.load_state_dict(model.state_dict())
    fully_shard(model)
    x, t = torch.randn(N, D), torch.randint(0, V, (N,))
    loss = model(x, t)
    loss.backward()
    grad = model.lm_head.weight.grad.full_tensor()
    plain_loss = plain(x, t)
    plain_loss.backward()
    out = {"loss": _err(loss.detach(), plain_loss.detach()),
           "dC": _err(grad, plain.lm_head.weight.grad),
           "sharded_grad": type(model.lm_head.weight.grad).__name__}
    # Resharded outside the forward: a DTensor Shard(0), taken as vocab-parallel (the same
    # x and t on every rank here).
    out["dtensor"] = _err(linear_cross_entropy(torch.tanh(plain.body(x)).detach(),
                                               model.lm_head.weight, t, softcap=5.0).detach(),
                          plain_loss.detach())
    full = model.lm_head.weight.full_tensor()
    out["full_tensor"] = _err(linear_cross_entropy(torch.tanh(plain.body(x)).detach(), full, t,
                                                   softcap=5.0), plain_loss.detach())
    return out


def _compiled(rank, world):
    """Under torch.compile the vocab-parallel call is a graph break that runs eagerly (the same
    result); fullgraph=True refuses it with a reason naming vocab_parallel."""
    e, c, t, bias, _ = _inputs("compiled", {}, world, 11)
    start, stop = _shards(world)[rank]
    vp = VocabParallel(None, start, stop)

    def step(e):
        return linear_cross_entropy(e, c[start:stop], t, softcap=4.0, vocab_parallel=vp)

    def whole(e):  # its own code object: dynamo's cache of step would skip fullgraph's check
        return linear_cross_entropy(e, c[start:stop], t, vocab_parallel=vp)

    module = LinearCrossEntropy(softcap=4.0, vocab_parallel=vp)
    out = {"eager_vs_compiled": _err(torch.compile(step, backend="aot_eager")(e), step(e)),
           "module_vs_function": _err(module(e, c[start:stop], t), step(e))}
    try:
        torch.compile(whole, backend="aot_eager", fullgraph=True)(e)
        out["fullgraph"] = "no error"
    except Exception as err:  # dynamo's own exception type
        out["fullgraph"] = str(err)
    return out


def _fp16_shared(rank, world):
    """fp16 with hidden states sharing a large component (as trained models' do): the ranks'
    partial dE cancel in their SUM, so each must stay in fp32 until the sum is made. The
    relative errors (norms) of dE and dC against fp64, sharded and single-process, with label
    smoothing (its target term added on the owning rank) and with low_memory."""
    g = torch.Generator().manual_seed(21)
    shared = torch.randn(D, generator=g) * 3
    e = torch.randn(N, D, generator=g) * 0.3 + shared
    c = torch.randn(V, D, generator=g) * 0.3 + shared * 0.2
    t = torch.randint(0, V, (N,), generator=g)
    start, stop = _shards(world)[rank]

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    out = {}
    for name, case in (("smooth", {"label_smoothing": 0.1}), ("low_memory", {"low_memory": True})):
        got = _run(e, c[start:stop], t, None, None, case, vp=VocabParallel(None, start, stop),
                   dtype=torch.float16)
        single = _run(e, c, t, None, None, case, dtype=torch.float16)
        ref = _run(e, c, t, None, None, case, dtype=torch.float64)
        out[name] = {"dE": {"sharded": rel(got[2], ref[2]), "single": rel(single[2], ref[2])},
                     "dC": {"sharded": rel(got[3], ref[3][start:stop]),
                            "single": rel(single[3][start:stop], ref[3][start:stop])}}
    return out


def _worker(rank, world, port, out_dir):
    with gloo_rank(rank, world, port, out_dir) as res:
        res.update(cases={}, broken={})
        for i, (name, case) in enumerate(CASES.items()):
            res["cases"][name] = _case_result(name, case, rank, world, seed=100 + i)
        real = dist.all_reduce
        for name, skip in BROKEN.items():
            dist.all_reduce = _Broken(skip, real)
            try:
                res["broken"][name] = _case_result(name, CASES["mean_smooth_bias_softcap_lse"],
                                                   rank, world, seed=7)
            finally:
                dist.all_reduce = real
        real = vocab_parallel.combine_shards
        vocab_parallel.combine_shards = _naive_nll_combine(real)
        try:
            res["broken"]["naive_nll"] = _case_result("naive_nll", CASES["confident_none"], rank,
                                                      world, seed=100 + list(CASES).index(
                                                          "confident_none"))
        finally:
            vocab_parallel.combine_shards = real
        res["fp16_shared"] = _fp16_shared(rank, world)
        res["errors"] = _errors_raised(rank, world)
        if world == 2:
            res["fsdp2"] = _fsdp2(rank, world)
            res["compiled"] = _compiled(rank, world)


def _spawn(world, tmp_path_factory):
    return spawn_world(_worker, world, str(tmp_path_factory.mktemp(f"vp{world}")))


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def ranks(request, tmp_path_factory):
    return _spawn(request.param, tmp_path_factory)


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_equals_single_process_kernel_and_fp64(ranks, name):
    for rank, res in enumerate(ranks):
        errs = res["cases"][name]
        bad = {f: x for f, x in errs["kernel"].items() if not x <= TOL_KERNEL}
        bad.update({f"fp64 {f}": x for f, x in errs["fp64"].items() if not x <= TOL_FP64})
        assert not bad, f"rank {rank} of {len(ranks)}, case {name}: {bad}"
        assert errs["min_loss"] >= 0.0, f"rank {rank}, case {name}: a negative loss"


def test_confident_rows_as_accurate_as_the_single_process_kernel(ranks):
    """lse_combine.py's rule, across ranks: each row's loss as accurate as the single-GPU
    kernel's (which is as accurate as a naive fp32 softmax), where lse - z_t is not."""
    for rank, res in enumerate(ranks):
        acc = res["cases"]["confident_none"]["loss_abs"]
        assert acc["sharded"] <= 1.5 * acc["single"] + 2e-8, (rank, acc)
        naive = res["broken"]["naive_nll"]["loss_abs"]
        assert naive["sharded"] > 3 * acc["single"], (rank, naive, acc)  # the check can fail


def test_a_wrong_combine_is_caught(ranks):
    for rank, res in enumerate(ranks):
        no_max = res["broken"]["no_max"]["kernel"]
        assert max(no_max["loss"], no_max["lse"]) > BROKEN_MIN, (rank, no_max)
        assert res["broken"]["no_de_sum"]["kernel"]["dE"] > BROKEN_MIN, (rank, res["broken"])


def test_fp16_partial_de_is_summed_in_fp32(ranks):
    """The ranks' partial dE are summed in fp32 and rounded once: the sharded dE is as accurate
    as the single-process kernel's, within 1/32 of fp16's unit roundoff (rounding each partial
    to fp16 before the SUM does not meet this bound). dC is each shard's own: one rounding as
    in the single-process kernel, label smoothing's target term added to rounded rows."""
    eps = torch.finfo(torch.float16).eps
    for rank, res in enumerate(ranks):
        for name, f in res["fp16_shared"].items():
            assert f["dE"]["sharded"] <= f["dE"]["single"] + eps / 32, (rank, name, f)
            assert f["dC"]["sharded"] <= 1.5 * f["dC"]["single"], (rank, name, f)
            assert f["dE"]["single"] < 2 * eps, (name, f)  # fp16's rounding, not a broken kernel


def test_misuse_raises_clear_errors_on_every_rank(ranks):
    for res in ranks:
        errors = res["errors"]
        assert "outside [0, 37)" in errors["bad_target"]
        assert "targets: differ between the ranks" in errors["targets_differ"]
        assert errors["wrong_rows"].startswith("ValueError: vocab_parallel:")
        assert "do not tile the vocabulary" in errors["overlap"]
        assert errors["not_vp"].startswith("TypeError: vocab_parallel:")


def test_fsdp2_fully_shard_lm_head(ranks):
    if len(ranks) != 2:
        pytest.skip("the FSDP2 case runs in the two-rank world")
    for res in ranks:
        f = res["fsdp2"]
        assert f["sharded_grad"] == "DTensor"
        assert f["loss"] <= TOL_KERNEL and f["dC"] <= TOL_KERNEL, f
        assert f["full_tensor"] <= TOL_KERNEL, f
        assert f["dtensor"] <= TOL_KERNEL, f


def test_torch_compile_runs_it_eagerly_and_fullgraph_says_why_not(ranks):
    if len(ranks) != 2:
        pytest.skip("the torch.compile case runs in the two-rank world")
    for res in ranks:
        assert res["compiled"]["eager_vs_compiled"] == 0.0, res["compiled"]
        assert res["compiled"]["module_vs_function"] == 0.0, res["compiled"]
        assert "vocab_parallel runs eagerly" in res["compiled"]["fullgraph"]


def test_vocab_parallel_argument_is_validated_without_a_process_group():
    with pytest.raises(ValueError, match="vocab_parallel: expected 0 <= start < stop"):
        VocabParallel(None, 5, 5)
    with pytest.raises(TypeError, match="vocab_parallel: start must be an int"):
        VocabParallel(None, 1.0, 5)
    e, c, t = torch.randn(4, 8), torch.randn(5, 8), torch.randint(0, 5, (4,))
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        linear_cross_entropy(e, c, t, vocab_parallel=VocabParallel(None, 0, 5))
