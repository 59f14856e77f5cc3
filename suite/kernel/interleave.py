"""Config variants of the own kernel timed in one process, their calls interleaved:
`python -m suite kernel interleave --out DIR --heads 8192x4096x128256,8192x4608x256000x30
--variants 'flat={"forward": {"flatten": true}}' [--budgets default,4096] [--compile]
[--low-memory]`.

Why not `suite bench --variant`: there each variant runs in a process of its own per round, so
two configs are compared across processes (another clock state, another compile) and each
process pays its compiles. Here every entry (a variant at a budget, and torch.compile's naive
loss with --compile) is called once per sweep, in turn, the order reversed every other sweep,
for --reps sweeps: drift of the GPU's clocks hits every entry alike, and the p20-p80 rule
compares neighbours in time. The floor (one cuBLAS E @ C.T) is one more entry of the sweeps,
so the floors column divides times taken side by side. Each head's torch.compile compiles
afresh for its shapes: one compile for every head would time dynamo's dynamic-shape graph at
each head after the first. The base variant (the config in force,
`{}`) always runs. The two methods can disagree beyond their noise: large matmuls run at the
GPU's power cap, where interleaved entries share the clock their mix sets, and a kernel that
draws more power than its neighbours gets a clock it would not get alone
(results/notes/gluon-forward.md#the-power-cap-why-the-two-methods-disagree). So check a
default's change with both: `--order blocked` times each entry's calls back to back in this
process, at the clock its own power sets (`--settle K`: after K untimed calls per block, as the
clock lags a change of kernel), and `--clocks` reads the SM clock, power and NVML's
clock-limiting reasons while each call runs (suite/clocks.py).

Per head (NxDxV[xS], S its softcap) and entry, a row of DIR/interleave.csv: the route's path
and chunks, median, p20 and p80 ms of the timed calls (L2 flushed before each, outside the
timed region), the cuBLAS floor (one E @ C.T) and the time in floors, ms over the base's and
over torch.compile's at the same budget with their verdicts (vs_base, vs_compile: faster,
slower or level by the p20-p80 rule, suite/report/verdict.py), the peak MiB beyond the inputs
of one call (its gradients included), and dE's and dC's relative difference from the base
variant's at the same budget (0 where a variant only reschedules the same arithmetic). A
failing entry (OOM, a compile error) is recorded as its row's status and the run goes on.
DIR/env.json records the environment. lm inputs (suite.inputs), bf16 unless --dtype says.
With --clocks, the median SM clock (MHz) and power (W) of the entry's samples, and the
fraction of them and the names of the reasons NVML gave for a limited clock.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
from dataclasses import dataclass

import torch

from suite.report.verdict import time_verdict

MIB = 2**20
FIELDS = ["head", "n", "d", "v", "softcap", "budget", "entry", "overrides", "status", "path",
          "chunks", "ms", "ms_p20", "ms_p80", "reps", "floor_ms", "floors", "ms_over_base",
          "ms_over_compile", "vs_base", "vs_compile", "peak_mib", "de_diff_vs_base",
          "dc_diff_vs_base", "device", "order", "settle", "sm_mhz", "power_w", "clock_limited",
          "clock_reasons"]
COMPILE = "torch_compile"
FLOOR = "cublas_floor"   # one E @ C.T, timed in the sweeps beside the entries


@dataclass(frozen=True)
class Entry:
    """One timed call: a config variant (name, overrides) at a budget, or torch.compile."""
    variant: str
    overrides: dict
    budget: int | None          # workspace_mib; None: the call's default

    @property
    def name(self) -> str:
        at = "" if self.budget is None else f"@ws{self.budget}"
        return self.variant if self.variant == COMPILE else f"{self.variant}{at}"


def parse_head(text: str) -> tuple[int, int, int, float | None]:
    """(n, d, v, softcap) of "NxDxV" or "NxDxVxS"; a malformed head is an error naming it."""
    parts = text.strip().split("x")
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        n, d, v = (int(p) for p in parts[:3])
        softcap = float(parts[3]) if len(parts) == 4 else None
    except ValueError:
        raise SystemExit(f"--heads: expected NxDxV or NxDxVxS, got {text!r}") from None
    if min(n, d, v) < 1 or (softcap is not None and softcap <= 0):
        raise SystemExit(f"--heads: sizes and softcap must be positive, got {text!r}")
    return n, d, v, softcap


def parse_variants(items: list[str]) -> list[tuple[str, dict]]:
    """[("base", {}), (name, overrides), ...] of NAME=JSON items."""
    variants = [("base", {})]
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name or name in ("base", COMPILE, FLOOR) or "@" in name:
            raise SystemExit(f"--variants: expected NAME=JSON (a new name without '@'), "
                             f"got {item!r}")
        try:
            overrides = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--variants: {name}'s JSON: {exc}") from None
        if not isinstance(overrides, dict):
            raise SystemExit(f"--variants: {name}'s JSON must be an object")
        variants.append((name, overrides))
    return variants


def parse_budgets(text: str) -> list[int | None]:
    """[None (the default budget) or MiB, ...] of "default,4096"."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if item == "default":
            out.append(None)
        elif item.isdigit():
            out.append(int(item))
        else:
            raise SystemExit(f"--budgets: expected 'default' or MiB, got {item!r}")
    return out


def entries(variants, budgets, with_compile: bool) -> list[Entry]:
    out = [Entry(name, ov, b) for b in budgets for name, ov in variants]
    return out + ([Entry(COMPILE, {}, None)] if with_compile else [])


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="folder for interleave.csv and env.json")
    ap.add_argument("--heads", required=True, help="NxDxV[xS],... (S: the softcap)")
    ap.add_argument("--variants", nargs="*", default=[],
                    help="NAME=JSON config overrides, each timed beside the base ({})")
    ap.add_argument("--budgets", default="default",
                    help="workspace_mib values: 'default' (the call's) or MiB, e.g. default,4096")
    ap.add_argument("--low-memory", action="store_true",
                    help="every own entry's call with low_memory=True (the low-memory path)")
    ap.add_argument("--compile", action="store_true",
                    help="also torch.compile of the naive loss, interleaved with the rest")
    ap.add_argument("--phase", choices=("loss+grad", "fwd"), default="loss+grad",
                    help="fwd: the loss under torch.no_grad (the forward-only route)")
    ap.add_argument("--reps", type=int, default=20, help="sweeps (timed calls per entry)")
    ap.add_argument("--order", choices=("interleaved", "blocked"), default="interleaved",
                    help="blocked: each entry's calls back to back (half in entry order, half "
                         "reversed), so a kernel follows itself: beside an interleaved run, "
                         "whether a time depends on the kernels run between its calls")
    ap.add_argument("--settle", type=int, default=0, metavar="K",
                    help="with --order blocked: K untimed calls before each block, so that at the "
                         "power cap the clock has moved to the entry's own before it is timed")
    ap.add_argument("--clocks", action="store_true",
                    help="also each entry's SM clock, power and clock-limiting reasons, read by "
                         "NVML while its calls run (suite/clocks.py; needs nvidia-ml-py); "
                         "each call then waits for the one before")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--device", default="cuda",
                    help="cuda, or cpu (TRITON_INTERPRET=1, fp16 or fp32: tools' tests)")


def _call(entry: Entry, inputs: dict, softcap, phase: str, low_memory: bool = False):
    """A function of no arguments making entry's call once (backward included)."""
    from own_kernel import linear_cross_entropy
    from own_kernel.policy.config import overridden
    from suite.providers.naive import torch_compile

    e, c, t = inputs["e"], inputs["c"], inputs["targets"]

    def loss():
        if entry.variant == COMPILE:
            return torch_compile(e, c, t, softcap=softcap)
        return linear_cross_entropy(e, c, t, softcap=softcap, workspace_mib=entry.budget,
                                    low_memory=low_memory)

    def run():
        with overridden(entry.overrides):
            if phase == "fwd":
                with torch.no_grad():
                    loss()
            else:
                loss().backward()
    return run


def _route_fields(entry: Entry, inputs: dict, softcap, low_memory: bool = False) -> dict:
    if entry.variant == COMPILE:
        return {}
    import own_kernel
    from own_kernel.policy.config import overridden

    with overridden(entry.overrides):
        p = own_kernel.plan(inputs["e"], inputs["c"], inputs["targets"], softcap=softcap,
                            workspace_mib=entry.budget, low_memory=low_memory)
    return {"path": p.path, "chunks": p.chunks}


def _peak_and_grads(run, inputs: dict, device) -> tuple[float, tuple]:
    """Peak MiB beyond the inputs of one call (its gradients included) and the gradients."""
    from suite.measure import sync

    e, c = inputs["e"], inputs["c"]
    e.grad = c.grad = None
    sync(device)
    cuda = device.type == "cuda"
    before = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    run()
    sync(device)
    peak = (torch.cuda.max_memory_allocated(device) - before) / MIB if cuda else 0.0
    grads = (e.grad, c.grad)
    e.grad = c.grad = None
    return peak, grads


def call_order(names: list[str], reps: int, order: str = "interleaved") -> list[str]:
    """The timed calls' sequence. "interleaved": every name once per sweep, in turn, the order
    reversed every other sweep. "blocked": each name's calls back to back, the first half of
    its reps in name order and the rest in reverse (A A B B | B B A A), so a kernel follows
    itself, as in a process of its own, and drift still reaches every name alike."""
    if order == "interleaved":
        return [n for sweep in range(reps) for n in (names if sweep % 2 == 0 else names[::-1])]
    if order == "blocked":
        first = (reps + 1) // 2
        return ([n for n in names for _ in range(first)]
                + [n for n in names[::-1] for _ in range(reps - first)])
    raise ValueError(f"order: expected 'interleaved' or 'blocked', got {order!r}")


def _sweeps(runs: dict, inputs: dict, reps: int, device, order: str = "interleaved",
            clocks=None, settle: int = 0) -> dict:
    """{name: [ms, ...]}: reps calls of every run in call_order's sequence, gradients cleared
    and the L2 flushed outside the timed region; clocks (a clocks.ClockLog): read while each
    call runs; settle: untimed calls before each block of one run's calls (--order blocked)."""
    from suite.measure import L2_FLUSH_BYTES, RegionTimer

    timers = {name: RegionTimer(device) for name in runs}
    flush = (torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
             if device.type == "cuda" else None)

    def call(name, timer=None):
        inputs["e"].grad = inputs["c"].grad = None
        if flush is not None:
            flush.zero_()
        with timer.region() if timer is not None else contextlib.nullcontext():
            runs[name]()

    previous = None
    for name in call_order(list(runs), reps, order):
        for _ in range(settle if name != previous else 0):
            call(name)   # untimed: the clock settles where this kernel's power takes it
        previous = name
        call(name, timers[name])
        if clocks is not None:
            clocks.during(name, device)
    inputs["e"].grad = inputs["c"].grad = None
    return {name: timer.times() for name, timer in timers.items()}


def _prepare(entry: Entry, inputs, softcap, args, device, base_grads) -> tuple[dict, object]:
    """(the entry's row so far, its run or None where it failed): route, warm-up, peak and
    gradients' difference from the base's at its budget (base_grads: filled by the base)."""
    from suite.measure import free_memory, is_oom, one_line
    from suite.reference import rel_err

    row = {"entry": entry.name, "budget": "" if entry.budget is None else entry.budget,
           "overrides": json.dumps(entry.overrides, sort_keys=True), "status": "ok"}
    run = _call(entry, inputs, softcap, args.phase, args.low_memory)
    try:
        row.update(_route_fields(entry, inputs, softcap, args.low_memory))
        for _ in range(args.warmup):
            run()
            inputs["e"].grad = inputs["c"].grad = None
        row["peak_mib"], grads = _peak_and_grads(run, inputs, device)
    except Exception as exc:  # out of memory, a compile failure: the row's status
        row["status"] = "oom" if is_oom(exc) else f"error: {one_line(exc)}"
        inputs["e"].grad = inputs["c"].grad = None
        free_memory(device)
        return row, None
    if args.phase != "fwd" and entry.variant != COMPILE:
        if entry.variant == "base":
            base_grads[entry.budget] = tuple(g.clone() for g in grads)
        ref = base_grads.get(entry.budget)
        if ref is not None:
            row["de_diff_vs_base"] = rel_err(grads[0], ref[0])
            row["dc_diff_vs_base"] = rel_err(grads[1], ref[1])
    del grads
    return row, run


def _relate(rows: list[dict]) -> None:
    """ms over the base variant's at the same budget and over torch.compile's, each with its
    verdict by the suite's one rule (suite/report/verdict.py: faster or slower only where the
    p20-p80 ranges are apart, else level)."""
    ok = [r for r in rows if r["status"] == "ok"]
    base = {r["budget"]: r for r in ok if r["entry"].split("@")[0] == "base"}
    compiled = next((r for r in ok if r["entry"] == COMPILE), None)
    for r in ok:
        if r["budget"] in base and r["entry"] != COMPILE:
            r["ms_over_base"] = round(r["ms"] / base[r["budget"]]["ms"], 4)
            r["vs_base"] = time_verdict(r, base[r["budget"]])
        if compiled:
            r["ms_over_compile"] = round(r["ms"] / compiled["ms"], 4)
            r["vs_compile"] = time_verdict(r, compiled)


def head_rows(head: str, args, device) -> list[dict]:
    """One head's rows: every entry prepared, then timed beside the floor in --order's
    sequence (call_order)."""
    from suite.inputs import make_inputs
    from suite.clocks import ClockLog, summary
    from suite.measure import free_memory, reset_compiled, time_stats

    reset_compiled()  # torch.compile afresh: static shapes, not the last head's dynamic ones
    n, d, v, softcap = parse_head(head)
    inputs = make_inputs("lm", n, d, v, args.dtype, seed=0, device=device, softcap=softcap)
    inputs["e"].requires_grad_(args.phase != "fwd")
    inputs["c"].requires_grad_(args.phase != "fwd")
    e, c = inputs["e"].detach(), inputs["c"].detach()
    for _ in range(args.warmup):  # the floor's warm-up; it is timed in the sweeps below
        torch.mm(e, c.T)
    base = {"head": head, "n": n, "d": d, "v": v, "softcap": softcap or "",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "order": args.order, "settle": args.settle}
    rows, runs, base_grads = [], {FLOOR: lambda: torch.mm(e, c.T)}, {}
    for entry in entries(parse_variants(args.variants), parse_budgets(args.budgets),
                         args.compile):
        row, run = _prepare(entry, inputs, softcap, args, device, base_grads)
        rows.append({**base, **row})
        if run is not None:
            runs[entry.name] = run
    base_grads.clear()
    free_memory(device)
    clocks = ClockLog(device) if args.clocks else None
    times = _sweeps(runs, inputs, args.reps, device, order=args.order, clocks=clocks,
                    settle=args.settle)
    floor = time_stats(times.pop(FLOOR))["ms"]
    for row in rows:
        row["floor_ms"] = floor
        if row["entry"] in times:
            row.update(time_stats(times[row["entry"]]))
            row.update(summary(clocks.samples.get(row["entry"], [])) if clocks else {})
            row.pop("ms_min", None)
            row["floors"] = round(row["ms"] / floor, 4) if floor > 0 else ""
    _relate(rows)
    return rows


def main(args) -> int:
    from suite.results import environment

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("python -m suite kernel interleave: --device cuda needs a CUDA device")
    if args.reps < 1 or args.warmup < 0:
        raise SystemExit("--reps must be >= 1 and --warmup >= 0")
    if args.settle < 0 or (args.settle and args.order != "blocked"):
        raise SystemExit("--settle: K >= 0 untimed calls before each block of --order blocked")
    if args.clocks:
        from suite.clocks import unavailable

        if reason := unavailable(device):
            raise SystemExit(f"--clocks: {reason}")
    heads = [h for h in args.heads.split(",") if h.strip()]
    for h in heads:  # a malformed argument is an error before anything runs
        parse_head(h)
    parse_variants(args.variants)
    parse_budgets(args.budgets)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(environment(args.device), f, indent=2, default=str)
    path = os.path.join(args.out, "interleave.csv")
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        out.writeheader()
        for head in heads:
            rows = head_rows(head, args, device)
            out.writerows(rows)
            f.flush()
            _print(rows)
    print(f"wrote {path}")
    return 0


def _print(rows: list[dict]) -> None:
    for r in rows:
        cells = [r["head"], r["entry"], r["status"][:40], r.get("path", ""), r.get("chunks", "")]
        cells += [f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, ""))
                  for k in ("ms", "ms_p20", "ms_p80", "floors", "ms_over_base", "vs_base",
                            "ms_over_compile", "vs_compile", "peak_mib", "sm_mhz", "power_w",
                            "clock_limited")]
        print(" ".join(str(x) for x in cells), flush=True)
