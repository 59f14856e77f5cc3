"""Launch the own kernel's passes once at the Gemma 2 (2B) shape, for a hardware-counter
profiler (nothing is timed here):

    ncu --clock-control none -k regex:"cce_fwd|nvjet" --section SpeedOfLight \\
        python -m suite kernel profile fwd          # cuBLAS floor, pointer and TMA forward
    ncu --clock-control none -k regex:softmax_grad --launch-skip 20 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python -m suite kernel profile bwd

and where the host's time goes (Python's profiler over whole loss+grad calls, after the host
time to queue a call and the call's wall time; at small shapes the host, not the GPU, sets the
pace): python -m suite kernel profile host --n 2048 --v 20000 --softcap 0 [--filter] [--dist uniform]
[--low-memory] [--workspace-mib 3072] [--trace t.json] [--provider torch_compile] [--autocast].
With --trace it also prints each kernel family's GPU time per call in floors (one cuBLAS E @ C.T of the shape)
and the GPU's idle time. --provider profiles a registered provider's loss+grad call instead of
the own kernel's (its options then come from the provider).
"""
import cProfile
import csv
import json
import os
import pstats
import statistics
import time
from pathlib import Path

import torch

from own_kernel import linear_cross_entropy
from own_kernel.policy.config import overridden
from suite.inputs import LM_ENTROPY, make_inputs
from suite.kernel.autocast import autocast_inputs, provider_call
from suite.kernel.common import add_call_arguments, require_cuda
from suite.kernel.internals import config_override, forward_lse
from suite.results import environment


def add_arguments(ap) -> None:
    ap.add_argument("what", choices=("fwd", "bwd", "bwd-filter", "host"))
    add_call_arguments(ap, note=" (host only)")
    ap.add_argument("--dist", choices=("lm", "uniform"),
                    help="the suite's inputs (default lm; not with --autocast)")
    ap.add_argument("--lm-entropy", type=float, default=LM_ENTROPY,
                    help=f"lm inputs: the targets' mean entropy in nats (default {LM_ENTROPY})")
    ap.add_argument("--trace", help="host: also write a torch.profiler trace (JSON) of 4 calls "
                    "here; the last 3 are counted (the first starts behind an idle GPU)")
    ap.add_argument("--workspace-mib", type=int, default=0,
                    help="host: the call's workspace budget (default 0: the zero budget, which the "
                    "CSV's call column names plain own)")
    ap.add_argument("--provider", help="host: profile this registered provider's call instead "
                    "(e.g. torch_compile, own_fused)")
    ap.add_argument("--autocast", action="store_true",
                    help="host: the call under bf16 autocast with an fp32 weight, on the inputs of "
                    "python -m suite kernel autocast (bf16 E, fp32 C, uniform targets); "
                    "--provider then names one of that tool's providers (torch_compile, own_ws0, "
                    "own_recompute, own_shifted, ...)")
    ap.add_argument("--csv", help="host, with --trace: append the call's row (shape, host and "
                    "wall ms, each kernel family's floors) to this CSV")


def main(args) -> int:
    require_cuda("profile")
    if args.autocast and (args.what != "host" or args.dist or args.filter or args.low_memory):
        raise SystemExit("--autocast: profiles a host call (what=host) on the autocast tool's "
                         "inputs and calls; not with --dist, --filter or --low-memory")
    if args.what != "host":
        e, c, t = _suite_inputs(args)
        launch_passes(args.what, e, c, t, args.softcap or None)
    else:
        if args.csv and not args.trace:
            raise SystemExit("--csv: needs --trace (the floors come from the trace)")
        loss_fn, overrides = _host_loss(args)
        e, c, t = (autocast_inputs(args.n, args.d, args.v) if args.autocast
                   else _suite_inputs(args))
        with overridden(overrides):
            measured = host_profile(e, c, t, args.softcap or None,
                                    "auto" if args.filter else None, args.trace,
                                    low_memory=args.low_memory, workspace_mib=args.workspace_mib,
                                    loss_fn=loss_fn, autocast=args.autocast)
        if args.csv:
            append_profile_row(args.csv, args, measured)
    torch.cuda.synchronize()
    return 0


def _suite_inputs(args):
    inp = make_inputs(args.dist or "lm", args.n, args.d, args.v, "bf16", seed=0, device="cuda",
                      softcap=args.softcap or None, target_entropy=args.lm_entropy)
    return inp["e"], inp["c"], inp["targets"]


def _host_loss(args):
    """(the loss function host_profile calls, config overrides to call it under) of --provider:
    a registered provider's call, or under --autocast the autocast tool's (its options then come
    from the provider); (None, {}) for the own call with the command line's options."""
    if not args.provider:
        return None, {}
    if args.autocast:
        try:
            provider_fn, overrides, _ = provider_call(args.provider)
        except SystemExit as exc:
            raise SystemExit(f"--provider: {exc}") from None
    else:
        from suite.catalog import PROVIDERS
        if args.provider not in PROVIDERS:
            raise SystemExit(f"--provider: unknown provider {args.provider!r}")
        provider_fn, overrides = PROVIDERS[args.provider].fn, {}

    def loss_fn(e, c, t, softcap, **_):  # the provider's own options
        return provider_fn(e, c, t, softcap=softcap)
    return loss_fn, overrides


def launch_passes(what: str, e, c, t, softcap: float | None) -> None:
    """fwd: the cuBLAS floor (E @ C.T), then the pointer and the TMA forward; bwd and
    bwd-filter: one loss+grad call, exact or filtered. At the inputs' softcap, so a profile at
    another head (--softcap 0) runs the epilogue that head runs."""
    if what == "fwd":
        e @ c.T
        for tma in (False, True):
            with config_override({"forward": {"tma": tma}}):
                forward_lse(e, c, t, softcap)
        return
    e.requires_grad_(), c.requires_grad_()
    eps = "auto" if what == "bwd-filter" else None
    linear_cross_entropy(e, c, t, softcap=softcap, filter_eps=eps).backward()


def host_profile(e, c, t, softcap, filter_eps, trace=None, calls=20, low_memory=False,
                 workspace_mib=0, loss_fn=None, autocast=False):
    """loss_fn(e, c, t, softcap=, filter_eps=, low_memory=, workspace_mib=): the loss profiled
    (default: the own kernel's linear_cross_entropy); with autocast, its forward under bf16
    autocast (the backward outside, as a training step runs it)."""
    e.requires_grad_(), c.requires_grad_()
    loss_fn = loss_fn or linear_cross_entropy

    def call():
        e.grad = c.grad = None
        with torch.autocast(e.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(e, c, t, softcap=softcap, filter_eps=filter_eps,
                           low_memory=low_memory, workspace_mib=workspace_mib)
        loss.backward()

    for _ in range(5):
        call()
    queued, wall = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        queued.append((t1 - t0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    measured = dict(host_ms=statistics.median(queued), wall_ms=statistics.median(wall))
    print(f"N={e.shape[0]} D={e.shape[1]} V={c.shape[0]} softcap={softcap} filter={filter_eps}: "
          f"host {measured['host_ms']:.3f} ms to queue a call, wall "
          f"{measured['wall_ms']:.3f} ms (medians of {calls})")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(45)
    if trace:
        from torch.profiler import ProfilerActivity, profile, record_function

        # One more call than is counted: the first starts behind an idle GPU, which waits while
        # the host queues it (a gap no call in a training loop has); print_gpu_gaps leaves out
        # what that call launched.
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(SKIPPED_CALLS + TRACED_CALLS):
                with record_function(CALL_MARK):
                    call()
            torch.cuda.synchronize()
        p.export_chrome_trace(trace)
        # the floor at the GEMMs' dtype: autocast's fp32 weight is multiplied in bf16
        measured["floor_ms"] = floor_ms(e.detach(), c.detach().to(e.dtype))
        measured["floors"] = print_gpu_gaps(trace, floor_ms=measured["floor_ms"],
                                            calls=TRACED_CALLS, skip_calls=SKIPPED_CALLS)
    return measured


# The traced calls (host_profile): each inside a CALL_MARK range, the first SKIPPED_CALLS left
# out of the accounting.
CALL_MARK = "cce_bench.profiled_call"
SKIPPED_CALLS, TRACED_CALLS = 1, 3


# A kernel family's column in the profile CSV (--csv), in floors per call.
FAMILY_COLUMNS = {
    "forward": "forward_floors",
    "recompute + softmax gradient": "recompute_floors",
    "logits -> gradient pass (three-matmul path)": "logits_grad_floors",
    "cuBLAS GEMMs (dE, dC; the three-matmul path's logits too)": "cublas_floors",
    "other own kernels": "other_own_floors",
    "torch.compile's generated kernels": "compile_kernels_floors",
    "torch ops, copies, memsets": "torch_ops_floors",
    "GPU idle": "idle_floors",
    "span of the traced calls": "span_floors",
}
PROFILE_FIELDS = (["n", "d", "v", "softcap", "lm_entropy", "call", "host_ms", "wall_ms",
                   "floor_ms", "wall_floors"] + list(FAMILY_COLUMNS.values()))


def append_profile_row(path: str, args, measured: dict) -> None:
    """One profiled call as a CSV row (PROFILE_FIELDS; a family that did not run: 0), and the
    run's env.json beside the CSV if none is there. call names what ran: the provider, or own
    with its options."""
    call = args.provider or "own" + "".join(
        f" {flag}" for flag, on in (("filter", args.filter), ("low_memory", args.low_memory),
                                    (f"workspace_mib={args.workspace_mib}", args.workspace_mib))
        if on)
    if args.autocast:
        call += " autocast"
    # rows of one CSV may come from processes with different kernel configs (env.json is once)
    if os.environ.get("CCE_OWN_CONFIG"):
        call += f" config={os.environ['CCE_OWN_CONFIG']}"
    floors = measured["floors"]
    row = dict(n=args.n, d=args.d, v=args.v, softcap=args.softcap or "",
               lm_entropy=args.lm_entropy if (args.dist or "lm") == "lm" and not args.autocast
               else "", call=call,
               host_ms=measured["host_ms"], wall_ms=measured["wall_ms"],
               floor_ms=measured["floor_ms"], wall_floors=measured["wall_ms"] / measured["floor_ms"],
               **{col: floors.get(family, 0.0) for family, col in FAMILY_COLUMNS.items()})
    new = not Path(path).exists()
    env = Path(path).with_name("env.json")  # the run's GPU, versions and commit, once
    if not env.exists():
        env.write_text(json.dumps(environment("cuda"), indent=2, default=str))
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, PROFILE_FIELDS)
        if new:
            w.writeheader()
        w.writerow({k: f"{x:.4g}" if isinstance(x, float) else x for k, x in row.items()})


def floor_ms(e, c, reps=20) -> float:
    """The suite's floor: median time of one cuBLAS E @ C.T (CUDA events, after a warm-up)."""
    with torch.no_grad():
        for _ in range(3):
            torch.mm(e, c.T)
        events = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(e, c.T)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(t) for s, t in events)


# The three-matmul path's logits-to-gradient kernels (logits_grad.py): from fp32 or 16-bit
# logits, or from the forward's shifted logits; target_shifted_grad.py's two, from cuBLAS's
# target-shifted ones
LOGITS_TO_GRAD = ("_logits_to_grad", "_shifted_to_grad", "_target_shifted_")


def kernel_family(name: str) -> str:
    """Which part of a loss+grad call a GPU operation belongs to, by its kernel's name."""
    if name.startswith("cce_fwd") or name in ("cce_target_logit_kernel", "cce_lse_combine_kernel",
                                             "cce_check_targets_kernel"):
        return "forward"
    if name.startswith("cce_dlogits"):
        return "recompute + softmax gradient"
    if name.startswith(LOGITS_TO_GRAD):
        return "logits -> gradient pass (three-matmul path)"
    if any(k in name for k in ("nvjet", "gemm", "cutlass", "xmma")):
        return "cuBLAS GEMMs (dE, dC; the three-matmul path's logits too)"
    if name.startswith("cce_"):
        return "other own kernels"
    if name.startswith("triton_"):
        return "torch.compile's generated kernels"
    return "torch ops, copies, memsets"


def own_path_of(kernel_names) -> str:
    """Which path of the own kernel a loss+grad ran, from the names of the GPU kernels it
    launched: "three-matmul" (its logits-to-gradient pass ran), "recompute" (a backward that
    recomputes the logits: the recompute or the low-memory path), or "" (no own backward ran:
    another backend, or the forward only)."""
    names = list(kernel_names)
    if any(name.startswith(LOGITS_TO_GRAD) for name in names):
        return "three-matmul"
    if any(name.startswith(("cce_dlogits", "cce_softmax_grad")) for name in names):
        return "recompute"
    return ""


def _gpu_ops(events: list, skip_calls: int) -> tuple[list, dict, list]:
    """(GPU operations in time order, launch events by correlation id, host ops) of a trace's
    complete events; with skip_calls, the operations launched inside the first skip_calls
    CALL_MARK ranges are left out (fewer ranges than that is an error naming skip_calls)."""
    launches = {ev["args"].get("correlation"): ev for ev in events
                if ev.get("cat") in ("cuda_runtime", "cuda_driver")}
    cpu_ops = [ev for ev in events if ev.get("cat") == "cpu_op"]
    gpu = sorted((ev for ev in events if ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda ev: ev["ts"])
    if skip_calls:
        # record_function's ranges ("user_annotation"); a call's backward launches from
        # autograd's device thread, so what a range holds is what launched during it, any thread
        marks = sorted((ev for ev in events if ev.get("name") == CALL_MARK
                        and ev.get("cat") in ("user_annotation", "cpu_op")),
                       key=lambda ev: ev["ts"])
        if len(marks) <= skip_calls:
            raise ValueError(f"skip_calls: {skip_calls} calls to leave out, but the trace marks "
                             f"{len(marks)} ({CALL_MARK!r} ranges)")
        skipped = marks[:skip_calls]

        def in_skipped(ev):
            launch = launches.get(ev.get("args", {}).get("correlation"))
            return launch is not None and any(
                m["ts"] <= launch["ts"] <= m["ts"] + m["dur"] for m in skipped)

        gpu = [ev for ev in gpu if not in_skipped(ev)]
    return gpu, launches, cpu_ops


def _print_longest_gaps(gaps: list, launches: dict, cpu_ops: list, top: int) -> None:
    """The longest gaps, each with the host operation that launched the GPU op after it."""
    def launched_by(ev):
        launch = launches.get(ev["args"].get("correlation"))
        if launch is None:
            return "?"
        inside = [op for op in cpu_ops if op["tid"] == launch["tid"]
                  and op["ts"] <= launch["ts"] <= op["ts"] + op["dur"]]
        return min(inside, key=lambda op: op["dur"])["name"] if inside else launch["name"]

    for gap, ev in sorted(gaps, key=lambda x: -x[0])[:top]:
        print(f"  {gap:8.1f} us before {ev['name'][:60]!r} (launched in {launched_by(ev)[:50]!r})")


def _print_floors(gpu: list, span: float, busy: float, floor_ms: float, calls: int) -> dict:
    """Each kernel family's GPU time per call in floors, with "GPU idle" and "span of the
    traced calls"; printed and returned."""
    families: dict = {}
    for ev in gpu:
        family = kernel_family(ev["name"])
        families[family] = families.get(family, 0.0) + ev["dur"]
    per_call = 1e3 * calls * floor_ms  # us of the traced calls per floor and call
    print(f"Per call, in floors (one E @ C.T = {floor_ms:.3f} ms):")
    for family, us in sorted(families.items(), key=lambda x: -x[1]):
        print(f"  {us / per_call:6.3f}  {family}")
    floors = {family: us / per_call for family, us in families.items()}
    floors["GPU idle"] = (span - busy) / per_call
    floors["span of the traced calls"] = span / per_call
    for family in ("GPU idle", "span of the traced calls"):
        print(f"  {floors[family]:6.3f}  {family}")
    return floors


def print_gpu_gaps(trace_path: str, min_gap_us: float = 20.0, top: int = 15,
                   floor_ms: float | None = None, calls: int = 1, skip_calls: int = 0) -> dict:
    """Where the GPU idled in a torch.profiler trace: its busy time against the span of the
    traced calls, and the longest gaps between GPU operations, each with the host operation
    that launched the next one (the host was still busy there, or waiting). skip_calls: leave
    out what the first skip_calls calls (CALL_MARK ranges) launched, so the span starts at the
    next call's first GPU operation. With floor_ms (one E @ C.T) and the number of calls
    counted: each kernel family's time per call in floors (four matmuls' worth is the least a
    loss+grad call can cost), printed and returned (with "GPU idle" and "span of the traced
    calls"); else {}."""
    with open(trace_path) as f:
        events = [ev for ev in json.load(f)["traceEvents"] if ev.get("ph") == "X"]
    gpu, launches, cpu_ops = _gpu_ops(events, skip_calls)
    if not gpu:
        print("no GPU operations in the trace")
        return {}
    busy, gaps, end = 0.0, [], gpu[0]["ts"]
    for ev in gpu:
        if ev["ts"] > end + min_gap_us:
            gaps.append((ev["ts"] - end, ev))
        busy += max(0.0, ev["ts"] + ev["dur"] - max(ev["ts"], end))
        end = max(end, ev["ts"] + ev["dur"])
    span = end - gpu[0]["ts"]
    left_out = f", the first {skip_calls} call(s) left out" if skip_calls else ""
    print(f"GPU busy {busy / 1e3:.3f} ms of {span / 1e3:.3f} ms traced "
          f"({len(gpu)} GPU operations{left_out}); {len(gaps)} gaps over {min_gap_us:.0f} us, "
          f"{sum(g for g, _ in gaps) / 1e3:.3f} ms in all. Longest:")
    _print_longest_gaps(gaps, launches, cpu_ops, top)
    totals: dict = {}
    for ev in gpu:
        count, us = totals.get(ev["name"][:60], (0, 0.0))
        totals[ev["name"][:60]] = (count + 1, us + ev["dur"])
    print("GPU time by operation (the calls counted):")
    for name, (count, us) in sorted(totals.items(), key=lambda x: -x[1][1])[:top]:
        print(f"  {us / 1e3:8.3f} ms {count:5d}x {name!r}")
    return _print_floors(gpu, span, busy, floor_ms, calls) if floor_ms else {}
