"""Measure the own kernel's block shapes on this GPU: `python -m suite kernel tune [--out DIR]`.

Times the forward and the whole backward for candidate configs (overrides of the config in
force), exact and filtered on the suite's uniform and lm inputs, the memory, and a per-kernel
breakdown of the default config (torch.profiler), against the cuBLAS floor E @ C.T, at the
Gemma 2 (2B) shape by default. What it prints is what the kernel's config table is chosen from.
"""
import json
import os

import torch
from triton.testing import do_bench

from own_kernel import linear_cross_entropy
from suite.inputs import make_inputs
from suite.kernel.common import require_cuda
from suite.kernel.internals import (backward_plan, compiled_kernels, config_in_force,
                                    config_override, filter_record, forward_lse)
from suite.results import git_commit

FWD = [  # overrides of the device's config
    {"forward": {"tma": False}},
    {"forward": {"tma": True}},
]
def _tma_tiles(block_n, block_v, block_d, num_warps, num_stages):
    return {"recompute": {"tiles": dict(block_n=block_n, block_v=block_v, block_d=block_d,
                                        num_warps=num_warps, num_stages=num_stages)}}


TMA_TILES = [  # dlogits_tma.py tiles (the default is 128 x 256 in 4 column slices, 8 warps)
    {"recompute": {"subtiles": 2}},
    _tma_tiles(256, 128, 64, 8, 3),
    {"recompute": {**_tma_tiles(128, 128, 64, 8, 4)["recompute"], "subtiles": 2}},
]
WIDE = {"chunks": {"max_width": 16384}}
CUBLAS = {"chunks": {"recompute": "cublas"}}
BWD = [{}, CUBLAS] + TMA_TILES + [WIDE, {"chunks": {"min_width": 512}}]
FILTER = [{}, CUBLAS, WIDE, {"filter": {"max_kept": 0.25}}]


def bench(fn):
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def add_arguments(ap) -> None:
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    ap.add_argument("--softcap", type=float, default=30.0, help="0 = none")
    ap.add_argument("--out", default=None, help="also write what is printed to OUT/tune.txt")
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
    ap.add_argument("--portable", action="store_true",
                    help="tune the portable path's tiles for the shape (bf16, fp16, fp32; the "
                         "forward and the backward's kernels) into the on-disk cache and print "
                         "the cache; nothing else")
    ap.add_argument("--dists", default="uniform,lm", help="input distributions of the filtered runs")


class Session:
    """One tuning run: the inputs at the shape, the floor, and the lines printed so far."""

    def __init__(self, args):
        self.args, self.softcap, self.lines = args, args.softcap or None, []
        self.dev = torch.device("cuda")
        self.inputs = {dist: make_inputs(dist, args.n, args.d, args.v, "bf16", seed=0,
                                         device=self.dev, softcap=self.softcap)
                       for dist in ("uniform", "lm")}
        self.e, self.c, self.t = (self.inputs["lm"][k] for k in ("e", "c", "targets"))
        self.floor = bench(lambda: self.e @ self.c.T)

    def say(self, text):
        print(text, flush=True)
        self.lines.append(text)

    def attempt(self, label, fn, override):
        # A config that does not compile or run is data, not a crash.
        with config_override(override):
            try:
                ms = bench(fn)
                self.say(f"{label} {override}: {ms:.3f} ms = {ms / self.floor:.3f} floors")
            except Exception as ex:
                self.say(f"{label} {override}: FAILED {type(ex).__name__}: "
                         f"{str(ex).splitlines()[0][:200]}")

    def fwd_bwd(self, filter_eps=None, dist="lm"):
        e, c, t = (self.inputs[dist][k] for k in ("e", "c", "targets"))
        e.requires_grad_(), c.requires_grad_()
        e.grad = c.grad = None
        linear_cross_entropy(e, c, t, softcap=self.softcap, filter_eps=filter_eps).backward()


def main(args) -> int:
    require_cuda("tune")
    if args.portable:
        return pretune_portable(args)
    s = Session(args)
    n, d, v = args.n, args.d, args.v
    commit, dirty = git_commit()
    s.say(f"{torch.cuda.get_device_name()} N={n} D={d} V={v} softcap={s.softcap} "
          f"commit {commit}{' (dirty)' if dirty else ''}, torch {torch.__version__}")
    s.say(f"floor (cuBLAS E@C.T) {s.floor:.3f} ms = {2*n*v*d/s.floor/1e9:.0f} TFLOP/s")
    base = config_in_force(s.dev, s.e.dtype)
    time_forwards(s)
    if args.fwd_only:
        return write(args.out, s.lines)
    if args.protocol:
        compare_protocols(s.fwd_bwd, s.say)
        return write(args.out, s.lines)
    for k in args.bwd:
        s.attempt("fwd+bwd exact", s.fwd_bwd, k)
    for dist in args.dists.split(","):
        for k in args.filter:
            s.attempt(f"fwd+bwd filter auto, {dist} inputs",
                      lambda dist=dist: s.fwd_bwd("auto", dist), k)
    measure_memory(s)
    for eps in (None, "auto"):
        kernel_breakdown(s, eps)
    for name, k in compiled_kernels().items():
        s.say(f"{name}: regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} "
              f"shared {k.metadata.shared} B, warps {k.metadata.num_warps}, "
              f"stages {k.metadata.num_stages}")
    s.say(f"config: {json.dumps(base, default=str)}")
    return write(args.out, s.lines)


def time_forwards(s: Session) -> None:
    """Each forward variant, timed and checked: the max error of a few rows' LSE against fp32."""
    n = s.args.n
    rows = torch.cat([torch.arange(256), torch.arange(n - 256, n)]).to(s.dev)
    z = s.e[rows].float() @ s.c.float().T
    z = s.softcap * torch.tanh(z / s.softcap) if s.softcap else z
    lse_ref = torch.logsumexp(z, dim=1)
    del z

    def fwd(softcap=s.softcap):
        return forward_lse(s.e, s.c, s.t, softcap)

    variants = s.args.fwd if s.args.fwd is not None else ([] if s.args.no_fwd_variants else FWD)
    for k in variants + [{}]:
        with config_override(k):
            try:
                err = (fwd()[rows] - lse_ref).abs().max().item()
            except Exception:  # attempt() below reports the failure
                err = float("nan")
        s.attempt(f"fwd (lse max err {err:.1e})", fwd, k)
    s.attempt("fwd, no softcap", lambda: fwd(None), {})


def measure_memory(s: Session) -> None:
    """Peak memory beyond the inputs of loss and of loss+grad, exact and filtered."""
    n, d, v = s.args.n, s.args.d, s.args.v
    grads = (n * d + v * d) * 2 / 2**20
    for eps in (None, "auto"):
        s.e.grad = s.c.grad = None
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.no_grad():
            linear_cross_entropy(s.e, s.c, s.t, softcap=s.softcap, filter_eps=eps)
        torch.cuda.synchronize()
        s.say(f"filter {eps}: loss memory extra "
              f"{(torch.cuda.max_memory_allocated() - before) / 2**20:.2f} MiB")
        torch.cuda.reset_peak_memory_stats()
        s.fwd_bwd(eps); torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - before) / 2**20
        s.say(f"filter {eps}: loss+grad memory extra {extra:.1f} MiB "
              f"(gradients {grads:.1f} MiB, ratio {extra / grads:.3f})")


def kernel_breakdown(s: Session, eps) -> None:
    """Per-kernel GPU time of the config in force (lm inputs), the idle gaps, and the host's
    time per op (profiled separately: recording the host slows it, which would inflate gaps)."""
    from torch.profiler import ProfilerActivity, profile

    s.fwd_bwd(eps); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            s.fwd_bwd(eps)
        torch.cuda.synchronize()
    busy = sum(ev.self_device_time_total for ev in prof.key_averages()) / 3e3
    s.say(f"per kernel, filter {eps}, 3 calls (floor x3 = {3 * s.floor:.1f} ms; GPU busy "
          f"{busy:.1f} ms per call, the rest of the call's time is launch gaps):")
    for ev in sorted(prof.key_averages(), key=lambda ev: -ev.device_time_total)[:8]:
        s.say(f"  {ev.device_time_total / 1e3:9.2f} ms  {ev.count:5d} calls  {ev.key[:70]}")
    idle_gaps(prof, s.say)
    filter_summary(s, eps, s.say)
    with profile(activities=[ProfilerActivity.CPU]) as host_prof:
        for _ in range(3):
            s.fwd_bwd(eps)
        torch.cuda.synchronize()
    host = sorted(host_prof.key_averages(), key=lambda ev: -ev.self_cpu_time_total)
    s.say("  host time per call by op (self, profiled):")
    for ev in host[:12]:
        s.say(f"    {ev.self_cpu_time_total / 3e3:7.3f} ms  {ev.count / 3:6.1f}x  {ev.key[:60]}")


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


def filter_summary(s, eps, say):
    """The backward's chunk plan and, filtered, how many columns each chunk kept."""
    n, d, v = s.args.n, s.args.d, s.args.v
    plan = backward_plan(n, v, d, s.e.dtype, s.dev, filtered=eps is not None)
    in_dc = [w for _, w, where in plan if where == "dC"]
    tail = [w for _, w, where in plan if where == "tail"]
    say(f"  chunks ({eps}): {len(in_dc)} in dC ({sum(in_dc)} columns, widest "
        f"{max(in_dc, default=0)}), {len(tail)} in the tail ({sum(tail)} columns)")
    if eps is None:
        return
    with filter_record() as records:
        s.fwd_bwd(eps)
    for rec in records:
        if not rec["filtered"]:
            say("  the filter skipped nothing (exact after the first chunk)")
            continue
        say(f"  flat rows {rec['flat']}; kept fraction per chunk: "
            + " ".join(f"{k / w:.2f}" for k, w in zip(rec["kept"], in_dc)))


def compare_protocols(fwd_bwd, say):
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


def write(out, lines):
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "tune.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def pretune_portable(args) -> int:
    """Fill the portable path's tile cache for this shape (each dtype): the forward, and a loss
    and gradients, exact and filtered, through the recompute backward (its softmax_grad chunks
    and dlogits tail); then print every entry: later calls and processes on this GPU read it
    instead of tuning."""
    from suite.kernel.internals import (portable_tile_cache, run_portable_forward,
                                        run_portable_loss_and_grad)

    for dtype in ("bf16", "fp16", "fp32"):
        x = make_inputs("lm", args.n, args.d, args.v, dtype, seed=0, device="cuda",
                        softcap=args.softcap or None)
        run_portable_forward(x["e"], x["c"], x["targets"], args.softcap or None)
        for filter_eps in (None, "auto"):
            run_portable_loss_and_grad(x["e"], x["c"], x["targets"], args.softcap or None,
                                       filter_eps)
    path, entries = portable_tile_cache()
    lines = [f"portable tile cache: {path}"] + describe_tile_cache(entries)
    print("\n".join(lines))
    return write(args.out, lines)


def describe_tile_cache(entries: dict) -> list[str]:
    """One line per cache entry: its key, launch shape (a forward or dlogits Tiles, or a
    softmax_grad SoftmaxGrad) and time."""
    lines = []
    for key, entry in sorted(entries.items()):
        shape = ", ".join(f"{name} {value}" for name, value in entry["tiles"].items())
        lines.append(f"  {key}: {entry.get('type', 'Tiles')}({shape}) ({entry['ms']:.3f} ms)")
    return lines
