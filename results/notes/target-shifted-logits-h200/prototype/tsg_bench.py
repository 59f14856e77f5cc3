"""Prototype check: target-shifted 16-bit logits (cuBLAS addmm bias, V x R) vs fp32 logits."""
import sys, torch, torch.nn.functional as F
from own_kernel import linear_cross_entropy
from own_kernel.policy.config import use_target
from own_kernel.kernels.target_shifted_grad import target_shifted_to_grad
from own_kernel.kernels.target import target_logit
from own_kernel.kernels.logits_grad import logits_to_grad
from own_kernel.kernels.gemm import logits_fp32

dev = "cuda"
def timeit(fn, reps=10, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(True); b = torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2], ts[len(ts)//5], ts[(4*len(ts))//5]

def lm_inputs(n, d, v, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    c = torch.randn(v, d, device=dev, generator=g) / d**0.5
    e = torch.randn(n, d, device=dev, generator=g) * 2.2
    with torch.no_grad():
        z = e @ c.T
        t = torch.distributions.Categorical(logits=z[:, :].float()).sample()
    del z
    return e.bfloat16(), c.bfloat16(), t

def proto(e, c, t, budget_mib, softcap, br, bv, nw, sp):
    N, D = e.shape; V = c.shape[0]
    rows = min(N, (budget_mib << 20) // (V * 2))
    if rows < N: rows = rows // 128 * 128
    buf = torch.empty(rows * V, device=dev, dtype=e.dtype)
    de = torch.empty_like(e); dc = torch.empty_like(c)
    losses = torch.empty(N, device=dev, dtype=torch.float32)
    b = (-target_logit(e, c, None, t, None)).to(e.dtype)
    for i, r0 in enumerate(range(0, N, rows)):
        r1 = min(N, r0 + rows); r = r1 - r0
        y = buf[:V * r].view(V, r)
        torch.addmm(b[r0:r1], c, e[r0:r1].t(), out=y)
        target_shifted_to_grad(y, b[r0:r1], t[r0:r1], losses[r0:r1], ignore_index=-100,
                               softcap=softcap, label_smoothing=0.0, block_r=br, block_v=bv,
                               num_warps=nw, splits=sp)
        torch.addmm(de[r0:r1], y.t(), c, beta=0, alpha=1.0 / N, out=de[r0:r1])
        torch.addmm(dc, y, e[r0:r1], beta=0 if i == 0 else 1, alpha=1.0 / N, out=dc)
    return losses.mean(), de, dc

def naive(e, c, t, softcap):
    z = e @ c.T
    if softcap: z = softcap * torch.tanh(z / softcap)
    return F.cross_entropy(z.float(), t)

def run_grad(fn, e, c):
    e = e.detach().requires_grad_(); c = c.detach().requires_grad_()
    loss = fn(e, c); loss.backward(); return loss, e.grad, c.grad

def rel(a, b):
    if b is None: return float('nan')
    return ((a.double() - b).norm() / b.norm()).item()

shapes = [(8192, 1536, 151936, None), (8192, 4096, 128256, None), (8192, 2304, 256000, 30.0),
          (16384, 1152, 262144, None), (16384, 2048, 49152, None)]
sel = sys.argv[1:] or [str(i) for i in range(len(shapes))]
compiled = torch.compile(naive)
for i in map(int, sel):
    n, d, v, sc = shapes[i]
    e, c, t = lm_inputs(n, d, v)
    floor = timeit(lambda: e @ c.T)[0]
    print(f"== N {n} D {d} V {v} softcap {sc}: floor {floor:.3f} ms", flush=True)
    # components at one chunk of R rows
    R = min(n, 8192)
    er = e[:R]; tr = t[:R]
    z32 = torch.empty(R, v, device=dev, dtype=torch.float32)
    cols = [(0, v)]
    tg = timeit(lambda: logits_fp32(z32, er, c, None, cols))
    loss = torch.empty(R, device=dev)
    tp = timeit(lambda: logits_to_grad(z32, tr, loss, ignore_index=-100, softcap=sc, label_smoothing=0.0,
                                       kept=None, eps=0.0, flat_p_max=0.0, block=2048, num_warps=8,
                                       g=z32.view(torch.bfloat16)[:, :v]))
    del z32
    y = torch.empty(v, R, device=dev, dtype=torch.bfloat16)
    b = (-target_logit(er, c, None, tr, None)).bfloat16()
    ta = timeit(lambda: torch.addmm(b, c, er.t(), out=y))
    tm = timeit(lambda: torch.mm(c, er.t(), out=y))
    print(f"  R {R}: fp32 GEMM {tg[0]/floor*n/R:.3f}  old pass {tp[0]/floor*n/R:.3f}  | addmm-bias {ta[0]/floor*n/R:.3f}"
          f"  mm-bf16 {tm[0]/floor*n/R:.3f}  (floors, scaled to N)", flush=True)
    best = {}
    for br, bv, nw, sp in [(64, 64, 8, 4), (64, 128, 8, 4), (32, 128, 4, 4), (128, 32, 8, 4), (64, 64, 4, 8), (64, 64, 8, 2), (32, 64, 4, 4), (64, 32, 4, 4), (128, 64, 8, 2)]:
        try:
            torch.addmm(b, c, er.t(), out=y)
            tn = timeit(lambda: target_shifted_to_grad(y, b, tr, loss, ignore_index=-100, softcap=sc,
                        label_smoothing=0.0, block_r=br, block_v=bv, num_warps=nw, splits=sp))
            best[(br, bv, nw, sp)] = tn[0]
            print(f"    new pass br {br} bv {bv} w {nw} sp {sp}: {tn[0]/floor*n/R:.3f} floors", flush=True)
        except Exception as ex:
            print(f"    new pass br {br} bv {bv} w {nw}: FAILED {type(ex).__name__}: {str(ex)[:200]}")
    del y
    torch.cuda.empty_cache()
    # end to end
    cfgs = {}
    with use_target("portable"):
        for ws in (1024, 3072):
            cfgs[f"own_portable ws{ws}"] = lambda e_, c_, ws=ws: linear_cross_entropy(e_, c_, t, softcap=sc, workspace_mib=ws)
    for ws in (1024, 3072):
        cfgs[f"proto ws{ws}"] = "proto"
    cfgs["torch_compile"] = lambda e_, c_: compiled(e_, c_, t, sc)
    # reference
    if n * v * 8 * 4 > 90e9:
        dE_ref = dC_ref = None
        lref = torch.tensor(float('nan'))
    else:
      zr = (e.double() @ c.double().T)
      with torch.enable_grad():
        zr.requires_grad_()
        zz = zr if sc is None else sc * torch.tanh(zr / sc)
        lref = F.cross_entropy(zz, t); lref.backward()
      gz = zr.grad; del zr, zz
      dE_ref = (gz @ c.double()); dC_ref = (gz.T @ e.double()); del gz
    torch.cuda.empty_cache()
    for name, fn in cfgs.items():
        try:
            if fn == "proto":
                ws = int(name.split("ws")[1])
                for br, bv, nw, sp in sorted(best, key=best.get)[:2]:
                    with use_target("portable"):
                        f = lambda: proto(e, c, t, ws, sc, br, bv, nw, sp)
                        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
                        l, de, dc = f()
                        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                        ms = timeit(f)
                    print(f"  {name} br{br} bv{bv} w{nw} sp{sp}: {ms[0]:.3f} ms [{ms[1]:.3f}-{ms[2]:.3f}] {ms[0]/floor:.3f} floors peak {peak:.0f} MiB "
                          f"loss err {abs(l.item()-lref.item()):.2e} dE {rel(de, dE_ref):.2e} dC {rel(dc, dC_ref):.2e}", flush=True)
                    del de, dc
                continue
            with use_target("portable") if name.startswith("own") else torch.no_grad() if False else torch.enable_grad():
                f = lambda: run_grad(fn, e, c)
                torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
                l, de, dc = f()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                ms = timeit(f)
            print(f"  {name}: {ms[0]:.3f} ms [{ms[1]:.3f}-{ms[2]:.3f}] {ms[0]/floor:.3f} floors peak {peak:.0f} MiB "
                  f"loss err {abs(l.item()-lref.item()):.2e} dE {rel(de, dE_ref):.2e} dC {rel(dc, dC_ref):.2e}", flush=True)
            del de, dc
        except Exception as ex:
            print(f"  {name}: FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)
    del dE_ref, dC_ref, e, c, t
    torch.cuda.empty_cache()
