"""Launch the own kernel's passes once at the Gemma 2 (2B) shape, for a hardware-counter
profiler (nothing is timed here):

    ncu --clock-control none -k regex:"cce_fwd|nvjet" --section SpeedOfLight \\
        python -m own_kernel.profile fwd          # cuBLAS floor, pointer and TMA forward
    ncu --clock-control none -k regex:softmax_grad --launch-skip 20 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python -m own_kernel.profile bwd
"""
import argparse
import json
import os

import torch

from own_kernel import linear_cross_entropy
from own_kernel.configs import config_for
from own_kernel.forward import forward


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("fwd", "bwd", "bwd-filter"))
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    args = ap.parse_args(argv)
    from suite.inputs import make_inputs

    inp = make_inputs("lm", args.n, args.d, args.v, "bf16", seed=0, device="cuda", softcap=30.0)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    if args.what == "fwd":
        e @ c.T
        for tma in (False, True):
            os.environ["CCE_OWN_CONFIG"] = json.dumps({"fwd": {"TMA": tma}})
            forward(e, c, None, t, 30.0, False, config_for(e.device, e.dtype))
    else:
        e.requires_grad_(), c.requires_grad_()
        eps = "auto" if args.what == "bwd-filter" else None
        linear_cross_entropy(e, c, t, softcap=30.0, filter_eps=eps).backward()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
