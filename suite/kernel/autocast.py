"""Loss + gradients under bf16 autocast with an fp32 weight (what Trainer(bf16=True) and most AMP
recipes run): `python -m suite kernel autocast --out DIR [--shapes ...] [--reps 10]`.

For each shape, bf16 hidden states E (N x D) and an fp32 weight C (V x D), both leaves that
need gradients, mean cross-entropy of uniform targets, every call under
``torch.autocast("cuda", dtype=torch.bfloat16)``:

- ``own``: ``linear_cross_entropy(e, c, t)`` as a user calls it (the default route);
- ``own_ws0``: ``workspace_mib=0``, whichever path the route picks for it (on Hopper the
  three-matmul path where its chunks fit the recompute path's memory);
- ``own_recompute``: ``workspace_mib=0`` with the recompute path pinned
  (``fused.zero_budget "recompute"``);
- ``own_wsB`` for each B of ``--budgets``: ``workspace_mib=B`` (the three-matmul path's speed
  and memory at other budgets);
- ``own_fp32logits``: the default call with fp32 logits (``fused.logits_shifted`` and
  ``fused.target_shift`` off);
- ``own_logits16``: the default call with plain 16-bit logits (``fused.logits_shifted``,
  ``fused.target_shift`` and ``fused.logits_fp32`` off: twice fp32's rows per chunk, less
  accurate on confident rows);
- ``own_shifted``: the default call with ``fused.logits_shifted`` on (16-bit logits relative to
  their forward tile's row max: twice fp32's rows per chunk, fp32 logits' accuracy; the Hopper
  default, where the TMA forward runs);
- ``own_target_shifted``: the default call with ``fused.target_shift`` on and
  ``fused.logits_shifted`` off (16-bit logits less each row's target logit, cuBLAS's bias: the
  portable default);
- ``torch_compile``: ``torch.compile`` of ``F.cross_entropy(F.linear(e, c).float(), t)``.

It writes DIR/autocast.csv (one row per shape and provider: median, p20 and p80 ms of the timed
calls, L2 flushed before each, gradients cleared outside the timed region; the peak MiB beyond
the inputs of one call, gradients included; the own kernel's plan; ms and MiB over
torch.compile's; dC's relative difference from torch.compile's; the cuBLAS floor, one bf16
E @ C.T) and DIR/env.json. A shape ``name:N:D:V:S`` softcaps every provider's logits at S (the
default shapes have none: their ``gemma2-2b`` row is Gemma 2 (2B)'s sizes without its 30). CUDA only; about three minutes on an H100 (most of it compiling).
"""
from __future__ import annotations

import csv
import json
import os

import torch
import torch.nn.functional as F

from suite.kernel.common import LOGITS_OVERRIDES, require_cuda
from suite.measure import reset_compiled

MIB = 2**20
# name:N:D:V[:S], S the softcap
SHAPES = ("gemma2-2b:8192:2304:256000,llama3-8b:8192:4096:128256,qwen25-7b:16384:3584:152064,"
          "nemo-12b:8192:5120:131072,gemma3-1b:8192:1152:262144")
PROVIDERS = ("torch_compile", "own", "own_ws0", "own_recompute", "own_fp32logits",
             "own_logits16", "own_shifted", "own_target_shifted")  # + own_wsB (--budgets)
# each kind of the three-matmul path's logits, pinned whatever the config's default
LOGITS = {"own_fp32logits": LOGITS_OVERRIDES["fp32"], "own_logits16": LOGITS_OVERRIDES["input"],
          "own_shifted": LOGITS_OVERRIDES["shifted"],
          "own_target_shifted": LOGITS_OVERRIDES["target-shifted"]}
FIELDS = ["shape", "n", "d", "v", "softcap", "provider", "status", "ms", "ms_p20", "ms_p80", "reps",
          "peak_mib", "ms_over_compile", "mib_over_compile", "dc_rel_diff_vs_compile",
          "dc_dtype", "path", "chunks", "chunk_rows", "plan_peak_mib", "budget_mib",
          "dc_fp32_mib", "c_bf16_copy_mib", "floor_ms", "device"]


def parse_shapes(text: str) -> list[tuple[str, int, int, int, float | None]]:
    """[(name, n, d, v, softcap or None)] of "name:N:D:V[:S],..."; a malformed entry is an
    error naming it."""
    shapes = []
    for item in text.split(","):
        parts = item.split(":")
        sizes, cap = parts[1:4], parts[4:]
        if (len(parts) not in (4, 5) or not all(p.isdigit() and int(p) > 0 for p in sizes)
                or not all(_positive_float(p) for p in cap)):
            raise SystemExit(f"--shapes: expected name:N:D:V[:S] with positive integers N, D, V "
                             f"and a positive softcap S; got {item!r}")
        shapes.append((parts[0], *map(int, sizes), float(cap[0]) if cap else None))
    return shapes


def _positive_float(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="directory for autocast.csv and env.json")
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated name:N:D:V[:S], S a "
                                                     "softcap (default: %(default)s)")
    ap.add_argument("--providers", default=",".join(PROVIDERS),
                    help="comma-separated subset of %(default)s")
    ap.add_argument("--budgets", default="768,2048,3072",
                    help="workspace_mib values for own_wsB providers ('' for none)")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per provider")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first (compilation)")


def _naive(e, c, t, softcap=None):
    logits = F.linear(e, c)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits.float(), t)


def provider_call(name: str):
    """(the loss function, its config overrides, its keyword arguments) of a provider."""
    from own_kernel import linear_cross_entropy
    from suite.providers.own import RECOMPUTE_AT_ZERO

    if name == "torch_compile":
        return torch.compile(_naive, dynamic=False), {}, {}
    if name == "own":
        return linear_cross_entropy, {}, {}
    if name in LOGITS:
        return linear_cross_entropy, {"fused": LOGITS[name]}, {}
    if name == "own_recompute":  # own_ws0's call, the recompute path pinned
        fn, _, zero = provider_call("own_ws0")
        return fn, RECOMPUTE_AT_ZERO, zero
    if name.startswith("own_ws") and name[6:].isdigit():
        budget = {"workspace_mib": int(name[6:])}
        return (lambda e, c, t, softcap=None: linear_cross_entropy(e, c, t, softcap=softcap,
                                                                   **budget)), {}, budget
    raise SystemExit(f"--providers: unknown provider {name!r} ({', '.join(PROVIDERS)}, own_wsB)")


def autocast_inputs(n, d, v, seed=0):
    """The bench's leaves: bf16 E (N x D) at unit-scale logits, an fp32 weight C (V x D) and
    uniform targets (the profile tool's --autocast makes the same)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    e = (torch.randn(n, d, device="cuda", generator=g) * d**-0.5).bfloat16().requires_grad_()
    c = torch.randn(v, d, device="cuda", generator=g).requires_grad_()  # fp32: the parameter
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    return e, c, t


def _measure(fn, e, c, t, softcap, reps: int, warmup: int) -> dict:
    """Peak MiB beyond the inputs of one call (its gradients included), then the timed calls."""
    from suite.measure import time_calls, time_stats

    def clear():
        e.grad = c.grad = None

    def step(_=None):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(e, c, t, softcap=softcap)
        loss.backward()

    for _ in range(warmup):
        clear()
        step()
    clear()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / MIB
    dc = c.grad.detach().clone()
    times = time_calls(step, device="cuda", reps=reps, prepare=clear)
    clear()
    return {**time_stats(times), "peak_mib": peak, "dc": dc}


def _plan_fields(e, c, t, softcap, kwargs: dict) -> dict:
    import own_kernel

    with torch.autocast("cuda", dtype=torch.bfloat16):
        p = own_kernel.plan(e, c, t, softcap=softcap, **kwargs)
    return {"path": p.path, "chunks": p.chunks, "chunk_rows": p.chunk_size,
            "plan_peak_mib": round(p.peak_bytes / MIB, 1), "budget_mib": p.budget_mib}


def _floor_ms(e, c, reps: int) -> float:
    from suite.measure import measure_floor

    return measure_floor(e.detach(), c.detach().bfloat16(), reps=reps, warmup=2)["ms"]


def _shape_rows(name, n, d, v, softcap, providers, args) -> list[dict]:
    from own_kernel.policy.config import overridden
    from suite.measure import free_memory, is_oom, one_line

    e, c, t = autocast_inputs(n, d, v)
    base = {"shape": name, "n": n, "d": d, "v": v, "softcap": softcap or "", "dc_fp32_mib": round(4 * v * d / MIB, 1),
            "c_bf16_copy_mib": round(2 * v * d / MIB, 1), "floor_ms": _floor_ms(e, c, args.reps),
            "device": torch.cuda.get_device_name()}
    rows, ref_dc = [], None
    for prov in providers:
        row = {**base, "provider": prov, "status": "ok"}
        fn, overrides, kwargs = provider_call(prov)
        try:
            with overridden(overrides):
                if prov.startswith("own"):
                    row.update(_plan_fields(e, c, t, softcap, kwargs))
                m = _measure(fn, e, c, t, softcap, args.reps, args.warmup)
            dc = m.pop("dc")
            row.update({k: m[k] for k in ("ms", "ms_p20", "ms_p80", "reps", "peak_mib")})
            row["dc_dtype"] = str(dc.dtype).replace("torch.", "")
            if prov == "torch_compile":
                ref_dc = dc
            elif ref_dc is not None:
                diff = (dc.float() - ref_dc.float()).norm() / ref_dc.float().norm()
                row["dc_rel_diff_vs_compile"] = float(diff)
            del dc
        except RuntimeError as exc:  # out of memory, a compile failure: the row's status
            row["status"] = "oom" if is_oom(exc) else f"error: {one_line(exc)}"
            e.grad = c.grad = None
        free_memory(torch.device("cuda"))
        rows.append(row)
        shown = ("shape", "provider", "status", "ms", "peak_mib", "path", "chunks")
        print(" ".join(f"{k}={row.get(k)}" for k in shown), flush=True)
    del ref_dc
    _relate_to_compile(rows)
    return rows


def _relate_to_compile(rows: list[dict]) -> None:
    """Each row's ms and MiB over torch.compile's."""
    ref = next((r for r in rows if r["provider"] == "torch_compile" and r["status"] == "ok"), None)
    if ref is None:
        return
    for r in rows:
        if r["status"] != "ok":
            continue
        r["ms_over_compile"] = round(r["ms"] / ref["ms"], 4)
        if ref["peak_mib"] > 0:
            r["mib_over_compile"] = round(r["peak_mib"] / ref["peak_mib"], 4)


def main(args) -> int:
    require_cuda("autocast")
    from suite.results import environment

    shapes = parse_shapes(args.shapes)
    providers = list(dict.fromkeys(  # in order, once each
        args.providers.split(",") + [f"own_ws{int(b)}" for b in args.budgets.split(",")
                                     if b.strip()]))
    for p in providers:
        provider_call(p)  # an unknown name is an error before anything runs
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(environment("cuda"), f, indent=2, default=str)
    path = os.path.join(args.out, "autocast.csv")
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS)
        out.writeheader()
        for name, n, d, v, softcap in shapes:
            reset_compiled()  # each shape's own static compile, within dynamo's limit
            for row in _shape_rows(name, n, d, v, softcap, providers, args):
                out.writerow(row)
            f.flush()
    print(f"wrote {path}")
    return 0
