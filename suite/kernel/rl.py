"""The head RL trainers need: per-token log-probability + entropy + backward, `python -m suite
kernel rl --out DIR [--models qwen2.5-7b,llama3-8b --n 32768 --reps 7 --methods ...]`.

For each model's head shape (vocabulary and hidden size from suite.model_configs), bf16, lm-like
inputs (suite.inputs, no softcap), random per-token weights w and beta, it times one call plus
its backward of

- own_loss_grad:      linear_cross_entropy(reduction="none", workspace_mib=0), backward of
                      sum w * loss: the exact recompute path without the entropy (the baseline);
- own_logp_entropy:   own_kernel.token_logprobs(return_entropy=True), backward of
                      sum w * logp + beta * H: the same path with the entropy;
- own_invariant:      the same with batch_invariant=True (each token's values and dE row
                      the same bits whatever else is in the batch);
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
                      compare against, timed on the same work (logp of every token + backward);
- liger_scaled_ce:    Liger's log-prob kernel, LigerFusedLinearScaledCrossEntropyFunction with
                      return_entropy=True (suite.providers.liger_scaled: its CuTe-DSL kernel on
                      sm_90), logp = -NLL, the same objective;
- verl_lce:           verl's linear_cross_entropy (suite.providers.verl: fused Triton log-probs
                      and entropy; upstream gradients made contiguous, which its backward
                      asserts), the same objective;
- liger_scaled_ce_tp: Liger's tensor-parallel variant: a row saying why it cannot run in one
                      process (suite.providers.liger_tp).

and writes, per method, the median, 20th and 80th percentile and fastest time of --reps calls
after a warm-up (p20-p80 so a verdict can use the project's rule: faster only where the ranges
do not overlap, else level), the peak memory beyond the inputs (gradients included), the
largest error of logp and H against an fp64 reference on the first --check-rows rows (NaN where
a method has none), the relative errors of dE and dC, ||g - g_ref|| / ||g_ref||, against the
fp64 gradient of the method's objective (with the entropy term where the method has one; NaN
for liger_grpo, whose objective is its own), and what a peer's provider reports it ran (``ran``).
A method that runs out of memory is a row with status "oom", one whose package is missing "not
installed", one whose provider cannot run here "unavailable", one that cannot take these
inputs or this device "unsupported", the reason in the note column (data, not a failure).
Writes DIR/rl.csv and DIR/env.json. CUDA: the timings and the memory need it; ``--device cpu``
(tiny shapes, TRITON_INTERPRET=1) runs the same code for tests.

``--models`` takes model names (their hidden size and vocabulary, --n tokens) and named shapes
of fixed N, D, V (SHAPES: Liger's published shape for its scaled CE).
"""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import time

import torch

from suite.measure import reset_compiled

MODELS = {"qwen2.5-7b": "Qwen 2.5 (7B)", "llama3-8b": "Llama 3 (8B)"}
# (N, D, V) that --n, --d and --v do not change: Liger's README times its scaled CE here
SHAPES = {"liger-readme": (16384, 4096, 131072)}
METHODS = ("own_loss_grad", "own_logp_entropy", "own_invariant", "naive", "compiled", "liger_flce_logp",
           "liger_scaled_ce", "verl_lce", "liger_scaled_ce_tp", "liger_grpo")
LIGER_METHODS = ("liger_flce_logp", "liger_grpo")
# methods that are a registered provider's log-prob function: availability and `ran` from it
PROVIDER_METHODS = ("liger_scaled_ce", "verl_lce", "liger_scaled_ce_tp")
OWN_OBJECTIVE = ("liger_grpo",)  # not sum w*logp + beta*H: no gradient reference
LIGER_MODULE = "liger_kernel"  # a name, so a test can play "not installed"
GRPO_SEQ_LEN = 4096  # tokens per GRPO sequence (a long completion); gcd with N where N is not
                     # a multiple, so tiny test shapes still split into whole sequences
FIELDS = ["model", "n", "d", "v", "dtype", "method", "status", "ms_median", "ms_p20", "ms_p80",
          "ms_min", "reps", "peak_extra_mib", "logp_max_abs_err", "entropy_max_abs_err",
          "de_rel_err", "dc_rel_err", "device", "ran", "note"]
NOTES = {  # what an ok row of a method does not measure, next to its numbers
    "own_loss_grad": "no entropy (the loss+grad baseline)",
    "liger_flce_logp": "no entropy; logp = -(per-token loss, reduction none)",
    "liger_grpo": "GRPO (dapo) loss, not sum w*logp + beta*H; returns the scalar loss only: "
                  "no logp or entropy to check",
    "verl_lce": "upstream gradients made contiguous (verl's backward asserts it)",
}


def add_arguments(ap) -> None:
    ap.add_argument("--out", required=True, help="directory for rl.csv and env.json")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                    + ", ".join(MODELS) + " (with --n), or the fixed shapes "
                    + ", ".join(f"{k} (N {n}, D {d}, V {v})" for k, (n, d, v) in SHAPES.items()))
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

    if name in SHAPES:
        return SHAPES[name]
    if name not in MODELS:
        raise SystemExit(f"--models: unknown model {name!r} ({', '.join([*MODELS, *SHAPES])})")
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
    if method in PROVIDER_METHODS:
        from suite import catalog

        why = catalog.get(method).unavailable_reason(device)
        return None if why is None else ("unavailable", why)
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
    if method == "own_invariant":
        return _weighted(lambda e, c, t: token_logprobs(e, c, t, return_entropy=True,
                                                        batch_invariant=True))
    if method == "naive":
        return _weighted(_naive_logp_entropy)
    if method == "compiled":
        return _weighted(torch.compile(_naive_logp_entropy))
    if method == "liger_flce_logp":
        return _weighted(_liger_flce_logp)
    if method == "liger_grpo":
        return _liger_grpo_call(e, c, t, device)
    if method == "liger_scaled_ce":
        from suite.providers.liger_scaled import logp_entropy
        return _weighted(logp_entropy)
    if method == "verl_lce":
        from suite.providers.verl import logp_entropy
        return _weighted(logp_entropy)
    raise ValueError(f"method: unknown {method!r}")


def _step(fn, e, c, t, w, beta, keep_grads=False):
    """One call and its backward; returns (logp, entropy) detached (None where absent), and
    with ``keep_grads`` also (dE, dC)."""
    ee, cc = e.detach().requires_grad_(), c.detach().requires_grad_()
    objective, logp, ent = fn(ee, cc, t, w, beta)
    objective.backward()
    out = (None if logp is None else logp.detach()), (None if ent is None else ent.detach())
    return (*out, ee.grad, cc.grad) if keep_grads else out


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _failed(status, note=""):
    nan = float("nan")
    return {"status": status, "note": note, "ms": nan, "ms_p20": nan, "ms_p80": nan,
            "ms_min": nan, "peak": nan, "out": None, "ran": ""}


def _ran(method) -> str:
    """What a provider-backed method's provider reports its last call ran."""
    if method not in PROVIDER_METHODS:
        return ""
    from suite import catalog

    report = catalog.get(method).ran
    return report() if report is not None else ""


def _timed(fn, e, c, t, w, beta, reps, device) -> tuple[list[float], float]:
    """(ms of each of ``reps`` steps, peak MiB beyond what was allocated before them)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        _step(fn, e, c, t, w, beta)
        _sync(device)
        times.append(1e3 * (time.perf_counter() - start))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
    return times, peak


def measure(method, e, c, t, w, beta, reps, device) -> dict:
    """status, note, ms (median), ms_p20, ms_p80, ms_min, peak (MiB beyond the inputs), ran and
    out ((logp, entropy, dE, dC) of one more step after the timed ones, None where the method
    did not run)."""
    from suite.measure import is_oom_text, time_stats
    from suite.registry import UnsupportedInput

    why = unavailable(method, device)
    if why is not None:
        return _failed(*why)
    try:
        fn = method_call(method, e, c, t, device)
        _step(fn, e, c, t, w, beta)  # warm-up: compilation, autotuning, workspaces
        _sync(device)
        times, peak = _timed(fn, e, c, t, w, beta, reps, device)
        out = _step(fn, e, c, t, w, beta, keep_grads=True)  # untimed: what errors are taken of
    except torch.OutOfMemoryError:
        return _failed("oom")
    except UnsupportedInput as err:  # the peer does not take these inputs: data
        return _failed("unsupported", str(err))
    except Exception as err:  # noqa: BLE001 - a failing method (a peer's compile error, a
        # rejected input, inductor's own allocation failure) is a row of data, not a crash
        status = "oom" if is_oom_text(str(err)) else "error"
        line = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
        print(f"{method}: {line}", flush=True)
        return dict(_failed(status, line), ran=_ran(method))
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    stats = time_stats(times)
    return {"status": "ok", "note": NOTES.get(method, ""), "ms": stats["ms"],
            "ms_p20": stats["ms_p20"], "ms_p80": stats["ms_p80"], "ms_min": stats["ms_min"],
            "peak": peak, "out": out, "ran": _ran(method)}


def reference_rows(e, c, t, rows):
    """(logp, entropy) of the first rows in fp64 (c in fp64 a chunk of the vocabulary at a
    time: its fp64 copy whole would be 4 V D bytes)."""
    e64 = e[:rows].double()
    z = torch.cat([e64 @ c[v0:v0 + 16384].double().T for v0 in range(0, c.shape[0], 16384)], 1)
    logp_all = torch.log_softmax(z, dim=-1)
    return (logp_all.gather(1, t[:rows, None]).squeeze(1),
            -(logp_all.exp() * logp_all).sum(-1))


def reference_grads(e, c, t, w, beta, rows_per_chunk=1024) -> dict:
    """{"logp": (dE, dC), "logp+H": (dE, dC)}: the fp64 gradients of sum w*logp and of
    sum w*logp + beta*H, a chunk of rows at a time (fp64 on the inputs' device; the results
    stored fp32 on the CPU, which adds ~6e-8 relative, so the GPU stays free for the methods).
    d(logp_t)/dz = onehot_t - p and dH/dz = -p (log p + H)."""
    c64 = c.double()
    de = {k: torch.empty(e.shape, dtype=torch.float32) for k in ("logp", "H")}
    dc = {k: torch.zeros(c.shape, dtype=torch.float64, device=c.device) for k in ("logp", "H")}
    for r0 in range(0, e.shape[0], rows_per_chunk):
        rows = slice(r0, r0 + rows_per_chunk)
        e64 = e[rows].double()
        logp_all = torch.log_softmax(e64 @ c64.T, dim=-1)
        p = logp_all.exp()
        entropy = -(p * logp_all).sum(-1, keepdim=True)
        g_logp = -p * w[rows, None].double()
        g_logp.scatter_add_(1, t[rows, None], w[rows, None].double())
        g_h = -p * (logp_all + entropy) * beta[rows, None].double()
        del logp_all, p
        for key, g in (("logp", g_logp), ("H", g_h)):
            de[key][rows] = (g @ c64).float().cpu()
            dc[key] += g.T @ e64
        del g_logp, g_h
    dc = {k: v.float().cpu() for k, v in dc.items()}
    return {"logp": (de["logp"], dc["logp"]),
            "logp+H": (de["logp"] + de["H"], dc["logp"] + dc["H"])}


def _errors(method, out, ref, grad_ref, rows) -> tuple[float, float, float, float]:
    """(logp max abs error, H max abs error, dE and dC relative errors); NaN where absent."""
    from suite.reference import rel_err

    nan = float("nan")
    if out is None:
        return nan, nan, nan, nan
    logp, ent, de, dc = out
    err_lp = nan if logp is None else float((logp[:rows].double() - ref[0]).abs().max())
    err_h = nan if ent is None else float((ent[:rows].double() - ref[1]).abs().max())
    if method in OWN_OBJECTIVE:
        return err_lp, err_h, nan, nan
    ref_de, ref_dc = grad_ref["logp" if ent is None else "logp+H"]
    return err_lp, err_h, rel_err(de, ref_de), rel_err(dc, ref_dc)


def _row(name, n, d, v, dtype, method, m, reps, errors, device_name) -> list:
    err_lp, err_h, err_de, err_dc = errors
    return [name, n, d, v, str(dtype).removeprefix("torch."), method, m["status"],
            f"{m['ms']:.3f}", f"{m['ms_p20']:.3f}", f"{m['ms_p80']:.3f}", f"{m['ms_min']:.3f}",
            reps, f"{m['peak']:.1f}", f"{err_lp:.3e}", f"{err_h:.3e}", f"{err_de:.3e}",
            f"{err_dc:.3e}", device_name, m["ran"], m["note"]]


def _measure_shape(write, name, args, methods, dtype, device_name) -> None:
    """Every method at one shape, each row handed to ``write`` as it comes."""
    n, d, v = _shape(name, args)
    e, c, t, w, beta = make_call_inputs(n, d, v, dtype, args.device)
    rows = min(args.check_rows, n)
    ref = reference_rows(e, c, t, rows)
    grad_ref = reference_grads(e, c, t, w, beta)
    for method in methods:
        m = measure(method, e, c, t, w, beta, args.reps, args.device)
        errors = _errors(method, m.pop("out"), ref, grad_ref, rows)
        write(_row(name, n, d, v, dtype, method, m, args.reps, errors, device_name))
        print(f"{name:12s} {method:18s} {m['status']:4s} {m['ms']:9.2f} ms "
              f"(p20 {m['ms_p20']:.2f} p80 {m['ms_p80']:.2f}) peak+ {m['peak']:9.1f} MiB  "
              f"logp err {errors[0]:.2e}  H err {errors[1]:.2e}  dE {errors[2]:.2e}  "
              f"dC {errors[3]:.2e}  {m['ran']} {m['note']}", flush=True)


def main(args) -> int:
    from suite.results import environment

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("python -m suite kernel rl needs a CUDA device (or --device cpu)")
    methods = _methods(args)
    for name in args.models.split(","):
        _shape(name, args)  # an unknown name fails before anything is measured
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

        def write(row):  # each row on disk as it comes: a killed run keeps what it measured
            out.writerow(row)
            f.flush()

        for name in args.models.split(","):
            reset_compiled()  # "compiled" for this shape alone, not dynamo's dynamic graph
            _measure_shape(write, name, args, methods, dtype, device_name)
    print(f"wrote {path}")
    return 0
