"""An fp32 weight under 16-bit autocast (what Trainer(bf16=True) and most AMP recipes do): C's
gradient must be fp32 anyway, so the three-matmul path's fp32 dC sums ARE that gradient (no
second V x D fp32 buffer, no 16-bit dC, no cast back), its 16-bit copy of C lives through the
forward only, and the budget holds the logits chunk alone, which makes that path the default.

The route at real shapes (pure, no launch), then the kernels under the Triton interpreter in
fp16 autocast (the interpreter refuses bf16) against an fp64 reference of autocast's rounded
operands: the allocations, the gradients and every autograd use (retain_graph, accumulation into
an fp32 .grad, C tied to the input embedding)."""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import own_kernel  # noqa: E402
from own_kernel import linear_cross_entropy  # noqa: E402
from own_kernel.paths import three_matmul as fused  # noqa: E402
from own_kernel.policy.config import HOPPER_16BIT, overridden, with_overrides  # noqa: E402
from own_kernel.policy.route import Call, route  # noqa: E402

if torch.cuda.is_available():
    pytest.skip("CPU tests (fp16 autocast under the Triton interpreter); the GPU measurement is "
                "python -m suite kernel autocast", allow_module_level=True)

MIB = 2**20
F16, BF16 = torch.float16, torch.bfloat16
EPS16 = torch.finfo(F16).eps
# (n, v, d): Gemma 2 (2B), Llama 3 (8B), Qwen 2.5 (7B), Mistral NeMo (12B) (D 5120), Gemma 3
# (1B) (D 1152, V 262144)
SHAPES = [(8192, 256000, 2304), (8192, 128256, 4096), (16384, 152064, 3584),
          (8192, 131072, 5120), (8192, 262144, 1152)]


# ---- the route (pure) --------------------------------------------------------------------------

@pytest.mark.parametrize("n, v, d", SHAPES)
def test_an_fp32_weight_takes_the_three_matmul_path_at_the_default_budget(n, v, d):
    cfg = HOPPER_16BIT
    budget = cfg.fused.default_workspace_mib
    # A 16-bit weight with dC's chunks summed in an fp32 accumulator (4 V D): it does not fit
    # the default budget (dC's own buffer sums them by default, and the chunk fits)
    fp32_acc = with_overrides(cfg, {"fused": {"dc_accumulator": "fp32"}})
    assert route(Call(n, v, d, BF16), fp32_acc).path == "recompute"
    assert not route(Call(n, v, d, BF16), cfg).fused.accumulate_dc
    call = Call(n, v, d, BF16, fp32_weight=True)
    r = route(call, cfg)
    assert (r.path, r.entry, r.budget_mib, r.note) == ("three-matmul", "fused", budget, "")
    p = r.fused
    # dC summed in fp32; shifted logits (2 bytes each, an fp32 max per row and forward tile)
    assert p.accumulate_dc and p.shifted and not p.logits_fp32
    assert p.shift_tiles == -(-v // cfg.forward.tiles.block_v)
    # The budget holds the chunk alone: its logits, the tile maxima where a dE row cannot hold
    # them (fused.tile_max_in_de: D 1152, V 262144), fp32 dE rows where V mod 8 splits dE's
    # reduction; never the accumulator, which is the gradient.
    assert p.tile_max_in_de == (d > 1152)
    maxima = 0 if p.tile_max_in_de else 4 * p.shift_tiles
    chunk = p.rows * (p.row_stride * 2 + maxima + (d * 4 if p.de_rows_fp32 else 0))
    assert p.extra_bytes == chunk <= budget * MIB
    assert p.rows >= cfg.fused.min_rows and p.rows * p.chunks >= n
    # What plan() reports: dE, fp32 dC, autocast's 16-bit copy of C, the chunk, the losses.
    peak = r.peak_bytes
    assert peak == 2 * n * d + 4 * v * d + 2 * v * d + chunk + 4 * n
    assert peak <= 2 * n * d + 4 * v * d + 2 * v * d + budget * MIB + 4 * n


def test_a_one_chunk_calls_peak_holds_dc_or_the_weights_copy_not_both():
    # N 4096, D 7168, V 129280 in one chunk: dC's fp32 buffer is made after the last dE drops
    # autocast's 16-bit copy of C and the losses, so the peak is dE, the chunk and the larger
    # of the two (call41h's peak on an H200 within a MiB of this estimate)
    n, v, d = 4096, 129280, 7168
    r = route(Call(n, v, d, BF16, fp32_weight=True), HOPPER_16BIT)
    assert r.path == "three-matmul" and r.chunks == 1
    dc32, copy = 4 * v * d, 2 * v * d
    assert r.peak_bytes == 2 * n * d + r.fused.extra_bytes + max(dc32, copy + 4 * n)
    bf16 = route(Call(n, v, d, BF16), HOPPER_16BIT)  # no copy: the gradients and the chunk
    assert bf16.chunks == 1 and bf16.peak_bytes == 2 * n * d + 2 * v * d + bf16.fused.extra_bytes


def test_fp32_logits_halve_the_rows_the_budget_holds():
    from own_kernel.policy.config import with_overrides
    n, v, d = SHAPES[1]
    call = Call(n, v, d, BF16, fp32_weight=True)
    p32 = route(call, with_overrides(HOPPER_16BIT, {"fused": {"logits_shifted": False}})).fused
    p16 = route(call, with_overrides(HOPPER_16BIT, {"fused": {"logits_shifted": False,
                                                              "logits_fp32": False}})).fused
    shifted = route(call, HOPPER_16BIT).fused
    assert p32.logits_fp32 and not p16.logits_fp32 and shifted.shifted
    assert p32.rows * p32.row_stride * 4 <= 1024 * MIB >= p16.rows * p16.row_stride * 2
    assert p16.rows == 2 * p32.rows == shifted.rows  # the tile maxima take 1/64 of a row


def test_a_bias_is_counted_in_fp32_and_in_its_copy():
    n, v, d = SHAPES[0]
    call = Call(n, v, d, BF16, has_bias=True, fp32_weight=True)
    r = route(call, HOPPER_16BIT)
    assert r.peak_bytes == (2 * n * d + 4 * (v * d + v) + 2 * (v * d + v)
                                            + r.fused.extra_bytes + 4 * n)


def test_plan_under_autocast_reports_the_fp32_weights_route():
    """own_kernel.plan at Llama 3 (8B) under fp16 autocast on the CPU (stand-in tensors, no
    memory): the fp32 weight keeps the three-matmul path at a 1 GiB default."""
    n, v, d = SHAPES[1]
    e = torch.empty((), dtype=F16).expand(n, d).requires_grad_()
    c = torch.empty(()).expand(v, d).requires_grad_()
    t = torch.zeros((), dtype=torch.int64).expand(n)
    # dC's chunks in an fp32 accumulator: the 16-bit weight's call cannot hold it at 1 GiB
    with overridden({"fused": {"default_workspace_mib": 1024, "min_rows": 1024,
                               "dc_accumulator": "fp32"}}), \
            torch.autocast("cpu", dtype=F16):
        planned = own_kernel.plan(e, c, t)
        frozen = own_kernel.plan(e, c.detach(), t)  # no gradient for C: autocast's copy
    assert planned.path == "three-matmul" and planned.budget_mib == 1024
    assert planned.peak_bytes <= 2 * n * d + 6 * v * d + 1024 * MIB + 4 * n
    assert frozen.path == "recompute"


# ---- the kernels (CPU, fp16 autocast) ----------------------------------------------------------

def rounded(x, dtype=F16):
    """x with autocast's rounding to dtype in its value, its gradient passed straight through."""
    return x + (x.to(dtype).to(x.dtype) - x).detach()


def reference(x, c, t, bias=None, ids=None, reduction="mean"):
    """fp64 loss of autocast's computation (e, c and bias rounded to fp16, the rest exact), with
    e = x + c[ids] / 4 when C is also the input embedding."""
    e = x + c[ids] / 4 if ids is not None else x
    z = rounded(e) @ rounded(c).T + (rounded(bias) if bias is not None else 0)
    return F.cross_entropy(z, t, reduction=reduction)


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


class NewTensors(TorchDispatchMode):
    """(op, dtype, storage pointer) of every tensor of ``numel`` elements an op creates (not a
    view of its inputs)."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.made = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves(
            (args, kwargs)) if isinstance(a, torch.Tensor)}
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(o, torch.Tensor) and o.numel() == self.numel
                    and o.untyped_storage().data_ptr() not in inputs):
                self.made.append((func.overloadpacket.__name__, o.dtype,
                                  o.untyped_storage().data_ptr()))
        return out


def _leaves(n, d, v, seed, x_dtype=torch.float32, has_bias=True):
    g = torch.Generator().manual_seed(seed)
    x = (0.5 * torch.randn(n, d, generator=g)).to(x_dtype).requires_grad_()
    c = (0.5 * torch.randn(v, d, generator=g)).requires_grad_()
    bias = (0.3 * torch.randn(v, generator=g)).requires_grad_() if has_bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[::5] = -100
    return x, c, bias, t


# N 48, D 40, V 8192: dC's fp32 buffer (1.25 MiB) exceeds a 1 MiB default budget, which holds
# 32 rows of fp32 logits: before, the recompute path; now two chunks of the three-matmul path.
SMALL_DEFAULT = {"fused": {"default_workspace_mib": 1, "block": 1024}}


def test_by_default_dcs_fp32_sums_are_cs_gradient_and_no_16_bit_dc_exists():
    n, d, v = 48, 40, 8192
    x, c, bias, t = _leaves(n, d, v, seed=0, x_dtype=F16)
    accumulators = []
    real_buffer = fused._Sums.dc_buffer

    def spy(self):
        made = self.dc_sums is None
        buffer = real_buffer(self)
        if made:
            accumulators.append(buffer.untyped_storage().data_ptr())
        return buffer

    made = NewTensors(v * d)
    with pytest.MonkeyPatch.context() as mp, overridden(SMALL_DEFAULT), \
            torch.autocast("cpu", dtype=F16):
        mp.setattr(fused._Sums, "dc_buffer", spy)
        planned = own_kernel.plan(x, c, t, bias=bias)
        with made:
            loss = linear_cross_entropy(x, c, t, bias=bias)
            loss.backward()
    assert planned.path == "three-matmul" and planned.chunks == 2
    # C's edge out of the path's Function is C itself: no cast between them.
    edges = [fn for fn, _ in loss.grad_fn.next_functions if fn is not None]
    assert type(loss.grad_fn).__name__ == "FusedLceBackward"
    assert sum(type(fn).__name__ == "AccumulateGrad" for fn in edges) == 2  # C and bias
    assert c.grad.dtype == bias.grad.dtype == torch.float32 and x.grad.dtype == F16
    # V x D tensors: one 16-bit (autocast's copy of C that the GEMMs read), one fp32 buffer
    # (the accumulator), and that buffer is C.grad. (The rest are the CPU fallbacks' fp32
    # copies of 16-bit GEMM operands, _to_copy: cuBLAS reads 16-bit operands directly.)
    half = [m for m in made.made if m[1] in (F16, BF16)]
    buffers = [m for m in made.made if m[0] in ("empty", "zeros", "empty_like", "new_empty",
                                                "empty_strided", "new_zeros", "zeros_like")]
    assert [m[0] for m in half] == ["_to_copy"], made.made
    assert len(buffers) == 1 and buffers[0][1] == torch.float32, made.made
    assert accumulators == [buffers[0][2]] == [c.grad.untyped_storage().data_ptr()]


def _errors(loss, grads, ref_loss, ref_grads):
    loss, ref_loss = float(loss.detach()), float(ref_loss.detach())
    return [abs(loss - ref_loss) / abs(ref_loss)] + [
        rel(g, r) for g, r in zip(grads, ref_grads)]


def test_a_one_chunk_call_drops_cs_16_bit_copy_before_dcs_fp32_buffer():
    # No GEMM reads C after the last chunk's dE, so autocast's 16-bit copy of the fp32 weight
    # is gone when dC's fp32 sums are made: a one-chunk call peaks at the larger of the two,
    # not their sum (V D 2 bytes less: 1.77 GB at D 7168, V 129280).
    from tests.test_fused import _AliveWhenDcIsMade

    n, d, v = 24, 32, 1024
    x, c, _, t = _leaves(n, d, v, seed=2, x_dtype=F16, has_bias=False)
    with overridden({"fused": {"min_rows": 1}}), torch.autocast("cpu", dtype=F16), \
            _AliveWhenDcIsMade(v * d, (x, c, t)) as seen:
        planned = own_kernel.plan(x, c, t, workspace_mib=64)
        linear_cross_entropy(x, c, t, workspace_mib=64).backward()
    assert planned.path == "three-matmul" and planned.chunks == 1, planned
    assert seen.alive is not None and v * d * 2 not in seen.alive.values(), seen.alive
    assert c.grad.dtype == torch.float32


@pytest.mark.parametrize("x_dtype", [torch.float32, F16])
def test_gradients_match_fp64_within_the_naive_fp16_computations_error(x_dtype):
    """Loss, dE, dC and dbias against fp64 of autocast's rounded operands: no larger than torch's
    own fp16 autocast computation's errors (its logits rounded to fp16), with a floor of eps."""
    n, d, v = 48, 40, 8192
    x, c, bias, t = _leaves(n, d, v, seed=1, x_dtype=x_dtype)
    leaves64 = [p.detach().double().requires_grad_() for p in (x, c, bias)]
    ref = reference(*leaves64[:2], t, leaves64[2])
    ref.backward()
    ref_grads = [p.grad for p in leaves64]
    with overridden(SMALL_DEFAULT), torch.autocast("cpu", dtype=F16):
        loss = linear_cross_entropy(x, c, t, bias=bias)
    loss.backward()
    own = _errors(loss, [x.grad, c.grad, bias.grad], ref, ref_grads)
    xn, cn, bn = (p.detach().clone().requires_grad_() for p in (x, c, bias))
    with torch.autocast("cpu", dtype=F16):
        naive_loss = F.cross_entropy(F.linear(xn, cn, bn).float(), t)
    naive_loss.backward()
    naive = _errors(naive_loss, [xn.grad, cn.grad, bn.grad], ref, ref_grads)
    assert c.grad.dtype == bias.grad.dtype == torch.float32
    # ... and fp32 in its digits too, not a 16-bit dC cast up: rounding it to fp16 (relative
    # error up to eps / 2 per entry) at least doubles its error.
    for g, r in ((c.grad, ref_grads[1]), (bias.grad, ref_grads[2])):
        assert 2 * rel(g, r) < rel(g.half(), r)
    for name, o, nv in zip(("loss", "dE", "dC", "dbias"), own, naive):
        assert o <= max(nv, EPS16), f"{name}: own {o:.3g}, naive fp16 {nv:.3g}"


def tolerance(v, d):
    """As tests/test_autograd_paths.py: 8 eps sqrt(V + D) of fp16 (W's and the outputs'
    rounding over reductions of V or D terms)."""
    return 8 * EPS16 * math.sqrt(v + d)


@pytest.mark.parametrize("steps, accumulate, tie, max_rows", [
    (2, False, False, 0), (1, True, False, 7), (2, True, True, 7), (1, False, True, 0),
    (3, True, False, 5)])
def test_autograd_uses_of_an_fp32_weight(steps, accumulate, tie, max_rows):
    """retain_graph (each backward adds the same gradients again), accumulation into existing
    fp32 .grad, and C tied to the input embedding (its gradient from two places), in one or
    several chunks, against fp64."""
    n, d, v = 23, 16, 56
    x, c, bias, t = _leaves(n, d, v, seed=steps + 7 * max_rows + tie, has_bias=not tie)
    ids = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(3)) if tie else None
    leaves = [p for p in (x, c, bias) if p is not None]
    leaves64 = [p.detach().double().requires_grad_() for p in leaves]
    g = torch.Generator().manual_seed(11)
    grad0 = [torch.randn(p.shape, generator=g, dtype=torch.float64) / 8 for p in leaves]
    if accumulate:
        for p, p64, g0 in zip(leaves, leaves64, grad0):
            p.grad, p64.grad = g0.float(), g0.clone()
    ref = reference(leaves64[0], leaves64[1], t, None if tie else leaves64[2], ids)
    for k in range(steps):
        ref.backward(retain_graph=k < steps - 1)
    with overridden({"fused": {"max_rows": max_rows}}), torch.autocast("cpu", dtype=F16):
        e = x + c[ids] / 4 if tie else x
        assert own_kernel.plan(e, c, t, bias=bias, workspace_mib=16).path == "three-matmul"
        loss = linear_cross_entropy(e, c, t, bias=bias, workspace_mib=16)
    # C's gradient leaves the path's Function as it is (no cast back to fp32 between them)
    assert type(loss.grad_fn.next_functions[1][0]).__name__ == "AccumulateGrad"
    for k in range(steps):
        loss.backward(retain_graph=k < steps - 1)
    tol = tolerance(v, d)
    assert abs(float(loss.detach()) - float(ref.detach())) <= tol * abs(float(ref.detach()))
    for name, p, r in zip(("x", "c", "bias"), leaves, leaves64):
        assert p.grad.dtype == torch.float32, name
        assert rel(p.grad, r.grad) <= tol, (name, rel(p.grad, r.grad), tol)


def test_the_hf_patch_hands_the_kernel_the_fp32_weight():
    """own_kernel.transformers passes lm_head.weight as it is under autocast: the fp32 weight
    reaches the three-matmul path, and the model's gradient is fp32."""
    test_hf = pytest.importorskip("tests.test_hf")
    model = test_hf.tiny_model("llama")
    input_ids, labels = test_hf.batch()
    weights = []
    real = fused.fused_loss_and_grads

    def spy(e, c, *args):
        weights.append((e.dtype, c.dtype))
        return real(e, c, *args)

    own_kernel.transformers.patch(model)
    with pytest.MonkeyPatch.context() as mp, torch.autocast("cpu", dtype=F16), \
            overridden({"fused": {"default_workspace_mib": 16}}):
        mp.setattr(fused, "fused_loss_and_grads", spy)
        model(input_ids=input_ids, labels=labels).loss.backward()
    assert weights == [(F16, torch.float32)]
    assert model.lm_head.weight.grad.dtype == torch.float32


# ---- the GPU measurement's CPU-checkable parts --------------------------------------------------

def test_the_measurement_tool_parses_its_shapes_and_needs_cuda(monkeypatch, capsys):
    from suite import cli
    from suite.kernel import autocast as tool

    assert tool.parse_shapes("a:1:2:3,b:4:5:6:30") == [("a", 1, 2, 3, None), ("b", 4, 5, 6, 30.0)]
    assert [s[1:] for s in tool.parse_shapes(tool.SHAPES)] == [(n, d, v, None)
                                                               for n, v, d in SHAPES]
    for bad in ("a:1:2", "a:1:2:3:0", "a:1:2:3:x", "a:1:2:3:30:4"):
        with pytest.raises(SystemExit, match="--shapes"):
            tool.parse_shapes(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        cli.main(["kernel", "autocast", "--out", "unused"])


@pytest.mark.parametrize("provider", ["own", "own_ws16", "own_ws0"])
def test_the_tools_providers_softcap_their_logits(provider):
    # A shape's softcap reaches every provider's call: the naive loss the tool compiles and the
    # own calls, each against softcap(e @ c.T) in fp64 (fp32 inputs: only fp32 roundings).
    from suite.kernel import autocast as tool

    g = torch.Generator().manual_seed(0)
    e, c = torch.randn(24, 16, generator=g), torch.randn(40, 16, generator=g)
    t = torch.randint(0, 40, (24,), generator=g)
    x = e.double() @ c.double().T
    want = F.cross_entropy(5.0 * torch.tanh(x / 5.0), t)
    assert float(want) != pytest.approx(float(F.cross_entropy(x, t)), rel=1e-2)
    assert float(tool._naive(e, c, t, softcap=5.0)) == pytest.approx(float(want), rel=1e-5)
    fn, override, kwargs = tool.provider_call(provider)
    with overridden(override):
        assert float(fn(e, c, t, softcap=5.0)) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("target, provider, logits", [
    ("hopper", "own_shifted", "shifted"), ("hopper", "own_fp32logits", "fp32"),
    ("hopper", "own_logits16", "input"), ("hopper", "own_target_shifted", "target-shifted"),
    # the portable config's default is target-shifted (no TMA forward: no shifted logits)
    ("portable", "own_fp32logits", "fp32"), ("portable", "own_logits16", "input"),
    ("portable", "own_target_shifted", "target-shifted")])
def test_the_tools_logits_providers_pin_their_kind_on_either_config(target, provider, logits):
    # Each provider's override gives its kind of logits whatever the config's default.
    from own_kernel.policy.config import PORTABLE, with_overrides
    from suite.kernel import autocast as tool

    _, override, _ = tool.provider_call(provider)
    cfg = {"hopper": HOPPER_16BIT, "portable": PORTABLE}[target]
    n, v, d = SHAPES[1]
    plan = route(Call(n, v, d, BF16, fp32_weight=True), with_overrides(cfg, override))
    assert (plan.path, plan.logits) == ("three-matmul", logits)


def test_the_tools_zero_budget_providers_take_their_paths_on_hopper():
    # own_ws0 is the call at 0 MiB, whatever the route picks; own_recompute pins the recompute
    # path. Under autocast both take it (below); with a 16-bit weight at Llama 3 (8B) the route
    # picks the three-matmul path in the recompute path's memory, the pin the recompute path.
    from own_kernel.policy.config import with_overrides
    from suite.kernel import autocast as tool

    n, v, d = SHAPES[1]
    paths = {}
    for provider in ("own_ws0", "own_recompute"):
        _, override, kwargs = tool.provider_call(provider)
        for fp32_weight in (False, True):
            call = Call(n, v, d, BF16, fp32_weight=fp32_weight, **kwargs)
            paths[provider, fp32_weight] = route(call, with_overrides(HOPPER_16BIT, override)).path
    assert paths == {("own_ws0", False): "three-matmul", ("own_ws0", True): "recompute",
                     ("own_recompute", False): "recompute", ("own_recompute", True): "recompute"}


@pytest.mark.parametrize("n, v, d", SHAPES)
def test_a_zero_budget_keeps_an_fp32_weight_on_the_recompute_path(n, v, d):
    # The recompute path's peak is its 16-bit dC beside autograd's fp32 cast of it (autocast's
    # copy freed by then): as much as the three-matmul path's fp32 sums beside the copy, so no
    # chunk fits within it (measured on an H200: 3195 against 3070 MiB at Llama 3 (8B)).
    r = route(Call(n, v, d, BF16, fp32_weight=True, workspace_mib=0), HOPPER_16BIT)
    assert r.path == "recompute"
    de, dc16, dc32 = 2 * n * d, 2 * v * d, 4 * v * d
    assert r.peak_bytes == de + dc16 + dc32  # the cast's moment: above the backward's at these


def test_the_recompute_paths_peak_under_autocast_is_the_larger_of_backward_and_cast():
    # Many rows, a small vocabulary: the fp32 dE accumulator (4 N D) outweighs the copy (2 V D),
    # so the backward's moment is the peak; not the sum of both moments.
    n, v, d = 65536, 32000, 4096
    r = route(Call(n, v, d, BF16, fp32_weight=True, workspace_mib=0), HOPPER_16BIT)
    de, dc16, dc32, acc = 2 * n * d, 2 * v * d, 4 * v * d, 4 * n * d
    assert r.path == "recompute"
    assert de + dc32 + acc < r.peak_bytes < de + dc32 + acc + dc16
