import cProfile, pstats, statistics, threading, time, torch
from own_kernel.backward import backward as bwd
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
        torch.cuda.synchronize(); q.append((t1 - t0) * 1e3)
    return statistics.median(q)

PROF = [None]
TIMES = []
class Rows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, c, t, cfg, mode):
        loss, lse, pmax = fwd(e, c, None, t, None, 0.0, -100, cfg)
        ctx.save_for_backward(e, c, t, lse, pmax); ctx.mode = mode
        ctx.mark_non_differentiable(pmax)
        return loss, lse, pmax
    @staticmethod
    def backward(ctx, gl, glse, gp):
        t0 = time.perf_counter()
        e, c, t, lse, pmax = ctx.saved_tensors
        if ctx.mode == "none":
            return torch.zeros_like(e), torch.zeros_like(c), None, None, None
        if PROF[0] is not None: PROF[0].enable()
        rw = torch.where(t != -100, gl.float(), 0.0)
        de, dc, _ = bwd(e, c, None, t, lse, pmax, rw, None, None, 0.0, None, 0.0)
        if PROF[0] is not None: PROF[0].disable()
        TIMES.append((time.perf_counter() - t0) * 1e3)
        return de, dc, None, None, None

n, d, v = 2048, 2304, 20000
inp = make_inputs("lm", n, d, v, "bf16", seed=0, device="cuda", softcap=30.0)
e, c, t = inp["e"], inp["c"], inp["targets"]
e.requires_grad_(), c.requires_grad_()
cfg = config_for(e.device, e.dtype)
def fwd_of(mode):
    def f():
        e.grad = c.grad = None
        return Rows.apply(e, c, t, cfg, mode)[0].sum() / n
    return f
loss_rows, lse, pmax = fwd(e.detach(), c.detach(), None, t, None, 0.0, -100, cfg)
rw = torch.full((n,), 1.0 / n, device="cuda")
def direct():
    bwd(e.detach(), c.detach(), None, t, lse, pmax, rw, None, None, 0.0, None, 0.0)
def in_thread():
    th = threading.Thread(target=direct); th.start(); th.join()
x = torch.zeros(10, device="cuda", requires_grad=True)
print("host ms, medians of 50")
print(f"  trivial graph .backward()        {med(lambda l: l.backward(), pre=lambda: x.sum()):7.3f}")
print(f"  Function, zero-work backward     {med(lambda l: l.backward(), pre=fwd_of('none')):7.3f}")
TIMES.clear()
print(f"  Function, real backward          {med(lambda l: l.backward(), pre=fwd_of('real')):7.3f}")
print(f"    of which inside backward()     {statistics.median(TIMES):7.3f}")
print(f"  backward direct, main thread     {med(direct):7.3f}")
print(f"  backward direct, new thread      {med(in_thread):7.3f}")
PROF[0] = cProfile.Profile()
for _ in range(20):
    fwd_of('real')().backward()
torch.cuda.synchronize()
pstats.Stats(PROF[0]).sort_stats("tottime").print_stats(12)
PROF[0] = None
p2 = cProfile.Profile(); p2.enable()
for _ in range(20): direct()
torch.cuda.synchronize(); p2.disable()
pstats.Stats(p2).sort_stats("tottime").print_stats(12)
