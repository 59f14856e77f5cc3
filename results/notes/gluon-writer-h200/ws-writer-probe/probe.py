"""Why dE of the ws writer differed from the TMA writer's at budget 0, D 1152, V 262144 (call24a:
dE 3.3 apart, dC equal): per chunk, each writer's W checksum and RowRound after it, then both
calls' dE and dC against fp64. Usage: python probe.py NxDxV[,...]"""
import sys

import torch

import own_kernel
from own_kernel import linear_cross_entropy
from own_kernel.paths import writers
from own_kernel.policy.config import overridden
from suite.inputs import make_inputs


LOG = []
LAST = {}  # the RowRound each writer left last


def record():
    """Wrap both TMA writers' write: per chunk (v_start, W's shape and strides, W's sum,
    RowRound's sum and largest magnitude after it) into LOG."""
    for cls in (writers.WsWriter, writers.TmaWriter):
        real = cls.write

        def write(self, w, rows, sums, v_start, *a, _real=real, **k):
            _real(self, w, rows, sums, v_start, *a, **k)
            LOG.append((v_start, tuple(w.shape), tuple(w.stride()), float(w.float().sum()),
                        float(sums.row_round.double().sum()),
                        float(sums.row_round.double().abs().max())))
            LAST[type(self).__name__] = sums.row_round.clone()
        cls.write = write



def fp64_grads(e, c, t):
    n = e.shape[0]
    de = torch.empty(n, e.shape[1], dtype=torch.float64, device=e.device)
    dc = torch.zeros(c.shape, dtype=torch.float64, device=e.device)
    used = (t != -100).sum()
    c64 = c.double()
    for r0 in range(0, n, 1024):
        z = e[r0:r0 + 1024].double() @ c64.T
        p = torch.softmax(z, dim=1)
        tt = t[r0:r0 + 1024]
        p[torch.arange(len(tt)), tt] -= 1.0
        p /= used
        de[r0:r0 + 1024] = p @ c64
        dc += p.T @ e[r0:r0 + 1024].double()
    return de, dc


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def main():
    record()
    for head in sys.argv[1].split(","):
        n, d, v = map(int, head.split("x"))
        inp = make_inputs("lm", n, d, v, torch.bfloat16, seed=0, device="cuda")
        e, c, t = inp["e"], inp["c"], inp["targets"]
        ref = fp64_grads(e, c, t)
        logs = {}
        for ws in (True, False):
            LOG.clear()
            with overridden({"recompute": {"ws": ws}, "fused": {"zero_budget": "recompute"}}):
                ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
                r = own_kernel.plan(ee, cc, t, workspace_mib=0)
                linear_cross_entropy(ee, cc, t, workspace_mib=0).backward()
            torch.cuda.synchronize()
            print(head, "ws" if ws else "tma", r.path, r.writer, r.tail_writer, r.chunks,
                  "dE", f"{rel(ee.grad, ref[0]):.3e}", "dC", f"{rel(cc.grad, ref[1]):.3e}",
                  flush=True)
            logs[ws] = list(LOG)
        a, b = LAST["WsWriter"].double(), LAST["TmaWriter"].double()
        nz = b.abs() > 0
        print("  RowRound ws / tma: median", float((a[nz] / b[nz]).median()), "rel diff",
              rel(a, b) if b.norm() > 0 else None, "|tma|", float(b.norm()))
        for i, (a, b) in enumerate(zip(logs[True], logs[False])):
            if i < 3 or a[3:] != b[3:]:
                print("  chunk", i, "ws", a, "\n         tma", b)
            if a[3:] != b[3:]:
                break


if __name__ == "__main__":
    main()
