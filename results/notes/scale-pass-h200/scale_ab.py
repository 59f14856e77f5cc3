"""The scale pass of the three-matmul path's backward: one program per block (OLD, the kernel at
99ea877) against the kernel now (default: scale-pass.csv) or against K strided programs per SM,
K = 8, 16, 32, 64 (--programs: scale-pass-programs.csv), alternating in one process: CUDA events
around each call, L2 flushed before each. Writes the CSV and env.json into OUT_DIR.
    PYTHONPATH=. python scale_ab.py OLD_SCALE_PY OUT_DIR [--programs]
(The committed CSVs were made by this script's two earlier halves, in git at ed5a433.)"""
import csv, importlib.util, json, statistics, sys
from pathlib import Path
import torch
from own_kernel.kernels import scale as new
from suite.measure import percentile
from suite.results import environment

LLAMA_DC = (128256, 4096)
CASES = [  # the tensor the backward scales: name, shape, dtype, into (None: in place), scale
    ("dC bf16 in place, Llama 3 (8B)", LLAMA_DC, torch.bfloat16, None, 1.0),
    ("dC bf16 in place, Llama 3 (8B)", LLAMA_DC, torch.bfloat16, None, 0.5),
    ("dC fp32 in place (autocast), Llama 3 (8B)", LLAMA_DC, torch.float32, None, 1.0),
    ("dC fp32 into bf16, Llama 3 (8B)", LLAMA_DC, torch.float32, torch.bfloat16, 1.0),
    ("dC bf16 in place, D 5120 V 131072", (131072, 5120), torch.bfloat16, None, 1.0),
    ("dE bf16 in place, N 8192 D 4096", (8192, 4096), torch.bfloat16, None, 1.0),
]
PROGRAMS_CASES = [
    ("dC bf16 in place, Llama 3 (8B)", LLAMA_DC, torch.bfloat16, None, 1.0),
    ("dC bf16 in place, Llama 3 (8B)", LLAMA_DC, torch.bfloat16, None, 0.5),
    ("dC fp32 in place (autocast), Llama 3 (8B)", LLAMA_DC, torch.float32, None, 0.5),
    ("dC fp32 into bf16, Llama 3 (8B)", LLAMA_DC, torch.float32, torch.bfloat16, 0.5),
]


def kernels(old, programs: bool) -> dict:
    if not programs:
        return {"one program per block": old.scale_into, "the kernel now": new.scale_into}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {"one program per block": old.scale_into}
    for k in (8, 16, 32, 64):
        out[f"{k} programs per SM"] = (lambda k: lambda s, d, sc: new.scale_into(
            s, d, sc, max_programs=k * sms))(k)
    return out


def timed(fns, x, y, sc, flush, reps, warmup=3) -> dict:
    events = {name: [] for name in fns}
    for rep in range(warmup + reps):
        for name, fn in fns.items():
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(x, y, sc); b.record()
            if rep >= warmup:
                events[name].append((a, b))
    torch.cuda.synchronize()
    return {name: [p.elapsed_time(q) for p, q in evs] for name, evs in events.items()}


def main(old_path, out_dir, programs=False):
    spec = importlib.util.spec_from_file_location("old_scale", old_path)
    old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
    out = Path(out_dir); out.mkdir(parents=True, exist_ok=True)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    fns, rows = kernels(old, programs), []
    for what, shape, dtype, into, s in (PROGRAMS_CASES if programs else CASES):
        x = torch.randn(shape, device="cuda").to(dtype)
        y = x if into is None else torch.empty(shape, device="cuda", dtype=into)
        times = timed(fns, x, y, torch.tensor(s, device="cuda"), flush, 20 if programs else 30)
        for name, ms in times.items():
            rows.append(dict(tensor=what, shape="x".join(map(str, shape)), dtype=str(dtype)[6:],
                             scale=s, kernel=name, ms=statistics.median(ms),
                             ms_p20=percentile(ms, 0.2), ms_p80=percentile(ms, 0.8),
                             reps=len(ms)))
        del x, y
    name = "scale-pass-programs" if programs else "scale-pass"
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0])); w.writeheader()
        w.writerows({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()}
                    for r in rows)
    env = "env-programs.json" if programs else "env.json"
    (out / env).write_text(json.dumps(environment("cuda"), indent=2, default=str))
    for r in rows:
        print(f"{r['tensor']:42s} {r['dtype']:9s} x{r['scale']:<4} {r['kernel']:22s} "
              f"{r['ms']:.4f} ms [{r['ms_p20']:.4f}, {r['ms_p80']:.4f}]")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], programs="--programs" in sys.argv[3:])
