"""One ws_lse call at a small shape, its lse against fp64: python3 diag.py N D V KWARGS_JSON
(each configuration in a process of its own, since a device fault ends the process's context)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ws_lse import ws_lse  # noqa: E402

n, d, v = (int(x) for x in sys.argv[1:4])
kw = json.loads(sys.argv[4])
g = torch.Generator(device="cuda").manual_seed(0)
e = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16)
c = (torch.randn(v, d, device="cuda", generator=g) / d**0.5).to(torch.bfloat16)
got = ws_lse(e, c, **kw)
torch.cuda.synchronize()
ref = torch.logsumexp(e.double() @ c.double().T, dim=1)
print("ok", n, d, v, kw, "max abs err", (got.double() - ref).abs().max().item(), flush=True)
