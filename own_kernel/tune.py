"""Measure the own kernel's block shapes on this GPU: `python -m own_kernel.tune [--out DIR]`.

Times the forward and the whole backward for candidate configs (CCE_OWN_CONFIG overrides), exact
and filtered on the suite's uniform and lm inputs, the memory, and a per-kernel breakdown of the
default config (torch.profiler), against the cuBLAS floor E @ C.T, at the Gemma 2 (2B) shape by
default. What it prints is what configs.py's table is chosen from.
"""
import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench

from own_kernel import linear_cross_entropy
from own_kernel.configs import config_for
from own_kernel.forward import forward

FWD = [  # overrides of the device's config (tune-v5 has more: stages, flatten, 128x128, 256x128)
    {"fwd": dict(TMA=False), "fwd_balance": False},  # session 3's kernel and split rule (2.4 waves)
    {"fwd": dict(TMA=False)},
    {"fwd": dict(TMA=True)},
]
TMA_TILES = [  # dlogits_tma.py tiles (the default is 128 x 256 in 4 column slices, 8 warps)
    dict(SUBTILES=2),
    dict(BLOCK_N=256, BLOCK_V=128, BLOCK_D=64, SUBTILES=4, num_warps=8, num_stages=3),
    dict(BLOCK_N=128, BLOCK_V=128, BLOCK_D=64, SUBTILES=2, num_warps=8, num_stages=4),
]
WIDE = {"cublas_max_width": 8192}
BWD = ([{}, {"recompute": "cublas"}] + [{"dlogits_tma": k} for k in TMA_TILES]
       + [WIDE, {"cublas_min_width": 512}])
FILTER = [{}, {"recompute": "cublas"}, WIDE, {"filter_max_kept": 0.25}]


def bench(fn, reps=10):
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    ap.add_argument("--softcap", type=float, default=30.0, help="0 = none")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fwd-only", action="store_true", help="forward variants only")
    ap.add_argument("--no-fwd-variants", action="store_true", help="time only the default forward")
    ap.add_argument("--protocol", action="store_true",
                    help="only compare timing protocols (do_bench vs the suite's) of fwd+bwd")
    ap.add_argument("--bwd", type=json.loads, default=BWD,
                    help="JSON list of config overrides timed for exact fwd+bwd (default: BWD)")
    ap.add_argument("--filter", type=json.loads, default=FILTER,
                    help="JSON list of config overrides timed filtered (default: FILTER)")
    ap.add_argument("--fwd", type=json.loads, default=None,
                    help="JSON list of config overrides timed for the forward (default: FWD)")
    ap.add_argument("--dists", default="uniform,lm", help="input distributions of the filtered runs")
    args = ap.parse_args(argv)
    args.softcap = args.softcap or None
    dev = torch.device("cuda")
    from suite.inputs import make_inputs  # the suite's input distributions (lm: peaked softmax)

    n, d, v = args.n, args.d, args.v
    inputs = {dist: make_inputs(dist, n, d, v, "bf16", seed=0, device=dev, softcap=args.softcap)
              for dist in ("uniform", "lm")}
    e, c, t = (inputs["lm"][k] for k in ("e", "c", "targets"))
    lines = []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    def attempt(label, fn, override):
        # A config that does not compile or run is data, not a crash.
        os.environ["CCE_OWN_CONFIG"] = json.dumps(override)
        try:
            ms = bench(fn)
            say(f"{label} {override}: {ms:.3f} ms = {ms / floor:.3f} floors")
        except Exception as ex:
            say(f"{label} {override}: FAILED {type(ex).__name__}: {str(ex).splitlines()[0][:200]}")
        finally:
            os.environ.pop("CCE_OWN_CONFIG")

    floor = bench(lambda: e @ c.T)
    from suite.results import git_commit

    commit, dirty = git_commit()
    say(f"{torch.cuda.get_device_name()} N={n} D={d} V={v} softcap={args.softcap} "
        f"commit {commit}{' (dirty)' if dirty else ''}, torch {torch.__version__}")
    say(f"floor (cuBLAS E@C.T) {floor:.3f} ms = {2*n*v*d/floor/1e9:.0f} TFLOP/s")
    base = config_for(dev, e.dtype)
    # Reference LSE of a few rows (fp32 logits), so every variant is checked, not only timed.
    rows = torch.cat([torch.arange(256), torch.arange(n - 256, n)]).to(dev)
    z = e[rows].float() @ c.float().T
    z = args.softcap * torch.tanh(z / args.softcap) if args.softcap else z
    lse_ref = torch.logsumexp(z, dim=1)
    del z

    def fwd_checked(softcap=args.softcap):
        return forward(e, c, None, t, softcap, 0.0, -100, config_for(dev, e.dtype))

    fwd_variants = args.fwd if args.fwd is not None else ([] if args.no_fwd_variants else FWD)
    for k in fwd_variants + [{}]:
        os.environ["CCE_OWN_CONFIG"] = json.dumps(k)
        try:
            err = (fwd_checked()[1][rows] - lse_ref).abs().max().item()
        except Exception:  # attempt() below reports the failure
            err = float("nan")
        os.environ.pop("CCE_OWN_CONFIG")
        attempt(f"fwd (lse max err {err:.1e})", fwd_checked, k)
    attempt("fwd, no softcap", lambda: fwd_checked(None), {})

    if args.fwd_only:
        return write(args.out, lines)

    def fwd_bwd(filter_eps=None, dist="lm"):
        ee, cc, tt = (inputs[dist][k] for k in ("e", "c", "targets"))
        ee.requires_grad_(), cc.requires_grad_()
        ee.grad = cc.grad = None
        linear_cross_entropy(ee, cc, tt, softcap=args.softcap, filter_eps=filter_eps).backward()

    if args.protocol:
        return compare_protocols(fwd_bwd, say, args.out, lines)
    for k in args.bwd:
        attempt("fwd+bwd exact (target <= 4.6 floors)", fwd_bwd, k)
    for dist in args.dists.split(","):
        for k in args.filter:
            attempt(f"fwd+bwd filter auto, {dist} inputs", lambda dist=dist: fwd_bwd("auto", dist), k)

    # Memory at the default config.
    grads = (n * d + v * d) * 2 / 2**20
    for eps in (None, "auto"):
        e.grad = c.grad = None
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.no_grad():
            linear_cross_entropy(e, c, t, softcap=args.softcap, filter_eps=eps)
        torch.cuda.synchronize()
        say(f"filter {eps}: loss memory extra {(torch.cuda.max_memory_allocated()-before)/2**20:.2f} MiB")
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd(eps); torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - before) / 2**20
        say(f"filter {eps}: loss+grad memory extra {extra:.1f} MiB "
            f"(gradients {grads:.1f} MiB, ratio {extra / grads:.3f})")

    # Per-kernel breakdown of the default config, exact and filtered (lm inputs).
    from torch.profiler import ProfilerActivity, profile
    for eps in (None, "auto"):
        fwd_bwd(eps); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fwd_bwd(eps)
            torch.cuda.synchronize()
        busy = sum(ev.self_device_time_total for ev in prof.key_averages()) / 3e3
        say(f"per kernel, filter {eps}, 3 calls (floor x3 = {3 * floor:.1f} ms; GPU busy "
            f"{busy:.1f} ms per call, the rest of the call's time is launch gaps):")
        for ev in sorted(prof.key_averages(), key=lambda ev: -ev.device_time_total)[:8]:
            say(f"  {ev.device_time_total / 1e3:9.2f} ms  {ev.count:5d} calls  {ev.key[:70]}")
        idle_gaps(prof, say)
        filter_summary(eps, say)
        # The host's side separately: recording it slows the host, which would inflate the gaps.
        with profile(activities=[ProfilerActivity.CPU]) as host_prof:
            for _ in range(3):
                fwd_bwd(eps)
            torch.cuda.synchronize()
        host = sorted(host_prof.key_averages(), key=lambda ev: -ev.self_cpu_time_total)
        say(f"  host time per call by op (self, profiled):")
        for ev in host[:12]:
            say(f"    {ev.self_cpu_time_total / 3e3:7.3f} ms  {ev.count / 3:6.1f}x  {ev.key[:60]}")
    from own_kernel.forward import LAST_COMPILED
    for name, k in LAST_COMPILED.items():
        say(f"{name}: regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} "
            f"shared {k.metadata.shared} B, warps {k.metadata.num_warps}, stages {k.metadata.num_stages}")
    say(f"config: {json.dumps(base)}")
    return write(args.out, lines)


def idle_gaps(prof, say, top=6):
    """Where the GPU waits between kernels (the host launching, or a host sync): the total, and
    the longest gaps with the kernels around them."""
    from torch.autograd import DeviceType

    kernels = sorted((ev for ev in prof.events() if ev.device_type == DeviceType.CUDA),
                     key=lambda ev: ev.time_range.start)
    gaps = [(b.time_range.start - a.time_range.end, a.name, b.name)
            for a, b in zip(kernels, kernels[1:]) if b.time_range.start > a.time_range.end]
    say(f"  idle between kernels: {sum(g for g, _, _ in gaps) / 3e3:.2f} ms per call; longest:")
    for gap, before, after in sorted(gaps, reverse=True)[:top]:
        say(f"    {gap / 1e3:6.3f} ms  after {before[:40]}  before {after[:40]}")
    by_pair = {}
    for gap, before, after in gaps:
        total, count = by_pair.get((before[:40], after[:40]), (0.0, 0))
        by_pair[(before[:40], after[:40])] = (total + gap, count + 1)
    say("  idle per call by kernel pair (all gaps):")
    for (before, after), (total, count) in sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:top]:
        say(f"    {total / 3e3:6.3f} ms  {count / 3:5.1f}x  after {before}  before {after}")


def filter_summary(eps, say):
    """The last call's chunk plan and, filtered, how many columns each cuBLAS chunk kept."""
    from own_kernel.backward import LAST_PLAN

    plan, kept = LAST_PLAN.get("plan", []), LAST_PLAN.get("kept_count")
    cublas = [w for _, w, kind in plan if kind == "cublas"]
    fused = [w for _, w, kind in plan if kind == "fused"]
    say(f"  chunks ({eps}): {len(cublas)} cuBLAS ({sum(cublas)} columns, widest {max(cublas, default=0)}), "
        f"{len(fused)} fused ({sum(fused)} columns); flat rows {LAST_PLAN.get('num_flat')}")
    if kept is not None:
        kept = kept.tolist()
        say("  kept fraction per cuBLAS chunk: "
            + " ".join(f"{k / w:.2f}" for k, w in zip(kept, cublas)))


def compare_protocols(fwd_bwd, say, out, lines):
    """The same fwd+bwd timed by do_bench and by the suite's loop (suite.measure.time_calls: no
    sync between reps), per rep, with the cycle collector on and off: finds time that only one
    protocol sees (host stalls)."""
    import gc

    from suite.measure import time_calls

    for eps in (None, "auto"):
        for collector in (True, False):
            (gc.enable if collector else gc.disable)()
            for _ in range(3):
                fwd_bwd(eps)
            reps = time_calls(lambda _: fwd_bwd(eps), device="cuda", reps=10)
            say(f"filter {eps}, gc {'on' if collector else 'off'}: do_bench {bench(lambda: fwd_bwd(eps)):.2f} ms; "
                f"suite loop {' '.join(f'{t:.1f}' for t in reps)} ms")
    gc.enable()
    return write(out, lines)


def write(out, lines):
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "tune.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
