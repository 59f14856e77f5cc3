# Ran as `python epilogue.py 8192 2304 8192 8` (output: epilogue-n8192d2304.txt).
# Diagnostic: what the dlogits_tma epilogue costs. Times 8 chunks of `width` columns at N x D:
# cuBLAS e @ c_chunk.T (bf16 out), the default kernel, and variants without the column sums,
# row sums, the store of W, or all three (then the epilogue is dead code: the GEMM alone).
import sys
import torch, triton
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor
from suite.inputs import make_inputs
from own_kernel.configs import config_for
from own_kernel.forward import num_sms, dot_precision
from own_kernel.tile import softcap_scalars
import os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "dlogits_tma_diag.py")):
    import make_diag  # noqa: F401  (writes it)
import dlogits_tma_diag as scratch_dlv  # ran as scratch_dlv.py next to this script

n, d, width, chunks = (int(x) for x in sys.argv[1:5])
v = width * chunks
for dist in ("lm", "uniform"):
    inp = make_inputs(dist, n, d, v, "bf16", seed=0, device="cuda", softcap=None)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    lse = torch.cat([torch.logsumexp((e[i:i + 1024] @ c.T).float(), 1) for i in range(0, n, 1024)])
    rw = torch.full((n,), 1.0 / n, device="cuda")
    cfg = config_for(e.device, e.dtype)
    k = dict(cfg["dlogits_tma"])
    persistent = k.pop("PERSISTENT", False)
    w = torch.empty((n, width), device="cuda", dtype=e.dtype)
    f32 = lambda m: torch.zeros(m, device="cuda", dtype=torch.float32)
    rr, cr, cs = f32(n), f32(v), f32(v)
    e_desc = TensorDescriptor.from_tensor(e, [k["BLOCK_N"], k["BLOCK_D"]])
    c_desc = TensorDescriptor.from_tensor(c, [k["BLOCK_V"], k["BLOCK_D"]])
    w_desc = TensorDescriptor.from_tensor(w, [k["BLOCK_N"], k["BLOCK_V"] // k["SUBTILES"]])
    tiles = triton.cdiv(n, k["BLOCK_N"]) * triton.cdiv(width, k["BLOCK_V"])
    grid = (min(tiles, num_sms(e.device)) if persistent else tiles,)

    def run(kk, flags):
        for i in range(chunks):
            scratch_dlv.cce_dlogits_tma_kernel[grid](
                e_desc, c_desc, w_desc, cs, t, lse, rw, rw, rw, rr, cr, rr, cr, cr, cs,
                n, v, i * width, width, *softcap_scalars(None), 0.0, D=d,
                DOT_PRECISION=dot_precision(e.dtype), HAS_BIAS=False, HAS_SOFTCAP=False,
                FILTER=False, HAS_GRAD_LSE=False, **kk, **flags)

    def floor():
        for i in range(chunks):
            torch.mm(e, c[i * width:(i + 1) * width].T, out=w)

    ms_floor = do_bench(floor, warmup=20, rep=200)
    print(f"{dist} N={n} D={d} width={width} x{chunks}: cuBLAS {ms_floor:.3f} ms")
    for label, flags in [("default", {}), ("no colsum", dict(COLSUM=False)),
                         ("no rowsum", dict(ROWSUM=False)), ("no store", dict(STORE=False)),
                         ("no col/row sums", dict(COLSUM=False, ROWSUM=False)),
                         ("GEMM only", dict(COLSUM=False, ROWSUM=False, STORE=False))]:
        for extra in ({}, dict(num_stages=4)):
            try:
                ms = do_bench(lambda: run({**k, **extra}, flags), warmup=20, rep=200)
                print(f"  {label:18s} {extra}: {ms:.3f} ms = {ms / ms_floor:.3f} x cuBLAS")
            except Exception as ex:
                print(f"  {label:18s} {extra}: FAILED {type(ex).__name__}: {str(ex)[:120]}")
