"""The three-matmul training path (own_kernel/paths/three_matmul.py) against an fp64 reference
under the Triton interpreter (fp32 / fp16, tiny shapes): options, chunking, the filter, the budget and
the API's choice of path. CCE_TEST_DEVICE=cuda runs the reference tests (test_matches_reference,
the shifted logits' accuracy) with the compiled kernels; the others read the CPU's route."""
import dataclasses
import os
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import own_kernel
from own_kernel import linear_cross_entropy
from own_kernel.paths import three_matmul as fused
from own_kernel.policy.config import (HOPPER_16BIT, INTERPRETER, config_for, overridden,
                                      with_overrides)
from own_kernel.policy.plan import aligned_runs, even_rows, fused_plan
from tests.test_own_kernel import peaked_inputs, reference, rel

DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
# The cases that run on DEV; the others build CPU tensors for the interpreter's route
ON_DEV = ("test_matches_reference",
          "test_shifted_logits_keep_fp32_logits_accuracy_where_16_bit_logits_lose_it")


@pytest.fixture(autouse=True)
def _cpu_cases_only_on_the_cpu(request):
    if DEV.type != "cpu" and request.function.__name__ not in ON_DEV:
        pytest.skip(f"CCE_TEST_DEVICE={DEV.type} runs the reference cases ({', '.join(ON_DEV)}); "
                    "this one reads the CPU's route under TRITON_INTERPRET=1")


@pytest.fixture
def fused_calls(monkeypatch):
    """Each call of the fused path: (rows of each chunk it ran, accumulate_dc, filtered)."""
    calls = []
    real = fused.fused_loss_and_grads

    def spy(e, c, targets, bias, opts, route, check, mean):
        calls.append(([], route.fused.accumulate_dc, route.filter is not None))
        return real(e, c, targets, bias, opts, route, check, mean)

    def spy_chunk(real_chunk, e_at):
        def chunk(*args):
            calls[-1][0].append(args[e_at].shape[0])  # the chunk's rows of E
            return real_chunk(*args)
        return chunk

    monkeypatch.setattr(fused, "fused_loss_and_grads", spy)
    # the three logits kinds, and where each takes E's rows
    for name, e_at in (("_logits_and_grad", 2), ("_shifted_logits_and_grad", 2),
                       ("_target_shifted_logits_and_grad", 1)):
        monkeypatch.setattr(fused, name, spy_chunk(getattr(fused, name), e_at))
    return calls


def expected_chunks(targets, max_rows, ignore_index=-100):
    """Rows per chunk: the first max_rows rows as they are, then the rest's rows with a target
    (gathered) in as few chunks of at most max_rows as hold them, of equal size."""
    flat = targets.reshape(-1)
    n = flat.numel()
    size = max_rows or n
    used_rest = int((flat[size:] != ignore_index).sum())
    if not used_rest:
        return [min(n, size)]
    chunks = -(-used_rest // size)
    step = -(-used_rest // chunks)
    return [min(n, size)] + [min(step, used_rest - r) for r in range(0, used_rest, step)]


def shifted(t, shift, ignore_index=-100):
    if not shift:
        return t
    out = torch.full_like(t, ignore_index)
    out[..., :-shift] = t[..., shift:]
    return out


def _inputs(dtype, lead, d, v, has_bias, ignore_every, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    e = (0.5 * torch.randn(*lead, d, generator=g)).to(dtype)
    c = (0.5 * torch.randn(v, d, generator=g)).to(dtype)
    t = torch.randint(0, v, lead, generator=g)
    flat = t.view(-1)
    for start in range(1, flat.numel(), ignore_every):  # runs of 3 ignored targets
        flat[start:start + 3] = -100
    bias = (0.3 * torch.randn(v, generator=g)).to(dtype) if has_bias else None
    e, c, t, bias = (None if x is None else x.to(device) for x in (e, c, t, bias))
    return (e.requires_grad_(), c.requires_grad_(), t,
            None if bias is None else bias.requires_grad_())


CASES = [  # dtype, lead dims, D, V, softcap, reduction, label smoothing, bias, shift, max_rows
    (torch.float32, (37,), 24, 101, None, "mean", 0.0, False, 0, 0),
    (torch.float32, (37,), 24, 101, None, "mean", 0.0, False, 0, 4),
    (torch.float32, (3, 13), 20, 97, 30.0, "sum", 0.0, True, 2, 5),
    (torch.float32, (2, 9), 16, 53, 5.0, "mean", 0.2, True, 1, 3),
    (torch.float16, (33,), 40, 67, 20.0, "mean", 0.1, True, 0, 7),
    (torch.float16, (24,), 32, 31, None, "sum", 0.0, False, 0, 0),
    # V a multiple of 8: one GEMM writes dE's 16-bit rows, no fp32 rows between
    (torch.float16, (30,), 24, 64, 10.0, "mean", 0.0, True, 1, 4),
    (torch.float16, (26,), 16, 48, None, "sum", 0.1, False, 0, 0),
]


# 16-bit logits relative to their forward tile's row max, the maxima beside them
SHIFTED = {"logits_shifted": True, "tile_max_in_de": False}
# Every case with the config's logits; the 16-bit ones with shifted logits too (fp32 inputs'
# logits are fp32 whatever the config)
# 16-bit cases in several chunks, dC summed in an fp32 accumulator (fused.dc_accumulator; by
# default dC's own 16-bit buffer sums them)
FP32_ACC = {"dc_accumulator": "fp32"}
# Shifted logits whose tile maxima live in the chunk's own dE rows until dE's GEMM writes them
IN_DE = {"logits_shifted": True, "tile_max_in_de": True}
# 16-bit logits shifted by each row's target logit (cuBLAS's bias; calls without a bias)
TARGET_SHIFT = {"logits_shifted": False, "target_shift": True}
LOGITS_CASES = ([pytest.param(*case, {}, id=f"logits-{i}") for i, case in enumerate(CASES)]
                + [pytest.param(*case, TARGET_SHIFT, id=f"target-shifted-{i}")
                   for i, case in enumerate(CASES) if case[0] != torch.float32]
                + [pytest.param(*case, SHIFTED, id=f"shifted-{i}")
                   for i, case in enumerate(CASES) if case[0] != torch.float32]
                + [pytest.param(*case, IN_DE, id=f"tile-max-in-de-{i}")
                   for i, case in enumerate(CASES) if case[0] != torch.float32]
                + [pytest.param(*case, FP32_ACC, id=f"fp32-accumulator-{i}")
                   for i, case in enumerate(CASES) if case[0] != torch.float32 and case[-1]])


@pytest.mark.parametrize(
    "dtype, lead, d, v, softcap, reduction, ls, has_bias, shift, max_rows, logits", LOGITS_CASES)
def test_matches_reference(fused_calls, monkeypatch, dtype, lead, d, v, softcap, reduction, ls,
                           has_bias, shift, max_rows, logits):
    e, c, t, bias = _inputs(dtype, lead, d, v, has_bias, ignore_every=7, device=DEV)
    ref, e2, c2, b2 = reference(e, c, t, bias, softcap, reduction, ls, shift=shift)
    ref.backward()
    plans = _spy_plans(monkeypatch)
    # min_rows 1: the GPU configs send chunks under 1024 rows to the recompute path
    with overridden({"fused": {"max_rows": max_rows, "min_rows": 1, "min_chunk_flops": 0,
                               **logits}}):
        loss = linear_cross_entropy(e, c, t, bias=bias, softcap=softcap, reduction=reduction,
                                    label_smoothing=ls, shift=shift, workspace_mib=16)
        # the config's kind (on Hopper 16-bit inputs take shifted logits by default; only the
        # TMA forward writes them: the portable config, forced, takes another kind)
        cfg = config_for(DEV, dtype)
        want_shifted = dtype != torch.float32 and cfg.fused.logits_shifted and cfg.forward.tma
        # (IN_DE's and the defaults' shapes fit the maxima in a dE row)
        in_de = want_shifted and cfg.fused.tile_max_in_de
        fp32_sums = dtype == torch.float32 or cfg.fused.dc_accumulator == "fp32"
        want_target = (dtype != torch.float32 and not want_shifted and not has_bias
                       and cfg.fused.target_shift)
    loss.backward()
    chunks = expected_chunks(shifted(t, shift), max_rows)
    assert fused_calls == [(chunks, 0 < max_rows < t.numel() and fp32_sums, False)]
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    assert abs(float(loss) - float(ref)) <= tol * max(1.0, abs(float(ref)))
    assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol
    assert e.grad.dtype == dtype and c.grad.dtype == dtype
    if bias is not None:
        assert rel(bias.grad, b2.grad) < tol
    # the plan took the kind asked for: shifted logits, their maxima in dE's rows where asked
    assert plans == [(want_shifted, in_de, want_target)]
    assert want_shifted or not cfg.forward.tma or not logits.get("logits_shifted")  # SHIFTED
    assert want_target or has_bias or not logits.get("target_shift")


@pytest.mark.parametrize("case", [CASES[4], CASES[6]], ids=["v67", "v64"])
def test_softcap_halves_on_the_shifted_forward_give_the_whole_tiles_loss_and_grads(monkeypatch,
                                                                                  case):
    # forward.softcap_halves on the TMA forward that writes the shifted logits: a tile's two
    # halves fold against the tile's one maximum, so only the order of the lse's fp32 sums
    # changes: loss within fp32 rounding, gradients within one rounding of their 16-bit dtype.
    from own_kernel.kernels import forward_tma
    from tests.test_own_kernel import spy_kernel_args

    dtype, lead, d, v, softcap, reduction, ls, has_bias, shift, max_rows = case
    launches = spy_kernel_args(monkeypatch, forward_tma, "cce_fwd_tma_kernel", "STORE_Y",
                               "HALVES")
    runs = []
    for halves in (False, True):
        e, c, t, bias = _inputs(dtype, lead, d, v, has_bias, ignore_every=7, device=DEV)
        with overridden({"fused": {"max_rows": max_rows, "min_rows": 1, "min_chunk_flops": 0,
                                   **SHIFTED}, "forward": {"softcap_halves": halves}}):
            loss = linear_cross_entropy(e, c, t, bias=bias, softcap=softcap,
                                        reduction=reduction, label_smoothing=ls, shift=shift,
                                        workspace_mib=16)
        loss.backward()
        runs.append((float(loss.detach()), e.grad, c.grad))
    calls = len(launches) // 2  # one shifted forward a chunk, each call as many
    assert calls and launches == [(True, False)] * calls + [(True, True)] * calls
    (loss0, de0, dc0), (loss1, de1, dc1) = runs
    assert abs(loss1 - loss0) <= 8 * torch.finfo(torch.float32).eps * v * max(1.0, abs(loss0))
    eps = torch.finfo(dtype).eps
    assert rel(de1, de0) <= eps and rel(dc1, dc0) <= eps


def _spy_plans(monkeypatch) -> list:
    """(plan.shifted, plan.tile_max_in_de, plan.target_shifted) of each fused call."""
    seen, inner = [], fused.fused_loss_and_grads

    def spy(e, c, targets, bias, opts, route, check, mean):
        seen.append((route.fused.shifted, route.fused.tile_max_in_de,
                     route.fused.target_shifted))
        return inner(e, c, targets, bias, opts, route, check, mean)

    monkeypatch.setattr(fused, "fused_loss_and_grads", spy)
    return seen


def test_shifted_logits_keep_fp32_logits_accuracy_where_16_bit_logits_lose_it():
    # Confident fp16 rows with logits up to ~60: a 16-bit logit loses |z| 2^-11 in the exponent,
    # a shifted one (relative to its tile's row max) only |y| 2^-11 with y near 0 where p is
    # large, so its gradients stay within one fp16 rounding of the fp32-logits path's.
    g = torch.Generator().manual_seed(0)
    n, d, v = 64, 32, 96
    c = torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    e = (c[t] + 0.3 * torch.randn(n, d, generator=g)).half().to(DEV)
    c, t = c.half().to(DEV), t.to(DEV)
    e64, c64 = e.double().requires_grad_(), c.double().requires_grad_()
    torch.nn.functional.cross_entropy(e64 @ c64.T, t).backward()
    err = {}
    # each kind named whatever the device's default
    plain = {"logits_shifted": False, "target_shift": False}
    for name, logits in (("fp32", {**plain, "logits_fp32": True}), ("shifted", SHIFTED),
                         ("16-bit", {**plain, "logits_fp32": False}),
                         ("target-shifted", TARGET_SHIFT)):
        e1, c1 = e.clone().requires_grad_(), c.clone().requires_grad_()
        with overridden({"fused": logits}):
            linear_cross_entropy(e1, c1, t, workspace_mib=16).backward()
        err[name] = max(rel(e1.grad, e64.grad), rel(c1.grad, c64.grad))
    eps = torch.finfo(torch.float16).eps
    assert err["shifted"] <= err["fp32"] + eps, err
    assert err["target-shifted"] <= err["fp32"] + eps, err  # the target its row's largest
    assert err["16-bit"] > err["fp32"] + eps, err  # what the shifted logits avoid


def test_the_first_chunk_overwrites_dcs_unzeroed_buffer(fused_calls, monkeypatch):
    # dC's fp32 buffer is allocated without zeroing; poison it to prove nothing stale survives.
    real_empty = torch.empty
    monkeypatch.setattr(fused.torch, "empty",
                        lambda *a, **k: real_empty(*a, **k).fill_(float("nan"))
                        if k.get("dtype") == torch.float32 else real_empty(*a, **k))
    e, c, t, _ = _inputs(torch.float32, (20,), 16, 40, False, ignore_every=6)
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    with overridden({"fused": {"max_rows": 4}}):
        linear_cross_entropy(e, c, t, workspace_mib=16).backward()
    assert fused_calls and fused_calls[0][1]  # several chunks: the fp32 accumulator
    assert rel(c.grad, c2.grad) < 1e-5 and rel(e.grad, e2.grad) < 1e-5


class _AliveWhenDcIsMade(TorchDispatchMode):
    """Weak references to every tensor the call's ops make; when an op makes dC's buffer (a
    new tensor of ``numel`` elements), the bytes of each storage then alive (by pointer), the
    inputs' left out."""

    def __init__(self, numel, inputs):
        super().__init__()
        self.numel, self.made, self.alive = numel, [], None
        self.inputs = {t.untyped_storage().data_ptr() for t in inputs}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(o, torch.Tensor):
                continue
            if (self.alive is None and o.numel() == self.numel
                    and func.overloadpacket.__name__ in ("empty", "zeros")):
                alive = [r() for r in self.made]
                self.alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                              for t in alive if t is not None}
                for ptr in self.inputs:
                    self.alive.pop(ptr, None)
            self.made.append(weakref.ref(o))
        return out


@pytest.mark.parametrize("logits", [{}, TARGET_SHIFT, IN_DE], ids=["logits", "target-shifted",
                                                                   "tile-max-in-de"])
def test_a_one_chunk_call_makes_dc_with_no_per_row_vector_alive(logits):
    # dC's buffer is made at its first GEMM, after the losses are summed and the rounding
    # residues and C's mean row are dropped: at N 4096, D 7168 those held a one-chunk call
    # 0.09 MiB above torch.compile's peak (dC, the logits and dE, which both hold too).
    e, c, t, _ = _inputs(torch.float16, (24,), 64, 67, False, ignore_every=7)
    with overridden({"fused": {**logits, "min_rows": 1, "min_chunk_flops": 0}}), \
            _AliveWhenDcIsMade(c.numel(), (e, c, t)) as seen:
        plan = own_kernel.plan(e, c, t, workspace_mib=16)
        linear_cross_entropy(e, c, t, workspace_mib=16).backward()
    assert plan.path == "three-matmul" and plan.fused.chunks == 1, plan
    # Alive: the logits, dE (and its fp32 rows where V mod 8 splits its reduction), and a few
    # bytes: the loss and the targets' counts. No vector of rows or of D (each >= 96 bytes).
    sizes = sorted(seen.alive.values(), reverse=True)
    assert e.numel() * e.element_size() in sizes, sizes
    assert sum(b for b in sizes if b < e.numel() * e.element_size()) < 32, sizes


def test_upstream_gradient_scales_the_gradients(fused_calls):
    e, c, t, _ = _inputs(torch.float32, (20,), 16, 40, False, ignore_every=6)
    ref, e2, c2, _ = reference(e, c, t)
    (0.25 * ref).backward()
    (0.25 * linear_cross_entropy(e, c, t, workspace_mib=16)).backward()
    assert len(fused_calls) == 1
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5


@pytest.mark.parametrize("max_rows", [0, 6])
@pytest.mark.parametrize("dtype, logits", [(torch.float32, {}), (torch.float16, SHIFTED)],
                         ids=["fp32", "fp16-shifted"])
def test_filter_skips_column_blocks_and_stays_close(fused_calls, monkeypatch, max_rows, dtype,
                                                    logits):
    e, c, t = peaked_inputs(40, 32, 1024, seed=1)
    e, c = e.to(dtype).requires_grad_(), c.to(dtype).requires_grad_()
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    runs = []
    real_runs = fused.kept_runs
    monkeypatch.setattr(fused, "kept_runs", lambda *a: runs.append(real_runs(*a)) or runs[-1])
    with overridden({"fused": {"max_rows": max_rows, **logits}}):
        linear_cross_entropy(e, c, t, filter_eps=1e-3, workspace_mib=16).backward()
    assert fused_calls and fused_calls[0][2]
    kept_columns = sum(b - a for chunk in runs for a, b in chunk)
    assert 0 < kept_columns < 0.9 * 1024 * len(runs)  # some blocks skipped, not all
    assert rel(e.grad, e2.grad) < 1e-2 and rel(c.grad, c2.grad) < 1e-2


def test_auto_filter_keeps_flat_rows_exact(fused_calls):
    g = torch.Generator().manual_seed(2)
    e = (0.01 * torch.randn(24, 16, generator=g)).requires_grad_()  # flat: every p ~ 1/V
    c = torch.randn(300, 16, generator=g).requires_grad_()
    t = torch.randint(0, 300, (24,), generator=g)
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    linear_cross_entropy(e, c, t, filter_eps="auto", workspace_mib=16).backward()
    assert fused_calls and fused_calls[0][2]
    assert rel(e.grad, e2.grad) < 1e-5 and rel(c.grad, c2.grad) < 1e-5


def test_scale_into_scales_casts_and_checks_its_arguments():
    from own_kernel.kernels.scale import scale_into
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=g)  # more than one block, a ragged last one
    scale = torch.tensor(-0.375)
    out = scale_into(x, torch.empty(5000, dtype=torch.float16), scale)
    assert out.dtype == torch.float16 and torch.equal(out, (x * -0.375).half())
    y = x.clone()
    assert scale_into(y, y, scale) is y and torch.equal(y, x * -0.375)
    with pytest.raises(ValueError, match="scale_into"):
        scale_into(x[::2], torch.empty(2500), scale)


@pytest.mark.parametrize("programs", [1, 2, 3, 8])
def test_scale_into_strides_few_programs_over_every_block(programs):
    # A few programs per SM stride over the blocks (not one program per block): each block,
    # the ragged last one included, is scaled once, whatever the programs' count.
    from own_kernel.kernels.scale import BLOCK, scale_into
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5 * BLOCK + 17, generator=g)
    out = scale_into(x, torch.empty(x.shape, dtype=torch.float16), torch.tensor(-0.375),
                     max_programs=programs)
    assert torch.equal(out, (x * -0.375).half())
    y = x.clone()
    assert torch.equal(scale_into(y, y, torch.tensor(3.0), max_programs=programs), x * 3.0)
    assert torch.equal(scale_into(y, y, torch.tensor(1.0), max_programs=programs), x * 3.0)
    with pytest.raises(ValueError, match="max_programs"):
        scale_into(x, y, torch.tensor(1.0), max_programs=0)


def test_aligned_runs_split_off_the_last_v_mod_8_columns():
    assert aligned_runs([(0, 101)], 101) == [(0, 96), (96, 101)]
    assert aligned_runs([(0, 32), (64, 101)], 101) == [(0, 32), (64, 96), (96, 101)]
    assert aligned_runs([(0, 96)], 96) == [(0, 96)]


def test_kept_runs_join_consecutive_blocks():
    kept = torch.tensor([1, 1, 0, 1, 0, 0, 1], dtype=torch.int8)
    assert fused.kept_runs(kept, 16, 100) == [(0, 32), (48, 64), (96, 100)]
    assert fused.kept_runs(torch.zeros(3, dtype=torch.int8), 16, 40) == []


def test_other_calls_take_the_recompute_path(fused_calls):
    e, c, t, _ = _inputs(torch.float32, (12,), 16, 40, False, ignore_every=5)
    for kwargs in (dict(reduction="none"), dict(return_lse=True), dict(low_memory=True),
                   dict(workspace_mib=0)):
        out = linear_cross_entropy(e, c, t, **{"workspace_mib": 16, **kwargs})
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    with torch.no_grad():
        linear_cross_entropy(e, c, t, workspace_mib=16)
    assert fused_calls == []
    with overridden({"fused": {"default_workspace_mib_fp32": 16}}):  # the API's own choice
        linear_cross_entropy(e, c, t, filter_eps=1e-3).backward()  # a filter asked: recompute
        assert fused_calls == []
        # "auto" runs exact where the exact call takes the three-matmul path (it filters
        # only where the exact call would recompute: results/notes/filter-auto.md)
        linear_cross_entropy(e, c, t, filter_eps="auto").backward()
        assert len(fused_calls) == 1 and not fused_calls[0][2]
        linear_cross_entropy(e, c, t).backward()
    assert len(fused_calls) == 2
    # A target whose config says so (the portable one) takes it for filtered calls too.
    with overridden({"fused": {"default_workspace_mib_fp32": 16, "filtered": True}}):
        linear_cross_entropy(e, c, t, filter_eps="auto").backward()
    assert len(fused_calls) == 3 and fused_calls[2][2]


def test_zero_budget_runs_three_matmul_within_the_recompute_paths_memory(fused_calls):
    # fused.zero_budget "recompute-memory": at workspace_mib=0 an exact call of 16-bit inputs
    # takes the three-matmul path where its chunks fit the recompute path's fp32 dE accumulator
    # (4 N D bytes): the plan's peak no higher than the recompute path's, the gradients as
    # exact. The default ("recompute"), fp32 inputs and a filter keep the recompute path.
    from own_kernel import plan

    e, c, t, _ = _inputs(torch.float16, (20,), 16, 40, False, ignore_every=6)
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    recompute = plan(e, c, t, workspace_mib=0)
    assert recompute.path == "recompute"
    with overridden({"fused": {"zero_budget": "recompute-memory"}}):
        within = plan(e, c, t, workspace_mib=0)
        assert within.path == "three-matmul" and within.chunks > 1
        assert within.peak_bytes <= recompute.peak_bytes
        assert within.fused.extra_bytes <= 4 * e.shape[0] * e.shape[1]
        linear_cross_entropy(e, c, t, workspace_mib=0).backward()
        assert len(fused_calls) == 1 and len(fused_calls[0][0]) > 1  # its chunks ran
        assert rel(e.grad, e2.grad) < 3e-3 and rel(c.grad, c2.grad) < 3e-3
        assert plan(e, c, t, workspace_mib=0, filter_eps=1e-3).path == "recompute"
        assert plan(e.detach().float(), c.detach().float().requires_grad_(), t,
                    workspace_mib=0).path == "recompute"
    with pytest.raises(ValueError, match="fused.zero_budget"):
        with_overrides(HOPPER_16BIT, {"fused": {"zero_budget": "none"}})


@pytest.mark.parametrize("n, d, v, path", [
    (16384, 2048, 49152, "three-matmul"),  # 13 chunks of 1280 rows fit 4 N D bytes
    (8192, 4096, 128256, "three-matmul"),  # 16 of 512
    (4096, 7168, 129280, "three-matmul"),  # 10 of 410
    (8192, 2304, 256000, "recompute"),     # 147 rows would fit: < fused.min_rows
    (65536, 2304, 256000, "recompute"),    # 56 chunks of 1179: more than fused.dc_max_chunks
    (8192, 4096, 32000, "three-matmul"),   # 4 of 2048, 1.6e12 flops each
    (4096, 2048, 32768, "recompute"),      # 8 of 512, 2.1e11 flops: < fused.min_chunk_flops
])
def test_zero_budget_on_hopper_only_where_min_rows_fit_in_few_chunks(n, d, v, path):
    # HOPPER_16BIT's zero budget runs the three-matmul path in the recompute path's memory
    # where its chunks hold fused.min_rows rows and number at most fused.dc_max_chunks (dC's
    # 16-bit sums round once per chunk); "recompute" keeps the recompute path.
    from own_kernel.policy.route import Call, route

    call = Call(n, v, d, torch.bfloat16, "mean", True, False, False, False, False,
                workspace_mib=0)
    recompute = route(call, with_overrides(HOPPER_16BIT, {"fused": {"zero_budget": "recompute"}}))
    r = route(call, HOPPER_16BIT)
    assert recompute.path == "recompute" and r.path == path
    assert r.peak_bytes <= recompute.peak_bytes
    if path == "three-matmul":
        assert r.fused.rows >= HOPPER_16BIT.fused.min_rows and r.budget_mib == 0
        assert r.chunks <= HOPPER_16BIT.fused.dc_max_chunks
        assert 6 * r.fused.rows * v * d >= HOPPER_16BIT.fused.min_chunk_flops


def test_a_budgets_chunks_each_hold_min_chunk_flops():
    # 8 chunks of 512 rows at N 4096, D 2048, V 32768 (2.1e11 flops each) were 1.75x slower
    # than recomputing at a 0 MiB budget (H200): any budget that makes them recomputes; one
    # chunk of any size is three matmuls against four.
    from own_kernel.policy.route import Call, route

    small = Call(4096, 32768, 2048, torch.bfloat16, workspace_mib=32)  # 512 rows a chunk
    r = route(small, HOPPER_16BIT)
    assert r.path == "recompute" and "fused.min_chunk_flops" in r.note
    off = route(small, with_overrides(HOPPER_16BIT, {"fused": {"min_chunk_flops": 0}}))
    assert off.path == "three-matmul" and off.chunks == 8
    one = route(dataclasses.replace(small, workspace_mib=256), HOPPER_16BIT)
    assert one.path == "three-matmul" and one.chunks == 1
    with pytest.raises(ValueError, match="fused.min_chunk_flops"):
        with_overrides(HOPPER_16BIT, {"fused": {"min_chunk_flops": -1}})


@pytest.mark.parametrize("n, d, v, softcap, mib, chunks", [
    (8192, 2304, 256000, True, 256, 0),     # Gemma 2 (2B): 16 chunks, dC's error 1.26x
    (8192, 2304, 256000, True, 512, 8),     # torch.compile's; 8 chunks 0.92x (H200)
    (65536, 2304, 256000, True, 1024, 0),   # N 65536 at the default budget: 32 chunks
    (16384, 1152, 262144, False, 256, 0),   # D 1152: 33 chunks, 1.38x
    (16384, 1152, 262144, False, 512, 17),  # 17 chunks, 0.89x
    (16384, 3584, 152064, False, 256, 19),  # Qwen 2.5 (7B): 19 chunks of 862 rows, 0.88x
    (65536, 4096, 128256, False, 1024, 16),
])
def test_a_budgets_chunks_are_capped_in_number_where_dc_sums_them(n, d, v, softcap, mib,
                                                                     chunks):
    # dC's own 16-bit buffer sums the chunks, one rounding each, so its error grows with their
    # number: at most fused.dc_max_chunks, fewer with a softcap (torch.compile's own dC error,
    # the bound's measure, is half as large at Gemma 2 (2B), N 8192). Chunks of 384 rows and
    # more are faster than recomputing (zero-budget.md), so the cap, not the rows, decides.
    from own_kernel.policy.route import Call, route

    call = Call(n, v, d, torch.bfloat16, workspace_mib=mib, softcap=softcap)
    r = route(call, HOPPER_16BIT)
    name = "dc_max_chunks_softcap" if softcap else "dc_max_chunks"
    if chunks:
        assert r.path == "three-matmul" and r.chunks == chunks
        assert r.chunks <= getattr(HOPPER_16BIT.fused, name)
        return
    assert r.path == "recompute" and f"fused.{name}" in r.note
    uncapped = route(call, with_overrides(HOPPER_16BIT, {"fused": {name: 0}}))
    assert uncapped.path == "three-matmul" and uncapped.chunks > getattr(HOPPER_16BIT.fused, name)
    # dC's sums in fp32 round once: an fp32 weight under autocast is not capped
    fp32_dc = route(dataclasses.replace(call, fp32_weight=True), HOPPER_16BIT)
    assert fp32_dc.path == "three-matmul" and fp32_dc.chunks == uncapped.chunks
    with pytest.raises(ValueError, match=f"fused.{name}"):
        with_overrides(HOPPER_16BIT, {"fused": {name: -1}})


def test_the_call_caps_a_softcapped_calls_chunks_lower():
    # plan() (the call's own route) passes the softcap on: 16 chunks of 4 rows are within
    # fused.dc_max_chunks but over fused.dc_max_chunks_softcap, which then recomputes.
    from own_kernel import plan

    fused = INTERPRETER.fused
    assert fused.dc_max_chunks_softcap < 16 <= fused.dc_max_chunks
    e = torch.randn(64, 16, dtype=torch.float16, requires_grad=True)
    c = torch.randn(40, 16, dtype=torch.float16, requires_grad=True)
    t = torch.randint(0, 40, (64,))
    with overridden({"fused": {"max_rows": 4}}):
        assert plan(e, c, t, workspace_mib=16).chunks == 16
        capped = plan(e, c, t, workspace_mib=16, softcap=30.0)
    assert capped.path == "recompute" and "fused.dc_max_chunks_softcap" in capped.note


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_ignored_gives_torchs_loss_and_zero_gradients(fused_calls, reduction):
    e, c, _, _ = _inputs(torch.float32, (6,), 8, 20, False, ignore_every=100)
    t = torch.full((6,), -100)
    loss = linear_cross_entropy(e, c, t, reduction=reduction, workspace_mib=16)
    loss.backward()
    assert fused_calls == [([6], False, False)]
    assert torch.isnan(loss) if reduction == "mean" else float(loss) == 0.0
    assert not e.grad.any() and not c.grad.any()


@pytest.mark.parametrize("where", [1, 5])  # in the first chunk (queued before the check is read)
def test_a_bad_target_is_refused_by_name(fused_calls, where):
    e, c, t, _ = _inputs(torch.float32, (8,), 8, 20, False, ignore_every=100)
    t[where] = 20
    with overridden({"fused": {"max_rows": 4}}), \
            pytest.raises(ValueError, match="targets: value 20 is outside"):
        linear_cross_entropy(e, c, t, workspace_mib=16)
    assert fused_calls and fused_calls[0][0] == [4]  # refused before the rest is queued


def test_the_check_is_read_after_the_first_chunk_is_queued(fused_calls, monkeypatch):
    # The host read waits for the GPU: queued first, the first chunk keeps the GPU busy.
    events = []
    real_values, real_chunk = fused.HostScalar.values, fused._logits_and_grad
    monkeypatch.setattr(fused.HostScalar, "values",
                        lambda self: events.append("read") or real_values(self))
    monkeypatch.setattr(fused, "_logits_and_grad",
                        lambda *a: events.append("chunk") or real_chunk(*a))
    e, c, t, _ = _inputs(torch.float32, (20,), 16, 40, False, ignore_every=6)
    with overridden({"fused": {"max_rows": 8}}):
        linear_cross_entropy(e, c, t, workspace_mib=16).backward()
    assert events[:2] == ["chunk", "read"] and events.count("chunk") == 2


@pytest.mark.parametrize("accumulator", ["dc", "fp32"])
def test_the_backward_never_reads_the_upstream_gradient_on_the_host(fused_calls, monkeypatch,
                                                                    accumulator):
    e, c, t, bias = _inputs(torch.float16, (20,), 16, 40, True, ignore_every=6)
    ref, e2, c2, b2 = reference(e, c, t, bias)
    (0.5 * ref).backward()
    with overridden({"fused": {"max_rows": 8, "dc_accumulator": accumulator}}):
        loss = linear_cross_entropy(e, c, t, bias=bias, workspace_mib=16)

    def refuse(self, *args):
        raise AssertionError("the upstream gradient was read on the host")

    for name in ("__float__", "item", "tolist", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    (0.5 * loss).backward()
    monkeypatch.undo()
    # several chunks: dC's sums scaled (fp32: and rounded) in the backward
    assert len(fused_calls[0][0]) > 1 and fused_calls[0][1] == (accumulator == "fp32")
    assert rel(e.grad, e2.grad) < 3e-3 and rel(c.grad, c2.grad) < 3e-3
    assert rel(bias.grad, b2.grad) < 3e-3


@pytest.mark.parametrize("ignored", [[0, 1, 2], [9, 10, 17]])  # first chunk only / rest only
def test_rows_without_a_target_in_the_first_chunk_or_the_rest(fused_calls, ignored):
    e, c, t, _ = _inputs(torch.float16, (18,), 16, 40, False, ignore_every=100)
    t[ignored] = -100
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    with overridden({"fused": {"max_rows": 8}}):
        linear_cross_entropy(e, c, t, workspace_mib=16).backward()
    assert fused_calls[0][0] == expected_chunks(t, 8)
    assert rel(e.grad, e2.grad) < 3e-3 and rel(c.grad, c2.grad) < 3e-3
    assert not e.grad[ignored].any()


def test_workspace_mib_is_validated():
    e, c, t, _ = _inputs(torch.float32, (4,), 8, 20, False, ignore_every=100)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="workspace_mib"):
            linear_cross_entropy(e, c, t, workspace_mib=bad)


MIB = 2**20
# The plan's arithmetic with 16-bit logits (fused.logits_fp32 off; fp32 logits, the default:
# tests/test_numerics.py).
# These tests' arithmetic is the fp32 accumulator's (dC's own buffer: the test after them).
HOPPER_LOGITS_16 = with_overrides(HOPPER_16BIT, {"fused": {"logits_fp32": False,
                                                           "dc_accumulator": "fp32"}})


@pytest.mark.parametrize("n, v, d, mib, expect", [
    # Gemma 2 (2B): dC's fp32 accumulator alone (2250 MiB) is more than 1 GiB
    (8192, 256000, 2304, 1024, "cannot hold dC's fp32 accumulator"),
    # 3 GiB: the chunk may take what dC (1125 MiB, allocated only in the backward) leaves
    (8192, 256000, 2304, 3072, (2816, 3, True)),       # 2731 rounded up (fused.row_align)
    (8192, 256000, 2304, 4096, (8192, 1, False)),      # all the logits (4000 MiB): one chunk
    # room for fewer than min_rows rows beside the accumulator: recomputing is faster
    (65536, 50257, 256, 50, f"fewer than {HOPPER_16BIT.fused.min_rows}"),  # 265 rows
    (8192, 128256, 4096, 3072, (8192, 1, False)),      # Llama 3 (8B): one chunk
    (16384, 152064, 3584, 3072, (5504, 3, True)),      # Qwen 2.5 (7B): 5462 rounded up
    (8192, 32000, 2304, 1024, (8192, 1, False)),       # everything in one chunk
])
def test_fused_plan_at_real_shapes(n, v, d, mib, expect):
    plan, why = fused_plan(n, v, d, 2, mib * MIB, HOPPER_LOGITS_16)
    if isinstance(expect, str):
        assert plan is None and expect in why
        return
    assert (plan.rows, plan.chunks, plan.accumulate_dc) == expect and why == ""
    assert plan.extra_bytes <= mib * MIB
    assert plan.rows * (plan.chunks - 1) < n <= plan.rows * plan.chunks


@pytest.mark.parametrize("n, v, d, expect", [
    (8192, 256000, 2304, (2048, 4)),    # Gemma 2 (2B): no fp32 accumulator to hold, 4 chunks
    (8192, 128256, 4096, (4096, 2)),    # Llama 3 (8B)
    (8192, 151936, 1536, (2816, 3)),    # 5 chunks of 1639 beside an fp32 accumulator
])
def test_dc_summed_in_its_own_buffer_leaves_the_budget_to_the_chunk(n, v, d, expect):
    # At 1 GiB the fp32 accumulator does not fit at the first two heads (recompute path)
    cfg = with_overrides(HOPPER_16BIT, {"fused": {"dc_accumulator": "dc"}})
    plan, why = fused_plan(n, v, d, 2, 1024 * MIB, cfg, shift_ok=True)
    assert (plan.rows, plan.chunks, plan.accumulate_dc) == (*expect, False) and why == ""
    # the logits alone: the tile maxima live in the chunk's dE rows (fused.tile_max_in_de)
    assert plan.tile_max_in_de and plan.extra_bytes == plan.rows * plan.row_stride * 2
    assert plan.extra_bytes <= 1024 * MIB


def test_too_few_rows_beside_no_accumulator_say_so():
    cfg = with_overrides(HOPPER_16BIT, {"fused": {"dc_accumulator": "dc"}})
    plan, why = fused_plan(8192, 600_000, 2304, 2, 256 * MIB, cfg, shift_ok=True)  # 205 rows
    assert plan is None and f"fewer than {HOPPER_16BIT.fused.min_rows}" in why
    assert "accumulator" not in why


def test_dc_accumulator_is_validated():
    with pytest.raises(ValueError, match="fused.dc_accumulator"):
        with_overrides(HOPPER_16BIT, {"fused": {"dc_accumulator": "bf16"}})


def test_the_budget_bounds_the_peak_beyond_the_gradients():
    # Gemma 2 (2B), 16-bit, 3 chunks: the forward holds the chunk's logits and dC's fp32
    # accumulator (dC itself not yet), the backward the accumulator and dC.
    v, d, mib = 256000, 2304, 3072
    plan, _ = fused_plan(8192, v, d, 2, mib * MIB, HOPPER_LOGITS_16)
    forward = plan.rows * plan.row_stride * 2 + 4 * v * d
    backward = 4 * v * d + 2 * v * d
    assert plan.extra_bytes == max(forward, backward) - 2 * v * d <= mib * MIB
    assert forward > backward  # the chunk took more than what the accumulator alone needs


@pytest.mark.parametrize("v, filtered, fp32_rows", [
    (256000, False, False), (50257, False, True), (256000, True, True)])
def test_fp32_de_rows_only_where_des_reduction_is_split(v, filtered, fp32_rows):
    # One GEMM over all V columns writes dE's rows itself; the filter's runs or V's last
    # V mod 8 columns apart need fp32 rows to sum in, and the budget pays for them.
    plan, _ = fused_plan(8192, v, 2304, 2, 3072 * MIB, HOPPER_LOGITS_16, filtered=filtered)
    assert plan.de_rows_fp32 == fp32_rows
    chunk = plan.rows * (plan.row_stride * 2 + 2304 * 4 * fp32_rows)
    assert plan.extra_bytes == (max(chunk + 2 * v * 2304, 4 * v * 2304) if plan.accumulate_dc
                                else chunk)


def test_chunks_are_of_equal_size():
    # 7007 rows fit at Qwen 2.5 (7B): three chunks of 5462 rows, not two of 7007 and one of
    # 2370; with fused.row_align 128, two of 5504 and one of 5376
    plain_cfg = with_overrides(HOPPER_LOGITS_16, {"fused": {"row_align": 1}})
    plain, _ = fused_plan(16384, 152064, 3584, 2, 3072 * MIB, plain_cfg)
    assert (plain.rows, plain.chunks) == (5462, 3)
    aligned, _ = fused_plan(16384, 152064, 3584, 2, 3072 * MIB, HOPPER_LOGITS_16)
    assert (aligned.rows, aligned.chunks) == (5504, 3)
    assert even_rows(5 * 3423 - 100, 3423) == 3403 and even_rows(10, 4) == 4


@pytest.mark.parametrize("v, elt, stride", [(50257, 2, 50264), (32000, 2, 32000), (101, 4, 104)])
def test_logits_rows_are_16_byte_aligned(v, elt, stride):
    plan, _ = fused_plan(64, v, 16, elt, 2**30, HOPPER_LOGITS_16)
    assert plan.row_stride == stride and (plan.row_stride * elt) % 16 == 0


def test_aligned_rows_keep_the_chunk_count_and_shorten_the_last():
    # config.Fused.row_align: Qwen 2.5 (7B) at 1 GiB, five chunks of 3277 rows (a partial
    # 128-row tile each) become four of 3328 and one of 3072
    n, v, d = 16384, 152064, 3584
    plain_cfg = with_overrides(HOPPER_16BIT, {"fused": {"row_align": 1}})
    plain, _ = fused_plan(n, v, d, 2, 1024 * MIB, plain_cfg, shift_ok=True)
    aligned, _ = fused_plan(n, v, d, 2, 1024 * MIB, HOPPER_16BIT, shift_ok=True)
    assert (plain.rows, plain.chunks) == (3277, 5) and (aligned.rows, aligned.chunks) == (3328, 5)
    assert aligned.row_align == 128 and aligned.extra_bytes <= 1024 * MIB
    # where the aligned rows would not fit, the even split stays
    assert even_rows(10, 4, 4) == 4 and even_rows(9, 5, 4) == 5 and even_rows(9, 5, 8) == 5
    assert even_rows(26, 16, 8) == 16 and even_rows(26, 16, 1) == 13
    with pytest.raises(ValueError, match="fused.row_align"):
        with_overrides(HOPPER_16BIT, {"fused": {"row_align": 0}})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_aligned_chunks_of_the_gathered_rest_match_the_reference(fused_calls, dtype):
    # The rest's gathered rows in chunks of a multiple of row_align, the last shorter, as many
    # chunks as the even split (dC summed over each)
    e, c, t, _ = _inputs(dtype, (61,), 24, 101, False, ignore_every=7)
    ref, e2, c2, _ = reference(e, c, t)
    ref.backward()
    runs = {}
    for align in (1, 8):
        e.grad = c.grad = None
        with overridden({"fused": {"max_rows": 16, "min_rows": 1, "min_chunk_flops": 0,
                                   "row_align": align}}):
            loss = linear_cross_entropy(e, c, t, workspace_mib=16)
        loss.backward()
        runs[align] = fused_calls[-1][0]
        tol = 1e-5 if dtype == torch.float32 else 3e-3
        assert abs(float(loss) - float(ref)) <= tol * max(1.0, abs(float(ref)))
        assert rel(e.grad, e2.grad) < tol and rel(c.grad, c2.grad) < tol
    plain, aligned = runs[1], runs[8]
    assert len(plain) == len(aligned) >= 3 and sum(plain) == sum(aligned)
    assert plain != aligned and all(r % 8 == 0 for r in aligned[:-1]), (plain, aligned)


def test_a_budget_below_one_row_falls_back_with_the_reason():
    plan, why = fused_plan(10, 1000, 16, 4, 1000, INTERPRETER)
    assert plan is None and "holds no row of logits" in why


@pytest.mark.parametrize("n, v, d, mib, expect", [
    # fp32 N 32768 D 2304 V 32000: dE and dC are fp32 already and take the sums in place, so
    # the budget holds logits only (16-bit inputs add fp32 dE rows and a 281 MiB dC buffer)
    (32768, 32000, 2304, 1024, (8192, 4, True)),
    (4096, 32000, 2304, 512, (4096, 1, False)),
])
def test_fp32_inputs_spend_the_budget_on_logits_only(n, v, d, mib, expect):
    plan, why = fused_plan(n, v, d, 4, mib * MIB, HOPPER_16BIT)
    assert (plan.rows, plan.chunks, plan.accumulate_dc) == expect and why == ""
    assert plan.extra_bytes == plan.rows * plan.row_stride * 4 <= mib * MIB


def test_fp32_calls_take_their_own_default_budget(fused_calls):
    e, c, t, _ = _inputs(torch.float32, (12,), 16, 40, False, ignore_every=5)
    with overridden({"fused": {"default_workspace_mib": 16, "default_workspace_mib_fp32": 0}}):
        linear_cross_entropy(e, c, t).backward()
    assert fused_calls == []  # fp32: its own budget, 0 here
    with overridden({"fused": {"default_workspace_mib": 0, "default_workspace_mib_fp32": 16}}):
        linear_cross_entropy(e, c, t).backward()
        linear_cross_entropy(e.half(), c.half(), t).backward()  # 16-bit: the other budget, 0
    assert len(fused_calls) == 1


def test_a_check_queued_with_the_defaults_serves_the_three_matmul_path(monkeypatch):
    """queue_targets_check(targets, v, ignore_index) is what a call of any path uses: on the
    three-matmul path (several chunks) the call reads its first chunk's count from the queued
    check's prefix, launching no check of its own (a launch at the call would be read after the
    forward: a wait for it), with the same loss and gradients."""
    import own_kernel
    import own_kernel.kernels.check_targets as ct
    launched = []
    for name in ("check_and_count_targets", "check_count_and_prefix"):
        launch = getattr(ct, name)
        monkeypatch.setattr(ct, name, lambda t, *a, _launch=launch, _name=name, **k:
                            launched.append((_name, t.numel())) or _launch(t, *a, **k))
    g = torch.Generator().manual_seed(4)
    e, c = torch.randn(20, 16, generator=g), torch.randn(40, 16, generator=g)
    t = torch.randint(0, 40, (20,), generator=g)
    t[::6] = -100

    def loss_and_grads(**kwargs):
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        with overridden({"fused": {"max_rows": 8}}):
            assert own_kernel.plan(ee, cc, t, workspace_mib=16).path == "three-matmul"
            loss = own_kernel.linear_cross_entropy(ee, cc, t, workspace_mib=16, **kwargs)
        loss.backward()
        return loss, ee.grad, cc.grad

    plain = loss_and_grads()
    launched.clear()
    queued = loss_and_grads(targets_check=own_kernel.queue_targets_check(t, 40, -100))
    # the queued check alone (with its prefix), no count of the first chunk's targets
    assert launched == [("check_count_and_prefix", 20), ("check_and_count_targets", 20)]
    assert all(torch.equal(a, b) for a, b in zip(plain, queued))


def test_a_pass_block_that_splits_a_forward_tile_is_refused_by_name():
    # The shifted logits' pass lays each block out as whole forward tiles (one maximum per tile
    # row): a block that is not a multiple of the tile width is a config error, not a launch.
    tile_v = HOPPER_16BIT.forward.tiles.block_v
    assert with_overrides(HOPPER_16BIT, {"fused": {"block": 2 * tile_v}}).fused.block == 2 * tile_v
    with pytest.raises(ValueError, match=rf"fused.block: expected a multiple of forward.tiles"
                                         rf".block_v \({tile_v}\).*got {tile_v // 2}"):
        with_overrides(HOPPER_16BIT, {"fused": {"block": tile_v // 2}})
