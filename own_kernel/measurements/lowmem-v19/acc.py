# (copied from the scratch script that produced acc.txt; run from the repository root on a GPU)
# dE error of own vs own low_memory variants, lm inputs (which chunking of the dE reduction)
import json, os, sys, torch
from suite.inputs import make_inputs
from suite.reference import reference, rel_err
from own_kernel import linear_cross_entropy
n, d, v = (int(x) for x in sys.argv[1:4])
x = make_inputs("lm", n, d, v, "bf16", seed=0, device="cuda")
ref = reference(x["e"], x["c"], x["targets"])
variants = {"own": ({}, False), "low": ({}, True),
            "low_groups4": ({"low_memory_min_entries": n * d}, True)}
for name, (cfg, lm) in variants.items():
    os.environ["CCE_OWN_CONFIG"] = json.dumps(cfg)
    e = x["e"].detach().clone().requires_grad_(); c = x["c"].detach().clone().requires_grad_()
    linear_cross_entropy(e, c, x["targets"], low_memory=lm).backward()
    from own_kernel import backward_low_memory as b
    print(f"{name:12s} de {rel_err(e.grad, ref['de']):.5f} dc {rel_err(c.grad, ref['dc']):.5f} {b.LAST_PLAN if lm else ''}", flush=True)
