"""The head RL trainers need: per-token log-probability + entropy + backward, `python -m suite
kernel rl --out DIR [--models qwen2.5-7b,llama3-8b --n 32768 --reps 3]`.

For each model's head shape (vocabulary and hidden size from suite.model_configs), bf16, lm-like
inputs (suite.inputs, no softcap), random per-token weights w and beta, it times one call plus
its backward of

- own_loss_grad:      linear_cross_entropy(reduction="none", workspace_mib=0), backward of
                      sum w * loss: the exact recompute path without the entropy (the baseline);
- own_logp_entropy:   own_kernel.token_logprobs(return_entropy=True), backward of
                      sum w * logp + beta * H: the same path with the entropy;
- naive:              torch on materialised logits (bf16 GEMM, fp32 log_softmax, the entropy
                      from it), the same objective;
- compiled:           that function under torch.compile (skip with --no-compiled).

and writes, per method, the median and fastest time of --reps calls after a warm-up, the peak
memory beyond the inputs (gradients included), and the largest error of logp and H against an
fp64 reference on the first --check-rows rows. A method that runs out of memory is a row with
status "oom" (data, not a failure). Writes DIR/rl.csv and DIR/env.json. CUDA: the timings and
the memory need it; ``--device cpu`` (tiny shapes, TRITON_INTERPRET=1) runs the same code for
tests.
"""
from __future__ import annotations

import csv
import json
import os
import time

import torch

MODELS = {"qwen2.5-7b": "Qwen 2.5 (7B)", "llama3-8b": "Llama 3 (8B)"}
METHODS = ("own_loss_grad", "own_logp_entropy", "naive", "compiled")
FIELDS = ["model", "n", "d", "v", "dtype", "method", "status", "ms_median", "ms_min", "reps",
          "peak_extra_mib", "logp_max_abs_err", "entropy_max_abs_err", "device"]


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="directory for rl.csv and env.json")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                    + ", ".join(MODELS))
    ap.add_argument("--n", type=int, default=32768, help="tokens (default %(default)s)")
    ap.add_argument("--d", type=int, default=0, help="hidden size (0: the model's)")
    ap.add_argument("--v", type=int, default=0, help="vocabulary (0: the model's)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per method (median)")
    ap.add_argument("--check-rows", type=int, default=256,
                    help="rows checked against fp64 (default %(default)s)")
    ap.add_argument("--no-compiled", action="store_true", help="skip the torch.compile method")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for tiny test shapes")


def _shape(name: str, args) -> tuple[int, int, int]:
    from suite.model_configs import MODELS as CONFIGS

    if name not in MODELS:
        raise SystemExit(f"--models: unknown model {name!r} ({', '.join(MODELS)})")
    cfg = next(m for m in CONFIGS if m.name == MODELS[name])
    return args.n, args.d or cfg.hidden, args.v or cfg.vocab


def make_call_inputs(n, d, v, dtype, device, seed=0):
    """(e, c, targets, w, beta): lm-like head inputs and per-token weights of both signs."""
    from suite.inputs import make_inputs

    x = make_inputs("lm", n, d, v, dtype, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    w = torch.randn(n, generator=g).to(device)
    beta = (0.01 * torch.randn(n, generator=g)).to(device)
    return x["e"], x["c"], x["targets"], w, beta


def _naive_logp_entropy(e, c, t):
    logp_all = torch.log_softmax((e @ c.T).float(), dim=-1)
    logp = logp_all.gather(1, t[:, None]).squeeze(1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def method_call(method: str):
    """fn(e, c, t, w, beta) -> (logp or -loss, entropy or None), run with gradients."""
    from own_kernel import linear_cross_entropy, token_logprobs

    if method == "own_loss_grad":
        return lambda e, c, t, w, beta: (
            -linear_cross_entropy(e, c, t, reduction="none", workspace_mib=0), None)
    if method == "own_logp_entropy":
        return lambda e, c, t, w, beta: token_logprobs(e, c, t, return_entropy=True)
    if method == "naive":
        return lambda e, c, t, w, beta: _naive_logp_entropy(e, c, t)
    if method == "compiled":
        return torch.compile(lambda e, c, t, w, beta: _naive_logp_entropy(e, c, t))
    raise ValueError(f"method: unknown {method!r}")


def _step(fn, e, c, t, w, beta):
    """One call and its backward; returns (logp, entropy) detached."""
    ee, cc = e.detach().requires_grad_(), c.detach().requires_grad_()
    logp, ent = fn(ee, cc, t, w, beta)
    objective = (w * logp).sum() + ((beta * ent).sum() if ent is not None else 0.0)
    objective.backward()
    return logp.detach(), None if ent is None else ent.detach()


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure(method, e, c, t, w, beta, reps, device):
    """(status, ms_median, ms_min, peak_extra_mib, (logp, entropy) or None)."""
    cuda = torch.device(device).type == "cuda"
    try:
        fn = method_call(method)
        out = _step(fn, e, c, t, w, beta)  # warm-up: compilation, autotuning, workspaces
        _sync(device)
        if cuda:
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            out = _step(fn, e, c, t, w, beta)
            _sync(device)
            times.append(1e3 * (time.perf_counter() - start))
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
    except torch.OutOfMemoryError:
        return "oom", float("nan"), float("nan"), float("nan"), None
    except RuntimeError as err:  # e.g. inductor's own allocation failures: data, not a crash
        status = "oom" if "out of memory" in str(err).lower() else "error"
        print(f"{method}: {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
        return status, float("nan"), float("nan"), float("nan"), None
    finally:
        if cuda:
            torch.cuda.empty_cache()
    times.sort()
    return "ok", times[len(times) // 2], times[0], peak, out


def reference_rows(e, c, t, rows):
    """(logp, entropy) of the first rows in fp64 (c in fp64 a chunk of the vocabulary at a
    time: its fp64 copy whole would be 4 V D bytes)."""
    e64 = e[:rows].double()
    z = torch.cat([e64 @ c[v0:v0 + 16384].double().T for v0 in range(0, c.shape[0], 16384)], 1)
    logp_all = torch.log_softmax(z, dim=-1)
    return (logp_all.gather(1, t[:rows, None]).squeeze(1),
            -(logp_all.exp() * logp_all).sum(-1))


def _errors(out, ref, rows):
    if out is None:
        return float("nan"), float("nan")
    logp, ent = out
    err_lp = float((logp[:rows].double() - ref[0]).abs().max())
    err_h = float("nan") if ent is None else float((ent[:rows].double() - ref[1]).abs().max())
    return err_lp, err_h


def main(args) -> int:
    from suite.results import environment

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("python -m suite kernel rl needs a CUDA device (or --device cpu)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(environment(args.device), f, indent=2, default=str)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    device_name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
                   else "cpu (interpreter)")
    methods = [m for m in METHODS if not (args.no_compiled and m == "compiled")]
    path = os.path.join(args.out, "rl.csv")
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(FIELDS)
        for name in args.models.split(","):
            n, d, v = _shape(name, args)
            e, c, t, w, beta = make_call_inputs(n, d, v, dtype, args.device)
            rows = min(args.check_rows, n)
            ref = reference_rows(e, c, t, rows)
            for method in methods:
                status, ms, ms_min, peak, values = measure(method, e, c, t, w, beta, args.reps,
                                                           args.device)
                err_lp, err_h = _errors(values, ref, rows)
                del values
                out.writerow([name, n, d, v, str(dtype).removeprefix("torch."), method, status,
                              f"{ms:.3f}", f"{ms_min:.3f}", args.reps, f"{peak:.1f}",
                              f"{err_lp:.3e}", f"{err_h:.3e}", device_name])
                f.flush()
                print(f"{name:11s} {method:17s} {status:4s} {ms:9.2f} ms (min {ms_min:.2f}) "
                      f"peak+ {peak:9.1f} MiB  logp err {err_lp:.2e}  H err {err_h:.2e}",
                      flush=True)
            del e, c, t, w, beta, ref
    print(f"wrote {path}")
    return 0
