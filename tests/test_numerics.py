"""Accuracy that does not depend on the logits' magnitude or on the route a call takes.

Each path's loss and gradients are compared with an fp64 reference computed from the same
(rounded) inputs, and the tolerance is the same-dtype naive computation's error (torch's
cross-entropy on materialised logits) or the recompute path's, times a small factor, plus a
few units of the dtype's rounding: never a constant that merely passed once.
"""
import os

import pytest
import torch
import torch.nn.functional as F

import own_kernel
from own_kernel import linear_cross_entropy
from own_kernel.policy.config import INTERPRETER, overridden, with_overrides
from own_kernel.policy.plan import fused_plan
from tests.test_fused import TARGET_SHIFT  # Hopper's config would take shifted logits first

DEVICE = os.environ.get("CCE_TEST_DEVICE", "cpu")
ON_GPU = DEVICE == "cuda" and torch.cuda.is_available()
EPS32 = torch.finfo(torch.float32).eps

# Every route of a mean with gradients: recompute (budget 0), low memory, the three-matmul path
# in several chunks (a budget, at most 8 rows a chunk; the config's logits, then target-shifted
# 16-bit ones), the filter (on a GPU too: its size thresholds off, and the recompute route's
# filter, as the interpreter's config has it).
CHUNKS = {"max_rows": 8, "min_rows": 1, "min_chunk_flops": 0}
PATHS = {
    # a 0 MiB budget takes the three-matmul path on Hopper where its chunks fit (16-bit calls)
    "recompute": ({"workspace_mib": 0}, {"fused": {"zero_budget": "recompute"}}),
    "low_memory": ({"low_memory": True}, {}),
    # the device's own logits, target-shifted ones aside (the portable default: the next path)
    "three_matmul": ({"workspace_mib": 1}, {"fused": {**CHUNKS, "target_shift": False}}),
    "target_shifted": ({"workspace_mib": 1}, {"fused": {**CHUNKS, **TARGET_SHIFT}}),
    "filtered": ({"filter_eps": "auto", "workspace_mib": 0},
                 {"filter": {"min_flops": 0, "min_total_flops": 0},
                  "fused": {"zero_budget": "recompute"}}),
}


def _errors(loss, grads, ref):
    """(loss error relative to the reference loss, then per gradient the larger of its norm-wise
    relative error and its largest entry's error relative to the largest reference entry)."""
    ref_loss, ref_grads = ref
    out = [abs(float(loss.detach()) - ref_loss) / abs(ref_loss)]
    for g, r in zip(grads, ref_grads):
        diff = g.double() - r
        out.append(max((diff.norm() / r.norm()).item(), (diff.abs().max() / r.abs().max()).item()))
    return out


def _reference(e, c, t, bias):
    leaves = [x.double().requires_grad_() for x in (e, c) + ((bias,) if bias is not None else ())]
    logits = leaves[0] @ leaves[1].T + (leaves[2] if bias is not None else 0)
    loss = F.cross_entropy(logits, t)
    loss.backward()
    return loss.item(), [x.grad for x in leaves]


def _naive(e, c, t, bias):
    """torch in the inputs' dtype: logits materialised (in that dtype), fp32 softmax."""
    leaves = [x.clone().requires_grad_() for x in (e, c) + ((bias,) if bias is not None else ())]
    logits = leaves[0] @ leaves[1].T + (leaves[2] if bias is not None else 0)
    loss = F.cross_entropy(logits.float(), t)
    loss.backward()
    return _errors(loss, [x.grad for x in leaves], _reference(e, c, t, bias))


def _ours(e, c, t, bias, path):
    kwargs, config = PATHS[path]
    leaves = [x.clone().requires_grad_() for x in (e, c) + ((bias,) if bias is not None else ())]
    with overridden(config):
        if path == "target_shifted":  # taken, not fallen back from
            assert own_kernel.plan(*leaves[:2], t, **kwargs).logits == "target-shifted"
        loss = linear_cross_entropy(leaves[0], leaves[1], t,
                                    bias=leaves[2] if bias is not None else None, **kwargs)
        loss.backward()
    return _errors(loss, [x.grad for x in leaves], _reference(e, c, t, bias))


# ---- logits of magnitude 1e3 (fp32) -----------------------------------------------------------

def _large_logits(seed, with_bias, n=16, d=64, v=96):
    """fp32 inputs whose logits lie near +-1e3 and are exact in fp32 whatever the order of the
    sums (multiples of 1/64 below 2^11: 17 bits), so the fp64 reference and every fp32
    computation see the same logits and what differs is the softmax's rounding alone. A bias
    of ~1e3, or a hidden component shared by every row of E and C (no bias)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-4, 5, (n, d), generator=g).float() / 8
    c = torch.randint(-4, 5, (v, d), generator=g).float() / 8
    t = torch.randint(0, v, (n,), generator=g)
    bias = None
    if with_bias:
        bias = (1000.0 + torch.randint(-256, 257, (v,), generator=g).float() / 64).to(DEVICE)
    else:
        e[:, 0], c[:, 0] = 31.0, 32.0  # every logit 992 + the rest's sum (|rest| <= 16)
    return e.to(DEVICE), c.to(DEVICE), t.to(DEVICE), bias


@pytest.mark.parametrize("path", sorted(set(PATHS) - {"target_shifted"}))  # 16-bit only
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "shared_component"])
def test_fp32_gradients_at_logits_of_magnitude_1e3(path, with_bias):
    # The lse rounded at 1e3 (one ulp: 6e-5) would put ~1e-4 into every probability; the
    # kernels keep the row max apart and subtract it first, as naive softmax does.
    e, c, t, bias = _large_logits(0, with_bias)
    naive = _naive(e, c, t, bias)
    ours = _ours(e, c, t, bias, path)
    names = ["loss", "dE", "dC", "dbias"]
    for name, err, base in zip(names, ours, naive):
        assert err <= 3 * base + 4 * EPS32, (path, name, err, base)


def test_the_returned_lse_is_the_lse_at_magnitude_1e3():
    e, c, t, bias = _large_logits(1, True)
    _, lse = linear_cross_entropy(e, c, t, bias=bias, reduction="none", return_lse=True)
    ref = torch.logsumexp(e.double() @ c.double().T + bias.double(), dim=1)
    assert ref.abs().min() > 500
    # rounded once to fp32: within half an ulp of the fp64 value, plus the sums' rounding
    assert ((lse.double() - ref).abs() <= ref.abs() * EPS32).all()


# ---- confident rows: the route does not set the accuracy (16-bit) -----------------------------

def _confident_rows(dtype, device, seed=0, n=32, d=64, v=128):
    """Peaked softmax (the target's probability ~0.9 on average, as late in training): the
    target's row of C leans towards the token's hidden state. Logits of magnitude ~1e2, so a
    16-bit rounding of a logit (~0.2 for fp16, ~0.4 for bf16 at |z| 100) is far above what
    the gradient's small entries can absorb."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g)
    c = 0.5 * torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    c.index_add_(0, t, 1.2 * e)
    return e.to(dtype).to(device), c.to(dtype).to(device), t.to(device)


def _shared_component(dtype, device):
    """Every row of E and C shares a large component (as trained models' hidden states do):
    dE's true terms along it cancel, and any rounding residue of the gradient does not."""
    e, c, t, _ = _large_logits(2, False)
    return e.to(dtype).to(device), c.to(dtype).to(device), t.to(device)


INPUTS = {"confident": _confident_rows, "shared_component": _shared_component}


def _route_accuracy(dtype, device, inputs="confident"):
    e, c, t = INPUTS[inputs](dtype, device)
    naive = _naive(e, c, t, None)
    per_path = {path: _ours(e, c, t, None, path) for path in PATHS}
    return naive, per_path


def _assert_routes_agree(naive, per_path, dtype):
    recompute = per_path["recompute"]
    # The inputs are in the regime where the route matters: the recompute path beats naive
    # 16-bit (whose logits are rounded to 16 bits) on the gradients.
    assert recompute[1] < naive[1] / 3, (recompute, naive)
    for path, errs in per_path.items():
        # loss: within a few fp32 roundings of the recompute path's, but target-shifted logits'
        # (from 16-bit values relative to the target's: within one rounding of the dtype's, where
        # naive 16-bit's is far above it); gradients: twice the recompute path's error
        loss_tol = (torch.finfo(dtype).eps if path == "target_shifted"
                    else 2 * recompute[0] + 4 * EPS32)
        assert errs[0] <= loss_tol, (path, "loss", errs[0], recompute[0])
        for name, err, base in zip(("dE", "dC"), errs[1:], recompute[1:]):
            assert err <= 2 * base, (path, name, err, base, dtype)


@pytest.mark.parametrize("inputs", sorted(INPUTS))
def test_fp16_same_accuracy_on_every_route(inputs):
    # The three-matmul path used to round the chunk's logits to 16 bits before the softmax
    # (naive 16-bit accuracy), and to leave out the rounding residue of its 16-bit gradient
    # that the recompute path adds back through C's mean row (dE along a shared component).
    naive, per_path = _route_accuracy(torch.float16, DEVICE, inputs)
    _assert_routes_agree(naive, per_path, torch.float16)


@pytest.mark.skipif(not ON_GPU, reason="bf16 needs CUDA (the Triton interpreter's bf16 arithmetic "
                    "is wrong; run with CCE_TEST_DEVICE=cuda on a GPU)")
@pytest.mark.parametrize("inputs", sorted(INPUTS))
def test_bf16_same_accuracy_on_every_route(inputs):
    naive, per_path = _route_accuracy(torch.bfloat16, "cuda", inputs)
    _assert_routes_agree(naive, per_path, torch.bfloat16)


# ---- the plan pays for fp32 logits --------------------------------------------------------------

@pytest.mark.parametrize("logits_fp32", [True, False])
def test_fp32_logits_cost_four_bytes_a_logit_in_the_plan(logits_fp32):
    cfg = with_overrides(INTERPRETER, {"fused": {"logits_fp32": logits_fp32}})
    v = 101  # rows padded to 16 bytes: 104 fp32 logits, 104 fp16 ones
    plan, _ = fused_plan(64, v, 16, 2, 2**30, cfg)
    elt = 4 if logits_fp32 else 2
    assert plan.logits_fp32 == logits_fp32
    assert (plan.row_stride * elt) % 16 == 0 and plan.row_stride >= v
    # one chunk of every row; V mod 8 != 0, so fp32 dE rows too (16 floats each)
    assert plan.extra_bytes == 64 * (plan.row_stride * elt + 16 * 4)
    # fp32 inputs' logits are fp32 either way
    plan32, _ = fused_plan(64, v, 16, 4, 2**30, cfg)
    assert not plan32.logits_fp32 and plan32.extra_bytes == 64 * 104 * 4


# ---- the GPU accuracy tool's CPU-checkable parts -------------------------------------------

def test_accuracy_tools_reference_is_the_fp64_gradient():
    from suite.kernel.accuracy import make_inputs, reference
    e, c, t = make_inputs("confident", 12, 16, 40, torch.float32, device="cpu")
    loss, de, dc = reference(e, c, t, rows=5)  # chunks of rows, a short last one
    ref_loss, (ref_de, ref_dc) = _reference(e, c, t, None)
    # fp64 roundings of the exponents (|z| eps each, V of them per row) on the terms before
    # they cancel (p and the one-hot), carried through the products with |C| and |E|
    z = e.double() @ c.double().T
    tol = 40 * torch.finfo(torch.float64).eps * z.abs().max()
    terms = (torch.softmax(z, dim=1) + F.one_hot(t, z.shape[1])) / z.shape[0]
    assert abs(loss - ref_loss) <= tol
    assert ((de - ref_de).abs() <= tol * terms @ c.double().abs()).all()
    assert ((dc - ref_dc).abs() <= tol * terms.T @ e.double().abs()).all()


@pytest.mark.parametrize("target", ["hopper", "portable"])
def test_accuracy_tools_three_matmul_routes_pin_their_logits_on_either_config(target):
    # Each route's override gives its kind of logits whatever the config's default (the
    # portable config's is target-shifted; shifted logits need the TMA forward, Hopper's).
    from own_kernel.policy.config import HOPPER_16BIT, PORTABLE
    from own_kernel.policy.route import Call, route
    from suite.kernel.accuracy import ROUTES

    cfg = {"hopper": HOPPER_16BIT, "portable": PORTABLE}[target]
    want = {"three_matmul": "fp32", "three_matmul_logits16": "input",
            "three_matmul_target_shifted": "target-shifted"}
    if target == "hopper":
        want["three_matmul_shifted"] = "shifted"
    for name, logits in want.items():
        kwargs, overrides = ROUTES[name]
        call = Call(n=4096, v=32000, d=2048, dtype=torch.bfloat16, **kwargs)
        assert route(call, with_overrides(cfg, overrides)).logits == logits, name


def test_accuracy_tools_large_logits_are_exact_in_fp32():
    from suite.kernel.accuracy import make_inputs
    e, c, _ = make_inputs("magnitude", 8, 256, 24, torch.float32, device="cpu")
    z32, z64 = e @ c.T, e.double() @ c.double().T
    assert z64.abs().min() > 500 and torch.equal(z32.double(), z64)


@pytest.mark.skipif(not ON_GPU, reason="the CUDA allocator's peak (run with CCE_TEST_DEVICE=cuda "
                                        "on a GPU)")
def test_the_rounding_corrections_mean_row_copies_nothing_of_the_rows():
    # sampled_mean sums ~4096 rows of C in fp32: as one GEMV, not through an fp32 copy of the
    # rows (4 bytes a sampled element, on top of the three-matmul path's peak).
    from own_kernel.kernels.gemm import MEAN_SAMPLE_ROWS, sampled_mean

    c = torch.randn(128256, 4096, device="cuda", dtype=torch.bfloat16)
    sampled_mean(c[:8192])  # cuBLAS's workspace, allocated at a process's first GEMM
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    mean = sampled_mean(c)
    torch.cuda.synchronize()
    rows_fp32 = MEAN_SAMPLE_ROWS * 4096 * 4
    assert torch.cuda.max_memory_allocated() - before < rows_fp32 // 8
    step = 128256 // MEAN_SAMPLE_ROWS
    ref = c[::step].double().mean(0)
    assert (mean.double() - ref).abs().max() <= 4096 * torch.finfo(torch.float32).eps
