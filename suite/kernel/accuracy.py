"""Accuracy of every route of the own kernel against an fp64 reference: `python -m suite kernel
accuracy --out DIR [--n 4096 --d 2048 --v 32000 --dtypes bf16,fp32]`.

Two kinds of inputs (no softcap, no bias, mean reduction):
- confident: peaked rows (the target's row of C leans towards the token's hidden state), as
  late in training;
- magnitude: logits near 1e3 whose every product and partial sum is exact in fp32 (multiples
  of 1/64, a component shared by every row of E and C), so the errors are the softmax's alone.
For each dtype and route (recompute, three-matmul with shifted, fp32 or 16-bit logits, low
memory, the filter) and torch's naive computation in the same dtype, it writes the loss's and dE's / dC's
relative errors (Frobenius norms) and the median time of a loss+backward call to
DIR/accuracy.csv (with DIR/env.json), and prints them. CUDA only."""
from __future__ import annotations

import csv
import json
import os

import torch
import torch.nn.functional as F

from own_kernel.policy.autotune import time_launch
from suite.kernel.common import LOGITS_OVERRIDES, require_cuda
from suite.results import environment

# route name -> (keyword arguments, config overrides)
ROUTES = {
    "recompute": ({"workspace_mib": 0}, {}),
    # the three-matmul path with each kind of logits (common.LOGITS_OVERRIDES): shifted 16-bit
    # (the Hopper default), target-shifted 16-bit (the portable default), fp32, plain 16-bit
    "three_matmul_shifted": ({"workspace_mib": 4096}, {"fused": LOGITS_OVERRIDES["shifted"]}),
    "three_matmul_target_shifted": ({"workspace_mib": 4096},
                                    {"fused": LOGITS_OVERRIDES["target-shifted"]}),
    "three_matmul": ({"workspace_mib": 4096}, {"fused": LOGITS_OVERRIDES["fp32"]}),
    "three_matmul_logits16": ({"workspace_mib": 4096}, {"fused": LOGITS_OVERRIDES["input"]}),
    "low_memory": ({"low_memory": True}, {}),
    "filter": ({"filter_eps": "auto", "workspace_mib": 0}, {}),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="directory for accuracy.csv")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--v", type=int, default=32000)
    ap.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument("--cases", default="confident,magnitude", help="comma-separated")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per route (median)")
    ap.add_argument("--workspace-mib", type=int, default=4096,
                    help="the three-matmul routes' budget (default %(default)s)")


def make_inputs(case: str, n: int, d: int, v: int, dtype, seed: int = 0, device="cuda"):
    """(e, c, targets) of the case ("confident" or "magnitude"; see the module docstring)."""
    g = torch.Generator(device=device).manual_seed(seed)
    t = torch.randint(0, v, (n,), device=device, generator=g)
    if case == "confident":
        e = torch.randn(n, d, device=device, generator=g)
        c = 2.0 * torch.randn(v, d, device=device, generator=g) / d ** 0.5
        c.index_add_(0, t, 18.0 * e / d)  # the target's logit ~18 above the others' spread
    elif case == "magnitude":
        e = torch.randint(-4, 5, (n, d), device=device, generator=g).float() / 8
        c = torch.randint(-4, 5, (v, d), device=device, generator=g).float() / 8
        # every logit 992 + the rest: products are multiples of 1/64 and |sums| < 2^11 for
        # d < 4096, exact in fp32 in any order
        e[:, 0], c[:, 0] = 31.0, 32.0
    else:
        raise ValueError(f"--cases: unknown case {case!r} (confident, magnitude)")
    return e.to(dtype), c.to(dtype), t


def reference(e, c, t, rows: int = 1024):
    """(loss, dE, dC) of the mean cross-entropy in fp64, in row chunks."""
    c64 = c.double()
    n = e.shape[0]
    de = torch.empty(e.shape, dtype=torch.float64, device=e.device)
    dc = torch.zeros(c.shape, dtype=torch.float64, device=e.device)
    loss = torch.zeros((), dtype=torch.float64, device=e.device)
    for r0 in range(0, n, rows):
        e64 = e[r0:r0 + rows].double()
        z = e64 @ c64.T
        lse = torch.logsumexp(z, dim=1)
        tk = t[r0:r0 + rows]
        loss += (lse - z.gather(1, tk[:, None]).squeeze(1)).sum()
        g = torch.exp(z - lse[:, None])
        g[torch.arange(len(tk), device=e.device), tk] -= 1.0
        g /= n
        de[r0:r0 + rows] = g @ c64
        dc += g.T @ e64
    return float(loss / n), de, dc


def _rel(a, r) -> float:
    return float((a.double() - r).norm() / r.norm())


def _naive(e, c, t):
    return F.cross_entropy((e @ c.T).float(), t)


def run_route(name, e, c, t, ref, reps, workspace_mib):
    """(loss, loss error, dE error, dC error, median ms) of one route ("naive": torch)."""
    from own_kernel import linear_cross_entropy
    from own_kernel.policy.config import overridden

    kwargs, overrides = ROUTES.get(name, ({}, {}))
    if name.startswith("three_matmul"):
        kwargs = {**kwargs, "workspace_mib": workspace_mib}

    def call():
        ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
        loss = _naive(ee, cc, t) if name == "naive" else linear_cross_entropy(ee, cc, t, **kwargs)
        loss.backward()
        return loss, ee.grad, cc.grad

    with overridden(overrides):
        loss, de, dc = call()
        ms = time_launch(call, reps) if reps else float("nan")  # the kernel's own event timer
    ref_loss, ref_de, ref_dc = ref
    loss = float(loss.detach())
    return (loss, abs(loss - ref_loss) / abs(ref_loss), _rel(de, ref_de),
            _rel(dc, ref_dc), ms)


def main(args) -> int:
    require_cuda("accuracy")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "env.json"), "w") as f:  # GPU, versions, commit
        json.dump(environment("cuda"), f, indent=2, default=str)
    path = os.path.join(args.out, "accuracy.csv")
    fields = ["case", "dtype", "route", "n", "d", "v", "workspace_mib", "loss", "loss_rel_err", "de_rel_err",
              "dc_rel_err", "ms", "device"]
    device = torch.cuda.get_device_name()
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(fields)
        for case in args.cases.split(","):
            for dname in args.dtypes.split(","):
                e, c, t = make_inputs(case, args.n, args.d, args.v, DTYPES[dname])
                ref = reference(e, c, t)
                for route in ["naive", *ROUTES]:
                    row = run_route(route, e, c, t, ref, args.reps, args.workspace_mib)
                    out.writerow([case, dname, route, args.n, args.d, args.v, args.workspace_mib,
                                  *(f"{x:.6e}" for x in row), device])
                    print(f"{case:10s} {dname:5s} {route:22s} loss {row[0]:.6f} "
                          f"loss err {row[1]:.2e} dE {row[2]:.2e} dC {row[3]:.2e} "
                          f"{row[4]:.2f} ms", flush=True)
    print(f"wrote {path}")
    return 0
