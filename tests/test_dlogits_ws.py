"""The warp-specialised Gluon W writer (own_kernel/kernels/dlogits_ws.py): which calls the route
gives it (pure, CPU), that it compiles for sm90 with the Triton installed (CPU: Gluon has no
interpreter), and, on a Hopper GPU (CCE_TEST_DEVICE=cuda), the gradients it gives on the
recompute and low-memory paths against fp64 and against the TMA writer's."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import own_kernel  # noqa: E402
from own_kernel import linear_cross_entropy  # noqa: E402
from own_kernel.policy import route as route_mod  # noqa: E402
from own_kernel.policy.config import (HOPPER_16BIT, PORTABLE, overridden,  # noqa: E402
                                      with_overrides)
from own_kernel.policy.options import Options, auto_filter  # noqa: E402
from own_kernel.policy.route import Call, route  # noqa: E402
from tests.gluon_sm90 import (DEV, NEEDS_HOPPER, compiled_for_sm90,  # noqa: E402
                               global_atomic_orders)

BF16 = torch.bfloat16
PLAIN = dict(n=8192, v=262144, d=1152, dtype=BF16, workspace_mib=0, e_tma_ready=True,
             c_tma_ready=True)
RECOMPUTE = with_overrides(HOPPER_16BIT, {"fused": {"zero_budget": "recompute"}})


# ---- the route (pure) -----------------------------------------------------------------------

@pytest.mark.parametrize("low_memory", [False, True])
def test_plain_logits_on_hopper_take_the_ws_writer(low_memory):
    r = route(Call(**{**PLAIN, "low_memory": low_memory}), RECOMPUTE)
    assert r.path == ("low-memory" if low_memory else "recompute")
    assert (r.writer, r.tail_writer, r.w_by_tma, r.col_round_summed) == ("ws", "ws", True, False)


@pytest.mark.parametrize("change", [
    dict(has_bias=True), dict(softcap=True), dict(temperature=True), dict(entropy=True),
    dict(filter=auto_filter(BF16)), dict(deterministic=True), dict(on_cuda=False),
])
def test_what_dlogits_ws_does_not_compute_keeps_the_tma_writer(change):
    r = route(Call(**{**PLAIN, **change}), RECOMPUTE)
    assert r.path == "recompute" and r.writer == "tma" and r.w_by_tma


def test_batch_invariant_calls_keep_their_pinned_writer():
    assert route(Call(**{**PLAIN, "batch_invariant": True}), RECOMPUTE).writer == "tma"


def test_the_config_decides_and_without_gluon_the_tma_writer_runs(monkeypatch):
    off = with_overrides(RECOMPUTE, {"recompute": {"ws": False}})
    assert route(Call(**PLAIN), off).writer == "tma"
    assert route(Call(**PLAIN), PORTABLE).writer != "ws"
    monkeypatch.setattr(route_mod, "gluon_hopper", lambda: False)
    assert route(Call(**PLAIN), RECOMPUTE).writer == "tma"


def test_ws_without_turning_column_rounding_off_is_refused():
    with pytest.raises(ValueError, match="recompute.ws"):
        with_overrides(HOPPER_16BIT, {"recompute": {"col_round": True}})


def test_the_deterministic_option_reaches_the_route():
    """Deterministic calls sum per tile in a fixed order, which the ws writer's atomics do
    not: the route must see the option."""
    e, c = torch.zeros(4, 8), torch.zeros(16, 8)
    for det in (False, True):
        assert route_mod.call_of(e, c, None, Options(deterministic=det)).deterministic is det


# ---- the kernel compiles for sm90 (CPU) -------------------------------------------------------

_COMPILE = """
import json
from triton import compile as triton_compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from own_kernel.kernels import dlogits_ws as ws

fn = ws.cce_dlogits_ws_kernel
const = dict(STAGES_=ws.STAGES, CONSUMER_REGS_=ws.CONSUMER_REGS, PRODUCER_REGS_=ws.PRODUCER_REGS)

def desc(rows, cols):
    layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)
    return f"tensordesc<bf16[{rows}, {cols}],{layout!r}>"

sig = {"e_desc": desc(ws.BLOCK_N, ws.BLOCK_K), "c_desc": desc(ws.BLOCK_V, ws.BLOCK_K),
       "w_desc": desc(ws.BLOCK_N, ws.BLOCK_V), "targets": "*i64", "smooth": "fp32"}
sig.update({a: "*fp32" for a in ("lse", "lse_lo", "nll", "weight", "weight_p", "row_round")})
sig.update({a: "constexpr" if a in const else "i32" for a in fn.arg_names if a not in sig})
k = triton_compile(GluonASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=4, maxnreg=ws.MAXNREG))
print(json.dumps({"ptx": k.asm["ptx"], "consumer_regs": ws.CONSUMER_REGS,
                  "producer_regs": ws.PRODUCER_REGS}))
"""


@pytest.mark.skipif(not route_mod.gluon_hopper(), reason="this Triton has no Gluon Hopper API")
def test_compiles_for_sm90():
    """Compiled to sm90 PTX in a process without the interpreter, which would turn the Gluon
    functions into interpreted ones."""
    got = compiled_for_sm90(_COMPILE)
    ptx = got["ptx"]
    # two consumers' 128 x 128 tiles: four 16-deep MMAs per 64-wide k-slice, in two m64 halves
    assert ptx.count("wgmma.mma_async") == 16
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared") == 2   # each consumer's W store
    # RowRound's adds are relaxed: an acq_rel atomic waits for its old value every tile
    orders = global_atomic_orders(ptx)
    assert orders and set(orders) == {"relaxed"}
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{got['consumer_regs']}" in ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{got['producer_regs']}" in ptx


# ---- the kernel on a Hopper GPU ---------------------------------------------------------------

def _inputs(n, d, v, dtype, seed=0, margin=0.0):
    """Logits of about unit spread; with margin, the even rows' target logit raised by it (a
    margin of 20 at V 5e4: p_t - 1 about -2e-4, the confident rows whose whole gradient is
    that small difference)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    c = torch.randn(v, d, device=DEV, generator=g) / d**0.25
    t = torch.randint(0, v, (n,), device=DEV, generator=g)
    e = torch.randn(n, d, device=DEV, generator=g) / d**0.25
    ct = c[t[::2]]
    e[::2] += margin * ct / (ct * ct).sum(dim=1, keepdim=True)
    t[::7] = -100
    return e.to(dtype), c.to(dtype), t


def _fp64_grads(e, c, t, label_smoothing, z_loss):
    ee, cc = e.double().requires_grad_(), c.double().requires_grad_()
    z = ee @ cc.T
    loss = F.cross_entropy(z, t, ignore_index=-100, label_smoothing=label_smoothing)
    if z_loss:
        used = t != -100
        loss = loss + z_loss * (torch.logsumexp(z, dim=1)[used] ** 2).mean()
    loss.backward()
    return ee.grad, cc.grad


def _own_grads(e, c, t, ws, **kw):
    z_loss = kw.pop("z_loss")
    with overridden({"recompute": {"ws": ws}, "fused": {"zero_budget": "recompute"}}):
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        r = own_kernel.plan(ee, cc, t, workspace_mib=0, return_lse=bool(z_loss), **kw)
        assert r.writer == ("ws" if ws else "tma")
        out = linear_cross_entropy(ee, cc, t, workspace_mib=0, return_lse=bool(z_loss), **kw)
        if z_loss:
            loss, lse = out
            used = t != -100
            (loss + z_loss * (lse[used] ** 2).mean()).backward()
        else:
            out.backward()
    return ee.grad, cc.grad


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@NEEDS_HOPPER
@pytest.mark.parametrize("n, d, v", [(1000, 520, 8000), (4096, 2048, 32768), (300, 64, 129)])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("label_smoothing, z_loss, low_memory",
                         [(0.0, 0.0, False), (0.1, 1e-3, False), (0.0, 0.0, True)])
def test_gradients_match_fp64_as_the_tma_writers_do(n, d, v, dtype, label_smoothing, z_loss,
                                                     low_memory):
    e, c, t = _inputs(n, d, v, dtype)
    ref = _fp64_grads(e, c, t, label_smoothing, z_loss)
    kw = dict(label_smoothing=label_smoothing, z_loss=z_loss, low_memory=low_memory)
    got = {ws: _own_grads(e, c, t, ws, **dict(kw)) for ws in (True, False)}
    # W rounded to the input dtype dominates both (one ulp, relative); the fp32 sums over D and
    # V add ~2^-24 sqrt(D + V). The two writers round the same d, apart by the logits' fp32
    # accumulation order.
    ulp = torch.finfo(dtype).eps
    for i, name in enumerate(("dE", "dC")):
        err_ws, err_tma = _rel(got[True][i], ref[i]), _rel(got[False][i], ref[i])
        assert err_ws <= 1.1 * err_tma + 2.0**-24 * (d + v)**0.5, (name, err_ws, err_tma)
        assert _rel(got[True][i], got[False][i].double()) < ulp, name


@NEEDS_HOPPER
def test_confident_rows_keep_their_gradient():
    """Rows with p_t near 1, whose whole gradient is p_t - 1 (from the forward's nll) against
    the rest: each row's dE as close to fp64 as the TMA writer's (whose own bound against
    torch.compile's is the frontier's: results/notes/accuracy-by-route.md)."""
    e, c, t = _inputs(2048, 1024, 50000, BF16, margin=20.0)
    de_ref, _ = _fp64_grads(e, c, t, 0.0, 0.0)
    rows = slice(0, None, 2)
    used = (t[rows] != -100) & (de_ref[rows].norm(dim=1) > 0)
    worst = {}
    for ws in (True, False):
        de, _ = _own_grads(e, c, t, ws, z_loss=0.0)
        err = (de[rows].double() - de_ref[rows]).norm(dim=1) / de_ref[rows].norm(dim=1)
        worst[ws] = float(err[used].max())
    assert worst[True] <= 1.1 * worst[False] + 2.0**-20, worst
