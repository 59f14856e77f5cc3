# Where the host's time of a loss+grad call goes, beyond the two direct passes.
import statistics, time, torch
from own_kernel import linear_cross_entropy, api
from own_kernel.backward import backward as bwd, HostScalar
from own_kernel.forward import forward as fwd
from own_kernel.configs import config_for
from suite.inputs import make_inputs

def med(fn, reps=50, pre=None):
    for _ in range(5):
        fn(pre()) if pre else fn()
    q = []
    for _ in range(reps):
        state = pre() if pre else None
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(state) if pre else fn(); t1 = time.perf_counter()
        torch.cuda.synchronize()
        q.append((t1 - t0) * 1e3)
    return statistics.median(q)

class Rows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, c, t, cfg):
        loss, lse, pmax = fwd(e, c, None, t, None, 0.0, -100, cfg)
        ctx.save_for_backward(e, c, t, lse, pmax)
        ctx.mark_non_differentiable(pmax)
        return loss, lse, pmax
    @staticmethod
    def backward(ctx, gl, glse, gp):
        e, c, t, lse, pmax = ctx.saved_tensors
        rw = torch.where(t != -100, gl.float(), 0.0)
        de, dc, _ = bwd(e, c, None, t, lse, pmax, rw, None, None, 0.0, None, 0.0)
        return de, dc, None, None

n, d, v = 2048, 2304, 20000
inp = make_inputs("lm", n, d, v, "bf16", seed=0, device="cuda", softcap=30.0)
e, c, t = inp["e"], inp["c"], inp["targets"]
e.requires_grad_(), c.requires_grad_()
cfg = config_for(e.device, e.dtype)
def full():
    e.grad = c.grad = None
    linear_cross_entropy(e, c, t).backward()
def fwd_grad():
    e.grad = c.grad = None
    return linear_cross_entropy(e, c, t)
def backward_of(loss):
    loss.backward()
def fn_full():
    e.grad = c.grad = None
    loss, lse, _ = Rows.apply(e, c, t, cfg)
    (loss.sum() / n).backward()
def fn_fwd():
    e.grad = c.grad = None
    return Rows.apply(e, c, t, cfg)[0].sum() / n
def check_only():
    out = torch.empty(2, device="cuda")
    api.cce_check_targets_kernel[(1,)](t, out, t.numel(), v, -100, BLOCK=1024)
    float(HostScalar(out[:1]))
def hostscalar_only():
    HostScalar(torch.zeros(1, device="cuda"))
def validate():
    api._validate(e, c, t, None, -100, None, "mean", 0, 0.0, None)
def config():
    config_for(e.device, e.dtype)
print(f"N={n} D={d} V={v} exact, host ms (medians of 50)")
for name, fn, pre in [("public loss+grad", full, None), ("public forward, grad on", fwd_grad, None),
                      ("public .backward() of it", backward_of, fwd_grad),
                      ("autograd.Function loss+grad", fn_full, None),
                      ("autograd.Function forward", fn_fwd, None),
                      ("autograd.Function .backward()", backward_of, fn_fwd),
                      ("targets check + wait", check_only, None), ("HostScalar", hostscalar_only, None),
                      ("_validate", validate, None), ("config_for", config, None)]:
    print(f"  {name:32s} {med(fn, pre=pre):7.3f}")
