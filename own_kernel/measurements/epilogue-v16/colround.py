# dC's error with and without the column rounding correction (ColRound x mean row of E), in fp64
# on the CPU with the suite's lm inputs, against the naive bf16 baseline's (bf16 logits).
# Run from the repository root: python own_kernel/measurements/epilogue-v16/colround.py
import torch

from suite.inputs import make_inputs
from suite.reference import rel_err

for n, d, v in [(2048, 2304, 32000), (4096, 1024, 20000), (8192, 1024, 16000)]:
    inp = make_inputs("lm", n, d, v, "bf16", seed=0, device="cpu", softcap=None)
    e, c, t = inp["e"], inp["c"], inp["targets"]
    E, C = e.double(), c.double()
    p = torch.softmax(E @ C.T, 1)
    dd = p.clone()
    dd[torch.arange(n), t] -= 1
    dd /= n
    ref = dd.T @ E
    W = dd.to(torch.bfloat16).double()  # the workspace's rounding
    base = W.T @ E
    without = base.to(torch.bfloat16)
    with_col_round = (base + (dd - W).sum(0)[:, None] * E.mean(0)[None, :]).to(torch.bfloat16)
    pb = torch.softmax((e.float() @ c.float().T).to(torch.bfloat16).double(), 1)
    pb[torch.arange(n), t] -= 1
    naive = ((pb / n).to(torch.bfloat16).double().T @ E).to(torch.bfloat16)
    print(f"lm N={n} D={d} V={v}: dC rel err with ColRound {rel_err(with_col_round, ref):.5f}, "
          f"without {rel_err(without, ref):.5f}, naive bf16 {rel_err(naive, ref):.5f}", flush=True)
