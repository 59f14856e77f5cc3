"""The scale pass of the three-matmul path's backward, one program per block (OLD, the kernel
at 99ea877) against a few programs per SM striding over the blocks (the kernel now), alternating
in one process: CUDA events around each call, L2 flushed before each. Writes CSV + env.json.
    python scale_ab.py OLD_SCALE_PY OUT_DIR"""
import csv, importlib.util, json, statistics, sys
from pathlib import Path
import torch
from own_kernel.kernels import scale as new
from suite.measure import percentile
from suite.results import environment

spec = importlib.util.spec_from_file_location("old_scale", sys.argv[1])
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
CASES = [  # what: the tensor the backward scales (shape, dtype, into: None = in place), scale
    ("dC bf16 in place, Llama 3 (8B)", (128256, 4096), torch.bfloat16, None, 1.0),
    ("dC bf16 in place, Llama 3 (8B)", (128256, 4096), torch.bfloat16, None, 0.5),
    ("dC fp32 in place (autocast), Llama 3 (8B)", (128256, 4096), torch.float32, None, 1.0),
    ("dC fp32 into bf16, Llama 3 (8B)", (128256, 4096), torch.float32, torch.bfloat16, 1.0),
    ("dC bf16 in place, D 5120 V 131072", (131072, 5120), torch.bfloat16, None, 1.0),
    ("dE bf16 in place, N 8192 D 4096", (8192, 4096), torch.bfloat16, None, 1.0),
]
rows = []
for what, shape, dtype, into, s in CASES:
    x = torch.randn(shape, device="cuda").to(dtype)
    y = x if into is None else torch.empty(shape, device="cuda", dtype=into)
    sc = torch.tensor(s, device="cuda")
    times = {"one program per block": [], "the kernel now": []}
    fns = {"one program per block": old.scale_into, "the kernel now": new.scale_into}
    for rep in range(33):
        for name, fn in fns.items():
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(x, y, sc); b.record()
            if rep >= 3:
                times[name].append((a, b))
    torch.cuda.synchronize()
    for name, evs in times.items():
        ms = [p.elapsed_time(q) for p, q in evs]
        rows.append(dict(tensor=what, shape="x".join(map(str, shape)), dtype=str(dtype)[6:],
                         scale=s, kernel=name, ms=statistics.median(ms),
                         ms_p20=percentile(ms, 0.2), ms_p80=percentile(ms, 0.8), reps=len(ms)))
    del x, y
with open(out / "scale-pass.csv", "w", newline="") as f:
    w = csv.DictWriter(f, list(rows[0])); w.writeheader()
    w.writerows({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
(out / "env.json").write_text(json.dumps(environment("cuda"), indent=2, default=str))
for r in rows:
    print(f"{r['tensor']:42s} {r['dtype']:9s} x{r['scale']:<4} {r['kernel']:22s} "
          f"{r['ms']:.4f} ms [{r['ms_p20']:.4f}, {r['ms_p80']:.4f}]")
