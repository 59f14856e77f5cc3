"""The head RL trainers need: per-token log-probability + entropy + backward, `python -m suite
kernel rl --out DIR [--models qwen2.5-7b,llama3-8b --n 32768 --reps 7 --methods ...]`.

For each model's head shape (vocabulary and hidden size from suite.model_configs), bf16, lm-like
inputs (suite.inputs, no softcap), random per-token weights w and beta, it times one call plus
its backward of

- own_loss_grad:      linear_cross_entropy(reduction="none", workspace_mib=0), backward of
                      sum w * loss: the exact recompute path without the entropy (the baseline);
- own_logp_entropy:   own_kernel.token_logprobs(return_entropy=True), backward of
                      sum w * logp + beta * H: the same path with the entropy;
- naive:              torch on materialised logits (bf16 GEMM, fp32 log_softmax, the entropy
                      from it), the same objective;
- compiled:           that function under torch.compile (skip with --no-compiled);
- liger_flce_logp:     Liger's fused linear cross-entropy (Triton inner kernel) with
                      reduction="none": its per-token losses are -logp, and Liger 0.8.5 defers
                      the gradient of that reduction to the backward (recomputing the chunked
                      logits there), so sum w * logp backpropagates with per-token weights. No
                      entropy: the peer for the logp part only;
- liger_grpo:         Liger's chunked GRPO head (LigerFusedLinearGRPOLoss, its defaults:
                      loss_type "dapo", beta 0.04, eps 0.2, compiled loss math) on the same hidden
                      states as sequences of GRPO_SEQ_LEN tokens: on-policy (no old logprobs, so
                      the ratio is 1 and the gradient is -A dlogp / tokens), advantages from a
                      seeded generator, reference logprobs the fp32 logp plus 0.01 seeded noise
                      (a reference policy near the current one, as in a real step). Its own
                      objective, not sum w * logp + beta * H; it returns only the scalar loss,
                      so it has no logp or entropy to check (NaN errors): the RL peer users would
                      compare against, timed on the same work (logp of every token + backward).

and writes, per method, the median, 20th and 80th percentile and fastest time of --reps calls
after a warm-up (p20-p80 so a verdict can use the project's rule: faster only where the ranges
do not overlap, else level), the peak memory beyond the inputs (gradients included), and the
largest error of logp and H against an fp64 reference on the first --check-rows rows (NaN where
a method has none). A method that runs out of memory is a row with status "oom", one whose
package is missing "not installed", one that cannot run on this device "unsupported", the
reason in the note column (data, not a failure). Writes DIR/rl.csv and DIR/env.json. CUDA: the
timings and the memory need it; ``--device cpu`` (tiny shapes, TRITON_INTERPRET=1) runs the
same code for tests.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import time

import torch

MODELS = {"qwen2.5-7b": "Qwen 2.5 (7B)", "llama3-8b": "Llama 3 (8B)"}
METHODS = ("own_loss_grad", "own_logp_entropy", "naive", "compiled", "liger_flce_logp",
           "liger_grpo")
LIGER_METHODS = ("liger_flce_logp", "liger_grpo")
LIGER_MODULE = "liger_kernel"  # a name, so a test can play "not installed"
GRPO_SEQ_LEN = 4096  # tokens per GRPO sequence (a long completion); gcd with N where N is not
                     # a multiple, so tiny test shapes still split into whole sequences
FIELDS = ["model", "n", "d", "v", "dtype", "method", "status", "ms_median", "ms_p20", "ms_p80",
          "ms_min", "reps", "peak_extra_mib", "logp_max_abs_err", "entropy_max_abs_err",
          "device", "note"]
NOTES = {  # what an ok row of a method does not measure, next to its numbers
    "own_loss_grad": "no entropy (the loss+grad baseline)",
    "liger_flce_logp": "no entropy; logp = -(per-token loss, reduction none)",
    "liger_grpo": "GRPO (dapo) loss, not sum w*logp + beta*H; returns the scalar loss only: "
                  "no logp or entropy to check",
}


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="directory for rl.csv and env.json")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                    + ", ".join(MODELS))
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: "
                    + ", ".join(METHODS))
    ap.add_argument("--n", type=int, default=32768, help="tokens (default %(default)s)")
    ap.add_argument("--d", type=int, default=0, help="hidden size (0: the model's)")
    ap.add_argument("--v", type=int, default=0, help="vocabulary (0: the model's)")
    ap.add_argument("--reps", type=int, default=7,
                    help="timed calls per method (median, p20, p80; default %(default)s)")
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


def _methods(args) -> list[str]:
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {', '.join(unknown)} ({', '.join(METHODS)})")
    return [m for m in methods if not (args.no_compiled and m == "compiled")]


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


def unavailable(method: str, device) -> tuple[str, str] | None:
    """(status, reason) where a method cannot run here, else None: asked before its row runs,
    so a missing package or device is a row of data, not a crash."""
    if method not in LIGER_METHODS:
        return None
    from suite.providers.liger import INSTALL, PACKAGE
    from suite.registry import needs_triton_device

    if importlib.util.find_spec(LIGER_MODULE) is None:
        return "not installed", f"{PACKAGE} is not installed (install: {INSTALL})"
    if method == "liger_flce_logp":  # Triton kernels; liger_grpo is torch (+ torch.compile)
        why = needs_triton_device(torch.device(device))
        if why is not None:
            return "unsupported", f"Liger's fused linear CE is a Triton kernel: {why}"
    return None


def _weighted(fn):
    """A (logp, entropy) function as one returning (objective, logp, entropy): the RL head's
    objective sum w * logp + beta * H (without the H term where a method has no entropy)."""
    def call(e, c, t, w, beta):
        logp, ent = fn(e, c, t)
        objective = (w * logp).sum() + ((beta * ent).sum() if ent is not None else 0.0)
        return objective, logp, ent
    return call


def _liger_flce_logp(e, c, t):
    from liger_kernel.functional import fused_linear_cross_entropy

    from suite.providers.liger import TRITON_IMPL

    # impl named (as the liger_flce provider does): the Triton kernel whatever else is
    # installed; reduction "none" is the per-token loss, and its backward takes per-token
    # upstream gradients (0.8.5 recomputes the chunked logits in the backward for it)
    loss, *_ = fused_linear_cross_entropy(e, c, t, reduction="none", impl=TRITON_IMPL)
    return -loss.float(), None


def grpo_extras(e, c, t, seed=0):
    """GRPO's other inputs for N tokens as sequences of GRPO_SEQ_LEN (or gcd(N, it)) tokens:
    (batch, seq_len, advantages (batch,), reference logprobs (batch, seq_len)). The reference
    logprobs are the fp32 logp plus 0.01 seeded noise, computed a 2048-row chunk at a time
    (the whole fp32 logits would be 4 N V bytes), so the k3 KL term sees a nearby policy."""
    n = e.shape[0]
    seq_len = math.gcd(n, GRPO_SEQ_LEN)
    batch = n // seq_len
    g = torch.Generator().manual_seed(seed + 2)
    advantages = torch.randn(batch, generator=g).to(e.device)
    noise = 0.01 * torch.randn(n, generator=g)
    with torch.no_grad():
        logp = torch.cat([_naive_logp_entropy(e[r:r + 2048], c, t[r:r + 2048])[0]
                          for r in range(0, n, 2048)])
    ref = (logp + noise.to(e.device)).view(batch, seq_len)
    return batch, seq_len, advantages, ref


def _liger_grpo_call(e, c, t, device):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    batch, seq_len, advantages, ref = grpo_extras(e, c, t)
    mask = torch.ones(batch, seq_len, device=e.device)
    # Liger's defaults (dapo, beta 0.04, compiled loss math) on CUDA; on the CPU (test shapes
    # only) inductor's C++ build would cost seconds for nothing measured
    head = LigerFusedLinearGRPOLoss(compiled=torch.device(device).type == "cuda")

    def call(e, c, t, w, beta):
        loss, _metrics = head(e.view(batch, seq_len, -1), c, t.view(batch, seq_len), mask,
                              advantages, ref_per_token_logps=ref)
        return loss, None, None
    return call


def method_call(method: str, e, c, t, device):
    """fn(e, c, t, w, beta) -> (objective, logp or None, entropy or None), run with gradients;
    e, c, t build the inputs a method needs besides them (liger_grpo's), outside the timing."""
    from own_kernel import linear_cross_entropy, token_logprobs

    if method == "own_loss_grad":
        return _weighted(lambda e, c, t: (
            -linear_cross_entropy(e, c, t, reduction="none", workspace_mib=0), None))
    if method == "own_logp_entropy":
        return _weighted(lambda e, c, t: token_logprobs(e, c, t, return_entropy=True))
    if method == "naive":
        return _weighted(_naive_logp_entropy)
    if method == "compiled":
        return _weighted(torch.compile(_naive_logp_entropy))
    if method == "liger_flce_logp":
        return _weighted(_liger_flce_logp)
    if method == "liger_grpo":
        return _liger_grpo_call(e, c, t, device)
    raise ValueError(f"method: unknown {method!r}")


def _step(fn, e, c, t, w, beta):
    """One call and its backward; returns (logp, entropy) detached (None where absent)."""
    ee, cc = e.detach().requires_grad_(), c.detach().requires_grad_()
    objective, logp, ent = fn(ee, cc, t, w, beta)
    objective.backward()
    return (None if logp is None else logp.detach()), (None if ent is None else ent.detach())


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _failed(status, note=""):
    nan = float("nan")
    return {"status": status, "note": note, "ms": nan, "ms_p20": nan, "ms_p80": nan,
            "ms_min": nan, "peak": nan, "out": None}


def measure(method, e, c, t, w, beta, reps, device) -> dict:
    """status, note, ms (median), ms_p20, ms_p80, ms_min, peak (MiB beyond the inputs) and out
    ((logp, entropy), None where the method did not run)."""
    from suite.measure import time_stats

    why = unavailable(method, device)
    if why is not None:
        return _failed(*why)
    cuda = torch.device(device).type == "cuda"
    try:
        fn = method_call(method, e, c, t, device)
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
        return _failed("oom")
    except (RuntimeError, ValueError, AssertionError) as err:
        # e.g. inductor's own allocation failures, or a peer rejecting these inputs: data, not a
        # crash
        from suite.measure import is_oom_text

        status = "oom" if is_oom_text(str(err)) else "error"
        line = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
        print(f"{method}: {line}", flush=True)
        return _failed(status, line)
    finally:
        if cuda:
            torch.cuda.empty_cache()
    stats = time_stats(times)
    return {"status": "ok", "note": NOTES.get(method, ""), "ms": stats["ms"],
            "ms_p20": stats["ms_p20"], "ms_p80": stats["ms_p80"], "ms_min": stats["ms_min"],
            "peak": peak, "out": out}


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
    err_lp = float("nan") if logp is None else float((logp[:rows].double() - ref[0]).abs().max())
    err_h = float("nan") if ent is None else float((ent[:rows].double() - ref[1]).abs().max())
    return err_lp, err_h


def _row(name, n, d, v, dtype, method, m, reps, errors, device_name) -> list:
    err_lp, err_h = errors
    return [name, n, d, v, str(dtype).removeprefix("torch."), method, m["status"],
            f"{m['ms']:.3f}", f"{m['ms_p20']:.3f}", f"{m['ms_p80']:.3f}", f"{m['ms_min']:.3f}",
            reps, f"{m['peak']:.1f}", f"{err_lp:.3e}", f"{err_h:.3e}", device_name, m["note"]]


def main(args) -> int:
    from suite.results import environment

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("python -m suite kernel rl needs a CUDA device (or --device cpu)")
    methods = _methods(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(environment(args.device), f, indent=2, default=str)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    device_name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
                   else "cpu (interpreter)")
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
                m = measure(method, e, c, t, w, beta, args.reps, args.device)
                err_lp, err_h = _errors(m.pop("out"), ref, rows)
                out.writerow(_row(name, n, d, v, dtype, method, m, args.reps, (err_lp, err_h),
                                  device_name))
                f.flush()
                print(f"{name:11s} {method:17s} {m['status']:4s} {m['ms']:9.2f} ms "
                      f"(p20 {m['ms_p20']:.2f} p80 {m['ms_p80']:.2f}) peak+ {m['peak']:9.1f} MiB"
                      f"  logp err {err_lp:.2e}  H err {err_h:.2e}  {m['note']}", flush=True)
            del e, c, t, w, beta, ref
    print(f"wrote {path}")
    return 0
