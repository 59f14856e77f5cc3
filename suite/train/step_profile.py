"""Where a multi-GPU training step's GPU time goes: a torch.profiler trace of a few steps of one
rank, summarised per stream and per kernel family.

Under FSDP2 each rank runs its compute on one stream and NCCL's all-gathers and
reduce-scatters on others; a step is fast when the collectives hide under compute. The summary
says how much of each stream was busy, how much NCCL time no compute kernel covered
(``nccl_exposed_ms``), how long the compute stream sat idle (``compute_idle_ms``) and, for its
longest gaps, which kernels bracket them and which collective ran meanwhile: what the compute
stream waited for. Families: ``nccl``, ``own`` (this project's kernels), ``gemm`` (cuBLAS /
CUTLASS), ``other`` (elementwise, copies, torch.compile's and others' Triton kernels).

Pure functions on kernel records (``Kernel``) so that the arithmetic is tested on the CPU;
``kernels_from_chrome_trace`` reads the records from the trace torch.profiler exports.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

OWN_PREFIXES = ("cce_", "_logits_to_grad", "_shifted_to_grad", "_scale_kernel")
GEMM_MARKERS = ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_")
TOP_GAPS = 5


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of the trace: name, stream, start and duration in microseconds."""
    name: str
    stream: int
    ts_us: float
    dur_us: float

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


def family(name: str) -> str:
    lower = name.lower()
    if "nccl" in lower:
        return "nccl"
    if name.startswith(OWN_PREFIXES):
        return "own"
    if any(m in lower for m in GEMM_MARKERS):
        return "gemm"
    return "other"


def kernels_from_chrome_trace(trace: dict) -> list[Kernel]:
    """The GPU kernels of a torch.profiler chrome trace (events of category "kernel")."""
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") == "kernel" and "dur" in ev:
            stream = ev.get("args", {}).get("stream", ev.get("tid", 0))
            out.append(Kernel(ev.get("name", ""), int(stream), float(ev["ts"]), float(ev["dur"])))
    return sorted(out, key=lambda k: k.ts_us)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _covered(interval: tuple[float, float], cover: list[tuple[float, float]]) -> float:
    """How much of ``interval`` the (merged, sorted) ``cover`` intervals overlap."""
    a, b = interval
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in cover if y > a and x < b)


def compute_stream(kernels: list[Kernel]) -> int | None:
    """The stream with the most non-NCCL kernel time (the default stream in practice)."""
    busy: dict[int, float] = {}
    for k in kernels:
        if family(k.name) != "nccl":
            busy[k.stream] = busy.get(k.stream, 0.0) + k.dur_us
    return max(busy, key=busy.get) if busy else None


def summarise(kernels: list[Kernel], steps: int) -> dict:
    """Per-step averages (ms) of the profiled window: per-family kernel time, NCCL time by
    collective and the part no compute kernel covered, the compute stream's idle time between
    its first and last kernel, and its longest gaps with their neighbours."""
    if not kernels:
        return {"profiled_steps": steps, "kernels": 0}
    per = 1e3 * max(steps, 1)  # us -> ms per step
    main = compute_stream(kernels)
    compute = [k for k in kernels if k.stream == main]
    nccl = [k for k in kernels if family(k.name) == "nccl"]
    fam: dict[str, float] = {}
    for k in kernels:
        fam[family(k.name)] = fam.get(family(k.name), 0.0) + k.dur_us
    collectives: dict[str, float] = {}
    for k in nccl:
        op = next((o for o in ("AllGather", "ReduceScatter", "AllReduce", "Broadcast")
                   if o.lower() in k.name.lower()), "other")
        collectives[op] = collectives.get(op, 0.0) + k.dur_us
    compute_cover = _union([(k.ts_us, k.end_us) for k in kernels if family(k.name) != "nccl"])
    nccl_union = _union([(k.ts_us, k.end_us) for k in nccl])
    exposed = sum((b - a) - _covered((a, b), compute_cover) for a, b in nccl_union)
    gaps = [(nxt.ts_us - prev.end_us, prev, nxt)
            for prev, nxt in zip(compute, compute[1:]) if nxt.ts_us > prev.end_us]
    window = (compute[-1].end_us - compute[0].ts_us) if compute else 0.0
    top = sorted(gaps, key=lambda g: -g[0])[:TOP_GAPS]
    return {
        "profiled_steps": steps, "kernels": len(kernels) // max(steps, 1),
        "compute_stream": main, "compute_window_ms": window / per,
        "compute_busy_ms": sum(b - a for a, b in _union([(k.ts_us, k.end_us)
                                                        for k in compute])) / per,
        "compute_idle_ms": sum(g for g, _, _ in gaps) / per,
        **{f"{f}_ms": t / per for f, t in sorted(fam.items())},
        **{f"nccl_{op}_ms": t / per for op, t in sorted(collectives.items())},
        "nccl_exposed_ms": exposed / per,
        "top_gaps": [{"gap_ms": g / 1e3, "after": _short(p.name), "before": _short(n.name),
                      "nccl_during": sorted({_short(k.name) for k in nccl
                                             if k.ts_us < n.ts_us and k.end_us > p.end_us})}
                     for g, p, n in top],
    }


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 1] + "~"


def summarise_trace_file(path: Path, steps: int) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return summarise(kernels_from_chrome_trace(json.load(f)), steps)
