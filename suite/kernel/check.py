"""Gradient agreement of own / own_filter with the naive baseline on the suite's inputs:
`python -m suite kernel check [--n 4096 --v 50257 --d 2304 --dist lm] [--override JSON]`.
Prints the reference's loss and each provider's relative error of dE and dC (Frobenius
norms). Without CUDA it runs on the CPU under the Triton interpreter (use small shapes there)."""
import json

import torch

from suite.inputs import make_inputs
from suite.kernel.internals import config_override
from suite.reference import reference
from suite.catalog import get

PROVIDERS = "naive,own,own_filter,own_low_memory"
# Under the CPU's Triton interpreter a problem of N x V logits takes about N x V / 10^5 seconds
# per provider: past 2^20 logits a check runs for minutes, so it is refused up front.
CPU_MAX_LOGITS = 1 << 20


def add_arguments(ap) -> None:
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=50257)
    ap.add_argument("--dist", default="lm", choices=("lm", "uniform"), help="the suite's inputs")
    ap.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--providers", default=PROVIDERS,
                    help="comma-separated providers to compare (default: %(default)s)")
    ap.add_argument("--override", type=json.loads, default={},
                    help="JSON config override the providers run under (e.g. "
                         "'{\"recompute\": {\"warp_specialize\": true}}'): an experimental "
                         "kernel variant checked against the same reference")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                    help="inputs' dtype (default bf16 on CUDA, fp32 on the CPU, where the "
                         "interpreter's bf16 is not the GPU's)")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm())


def main(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("kernel check: --device cuda, but no CUDA device is available here")
        return 2
    if torch.device(device).type == "cpu" and args.n * args.v > CPU_MAX_LOGITS:
        print(f"kernel check: no CUDA device, and N {args.n} x V {args.v} is too large for the "
              f"CPU's Triton interpreter (at most {CPU_MAX_LOGITS} logits): pass a small shape, "
              f"e.g. --n 256 --d 64 --v 1000, or run on a CUDA device")
        return 2
    dtype = args.dtype or ("fp32" if device == "cpu" else "bf16")
    inp = make_inputs(args.dist, args.n, args.d, args.v, dtype, seed=0, device=device, softcap=30.0)
    ref = reference(inp["e"], inp["c"], inp["targets"], softcap=30.0)
    print({k: (float(v) if torch.is_tensor(v) and v.numel() == 1 else None) for k, v in ref.items()
           if not torch.is_tensor(v) or v.numel() == 1})
    if args.override:
        print(f"config override: {json.dumps(args.override)}")
    for name in args.providers.split(","):
        e = inp["e"].clone().requires_grad_()
        c = inp["c"].clone().requires_grad_()
        with config_override(args.override):
            get(name).fn(e, c, inp["targets"], softcap=30.0).backward()
        print(f"{name:12s} dE {relative_error(e.grad, ref['de']):.2e} "
              f"dC {relative_error(c.grad, ref['dc']):.2e}")
    return 0
