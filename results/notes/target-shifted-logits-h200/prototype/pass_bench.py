import sys, torch
sys.path.insert(0, ".gpu/proto")
import tsg_even
from own_kernel.kernels import target_shifted_grad as cur
from own_kernel.kernels.target import target_logit
from own_kernel.kernels.logits_grad import logits_to_grad
dev = "cuda"
def timeit(fn, reps=10, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        a = torch.cuda.Event(True); b = torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]
for n, d, v, sc in [(8192, 1536, 151936, None), (8192, 2048, 49152, None), (8192, 1152, 262144, None), (8192, 2304, 256000, 30.0)]:
    g = torch.Generator(device=dev).manual_seed(0)
    c = (torch.randn(v, d, device=dev, generator=g) / d**0.5).bfloat16()
    e = (torch.randn(n, d, device=dev, generator=g) * 2.2).bfloat16()
    t = torch.randint(0, v, (n,), device=dev)
    floor = timeit(lambda: e @ c.T)
    b = (-target_logit(e, c, None, t, None)).bfloat16()
    y = torch.empty(v, n, device=dev, dtype=torch.bfloat16); loss = torch.empty(n, device=dev); rr = torch.empty(n, device=dev)
    torch.addmm(b, c, e.t(), out=y)
    z = torch.empty(n, v, device=dev, dtype=torch.bfloat16)
    out = [f"N {n} D {d} V {v} sc {sc}: bytes-bound 6B@4.3TB/s {n*v*6/4.3e12*1e3/floor:.3f}"]
    out.append(f"old pass bf16 row-major {timeit(lambda: logits_to_grad(z, t, loss, ignore_index=-100, softcap=sc, label_smoothing=0.0, kept=None, eps=0.0, flat_p_max=0.0, block=4096, num_warps=8, row_round=rr))/floor:.3f}")
    for name, mod in (("even", tsg_even), ("prefetch", cur)):
        for br, bv, nw, sp in [(64, 64, 8, 4), (64, 32, 4, 4), (128, 32, 8, 4), (64, 64, 4, 4), (32, 64, 4, 4), (64, 64, 8, 8), (128, 64, 8, 4), (64, 128, 8, 4)]:
            ms = timeit(lambda: mod.target_shifted_to_grad(y, b, t, loss, ignore_index=-100, softcap=sc, label_smoothing=0.0,
                         block_r=br, block_v=bv, num_warps=nw, splits=sp, row_round=rr))
            out.append(f"{name} {br}/{bv}/{nw}/{sp} {ms/floor:.3f}")
    print(" | ".join(out), flush=True)
    del y, z, c, e; torch.cuda.empty_cache()
