# Public loss+grad: eager autograd.Function route vs the custom op route, interleaved.
import statistics, time, torch
from own_kernel import linear_cross_entropy, api
from suite.inputs import make_inputs

EAGER = api._LceRowsEager.apply
def route(op):
    api._LceRowsEager.apply = staticmethod(api.lce_rows) if op else EAGER

for n, d, v, filt in [(2048, 2304, 20000, None), (2048, 2304, 32000, None), (2048, 4096, 20000, None)]:
    inp = make_inputs("lm", n, d, v, "bf16", seed=0, device="cuda", softcap=30.0)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    e.requires_grad_(), c.requires_grad_()
    res = {k: ([], [], []) for k in ("function", "custom op")}
    for rep in range(60):
        for name in res:
            route(name == "custom op")
            e.grad = c.grad = None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = linear_cross_entropy(e, c, t, filter_eps=filt)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            if rep >= 10:
                for lst, x in zip(res[name], (t1 - t0, t2 - t1, t3 - t0)):
                    lst.append(x * 1e3)
    print(f"N={n} D={d} V={v}: host forward / host backward() / wall, ms (medians of 50)")
    for name, (a, b, w) in res.items():
        print(f"  {name:10s} {statistics.median(a):6.3f} {statistics.median(b):6.3f} {statistics.median(w):6.3f}")
route(False)
