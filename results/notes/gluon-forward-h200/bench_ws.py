"""The warp-specialised Gluon log-sum-exp prototype (ws_lse.py) against the own kernel's forward
and one cuBLAS E @ C.T, interleaved in one process per head:

    PYTHONPATH=$PWD python3 results/notes/gluon-forward-h200/bench_ws.py OUT_DIR \
        16384x2048x49152,4096x7168x129280 [--reps 30]

Per head: lm inputs (suite.inputs, bf16, seed 0); every entry called once per sweep, in turn,
the order reversed every other sweep, the L2 flushed outside the timed region (as `suite kernel
interleave`); each entry's lse against an fp64 reference on 1024 rows (the first and last 512).
Entries: `cublas_mm` (the floor: torch.mm, bf16 out), `own_fwd` (the own kernel's forward under
its route, suite.kernel.internals.forward_lse), and the prototype's variants (VARIANTS). A
variant that fails (compile, launch, wrong lse) is a row with its status; the run goes on.
Writes OUT_DIR/ws_lse.csv and OUT_DIR/env.json.
"""
import argparse
import csv
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {   # name: ws_lse keyword arguments
    "ws_st4": {},
    "ws_st3": {"stages": 3},
    "ws_st5": {"stages": 5},
    "ws_st4_splitx2": {"split_factor": 2},
    "ws_st4_g16": {"group_rows": 16},
    "ws_one_consumer": {"pingpong": False},
}
FIELDS = ["head", "n", "d", "v", "entry", "status", "ms", "ms_p20", "ms_p80", "ms_min", "reps",
          "floor_ms", "floors", "over_own", "lse_max_abs_err", "device"]


def _reference_lse(e, c, rows):
    return torch.logsumexp(e[rows].double() @ c.double().T, dim=1)


def _entries(e, c, t):
    from suite.kernel.internals import forward_lse
    from ws_lse import ws_lse

    out = torch.empty(e.shape[0], c.shape[0], device=e.device, dtype=e.dtype)
    runs = {"cublas_mm": lambda: torch.mm(e, c.T, out=out),
            "own_fwd": lambda: forward_lse(e, c, t, None)}
    sm = torch.cuda.get_device_properties(e.device).multi_processor_count
    for name, kw in VARIANTS.items():
        kw = dict(kw)
        factor = kw.pop("split_factor", 1)
        runs[name] = (lambda kw=kw, factor=factor:
                      ws_lse(e, c, sm_count=sm * factor, **kw))
    return runs


def _sweeps(runs, reps):
    from suite.measure import L2_FLUSH_BYTES, RegionTimer

    timers = {k: RegionTimer("cuda") for k in runs}
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    order = list(runs)
    for sweep in range(reps):
        for name in (order if sweep % 2 == 0 else order[::-1]):
            flush.zero_()
            with timers[name].region():
                runs[name]()
    return {k: t.times() for k, t in timers.items()}


def head_rows(head, reps):
    from suite.inputs import make_inputs
    from suite.measure import one_line, time_stats

    n, d, v = (int(x) for x in head.split("x"))
    x = make_inputs("lm", n, d, v, torch.bfloat16, seed=0, device="cuda", softcap=None)
    e, c, t = x["e"], x["c"], x["targets"]
    rows_idx = torch.cat([torch.arange(512), torch.arange(n - 512, n)]).to(e.device)
    ref = _reference_lse(e, c, rows_idx)
    base = {"head": head, "n": n, "d": d, "v": v, "device": torch.cuda.get_device_name()}
    rows, ok = {}, {}
    for name, run in _entries(e, c, t).items():
        row = {**base, "entry": name, "status": "ok"}
        try:
            got = run()
            torch.cuda.synchronize()
            if name != "cublas_mm":
                err = (got[rows_idx].double() - ref).abs().max().item()
                row["lse_max_abs_err"] = err
                if not err < 1e-2:
                    raise RuntimeError(f"lse max abs err {err:.3g} against fp64")
            ok[name] = run
        except Exception as exc:  # a failing variant is data; the others still run
            row["status"] = one_line(exc)
        rows[name] = row
    torch.cuda.synchronize()
    for name, times in _sweeps(ok, reps).items():
        rows[name].update(time_stats(times))
    floor = rows["cublas_mm"].get("ms")
    own = rows["own_fwd"].get("ms")
    for row in rows.values():
        row["floor_ms"] = floor
        if "ms" in row and floor:
            row["floors"] = row["ms"] / floor
            row["over_own"] = row["ms"] / own if own else ""
    return list(rows.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("heads")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    from suite.results import environment

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(environment("cuda"), f, indent=2, default=str)
    path = os.path.join(args.out, "ws_lse.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for head in args.heads.split(","):
            rows = head_rows(head, args.reps)
            w.writerows(rows)
            f.flush()
            for r in rows:
                print(head, r["entry"], r["status"][:60], *(
                    f"{r[k]:.4g}" if isinstance(r.get(k), float) else "-"
                    for k in ("ms", "ms_p20", "ms_p80", "floors", "over_own", "lse_max_abs_err")),
                    flush=True)
    print("wrote", path)


if __name__ == "__main__":
    main()
