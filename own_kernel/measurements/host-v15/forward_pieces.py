# Host time of the pieces of the public forward (GPU idle at each call's start).
import collections, statistics, time, torch
from own_kernel import linear_cross_entropy, api, forward as fwdmod
from suite.inputs import make_inputs

acc = collections.defaultdict(list)
def timed(mod, name):
    fn = getattr(mod, name)
    def wrap(*a, **k):
        t0 = time.perf_counter(); r = fn(*a, **k); acc[name].append((time.perf_counter() - t0) * 1e3); return r
    setattr(mod, name, wrap)
for name in ("_validate", "_check_and_count_targets", "_rows_forward", "_raise_on_bad_targets"):
    timed(api, name)
for name in ("target_logit",):
    timed(fwdmod, name)

for n, d, v in [(2048, 2304, 20000), (2048, 2304, 32000), (2048, 4096, 20000)]:
    inp = make_inputs("lm", n, d, v, "bf16", seed=0, device="cuda", softcap=30.0)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    e.requires_grad_(), c.requires_grad_()
    tot = []
    for rep in range(60):
        if rep == 10:
            acc.clear()
        e.grad = c.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = linear_cross_entropy(e, c, t)
        tot.append((time.perf_counter() - t0) * 1e3)
        loss.backward()
        torch.cuda.synchronize()
    print(f"N={n} D={d} V={v}: public forward host {statistics.median(tot[10:]):.3f} ms; pieces:")
    for k, xs in acc.items():
        print(f"  {k:28s} {statistics.median(xs):.3f}")
