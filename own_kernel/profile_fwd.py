"""One launch each of the cuBLAS floor (E @ C.T), the pointer forward and the TMA forward at the
Gemma 2 (2B) shape, for a hardware-counter profiler:

    ncu --clock-control none -k regex:"cce_fwd|nvjet" --section SpeedOfLight \\
        python -m own_kernel.profile_fwd
"""
import argparse
import json
import os

import torch

from own_kernel.configs import config_for
from own_kernel.forward import forward


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    args = ap.parse_args(argv)
    from suite.inputs import make_inputs

    inp = make_inputs("lm", args.n, args.d, args.v, "bf16", seed=0, device="cuda", softcap=30.0)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    e @ c.T
    for tma in (False, True):
        os.environ["CCE_OWN_CONFIG"] = json.dumps({"fwd": {"TMA": tma}})
        forward(e, c, None, t, 30.0, False, config_for(e.device, e.dtype))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
