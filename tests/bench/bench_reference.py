"""fp32 reference loss and gradients for the benchmarks' error columns.

Chunked over tokens so the N x V logits never exist at once (at Gemma 2 (2B) they would be
8 GB in fp32); gradients are written out by hand instead of through autograd, which would keep
every chunk's logits alive. TF32 is switched off: the reference must be more exact than the
bf16 kernels it judges.
"""
from __future__ import annotations

import torch

CHUNK_ELEMS = 1 << 28  # logits materialised at a time (1 GiB in fp32)


@torch.no_grad()
def fp32_reference(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    """Mean loss over non-ignored targets, dE (N, D), dC (V, D), dbias (V,) or None; all fp32."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return _reference(e.float(), c.float(), targets, None if bias is None else bias.float(),
                          softcap, ignore_index)
    finally:
        torch.set_float32_matmul_precision(precision)


def _reference(e, c, targets, bias, softcap, ignore_index):
    n, v = e.shape[0], c.shape[0]
    valid = targets != ignore_index
    count = valid.sum().clamp_min(1).to(torch.float32)
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    de = torch.empty_like(e)
    dc = torch.zeros_like(c)
    dbias = None if bias is None else torch.zeros_like(bias)
    loss = torch.zeros((), device=e.device, dtype=torch.float32)
    step = max(1, min(n, CHUNK_ELEMS // max(v, 1)))
    for s in range(0, n, step):
        rows = slice(s, s + step)
        logits = e[rows] @ c.T
        if bias is not None:
            logits += bias
        capped = None
        if softcap is not None:
            capped = torch.tanh(logits / softcap)
            logits = softcap * capped
        lse = torch.logsumexp(logits, dim=-1)
        ok = valid[rows].to(torch.float32)
        picked = logits.gather(1, safe[rows, None]).squeeze(1)
        loss += ((lse - picked) * ok).sum()
        # d(mean loss)/d(logits) = (softmax - onehot) / count on valid rows, 0 elsewhere.
        grad = torch.exp(logits.sub_(lse[:, None]))
        grad[torch.arange(grad.shape[0], device=grad.device), safe[rows]] -= 1.0
        grad *= (ok / count)[:, None]
        if capped is not None:
            grad *= 1.0 - capped * capped  # d(softcap * tanh(x / softcap))/dx
        de[rows] = grad @ c
        dc.addmm_(grad.T, e[rows])
        if dbias is not None:
            dbias += grad.sum(0)
    return loss / count, de, dc, dbias


def rel_err(x, ref) -> float:
    """||x - ref|| / ||ref||, in fp32."""
    ref_norm = ref.norm().item()
    diff = (x.float() - ref).norm().item()
    return diff / ref_norm if ref_norm > 0 else diff
