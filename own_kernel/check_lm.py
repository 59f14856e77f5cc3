"""Gradient agreement of own / own_filter with the naive baseline on the suite's lm inputs:
`python -m own_kernel.check_lm [--n 4096 --v 50257 --d 2304]` (GPU)."""
import argparse

import torch

from suite.inputs import make_inputs
from suite.reference import reference
from suite.registry import get


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=50257)
    ap.add_argument("--dist", default="lm")
    args = ap.parse_args()
    inp = make_inputs(args.dist, args.n, args.d, args.v, "bf16", seed=0, device="cuda", softcap=30.0)
    ref = reference(inp["e"], inp["c"], inp["targets"], softcap=30.0)
    print({k: (float(v) if torch.is_tensor(v) and v.numel() == 1 else None) for k, v in ref.items()
           if not torch.is_tensor(v) or v.numel() == 1})
    rel = lambda a, b: float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())
    for name in ["naive", "own", "own_filter"]:
        e = inp["e"].clone().requires_grad_()
        c = inp["c"].clone().requires_grad_()
        loss = get(name).fn(e, c, inp["targets"], softcap=30.0)
        loss.backward()
        print(f"{name:12s} dE {rel(e.grad, ref['de']):.2e} dC {rel(c.grad, ref['dc']):.2e}")


if __name__ == "__main__":
    main()
