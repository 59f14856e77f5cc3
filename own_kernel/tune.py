"""Measure the own kernel's block shapes on this GPU: `python -m own_kernel.tune [--out DIR]`.

Times the forward and the whole backward for candidate configs (CCE_OWN_CONFIG overrides), a
per-kernel breakdown of the default config (torch.profiler), against the cuBLAS floor E @ C.T,
at the Gemma 2 (2B) shape. What it prints is what configs.py's table is chosen from.
"""
import argparse
import json
import os
import sys

import torch
import triton
from triton.testing import do_bench

from own_kernel import linear_cross_entropy
from own_kernel.configs import config_for
from own_kernel.forward import forward

FWD = [
    dict(BLOCK_N=128, BLOCK_V=256, BLOCK_D=64, num_warps=8, num_stages=3, FLATTEN=True),
    dict(BLOCK_N=128, BLOCK_V=256, BLOCK_D=64, num_warps=8, num_stages=3, FLATTEN=False),
    dict(BLOCK_N=128, BLOCK_V=256, BLOCK_D=64, num_warps=8, num_stages=4, FLATTEN=True),
    dict(BLOCK_N=128, BLOCK_V=128, BLOCK_D=64, num_warps=8, num_stages=4, FLATTEN=True),
    dict(BLOCK_N=256, BLOCK_V=128, BLOCK_D=64, num_warps=8, num_stages=3, FLATTEN=True),
    dict(BLOCK_N=128, BLOCK_V=256, BLOCK_D=128, num_warps=8, num_stages=2, FLATTEN=True),
]
BWD = [
    {},
    {"exact_gemm": "triton"},
    {"dlogits": dict(TILES=1, FLATTEN=False)},
    {"dlogits": dict(TILES=8)},
    {"dlogits": dict(BLOCK_V=256, num_stages=3, TILES=2)},
    {"workspace_mib": 80},
]


def bench(fn, reps=10):
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    ap.add_argument("--softcap", type=float, default=30.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    n, d, v = args.n, args.d, args.v
    e = (torch.randn(n, d, device=dev, generator=g) * d**-0.5).bfloat16().requires_grad_()
    c = torch.randn(v, d, device=dev, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device=dev, generator=g)
    lines = []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    floor = bench(lambda: e @ c.T)
    say(f"{torch.cuda.get_device_name()} N={n} D={d} V={v} softcap={args.softcap}")
    say(f"floor (cuBLAS E@C.T) {floor:.3f} ms = {2*n*v*d/floor/1e9:.0f} TFLOP/s")
    base = config_for(dev, e.dtype)
    for k in FWD:
        os.environ["CCE_OWN_CONFIG"] = json.dumps({"fwd": k})
        cfg = config_for(dev, e.dtype)
        try:
            ms = bench(lambda: forward(e, c, None, t, args.softcap, False, cfg))
            say(f"fwd {k}: {ms:.3f} ms = {ms/floor:.3f} floors")
        except Exception as ex:  # a config that does not compile is data, not a crash
            say(f"fwd {k}: FAILED {type(ex).__name__}: {str(ex).splitlines()[0][:200]}")
    os.environ.pop("CCE_OWN_CONFIG")

    def fwd_bwd(filter_eps=None):
        e.grad = c.grad = None
        linear_cross_entropy(e, c, t, softcap=args.softcap, filter_eps=filter_eps).backward()

    for k in BWD:
        os.environ["CCE_OWN_CONFIG"] = json.dumps(k)
        try:
            ms = bench(fwd_bwd)
            say(f"fwd+bwd exact {k}: {ms:.3f} ms = {ms/floor:.3f} floors (target <= 4.6)")
        except Exception as ex:
            say(f"fwd+bwd {k}: FAILED {type(ex).__name__}: {str(ex).splitlines()[0][:200]}")
    os.environ.pop("CCE_OWN_CONFIG")
    for k in [{}, {"de": dict(num_stages=3), "dc": dict(num_stages=3)}]:
        os.environ["CCE_OWN_CONFIG"] = json.dumps(k)
        ms = bench(lambda: fwd_bwd("auto"))
        say(f"fwd+bwd filter auto (uniform inputs) {k}: {ms:.3f} ms = {ms/floor:.3f} floors")
    os.environ.pop("CCE_OWN_CONFIG")

    # Memory at the default config.
    e.grad = c.grad = None
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = linear_cross_entropy(e, c, t, softcap=args.softcap)
    torch.cuda.synchronize()
    say(f"loss memory extra {(torch.cuda.max_memory_allocated()-before)/2**20:.2f} MiB")
    loss.backward(); torch.cuda.synchronize()
    grads = (n * d + v * d) * 2 / 2**20
    say(f"loss+grad memory extra {(torch.cuda.max_memory_allocated()-before)/2**20:.1f} MiB "
        f"(gradients {grads:.1f} MiB, ratio {(torch.cuda.max_memory_allocated()-before)/2**20/grads:.3f})")

    # Per-kernel breakdown of the default config.
    from torch.profiler import ProfilerActivity, profile
    fwd_bwd(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fwd_bwd()
        torch.cuda.synchronize()
    say(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    from own_kernel.forward import LAST_COMPILED
    fwd_bwd("auto")
    for name, k in LAST_COMPILED.items():
        say(f"{name}: regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} "
            f"shared {k.metadata.shared} B, warps {k.metadata.num_warps}, stages {k.metadata.num_stages}")
    say(f"config: {json.dumps(base)}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "tune.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
