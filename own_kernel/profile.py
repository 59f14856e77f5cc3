"""Launch the own kernel's passes once at the Gemma 2 (2B) shape, for a hardware-counter
profiler (nothing is timed here):

    ncu --clock-control none -k regex:"cce_fwd|nvjet" --section SpeedOfLight \\
        python -m own_kernel.profile fwd          # cuBLAS floor, pointer and TMA forward
    ncu --clock-control none -k regex:softmax_grad --launch-skip 20 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python -m own_kernel.profile bwd

and where the host's time goes (Python's profiler over whole loss+grad calls, after the host
time to queue a call and the call's wall time; at small shapes the host, not the GPU, sets the
pace): python -m own_kernel.profile host --n 2048 --v 20000 --softcap 0 [--filter]
"""
import argparse
import cProfile
import json
import os
import pstats
import statistics
import time

import torch

from own_kernel import linear_cross_entropy
from own_kernel.configs import config_for
from own_kernel.forward import forward


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("fwd", "bwd", "bwd-filter", "host"))
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    ap.add_argument("--softcap", type=float, default=30.0, help="0 = none (host only)")
    ap.add_argument("--filter", action="store_true", help="filter_eps='auto' (host only)")
    ap.add_argument("--trace", help="host: also write a torch.profiler trace (JSON) of 3 calls here")
    args = ap.parse_args(argv)
    from suite.inputs import make_inputs

    inp = make_inputs("lm", args.n, args.d, args.v, "bf16", seed=0, device="cuda", softcap=30.0)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    if args.what == "host":
        host_profile(e, c, t, args.softcap or None, "auto" if args.filter else None, args.trace)
    elif args.what == "fwd":
        e @ c.T
        for tma in (False, True):
            os.environ["CCE_OWN_CONFIG"] = json.dumps({"fwd": {"TMA": tma}})
            forward(e, c, None, t, 30.0, 0.0, -100, config_for(e.device, e.dtype))
    else:
        e.requires_grad_(), c.requires_grad_()
        eps = "auto" if args.what == "bwd-filter" else None
        linear_cross_entropy(e, c, t, softcap=30.0, filter_eps=eps).backward()
    torch.cuda.synchronize()


def host_profile(e, c, t, softcap, filter_eps, trace=None, calls=20):
    e.requires_grad_(), c.requires_grad_()

    def call():
        e.grad = c.grad = None
        linear_cross_entropy(e, c, t, softcap=softcap, filter_eps=filter_eps).backward()

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
    print(f"N={e.shape[0]} D={e.shape[1]} V={c.shape[0]} softcap={softcap} filter={filter_eps}: "
          f"host {statistics.median(queued):.3f} ms to queue a call, wall "
          f"{statistics.median(wall):.3f} ms (medians of {calls})")
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
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        p.export_chrome_trace(trace)


if __name__ == "__main__":
    main()
