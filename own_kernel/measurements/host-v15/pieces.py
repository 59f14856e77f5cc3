# Host time to queue pieces of one loss+grad call (GPU idle before each; medians of 50).
import statistics, sys, time, torch
from own_kernel import linear_cross_entropy
from own_kernel import api
from own_kernel.backward import backward as bwd
from own_kernel.forward import forward as fwd
from own_kernel.configs import config_for
from suite.inputs import make_inputs

def med(fn, reps=50):
    for _ in range(5): fn()
    q, w = [], []
    for _ in range(reps):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        q.append((t1 - t0) * 1e3); w.append((t2 - t0) * 1e3)
    return statistics.median(q), statistics.median(w)

for n, d, v, filt in [(2048, 2304, 20000, None), (2048, 2304, 32000, "auto"), (8192, 2304, 32000, "auto")]:
    inp = make_inputs("lm", n, d, v, "bf16", seed=0, device="cuda", softcap=30.0)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    e.requires_grad_(), c.requires_grad_()
    cfg = config_for(e.device, e.dtype)
    def full():
        e.grad = c.grad = None
        linear_cross_entropy(e, c, t, filter_eps=filt).backward()
    def fwd_only():
        with torch.no_grad(): linear_cross_entropy(e, c, t, filter_eps=filt)
    def fwd_direct():
        fwd(e.detach(), c.detach(), None, t, None, 0.0, -100, cfg)
    loss_rows, lse, pmax = fwd(e.detach(), c.detach(), None, t, None, 0.0, -100, cfg)
    rw = torch.full((n,), 1.0 / n, device="cuda")
    eps = api.AUTO_EPS[e.dtype] if filt else None
    def bwd_direct():
        bwd(e.detach(), c.detach(), None, t, lse, pmax, rw, None, None, 0.0, eps, api.AUTO_FLAT_P_MAX if filt else 0.0)
    def bwd_op():
        api.lce_rows_backward(e.detach(), c.detach(), t, None, lse, pmax, rw, None, -100, 0.0, 0.0,
                              eps if eps else -1.0, api.AUTO_FLAT_P_MAX if filt else 0.0)
    def nothing_op():
        torch.ops.own_kernel.lce_rows_backward  # attribute only
    print(f"N={n} D={d} V={v} filter={filt}: host / wall ms")
    for name, fn in [("loss+grad", full), ("forward (public, no grad)", fwd_only), ("forward direct", fwd_direct),
                     ("backward direct", bwd_direct), ("backward custom op", bwd_op)]:
        qh, wl = med(fn)
        print(f"  {name:28s} {qh:7.3f} {wl:7.3f}")
