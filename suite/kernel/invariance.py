"""Batch invariance on a GPU, `python -m suite kernel invariance --out DIR [--models
llama3-8b,qwen2.5-7b --rows 256 --ns 257,1024,8192]`.

For each model's head shape (suite.model_configs), bf16, seeded random hidden states and
targets (a tenth ignored), per-row weights w and beta: the first --rows rows are run alone, then
inside other calls, and each variant's rows are compared bit for bit with the alone call's:

- ``n<N>``: inside a batch of N rows, permuted (a seeded permutation);
- ``padded``: followed by --pad-rows rows of zero hidden states with ignored targets;
- ``reversed``: the same rows in reverse order;
- ``budget0``: alone again with workspace_mib=0 (reduction "sum": the default call takes the
  three-matmul path with its default budget, the recompute path with 0).

each with batch_invariant=True and the default call, for linear_cross_entropy(reduction="none",
return_lse=True, return_entropy=True) and the backward of sum w loss + beta H (the loss, lse,
entropy and dE rows), and reduction="sum" for budget0 (dE rows). ``dc_run_to_run``: dC of two
identical invariant calls. Writes DIR/invariance.json (every comparison: equal, largest absolute
difference) and DIR/invariance.md (one table), and DIR/env.json. The invariant rows must all
be equal; the default's show what the option fixes. ``--ranks K``: the vocab-parallel check
over K ranks instead (suite/kernel/invariance_ranks.py).
"""
from __future__ import annotations

import json
import os

import torch

from suite.kernel import invariance_ranks
from suite.kernel.invariance_ranks import seeded_inputs

MODELS = {"llama3-8b": "Llama 3 (8B)", "qwen2.5-7b": "Qwen 2.5 (7B)",
          "gemma2-2b": "Gemma 2 (2B)", "phi3.5-mini": "Phi 3.5 Mini"}
OUTPUTS = ("loss", "entropy", "lse", "dE")


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="directory for invariance.json/.md, env.json")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                    + ", ".join(MODELS))
    ap.add_argument("--rows", type=int, default=256, help="rows compared (default %(default)s)")
    ap.add_argument("--ns", default="257,1024,8192",
                    help="batch sizes the rows are hidden in (default %(default)s)")
    ap.add_argument("--pad-rows", type=int, default=512,
                    help="ignored rows padding the 'padded' variant (default %(default)s)")
    ap.add_argument("--d", type=int, default=0, help="hidden size (0: the model's)")
    ap.add_argument("--v", type=int, default=0, help="vocabulary (0: the model's)")
    ap.add_argument("--ranks", type=int, default=0,
                    help="K > 0: the vocab-parallel check over K ranks instead "
                         "(suite/kernel/invariance_ranks.py; DIR/ranks<K>.json)")
    ap.add_argument("--shards", default="even", choices=("even", "blocks"),
                    help="--ranks: the vocabulary split as torch.chunk splits it (even) or "
                         "on whole vocabulary blocks (default %(default)s)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for tiny test shapes")


def _per_row(e, c, t, w, invariant, **kw):
    """(loss, entropy, lse, dE) per row, and dC."""
    from own_kernel import linear_cross_entropy

    e = e.detach().clone().requires_grad_()
    c = c.detach().clone().requires_grad_()
    out = linear_cross_entropy(e, c, t, reduction="none", return_lse=True, return_entropy=True,
                               batch_invariant=invariant, **kw)
    (out.loss * w[:, 0] + out.entropy * w[:, 1]).sum().backward()
    return {"loss": out.loss.detach(), "entropy": out.entropy.detach(),
            "lse": out.lse.detach(), "dE": e.grad}, c.grad


def _sum_de(e, c, t, invariant, **kw):
    from own_kernel import linear_cross_entropy

    e = e.detach().clone().requires_grad_()
    linear_cross_entropy(e, c, t, reduction="sum", batch_invariant=invariant, **kw).backward()
    return {"dE": e.grad}


def _compare(ref: dict, got: dict, where) -> dict:
    out = {}
    for name, r in ref.items():
        g = got[name][where]
        diff = (r.float() - g.float()).abs()
        out[name] = {"equal": bool(torch.equal(r, g)),
                     "max_abs_diff": float(diff[torch.isfinite(diff)].max()) if diff.numel() else 0.0}
    return out


def _variants(e, c, t, w, rows, ns, pad, invariant):
    """{variant: {output: {equal, max_abs_diff}}} of the first `rows` rows."""
    dev = e.device
    alone, _ = _per_row(e[:rows], c, t[:rows], w[:rows], invariant)
    idx = torch.arange(rows, device=dev)
    results = {}
    for n in ns:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(n)).to(dev)
        got, _ = _per_row(e[:n][perm], c, t[:n][perm], w[:n][perm], invariant)
        results[f"n{n}"] = _compare(alone, got, torch.argsort(perm)[:rows])
    pad_e = torch.cat([e[:rows], e.new_zeros(pad, e.shape[1])])
    pad_t = torch.cat([t[:rows], t.new_full((pad,), -100)])
    pad_w = torch.cat([w[:rows], w.new_ones(pad, 2)])
    results["padded"] = _compare(alone, _per_row(pad_e, c, pad_t, pad_w, invariant)[0], idx)
    rev = idx.flip(0)
    results["reversed"] = _compare(alone, _per_row(e[:rows][rev], c, t[:rows][rev],
                                                   w[:rows][rev], invariant)[0], rev)
    sum_alone = _sum_de(e[:rows], c, t[:rows], invariant)
    results["budget0"] = _compare(sum_alone, _sum_de(e[:rows], c, t[:rows], invariant,
                                                     workspace_mib=0), idx)
    return results


def _shape(name, args):
    from suite.model_configs import MODELS as CONFIGS

    if name not in MODELS:
        raise SystemExit(f"--models: unknown model {name!r} ({', '.join(MODELS)})")
    cfg = next(m for m in CONFIGS if m.name == MODELS[name])
    return args.d or cfg.hidden, args.v or cfg.vocab


def _markdown(report: dict) -> str:
    lines = ["| model | mode | variant | " + " | ".join(OUTPUTS) + " |",
             "|---|---|---|" + "---|" * len(OUTPUTS)]
    for model, modes in report["models"].items():
        for mode in ("batch_invariant", "default"):
            for variant, outs in modes[mode].items():
                cells = [("equal" if outs[o]["equal"] else f"{outs[o]['max_abs_diff']:.2e}")
                         if o in outs else "" for o in OUTPUTS]
                lines.append(f"| {model} | {mode} | {variant} | " + " | ".join(cells) + " |")
        lines.append(f"| {model} | batch_invariant | dc_run_to_run | | | | "
                     f"{'equal' if modes['dc_run_to_run'] else 'DIFFERS'} |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    from suite.results import environment

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("python -m suite kernel invariance needs a CUDA device (or --device cpu)")
    models = [m for m in args.models.split(",") if m]
    if args.ranks:
        return invariance_ranks.run(args, {name: _shape(name, args) for name in models})
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    ns = [int(x) for x in args.ns.split(",") if x]
    report = {"dtype": str(dtype), "rows": args.rows, "ns": ns, "models": {}}
    all_equal = True
    for name in models:
        d, v = _shape(name, args)
        e, c, t, w = seeded_inputs(max(ns + [args.rows]), d, v, args.device, dtype)
        modes = {"d": d, "v": v}
        for mode, invariant in (("batch_invariant", True), ("default", False)):
            modes[mode] = _variants(e, c, t, w, args.rows, ns, args.pad_rows, invariant)
        dc1 = _per_row(e[:args.rows], c, t[:args.rows], w[:args.rows], True)[1]
        dc2 = _per_row(e[:args.rows], c, t[:args.rows], w[:args.rows], True)[1]
        modes["dc_run_to_run"] = bool(torch.equal(dc1, dc2))
        all_equal &= modes["dc_run_to_run"] and all(
            o["equal"] for outs in modes["batch_invariant"].values() for o in outs.values())
        report["models"][name] = modes
        print(f"{name}: batch_invariant all equal: {all_equal}", flush=True)
    report["all_invariant_equal"] = all_equal
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "invariance.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "invariance.md"), "w") as f:
        f.write(_markdown(report))
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(environment(), f, indent=1)
    return 0 if all_equal else 1
