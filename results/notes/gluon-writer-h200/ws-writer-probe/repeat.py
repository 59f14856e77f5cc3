"""dE of repeated calls at budget 0 against fp64, as interleave makes them (its warm-up calls,
then the measured one), where interleave found two entries' dE far apart at D 1152, V 262144.
Usage: python repeat.py NxDxV CALLS OVERRIDES_JSON..."""
import json
import sys

import torch

from own_kernel import linear_cross_entropy
from own_kernel.policy.config import overridden
from suite.inputs import make_inputs

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe import fp64_grads, rel  # noqa: E402

n, d, v = map(int, sys.argv[1].split("x"))
inp = make_inputs("lm", n, d, v, torch.bfloat16, seed=0, device="cuda")
e, c, t = inp["e"], inp["c"], inp["targets"]
ref = fp64_grads(e, c, t)
e.requires_grad_()
c.requires_grad_()
for spec in sys.argv[3:]:
    for i in range(int(sys.argv[2])):
        with overridden(json.loads(spec)):
            loss = linear_cross_entropy(e, c, t, workspace_mib=0)
            loss.backward()
        torch.cuda.synchronize()
        print(spec, "call", i, "loss", float(loss), "dE", f"{rel(e.grad, ref[0]):.3e}", "dC",
              f"{rel(c.grad, ref[1]):.3e}", "dE finite", bool(e.grad.isfinite().all()),
              flush=True)
        e.grad = c.grad = None
