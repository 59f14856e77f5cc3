"""dC's error when its row chunks are summed in a bf16 buffer (one rounding per chunk), and
with the most frequent target tokens' rows summed in fp32 instead: a CPU simulation in fp64.

    PYTHONPATH=. python results/notes/dc-accumulator-cpu-sim/sim.py 16384 256 32000 OUT.csv

G is the exact softmax gradient (mean reduction) rounded to bf16, as the three-matmul path's
16-bit G; each chunk's G_R^T E_R is summed in fp32 (a GEMM's sums), then added to dC's bf16
buffer (round once); `hot` rows of dC (the most frequent targets of the batch) keep fp32 sums.
The error is ||dC - ref|| / ||ref|| against fp64's dC (suite.reference.rel_err's measure).
"""
import csv
import sys

import torch

from suite.inputs import make_inputs


def main(n, d, v, out):
    inp = make_inputs("lm", n, d, v, torch.bfloat16, seed=0, softcap=None)
    e, c, t = inp["e"].double(), inp["c"].double(), inp["targets"]
    g = torch.softmax(e @ c.T, -1)
    g[torch.arange(n), t] -= 1
    g /= n
    ref = g.T @ e
    g16 = g.to(torch.bfloat16).double()
    rel = lambda x: ((x - ref).norm() / ref.norm()).item()
    rows = [dict(chunks=1, hot=0, dc_rel_err=rel((g16.T @ e).float().bfloat16().double()))]
    counts = torch.bincount(t, minlength=v)
    for chunks in (4, 8, 16, 32):
        step = n // chunks
        for hot in (0, 256, 1024, 4096):
            idx = counts.topk(hot).indices
            dc = torch.zeros(v, d, dtype=torch.bfloat16)
            fp32 = torch.zeros(hot, d, dtype=torch.float64)
            for k in range(chunks):
                part = (g16[k * step:(k + 1) * step].T @ e[k * step:(k + 1) * step]).float()
                dc = (dc.double() + part.double()).float().bfloat16()
                fp32 += part[idx].double()
            got = dc.double()
            got[idx] = fp32.float().bfloat16().double()
            rows.append(dict(chunks=chunks, hot=hot, dc_rel_err=rel(got)))
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["n", "d", "v", "chunks", "hot", "dc_rel_err", "torch"])
        w.writeheader()
        for r in rows:
            w.writerow(dict(n=n, d=d, v=v, torch=torch.__version__, **r))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]), sys.argv[4])
