"""Why own_filter is slower after another provider ran in the same process, and where the time
goes: the suite's measurement of own_filter (loss+grad) alone, after naive, after torch.compile,
with the cycle collector off / frozen, each followed by a profile of a few calls (host wall
time vs. GPU kernel time per call, and the host's top operations).

    python own_kernel/measurements/order-n2048-v256000/probe.py [--n 2048 --d 2304 --v 256000]
"""
import argparse
import gc
import time

import torch
from torch.profiler import ProfilerActivity, profile

from suite import registry
from suite.inputs import make_inputs
from suite.measure import _Leaves, free_memory, measure_provider
from suite.reference import reference

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=2048)
ap.add_argument("--d", type=int, default=2304)
ap.add_argument("--v", type=int, default=256000)
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()
dev = torch.device("cuda")
inputs = make_inputs("lm", args.n, args.d, args.v, "bf16", seed=0, device=dev)
ref = reference(inputs["e"], inputs["c"], inputs["targets"])
free_memory(dev)
summary = []


def suite_ms(name):
    row = measure_provider(registry.get(name), inputs, ref, phases=["loss+grad"], softcap=None,
                           ignore_index=-100, reps=args.reps, warmup=2, floor_ms=None,
                           n=args.n, v=args.v, d=args.d)[0]
    return row.get("ms", float("nan")), row["status"]


def probe(label, calls=5):
    """own_filter and own as the suite times them, then a profile of own_filter's calls."""
    ms, status = suite_ms("own_filter")
    own_ms, _ = suite_ms("own")
    x = _Leaves(inputs, grad=True)
    fn = registry.get("own_filter").fn
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            x.clear_grads()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(x.e, x.c, x.targets).backward()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
    del x
    free_memory(dev)
    events = prof.key_averages()
    gpu_ms = sum(ev.self_device_time_total for ev in events) / 1e3 / calls
    count = {ev.key: ev.count // calls for ev in events}
    print(f"\n=== {label}: suite own_filter {ms:.2f} ms ({status}), own {own_ms:.2f} ms; "
          f"profiled wall {min(walls):.2f}-{max(walls):.2f} ms, GPU kernels {gpu_ms:.2f} ms/call")
    print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
    summary.append((label, ms, own_ms, min(walls), gpu_ms,
                    count.get("cudaMalloc", 0), count.get("cudaHostAlloc", 0)))


def run_peer(name):
    ms, status = suite_ms(name)
    print(f"--- {name}: {ms:.2f} ms ({status})")


probe("alone")
run_peer("naive")
probe("after naive")
gc.disable()
probe("after naive, gc off")
gc.enable()
run_peer("torch_compile")
probe("after torch_compile")
gc.collect()
gc.freeze()
probe("after torch_compile, gc frozen")
run_peer("naive")
probe("after naive again, gc frozen")

print("\n| when | own_filter ms | own ms | profiled wall ms | GPU kernel ms | cudaMalloc/call | cudaHostAlloc/call |")
print("|---|---|---|---|---|---|---|")
for label, ms, own_ms, wall, gpu, mallocs, host_allocs in summary:
    print(f"| {label} | {ms:.2f} | {own_ms:.2f} | {wall:.2f} | {gpu:.2f} | {mallocs} | {host_allocs} |")
