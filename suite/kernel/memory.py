"""What is alive at the own kernel's memory peak: `python -m suite kernel memory [--filter]
[--workspace-mib MIB]`.

Runs forward + backward once (after a warm-up call, so compilation and cuBLAS workspaces are
settled), with the CUDA caching allocator's history recorded, replays the trace to find the
moment of the largest allocated total and lists the blocks alive then, with the source line that
allocated each. This is how the loss+grad memory beyond the gradients is accounted for.
"""
import torch

from own_kernel import linear_cross_entropy
from suite.kernel.common import add_call_arguments, require_cuda


def _site(frames) -> str:
    """The innermost frame in this repository (else the innermost Python frame)."""
    for f in frames:
        name = f.get("filename", "")
        if "own_kernel" in name or "suite" in name:
            return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    for f in frames:
        if f.get("filename", "").endswith(".py"):
            return f"{f['filename'].rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    return "?"


def peak_breakdown(trace: list[dict]) -> tuple[int, list[tuple[int, str]]]:
    """(peak bytes above the trace's start, [(bytes, site)] alive at the peak), from the
    allocator's trace events (alloc / free_completed)."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames", [])))
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return peak, sorted(at_peak.values(), reverse=True)


def add_arguments(ap) -> None:
    add_call_arguments(ap)
    ap.add_argument("--workspace-mib", type=int, default=None,
                    help="the call's workspace_mib (default: the config's; 0: the recompute path)")
    ap.add_argument("--list-kib", type=float, default=1024.0,
                    help="list each block alive at the peak of at least this many KiB (default "
                         "1024); the smaller ones are summed in one line")


def main(args) -> int:
    require_cuda("memory")  # it reads the CUDA allocator's trace
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    n, d, v = args.n, args.d, args.v
    e = (torch.randn(n, d, device=dev, generator=g) * d**-0.5).bfloat16().requires_grad_()
    c = torch.randn(v, d, device=dev, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device=dev, generator=g)
    eps = "auto" if args.filter else None
    softcap = args.softcap or None

    def step():
        e.grad = c.grad = None
        linear_cross_entropy(e, c, t, softcap=softcap, filter_eps=eps,
                             low_memory=args.low_memory,
                             workspace_mib=args.workspace_mib).backward()
        torch.cuda.synchronize()

    step()
    e.grad = c.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    step()
    measured = torch.cuda.max_memory_allocated() - before
    trace = torch.cuda.memory._snapshot()["device_traces"][dev.index or 0]
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, alive = peak_breakdown(trace)
    grads = (n * d + v * d) * e.element_size()
    mib = 2**20
    print(f"N={n} D={d} V={v} softcap={softcap} filter={eps} low_memory={args.low_memory}: peak extra {measured / mib:.1f} MiB "
          f"(trace replay {peak / mib:.1f}); gradients dE+dC {grads / mib:.1f} MiB; "
          f"ratio {measured / grads:.3f}")
    listed = args.list_kib * 1024
    for size, site in alive:
        if size >= listed:
            print(f"  {size / mib:11.3f} MiB  {site}")
    rest = sum(s for s, _ in alive if s < listed)
    print(f"  {rest / mib:11.3f} MiB  (blocks under {args.list_kib:g} KiB, "
          f"{sum(1 for s, _ in alive if s < listed)})")
    return 0
