"""High-precision reference loss and gradients, and the relative errors against it.

Same math as the ``naive`` provider, softcap(E @ C.T + bias) then mean cross-entropy over the
non-ignored rows, but with the inputs upcast first: fp64 on CPU, fp32 with TF32 off on CUDA.
Rows are processed in chunks so at most ``ROW_CHUNK_ELEMS`` logits exist at once; the gradients
are moved to the CPU so providers are measured without them in GPU memory.
"""
from __future__ import annotations

import contextlib
import math

import torch

from suite.inputs import apply_softcap, row_chunk


@contextlib.contextmanager
def no_tf32():
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
           torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old[:2]
        torch.set_float32_matmul_precision(old[2])


def reference(e, c, targets, *, bias=None, softcap=None, ignore_index=-100) -> dict:
    """Return dict(loss, de, dc, dbias, mean_loss, entropy); gradients are CPU tensors.

    ``loss`` / ``mean_loss``: mean cross-entropy over non-ignored rows (a float);
    ``entropy``: mean softmax entropy over all rows (nats).
    """
    acc = torch.float64 if e.device.type == "cpu" else torch.float32
    n, v = e.shape[0], c.shape[0]
    valid = targets != ignore_index
    n_valid = int(valid.sum())
    with torch.no_grad(), no_tf32():
        c_up = c.to(acc)
        b_up = None if bias is None else bias.to(acc)
        dc = torch.zeros_like(c_up)
        dbias = None if bias is None else torch.zeros_like(b_up)
        # Pinned host memory: each provider's error check copies the reference back to the
        # GPU, ~4 GiB for dC at V 256000 D 4096, twice per provider; pageable copies made that
        # a large share of a grid cell's time.
        pin = e.device.type == "cuda"
        de = torch.empty(e.shape, dtype=torch.float32 if acc == torch.float32 else acc,
                         pin_memory=pin)
        loss_sum = torch.zeros((), dtype=torch.float64, device=e.device)
        ent_sum = torch.zeros((), dtype=torch.float64, device=e.device)
        step = row_chunk(n, v)
        for s in range(0, n, step):
            e_k = e[s:s + step].to(acc)
            t_k, ok = targets[s:s + step], valid[s:s + step]
            z = e_k @ c_up.T
            if b_up is not None:
                z += b_up
            x = apply_softcap(z, softcap)
            logp = torch.log_softmax(x, dim=-1)
            del x
            p = logp.exp()
            ent_sum += -(p * logp).sum(-1).sum().double()
            safe_t = torch.where(ok, t_k, 0)
            picked = logp.gather(1, safe_t[:, None]).squeeze(1)
            loss_sum += -(picked * ok).sum().double()
            del logp
            # d loss / d x = (softmax - onehot) / n_valid on valid rows; 0 on ignored ones.
            g = p
            g.scatter_add_(1, safe_t[:, None], -torch.ones_like(picked)[:, None])
            g *= (ok.to(acc) / max(n_valid, 1))[:, None]
            if softcap is not None:
                g *= 1 - torch.tanh(z / softcap) ** 2
            del z
            de[s:s + step] = (g @ c_up).to(de.dtype).cpu()
            dc += g.T @ e_k
            if dbias is not None:
                dbias += g.sum(0)
            del g
        loss = (loss_sum / n_valid).item() if n_valid else math.nan
        out = {
            "loss": loss,
            "mean_loss": loss,
            "entropy": (ent_sum / n).item(),
            "de": de,
            "dc": _to_host(dc.to(de.dtype), pin),
            "dbias": None if dbias is None else _to_host(dbias.to(de.dtype), pin),
        }
    return out


def _to_host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
    out.copy_(t)
    return out


def rel_err(got: torch.Tensor | None, ref: torch.Tensor | None, chunk_elems: int = 1 << 26) -> float:
    """||got - ref|| / ||ref||, in fp64, chunked along dim 0 so no full-size copy is made.

    ``got`` may live on the GPU and ``ref`` on the CPU; NaN when got is missing or not finite.
    """
    if got is None or ref is None:
        return math.nan
    if got.shape != ref.shape:
        raise ValueError(f"gradient shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
    num = torch.zeros((), dtype=torch.float64, device=got.device)
    den = torch.zeros((), dtype=torch.float64, device=got.device)
    rows = max(1, chunk_elems // max(1, ref[0].numel() if ref.dim() else 1))
    if ref.dim() == 0:
        got, ref = got.reshape(1), ref.reshape(1)
    with torch.no_grad():
        for s in range(0, ref.shape[0], rows):
            r = ref[s:s + rows].to(got.device, torch.float64)
            g = got[s:s + rows].to(torch.float64)
            num += (g - r).square().sum()
            den += r.square().sum()
    num, den = num.item(), den.item()
    if not math.isfinite(num):
        return math.nan
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return math.sqrt(num / den)


def loss_rel_err(loss: float, ref_loss: float) -> float:
    if not math.isfinite(loss):
        return math.nan
    return abs(loss - ref_loss) / abs(ref_loss) if ref_loss else abs(loss - ref_loss)
