"""The scale pass: one program per block (OLD, 99ea877) against K programs per SM striding
(the kernel now, max_programs = K x SMs), alternating in one process, L2 flushed before each.
    python scale_ab2.py OLD_SCALE_PY OUT_DIR"""
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
sms = torch.cuda.get_device_properties(0).multi_processor_count
CASES = [("dC bf16 in place, Llama 3 (8B)", (128256, 4096), torch.bfloat16, None, 1.0),
         ("dC bf16 in place, Llama 3 (8B)", (128256, 4096), torch.bfloat16, None, 0.5),
         ("dC fp32 in place (autocast), Llama 3 (8B)", (128256, 4096), torch.float32, None, 0.5),
         ("dC fp32 into bf16, Llama 3 (8B)", (128256, 4096), torch.float32, torch.bfloat16, 0.5)]
KERNELS = {"one program per block": lambda s, d, sc: old.scale_into(s, d, sc)}
for k in (8, 16, 32, 64):
    KERNELS[f"{k} programs per SM"] = (lambda k: lambda s, d, sc: new.scale_into(
        s, d, sc, max_programs=k * sms))(k)
rows = []
for what, shape, dtype, out_dtype, s in CASES:
    x = torch.randn(shape, device="cuda").to(dtype)
    y = x if out_dtype is None else torch.empty(shape, device="cuda", dtype=out_dtype)
    sc = torch.tensor(s, device="cuda")
    times = {name: [] for name in KERNELS}
    for rep in range(23):
        for name, fn in KERNELS.items():
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(x, y, sc); b.record()
            if rep >= 3:
                times[name].append((a, b))
    torch.cuda.synchronize()
    for name, evs in times.items():
        ms = [p.elapsed_time(q) for p, q in evs]
        rows.append(dict(tensor=what, shape="x".join(map(str, shape)), scale=s, kernel=name,
                         ms=statistics.median(ms), ms_p20=percentile(ms, 0.2),
                         ms_p80=percentile(ms, 0.8), reps=len(ms)))
    del x, y
with open(out / "scale-pass-programs.csv", "w", newline="") as f:
    w = csv.DictWriter(f, list(rows[0])); w.writeheader()
    w.writerows({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
(out / "env-programs.json").write_text(json.dumps(environment("cuda"), indent=2, default=str))
for r in rows:
    print(f"{r['tensor']:42s} x{r['scale']:<4} {r['kernel']:22s} {r['ms']:.4f} ms "
          f"[{r['ms_p20']:.4f}, {r['ms_p80']:.4f}]")
