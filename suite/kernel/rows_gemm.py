"""batch_invariant's dE GEMM against cuBLAS: `python -m suite kernel rows-gemm [--shapes
8192x4096x4096,16384x3584x3584] [--candidates JSON] [--csv FILE]`.

For each shape M x K x D (rows, the chunk's width, the hidden size: batch_invariant's chunk is
D columns wide, so K = D at the presets) and each candidate (an override of the config's
``rows_gemm``, config.RowsGemm), times own_kernel's ``addmm_rows`` (acc fp32 += a @ b, bf16 a
and b) with do_bench (median, p20, p80 of its repetitions) beside cuBLAS's fp32-output addmm
(``addmm_fp32``, what the default call runs), and checks what the mode promises:

- ``rows_equal``: the first 257 rows computed alone are the M-row call's bits;
- ``permuted_equal``: the rows of a permuted a, permuted back, are the call's bits;
- ``rel_err``: the largest error of 64 rows against an fp64 product, over that product's
  largest entry.

A candidate that fails to compile or run is a row with its error, and the run goes on. With
--csv, the run's environment (GPU, versions, commit) goes to env.json beside the CSV.
"""
from __future__ import annotations

import csv
import json
import os

import torch

from suite.kernel.common import require_cuda

CANDIDATES = [  # overrides of rows_gemm: tiles (rows x D columns x K step), loader, grouping
    {},
    {"tma": True},
    {"tma": True, "tiles": {"block_v": 256, "num_stages": 3}},
    {"tma": True, "tiles": {"block_v": 256, "num_stages": 4}},
    {"tma": True, "tiles": {"block_n": 256, "num_stages": 3}},
    {"tma": True, "tiles": {"block_v": 256, "num_stages": 3}, "group_m": 16},
    {"tma": True, "tiles": {"block_n": 64, "block_v": 256, "num_warps": 4, "num_stages": 4}},
    {"tiles": {"block_v": 256, "num_stages": 3}},
]
FIELDS = ("m", "k", "d", "candidate", "loader", "ms", "ms_p20", "ms_p80", "cublas_ms",
          "x_cublas", "tflops", "rows_equal", "permuted_equal", "rel_err",
          "error")


def add_arguments(ap) -> None:
    ap.add_argument("--shapes", default="8192x4096x4096,16384x3584x3584",
                    help="comma-separated MxKxD (default: Llama 3 (8B) and Qwen 2.5 (7B) "
                         "chunks)")
    ap.add_argument("--candidates", type=json.loads, default=CANDIDATES,
                    help="JSON list of overrides of the config's rows_gemm")
    ap.add_argument("--csv", default=None, help="also write the rows to this CSV")


def _time(fn) -> tuple[float, float, float]:
    from triton.testing import do_bench

    p50, p20, p80 = do_bench(fn, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
    return p50, p20, p80


def _checks(addmm, a, b) -> dict:
    """The mode's promises for this launcher, and its error against fp64."""
    m, k = a.shape
    d = b.shape[1]
    start = torch.randn(m, d, device=a.device, dtype=torch.float32)
    full = start.clone()
    addmm(full, a, b)
    alone = start[:257].clone()
    addmm(alone, a[:257], b)
    perm = torch.randperm(m, device=a.device)
    permuted = start[perm].clone()
    addmm(permuted, a[perm], b)
    exact = start[:64].double() + a[:64].double() @ b.double()
    return {"rows_equal": torch.equal(full[:257], alone),
            "permuted_equal": torch.equal(full[perm], permuted),
            "rel_err": float(((full[:64].double() - exact).abs().max()
                              / exact.abs().max()).item())}


def measure(shape: tuple[int, int, int], override: dict, cublas_ms: float) -> dict:
    from own_kernel.kernels.gemm_rows import addmm_rows
    from own_kernel.policy.config import config_for, with_overrides
    from own_kernel.policy.route import rows_gemm_reads_tma

    m, k, d = shape
    row = {"m": m, "k": k, "d": d, "candidate": json.dumps(override, sort_keys=True),
           "cublas_ms": cublas_ms}
    dev = torch.device("cuda")
    cfg = with_overrides(config_for(dev, torch.bfloat16), {"rows_gemm": override})
    rg = cfg.rows_gemm
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, d, device=dev, dtype=torch.bfloat16, generator=gen) * k ** -0.5
    acc = torch.zeros(m, d, device=dev, dtype=torch.float32)
    tma = rows_gemm_reads_tma(rg, a, b)
    row["loader"] = "tma" if tma else "pointer"
    try:
        row.update(_checks(lambda o, x, y: addmm_rows(o, x, y, rg, tma), a, b))
        ms, p20, p80 = _time(lambda: addmm_rows(acc, a, b, rg, tma))
    except Exception as exc:  # a candidate that cannot compile or run is data
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return row
    row.update(ms=ms, ms_p20=p20, ms_p80=p80, x_cublas=ms / cublas_ms,
               tflops=2 * m * k * d / ms / 1e9)
    return row


def cublas_ms(shape) -> float:
    from own_kernel.kernels.gemm import addmm_fp32

    m, k, d = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, d, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(m, d, device="cuda", dtype=torch.float32)
    return _time(lambda: addmm_fp32(acc, a, b, beta=1.0))[0]


def main(args) -> int:
    require_cuda("rows-gemm")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    rows = []
    for shape in shapes:
        base = cublas_ms(shape)
        for override in args.candidates:
            rows.append(measure(shape, override, base))
            r = rows[-1]
            print(f"{r['m']}x{r['k']}x{r['d']} {r['candidate']:70s} {r.get('loader', '-'):7s} "
                  + (f"{r['ms']:7.3f} ms ({r['ms_p20']:.3f}-{r['ms_p80']:.3f})  "
                     f"x cuBLAS {r['x_cublas']:.3f} ({base:.3f} ms)  rows {r['rows_equal']} "
                     f"perm {r['permuted_equal']} "
                     f"err {r['rel_err']:.2e}" if "ms" in r else r["error"]), flush=True)
    if args.csv:
        from suite.results import environment

        folder = os.path.dirname(os.path.abspath(args.csv))
        os.makedirs(folder, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
        with open(os.path.join(folder, "env.json"), "w") as f:
            json.dump(environment(), f, indent=1)
    return 0
