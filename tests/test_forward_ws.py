"""The warp-specialised Gluon forward (own_kernel/kernels/forward_ws.py): which calls the route
gives it (pure, CPU), that it compiles for sm90 with the Triton installed (CPU: Gluon has no
interpreter, so this is the CPU's check of its code), and, on a Hopper GPU
(CCE_TEST_DEVICE=cuda), its losses and lse against fp64 and against the TMA forward, and a
backward on its lse."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import own_kernel  # noqa: E402
from own_kernel import linear_cross_entropy  # noqa: E402
from own_kernel.policy import route as route_mod  # noqa: E402
from own_kernel.policy.config import HOPPER_16BIT, PORTABLE, overridden, with_overrides  # noqa: E402
from own_kernel.policy.route import Call, route  # noqa: E402
from tests.gluon_sm90 import DEV, NEEDS_HOPPER, compiled_for_sm90  # noqa: E402

BF16 = torch.bfloat16
PLAIN = dict(n=8192, v=128256, d=2048, dtype=BF16, needs_grad=False, e_tma_ready=True,
             c_tma_ready=True)


# ---- the route (pure) -----------------------------------------------------------------------

@pytest.mark.parametrize("needs_grad", [False, True])
def test_plain_logits_on_hopper_take_the_ws_forward(needs_grad):
    recompute = with_overrides(HOPPER_16BIT, {"fused": {"zero_budget": "recompute"}})
    r = route(Call(**{**PLAIN, "needs_grad": needs_grad, "workspace_mib": 0}), recompute)
    assert r.forward == "ws" and r.path == ("recompute" if needs_grad else "forward-only")


@pytest.mark.parametrize("change", [dict(softcap=True), dict(temperature=True)])
def test_a_softcap_or_temperature_takes_the_ws_forward_where_the_config_asks(change):
    scaled = with_overrides(HOPPER_16BIT, {"forward": {"ws_scaled_logits": True}})
    assert route(Call(**{**PLAIN, **change}), scaled).forward == "ws"
    assert route(Call(**{**PLAIN, **change}), HOPPER_16BIT).forward == "tma"


@pytest.mark.parametrize("change", [
    dict(has_bias=True), dict(entropy=True), dict(vocab_parallel=True),
    dict(batch_invariant=True), dict(on_cuda=False),
])
def test_what_forward_ws_does_not_compute_keeps_the_tma_forward(change):
    assert route(Call(**{**PLAIN, **change}), HOPPER_16BIT).forward == "tma"


def test_the_config_and_tiles_decide_and_unaligned_inputs_take_the_pointer_forward():
    off = with_overrides(HOPPER_16BIT, {"forward": {"ws": False}})
    narrow = with_overrides(HOPPER_16BIT, {"forward": {"tiles": dataclasses.replace(
        HOPPER_16BIT.forward.tiles, block_v=64)}})
    assert route(Call(**PLAIN), off).forward == "tma"
    assert route(Call(**PLAIN), narrow).forward == "tma"   # splits of 64 columns
    assert route(Call(**PLAIN), PORTABLE).forward in ("tma", "pointer")
    assert route(Call(**{**PLAIN, "e_tma_ready": False}), HOPPER_16BIT).forward == "pointer"


def test_above_ws_max_d_the_tma_forward_runs():
    # At the power cap forward_tma.py was faster from D 3584 (results/notes/gluon-forward.md).
    limit = HOPPER_16BIT.forward.ws_max_d
    assert limit > 0
    assert route(Call(**{**PLAIN, "d": limit}), HOPPER_16BIT).forward == "ws"
    assert route(Call(**{**PLAIN, "d": limit + 8}), HOPPER_16BIT).forward == "tma"
    anyd = with_overrides(HOPPER_16BIT, {"forward": {"ws_max_d": 0}})
    assert route(Call(**{**PLAIN, "d": 8192}), anyd).forward == "ws"
    with pytest.raises(ValueError, match="forward.ws_max_d"):
        with_overrides(HOPPER_16BIT, {"forward": {"ws_max_d": -1}})


def test_without_gluon_the_tma_forward_runs(monkeypatch):
    monkeypatch.setattr(route_mod, "gluon_hopper", lambda: False)
    assert route(Call(**PLAIN), HOPPER_16BIT).forward == "tma"


def test_the_three_matmul_path_keeps_its_own_forward():
    r = route(Call(**{**PLAIN, "needs_grad": True}), HOPPER_16BIT)
    assert r.path == "three-matmul" and r.forward in ("tma", "cublas")


# ---- the kernel compiles for sm90 (CPU) -------------------------------------------------------

_COMPILE = """
import json, sys
from triton import compile as triton_compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from own_kernel.kernels import forward_ws as ws

fn = ws.cce_fwd_ws_kernel
const = dict(HAS_SOFTCAP=sys.argv[1] == "1", STAGES_=ws.STAGES, CONSUMER_REGS_=ws.CONSUMER_REGS,
             PRODUCER_REGS_=ws.PRODUCER_REGS)

def desc(rows):
    layout = gl.NVMMASharedLayout.get_default_for([rows, ws.BLOCK_K], gl.bfloat16)
    return f"tensordesc<bf16[{rows}, {ws.BLOCK_K}],{layout!r}>"

sig = {"e_desc": desc(ws.BLOCK_N), "c_desc": desc(ws.BLOCK_V), "part": "*fp32",
       "tanh_scale": "fp32", "cap": "fp32"}
sig.update({a: "constexpr" if a in const else "i32" for a in fn.arg_names if a not in sig})
k = triton_compile(GluonASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=4, maxnreg=ws.MAXNREG))
print(json.dumps({"ptx": k.asm["ptx"], "consumer_regs": ws.CONSUMER_REGS,
                  "producer_regs": ws.PRODUCER_REGS}))
"""


@pytest.mark.skipif(not route_mod.gluon_hopper(), reason="this Triton has no Gluon Hopper API")
@pytest.mark.parametrize("softcap", ["0", "1"])
def test_compiles_for_sm90(softcap):
    """Compiled to sm90 PTX (the bundled ptxas too) in a process without the interpreter,
    which would turn the Gluon functions into interpreted ones."""
    got = compiled_for_sm90(_COMPILE, softcap)
    ptx = got["ptx"]
    # two consumers' 128 x 128 tiles: four 16-deep MMAs per 64-wide k-slice, in two m64 halves
    assert ptx.count("wgmma.mma_async") == 16
    # each consumer's 128 logits a thread take one exp2 (the sum) or two (the softcap's tanh)
    assert ptx.count("ex2.approx") >= 2 * 128 * (2 if softcap == "1" else 1)
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{got['consumer_regs']}" in ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{got['producer_regs']}" in ptx


# ---- the kernel on a Hopper GPU ---------------------------------------------------------------

def _inputs(n, d, v, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    e = torch.randn(n, d, device=DEV, generator=g).to(dtype)
    c = (torch.randn(v, d, device=DEV, generator=g) * (2.0 / d**0.5)).to(dtype)
    t = torch.randint(0, v, (n,), device=DEV, generator=g)
    t[1::7] = -100   # from row 1: a one-row call keeps its target
    return e, c, t


def _fp64(e, c, t, label_smoothing, softcap=None, temperature=1.0):
    z = e.double() @ c.double().T
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    loss = F.cross_entropy(z, t, ignore_index=-100, reduction="none",
                           label_smoothing=label_smoothing)
    return loss, torch.logsumexp(z, dim=1)


@NEEDS_HOPPER
@pytest.mark.parametrize("n, d, v", [(1000, 520, 8000), (4096, 2048, 32768), (300, 64, 129),
                                     (1, 128, 1000)])   # n 1: a constexpr to Triton
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_losses_and_lse_match_fp64_as_the_tma_forward_does(n, d, v, dtype, label_smoothing):
    e, c, t = _inputs(n, d, v, dtype)
    ref_loss, ref_lse = _fp64(e, c, t, label_smoothing)
    kw = dict(reduction="none", return_lse=True, label_smoothing=label_smoothing)
    got = {}
    for ws in (True, False):
        with overridden({"forward": {"ws": ws}}), torch.no_grad():
            assert own_kernel.plan(e, c, t, **kw).forward == ("ws" if ws else "tma")
            got[ws] = linear_cross_entropy(e, c, t, **kw)
    # fp32 sums over D products and V exponentials: their rounding, at the rows' magnitude
    scale = ref_lse.abs().max().item()
    tol = 2.0**-24 * (d**0.5 + v**0.5) * 8 * scale
    used = t != -100
    for ws in (True, False):
        loss, lse = got[ws]
        assert (loss[~used] == 0).all()
        torch.testing.assert_close(lse[used].double(), ref_lse[used], rtol=0, atol=tol)
        torch.testing.assert_close(loss.double(), ref_loss, rtol=0, atol=tol)
    torch.testing.assert_close(got[True][1][used], got[False][1][used], rtol=0, atol=tol)


@NEEDS_HOPPER
@pytest.mark.parametrize("softcap, temperature", [(30.0, 1.0), (None, 0.7), (20.0, 1.5)])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_a_softcap_and_temperature_match_fp64_as_the_tma_forward_does(softcap, temperature,
                                                                       label_smoothing):
    n, d, v = 1000, 520, 8000
    e, c, t = _inputs(n, d, v, BF16)
    e = e * 4   # logits of tens: the softcap bends them
    ref_loss, ref_lse = _fp64(e, c, t, label_smoothing, softcap, temperature)
    kw = dict(reduction="none", return_lse=True, label_smoothing=label_smoothing,
              softcap=softcap, temperature=temperature)
    got = {}
    for ws in (True, False):
        with overridden({"forward": {"ws": ws, "ws_scaled_logits": True}}), torch.no_grad():
            assert own_kernel.plan(e, c, t, **kw).forward == ("ws" if ws else "tma")
            got[ws] = linear_cross_entropy(e, c, t, **kw)
    # as above, and tanh's exp2 form: a few ulps of 1 in tanh, times softcap / T per logit
    scale = ref_lse.abs().max().item()
    tol = 2.0**-24 * (d**0.5 + v**0.5) * 8 * scale + 2.0**-20 * (softcap or 0) / temperature
    used = t != -100
    for ws in (True, False):
        loss, lse = got[ws]
        torch.testing.assert_close(lse[used].double(), ref_lse[used], rtol=0, atol=tol)
        torch.testing.assert_close(loss.double(), ref_loss, rtol=0, atol=tol)


@NEEDS_HOPPER
def test_a_recompute_backward_on_its_lse_matches_the_tma_forwards():
    e, c, t = _inputs(2048, 1024, 50000, BF16)
    grads = {}
    for ws in (True, False):
        with overridden({"forward": {"ws": ws}, "fused": {"zero_budget": "recompute"}}):
            ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
            r = own_kernel.plan(ee, cc, t, workspace_mib=0)
            assert (r.path, r.forward) == ("recompute", "ws" if ws else "tma")
            linear_cross_entropy(ee, cc, t, workspace_mib=0).backward()
            grads[ws] = (ee.grad, cc.grad)
    for a, b in zip(grads[True], grads[False]):   # lse apart by fp32 rounding only
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 2.0**-8
