"""Where a multi-GPU training step's GPU time goes: a torch.profiler trace of a few steps of one
rank, summarised per stream and per kernel family.

Under FSDP2 each rank runs its compute on one stream and NCCL's all-gathers and
reduce-scatters on others; a step is fast when the collectives hide under compute. The summary
says how much of each stream was busy, how much NCCL time no compute kernel covered
(``nccl_exposed_ms``), how long the compute stream sat idle (``compute_idle_ms``) and, for its
longest gaps, which kernels bracket them and which collective ran meanwhile: what the compute
stream waited for. Families: ``nccl``, ``own`` (this project's kernels), ``gemm`` (cuBLAS /
CUTLASS), ``other`` (elementwise, copies, torch.compile's and others' Triton kernels).

Each collective is also charged to the FSDP unit whose hook launched it (``unit_collectives``):
the innermost ``FSDP::...`` annotation around the host call that launched the kernel, matched
through the trace's correlation ids. ``root`` is the unit fully_shard gave the whole model, which
holds what no layer does (here the embedding, the final norm and lm_head): the loss's unit.

    python -m suite.train.step_profile RUN_DIR   # its traces -> RUN_DIR/profile_units.csv

Pure functions on kernel records (``Kernel``) so that the arithmetic is tested on the CPU;
``kernels_from_chrome_trace`` reads the records from the trace torch.profiler exports.
"""
from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

OWN_PREFIXES = ("cce_", "_logits_to_grad", "_shifted_to_grad", "_scale_kernel")
GEMM_MARKERS = ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_")
TOP_GAPS = 5
COLLECTIVES = ("AllGather", "ReduceScatter", "AllReduce", "Broadcast")
UNIT_FIELDS = ["config", "unit", "collective", "calls_per_step", "ms", "exposed_ms"]


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of the trace: name, stream, start and duration in microseconds; unit: the
    FSDP unit whose hook launched it ("" where none did)."""
    name: str
    stream: int
    ts_us: float
    dur_us: float
    unit: str = ""

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


def collective(name: str) -> str:
    """AllGather, ReduceScatter, AllReduce, Broadcast or other, from an NCCL kernel's name."""
    return next((op for op in COLLECTIVES if op.lower() in name.lower()), "other")


def fsdp_unit(annotation: str) -> str:
    """"FSDP::all_gather (model.layers.3)" -> "model.layers.3"; no module named -> "root"."""
    found = re.search(r"\((.+)\)\s*$", annotation)
    return found.group(1) if found else "root"


def _launch_units(events: list[dict]) -> dict:
    """correlation id -> the FSDP unit of the innermost FSDP annotation around its launch.
    One sweep per host thread in time order, holding the annotations open at each launch, so
    that a trace of many launches and annotations costs their sum, not their product."""
    spans: dict = {}
    launches: dict = {}
    for ev in events:
        if ev.get("cat") == "user_annotation" and ev.get("name", "").startswith("FSDP::"):
            spans.setdefault(ev.get("tid"), []).append(ev)
        elif (ev.get("cat") in ("cuda_runtime", "cuda_driver")
              and ev.get("args", {}).get("correlation") is not None):
            launches.setdefault(ev.get("tid"), []).append(ev)
    out = {}
    for tid, calls in launches.items():
        pending = sorted(spans.get(tid, ()), key=lambda a: a["ts"])
        open_spans: list[dict] = []
        i = 0
        for ev in sorted(calls, key=lambda e: e["ts"]):
            while i < len(pending) and pending[i]["ts"] <= ev["ts"]:
                open_spans.append(pending[i])
                i += 1
            open_spans = [a for a in open_spans if ev["ts"] <= a["ts"] + a.get("dur", 0.0)]
            if open_spans:
                inner = min(open_spans, key=lambda a: a.get("dur", 0.0))
                out[ev["args"]["correlation"]] = fsdp_unit(inner["name"])
    return out


def kernels_from_chrome_trace(trace: dict) -> list[Kernel]:
    """The GPU kernels of a torch.profiler chrome trace (events of category "kernel"), each
    NCCL kernel with the FSDP unit that launched it."""
    events = trace.get("traceEvents", [])
    units = _launch_units(events)
    out = []
    for ev in events:
        if ev.get("cat") == "kernel" and "dur" in ev:
            args = ev.get("args", {})
            unit = units.get(args.get("correlation"), "") if "nccl" in ev["name"].lower() else ""
            out.append(Kernel(ev.get("name", ""), int(args.get("stream", ev.get("tid", 0))),
                              float(ev["ts"]), float(ev["dur"]), unit))
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
    """How much of ``interval`` the (merged, sorted, so disjoint and ordered) ``cover``
    intervals overlap; a binary search finds the first that can."""
    a, b = interval
    i = max(bisect.bisect_right(cover, (a, float("inf"))) - 1, 0)  # last starting at or before a
    total = 0.0
    while i < len(cover) and cover[i][0] < b:  # by index: a slice would copy the tail
        x, y = cover[i]
        total += max(0.0, min(b, y) - max(a, x))
        i += 1
    return total


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
    nccl = [k for k in kernels if family(k.name) == "nccl"]
    cover = _compute_cover(kernels)  # once: the NCCL totals and the per-unit rows share it
    exposed = sum((b - a) - _covered((a, b), cover)
                  for a, b in _union([(k.ts_us, k.end_us) for k in nccl]))
    units = unit_collectives(kernels, steps, cover)
    return {
        "profiled_steps": steps, "kernels": len(kernels) // max(steps, 1),
        "compute_stream": main,
        **_compute_stream_times([k for k in kernels if k.stream == main], nccl, per),
        **{f"{f}_ms": t / per for f, t in _sums(kernels, lambda k: family(k.name)).items()},
        **{f"nccl_{op}_ms": t / per for op, t in _sums(nccl, lambda k: collective(k.name)).items()},
        "nccl_exposed_ms": exposed / per,
        "root_nccl_ms": sum(u["ms"] for u in units if u["unit"] == "root"),
        "root_nccl_exposed_ms": sum(u["exposed_ms"] for u in units if u["unit"] == "root"),
        "fsdp_units": units,
    }


def _sums(kernels: list[Kernel], key) -> dict[str, float]:
    """Kernel time (us) per ``key(kernel)``, keys sorted."""
    out: dict[str, float] = {}
    for k in kernels:
        out[key(k)] = out.get(key(k), 0.0) + k.dur_us
    return dict(sorted(out.items()))


def _compute_stream_times(compute: list[Kernel], nccl: list[Kernel], per: float) -> dict:
    """The compute stream's window, busy and idle time (ms per step), and its TOP_GAPS longest
    gaps, each with the kernels around it and the collectives that ran during it."""
    gaps = [(nxt.ts_us - prev.end_us, prev, nxt)
            for prev, nxt in zip(compute, compute[1:]) if nxt.ts_us > prev.end_us]
    window = (compute[-1].end_us - compute[0].ts_us) if compute else 0.0
    busy = sum(b - a for a, b in _union([(k.ts_us, k.end_us) for k in compute]))
    top = sorted(gaps, key=lambda g: -g[0])[:TOP_GAPS]
    return {
        "compute_window_ms": window / per, "compute_busy_ms": busy / per,
        "compute_idle_ms": sum(g for g, _, _ in gaps) / per,
        "top_gaps": [{"gap_ms": g / 1e3, "after": _short(p.name), "before": _short(n.name),
                      "nccl_during": sorted({_short(k.name) for k in nccl
                                             if k.ts_us < n.ts_us and k.end_us > p.end_us})}
                     for g, p, n in top],
    }


def _compute_cover(kernels: list[Kernel]) -> list[tuple[float, float]]:
    return _union([(k.ts_us, k.end_us) for k in kernels if family(k.name) != "nccl"])


def _exposed(k: Kernel, cover: list[tuple[float, float]]) -> float:
    """How much of kernel k ran under no compute kernel (us)."""
    return k.dur_us - _covered((k.ts_us, k.end_us), cover)


def unit_collectives(kernels: list[Kernel], steps: int, cover=None) -> list[dict]:
    """Per FSDP unit and collective, per step: calls, ms and the ms no compute kernel covered
    (most exposed first); NCCL kernels no FSDP hook launched are unit "-". ``cover``: the
    kernels' _compute_cover where the caller has it."""
    cover = _compute_cover(kernels) if cover is None else cover
    per, rows = 1e3 * max(steps, 1), {}
    for k in kernels:
        if family(k.name) == "nccl":
            row = rows.setdefault((k.unit or "-", collective(k.name)), [0, 0.0, 0.0])
            row[0] += 1
            row[1] += k.dur_us
            row[2] += _exposed(k, cover)
    out = [{"unit": unit, "collective": op, "calls_per_step": n / max(steps, 1),
            "ms": dur / per, "exposed_ms": exposed / per}
           for (unit, op), (n, dur, exposed) in rows.items()]
    return sorted(out, key=lambda r: (-r["exposed_ms"], r["unit"], r["collective"]))


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 1] + "~"


def read_trace(path: Path) -> list[Kernel]:
    """The kernels of a chrome trace file (gzipped where its name ends in .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return kernels_from_chrome_trace(json.load(f))


def summarise_trace_file(path: Path, steps: int) -> dict:
    return summarise(read_trace(path), steps)


def write_units_csv(run_dir: Path) -> Path:
    """Every ``trace_<config>.json.gz`` of a training run folder, re-read: its per-unit
    collectives (``unit_collectives``) into ``profile_units.csv``, one block of rows per
    configuration; the profiled steps per trace from the folder's ``profile.csv``."""
    run_dir = Path(run_dir)
    with open(run_dir / "profile.csv", newline="") as f:
        steps = {r["config"]: int(r["profiled_steps"]) for r in csv.DictReader(f)}
    rows = []
    for name, n in steps.items():
        trace = run_dir / f"trace_{name.replace('@', '-at-')}.json.gz"
        if not trace.exists():
            raise FileNotFoundError(f"{trace}: profile.csv names {name} but its trace is missing")
        rows += [{"config": name, **r} for r in unit_collectives(read_trace(trace), n)]
    out = run_dir / "profile_units.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=UNIT_FIELDS)
        w.writeheader()
        w.writerows(rows)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m suite.train.step_profile",
                                description="A training run's traces -> per-FSDP-unit "
                                            "collectives (profile_units.csv).")
    p.add_argument("run_dir", type=Path, help="a suite.train.distributed --out folder run "
                   "with --profile-steps")
    print(f"step-profile: wrote {write_units_csv(p.parse_args(argv).run_dir)}")


if __name__ == "__main__":
    main()
