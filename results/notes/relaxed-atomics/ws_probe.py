"""Probe (not committed code): where the Gluon W writer's time over the floor goes.
Variants of dlogits_ws.py's consumer epilogue, each flag a module constexpr, one module per
variant (written from this file's TEMPLATE), timed with do_bench against the real launcher and
cuBLAS E @ C_chunk.T (bf16 out) at one chunk of a few heads."""
import importlib.util, itertools, os, sys, json
import torch
from triton.testing import do_bench

TEMPLATE = r'''
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma_wait)
from own_kernel.kernels.forward_ws import (LOG2E, _tile_logits, ring_and_barriers)
from own_kernel.kernels.dlogits_ws import _tile_at, _producer, _expm1, TMA_STORE

ROWBIAS = gl.constexpr(@ROWBIAS@)
TARGET = gl.constexpr(@TARGET@)
WIDTH = gl.constexpr(@WIDTH@)
ATOMIC = gl.constexpr(@ATOMIC@)
STORE = gl.constexpr(@STORE@)

@gluon.jit
def _grad(acc, rows, cols, row_in, n, v, v_start, width, smooth, edge):
    lse_ptr, lo_ptr, nll_ptr, w_ptr, wp_ptr, tgt_ptr = row_in
    live = rows < n
    lse = gl.load(lse_ptr + rows, mask=live, other=float("inf"))
    lo2 = gl.load(lo_ptr + rows, mask=live, other=0.0) * LOG2E
    w = gl.load(w_ptr + rows, mask=live, other=0.0)
    wp = gl.load(wp_ptr + rows, mask=live, other=0.0)
    if ROWBIAS:
        bias = lse * LOG2E + lo2
        p = gl.exp2(acc * LOG2E - bias[:, None])
    else:
        p = gl.exp2((acc - lse[:, None]) * LOG2E - lo2[:, None])
    d = wp[:, None] * p - (w * (smooth / v))[:, None]
    if TARGET:
        tgt = gl.load(tgt_ptr + rows, mask=live, other=-1).to(gl.int32)
        pt_m1 = _expm1(-gl.load(nll_ptr + rows, mask=live, other=float("inf")))
        d_target = w * pt_m1 + (wp - w) * (1.0 + pt_m1) + w * (smooth * (1.0 - 1.0 / v))
        d = gl.where((v_start + cols)[None, :] == tgt[:, None], d_target[:, None], d)
    if WIDTH == 1:
        d = gl.where((cols < width)[None, :], d, 0.0)
    elif WIDTH == 2:
        if edge:
            d = gl.where((cols < width)[None, :], d, 0.0)
    return d

@gluon.jit
def _consume(WHICH: gl.constexpr, bufs, w_desc, row_in, row_round, n, v, v_start, width,
             num_nb, num_vb, group_n, k_steps, smooth):
    ready, empty, turn, ring_e, ring_c, w_smem = bufs
    stages: gl.constexpr = ring_e.type.shape[0]
    block_n: gl.constexpr = ring_e.type.shape[1]
    block_v: gl.constexpr = ring_c.type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, block_v, 16])
    out = w_smem.index(WHICH)
    programs = gl.num_programs(0)
    j = 0
    for tile in range(gl.program_id(0) + WHICH * programs, num_nb * num_vb, 2 * programs):
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        acc, cnt = _tile_logits(ready, empty, ring_e, ring_c, (2 * j + WHICH) * k_steps,
                                k_steps, acc_layout)
        mbarrier.arrive(turn.index(1 - WHICH))
        j += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((cnt + stages - 1) % stages))
        n0, w0 = _tile_at(tile, num_nb, num_vb, group_n, block_n, block_v)
        rows = n0 + gl.arange(0, block_n, layout=gl.SliceLayout(1, acc_layout))
        cols = w0 + gl.arange(0, block_v, layout=gl.SliceLayout(0, acc_layout))
        d = _grad(acc, rows, cols, row_in, n, v, v_start, width, smooth, w0 + block_v > width)
        d_used = d.to(w_desc.dtype)
        if ATOMIC == 1:
            gl.atomic_add(row_round + rows, gl.sum(d - d_used.to(gl.float32), axis=1),
                          mask=rows < n)
        elif ATOMIC == 2:
            gl.atomic_add(row_round + rows, gl.sum(d - d_used.to(gl.float32), axis=1),
                          mask=rows < n, sem="relaxed")
        elif ATOMIC == 3:
            gl.store(row_round + rows, gl.sum(d - d_used.to(gl.float32), axis=1),
                     mask=rows < n)
        if STORE:
            tma.store_wait(0)
            out.store(d_used)
            fence_async_shared()
            TMA_STORE(w_desc, [n0, w0], out)
    tma.store_wait(0)

@gluon.jit
def _consumer0(bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
               k_steps, smooth):
    _consume(0, bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
             k_steps, smooth)

@gluon.jit
def _consumer1(bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
               k_steps, smooth):
    _consume(1, bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
             k_steps, smooth)

@gluon.jit(do_not_specialize=["n", "v", "v_start", "width", "d", "group_n"])
def probe_kernel(e_desc, c_desc, w_desc, lse, lse_lo, nll, weight, weight_p, targets,
                 row_round, n, v, v_start, width, d, group_n, smooth,
                 STAGES_: gl.constexpr, CONSUMER_REGS_: gl.constexpr,
                 PRODUCER_REGS_: gl.constexpr):
    ring_e, ring_c, ready, empty, turn = ring_and_barriers(e_desc, c_desc, STAGES_)
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [2] + w_desc.block_type.shape,
                                       w_desc.layout)
    num_nb = gl.cdiv(n, e_desc.block_type.shape[0])
    num_vb = gl.cdiv(width, c_desc.block_type.shape[0])
    k_steps = gl.cdiv(d, e_desc.block_type.shape[1])
    consumer_args = ((ready, empty, turn, ring_e, ring_c, w_smem), w_desc,
                     (lse, lse_lo, nll, weight, weight_p, targets), row_round, n, v, v_start,
                     width, num_nb, num_vb, group_n, k_steps, smooth)
    producer_args = (e_desc, c_desc, ready, empty, ring_e, ring_c, v_start, num_nb, num_vb,
                     group_n, k_steps)
    gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                        (_producer, producer_args)], [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])
'''

VARIANTS = {  # ROWBIAS TARGET WIDTH ATOMIC STORE (ATOMIC 1 acq_rel, 2 relaxed, 3 a plain store)
    "base": (0, 1, 1, 1, 1),
    "relaxed": (0, 1, 1, 2, 1),
    "lean_relaxed": (1, 1, 2, 2, 1),
    "sum_store": (0, 1, 1, 3, 1),
    "noatomic": (0, 1, 1, 0, 1),
}


def load_variant(name, flags, folder):
    src = TEMPLATE
    for key, val in zip(("ROWBIAS", "TARGET", "WIDTH", "ATOMIC", "STORE"), flags):
        src = src.replace(f"@{key}@", str(val))
    path = os.path.join(folder, f"probe_{name}.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"probe_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    from own_kernel.kernels import dlogits_ws as dw
    from own_kernel.kernels import forward_ws as fw
    from own_kernel.kernels.rows import Rows, Sums
    folder = os.environ.get("PROBE_DIR", "/tmp/probe"); os.makedirs(folder, exist_ok=True)
    mods = {k: load_variant(k, f, folder) for k, f in VARIANTS.items()}
    heads = [(16384, 1152, 262144), (8192, 2304, 256000), (16384, 2048, 49152), (8192, 4096, 128256)]
    width = 8192
    out = []
    for n, d, v in heads:
        g = torch.Generator(device="cuda").manual_seed(0)
        e = (torch.randn(n, d, device="cuda", generator=g) / d**0.5).bfloat16()
        c = torch.randn(v, d, device="cuda", generator=g).bfloat16()
        v_start = v - width - 64 * 7  # a chunk in the middle-end of V, as the plan's first ones
        w = torch.empty(n, width, device="cuda", dtype=torch.bfloat16)
        lse = 12 + torch.rand(n, device="cuda")
        rows = Rows(targets=torch.randint(0, v, (n,), device="cuda"), lse=lse,
                    nll=torch.rand(n, device="cuda") * 3, weight=torch.full((n,), 1 / n, device="cuda"),
                    weight_lse=None)
        sums = Sums.zeros(n, v, "cuda")
        real = dw.RecomputeWs(e, c, 0.0, 8)
        cc = c[v_start:v_start + width]
        fns = {"cublas": lambda: torch.mm(e, cc.t(), out=w),
               "real": lambda: real.write(w, rows, sums, v_start)}
        for name, mod in mods.items():
            def call(mod=mod):
                tiles = -(-n // fw.BLOCK_N) * -(-width // fw.BLOCK_V)
                mod.probe_kernel[(min(tiles, real.slots),)](
                    real._desc(e, [fw.BLOCK_N, fw.BLOCK_K]), real.c_desc,
                    real._desc(w, [fw.BLOCK_N, fw.BLOCK_V]), rows.lse, rows.lse_lo_or_zeros(),
                    rows.nll, rows.weight, rows.weight, rows.targets, sums.row_round, n, v,
                    v_start, width, d, 8, 0.0, STAGES_=fw.STAGES, CONSUMER_REGS_=fw.CONSUMER_REGS,
                    PRODUCER_REGS_=fw.PRODUCER_REGS, num_warps=4, maxnreg=fw.MAXNREG)
            fns[name] = call
        # correctness of the lean variant against the real one (same W, RowRound to 1e-5)
        real.write(w, rows, sums, v_start); torch.cuda.synchronize()
        w_ref, rr_ref = w.clone(), sums.row_round.clone(); sums.row_round.zero_()
        fns["lean_relaxed"](); torch.cuda.synchronize()
        diff_w = (w.float() - w_ref.float()).abs().max().item()
        sums.row_round.zero_(); fns["lean_relaxed"](); lean_rr = sums.row_round.clone()
        sums.row_round.zero_(); real.write(w, rows, sums, v_start); real_rr = sums.row_round.clone()
        print(f"check N {n} D {d}: lean_relaxed vs real W max diff {diff_w:.3g}, RowRound max rel diff "
              f"{((lean_rr - real_rr).abs().max() / real_rr.abs().max()).item():.3g}", flush=True)
        for order in (list(fns), list(fns)[::-1]):
            for name in order:
                q = do_bench(fns[name], warmup=25, rep=300, quantiles=[0.2, 0.5, 0.8])
                out.append(dict(n=n, d=d, v=v, width=width, variant=name, p20=q[0], ms=q[1], p80=q[2],
                                order=order[0]))
        for name in fns:
            ms = [r["ms"] for r in out if r["n"] == n and r["d"] == d and r["variant"] == name]
            fl = [r["ms"] for r in out if r["n"] == n and r["d"] == d and r["variant"] == "cublas"]
            print(f"N {n} D {d} {name:9s} " + " ".join(f"{m:.4f}" for m in ms) +
                  "  floors " + " ".join(f"{m / f:.3f}" for m, f in zip(ms, fl)), flush=True)
        del e, c, w
    if os.environ.get("OUT"):
        json.dump(out, open(os.path.join(os.environ["OUT"], "ws_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
