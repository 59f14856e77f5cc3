"""Torch-side helpers of the backward: GEMMs that accumulate 16-bit products in fp32 (cuBLAS on
CUDA, fp32 math on the CPU for the interpreter's tests), sampled mean rows, and host reads of
small device values that wait for their own copy only."""
from __future__ import annotations

import functools

import torch

# Rows sampled for the plain mean rows of C and E used by the rounding corrections: any vector
# keeps the result exact (see dlogits.py); a good estimate of the shared component keeps the
# residual small.
MEAN_SAMPLE_ROWS = 4096


def sampled_mean(x: torch.Tensor) -> torch.Tensor:
    """The fp32 mean of about MEAN_SAMPLE_ROWS evenly spaced rows of x, as one GEMV summing in
    fp32: a sum with dtype=float32 would first copy the rows to fp32, a block that sat on top of
    the three-matmul path's peak (`python -m suite kernel memory --workspace-mib 2048`)."""
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1], device=x.device, dtype=torch.float32)
    rows = x[:: max(1, x.shape[0] // MEAN_SAMPLE_ROWS)]
    total = torch.empty(1, x.shape[1], device=x.device, dtype=torch.float32)
    mm_fp32(torch.ones(1, rows.shape[0], device=x.device, dtype=x.dtype), rows, total)
    return total[0] / rows.shape[0]


def weighted_mean(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum_i weights[i] x[i] / sum_i weights[i] (0 when nothing was weighted)."""
    total = weights.sum()
    mean = (weights.to(x.dtype) @ x).float()
    return torch.where(total != 0, mean / total, 0.0)




@functools.lru_cache(maxsize=None)
def cublas_accumulates_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch.addmm can add a 16-bit product into an fp32 matrix in place on this device
    (torch >= 2.7's out_dtype): a property of the installed torch, probed once."""
    try:
        a = torch.ones(8, 8, device=device, dtype=dtype)
        acc = torch.ones(8, 8, device=device, dtype=torch.float32)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
        return bool((acc == 9).all())
    except (RuntimeError, TypeError):
        return False


# ---- GEMMs in torch: cuBLAS on CUDA; fp32 math on the CPU (interpreter tests) -----------------

def _fp32_products(a) -> bool:
    """Whether a @ b of a's dtype can accumulate in fp32 in place: fp32 itself, or cuBLAS with
    out_dtype; else (the CPU, an older torch) the operands are upcast."""
    return a.dtype == torch.float32 or (a.is_cuda and cublas_accumulates_fp32(a.device, a.dtype))


def mm_fp32(a, b, out):
    """out (fp32) = a @ b, products of 16-bit inputs accumulated in fp32."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
    elif _fp32_products(a):
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        torch.mm(a.float(), b.float(), out=out)


def logits_fp32(z, e_rows, c, bias, runs) -> None:
    """z[:, a:b] (fp32) = e_rows @ c[a:b].T (+ bias[a:b], added in fp32) for each column run
    (a, b): the logits of 16-bit rows as cuBLAS sums them, never rounded to 16 bits."""
    for a, b in runs:
        mm_fp32(e_rows, c[a:b].t(), z[:, a:b])
        if bias is not None:
            z[:, a:b] += bias[a:b]


def addmm_fp32(acc, a, b, alpha: float = 1.0, beta: float = 1.0):
    """acc (fp32) = beta * acc + alpha * a @ b (beta 0: acc is not read, may hold anything)."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b, alpha=alpha, beta=beta)
    elif _fp32_products(a):
        torch.addmm(acc, a, b, alpha=alpha, beta=beta, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float(), alpha=alpha, beta=beta)


def mm_scaled(out, a, b, scale, accumulate=False):
    """out (input dtype) (+)= scale * a @ b."""
    if a.is_cuda:
        torch.addmm(out, a, b, beta=1 if accumulate else 0, alpha=scale, out=out)
    else:
        res = torch.mm(a.float(), b.float()) * scale
        out.copy_(res + out.float() if accumulate else res)


class HostScalar:
    """A small device tensor read on the host once, when first needed: the copy is queued
    (pinned, non-blocking) when it is made, so the read waits for that copy, not for the kernels
    queued after it (a plain .item() waits for the whole stream and idles the GPU while the
    host catches up)."""

    def __init__(self, tensor: torch.Tensor | None = None, value: float | None = None):
        self.value, self.ready = value, None
        if value is None:
            if tensor.is_cuda:
                self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                self.host.copy_(tensor, non_blocking=True)
                self.ready = torch.cuda.Event()
                self.ready.record()
            else:
                self.host = tensor

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None

    def __float__(self) -> float:
        if self.value is None:
            self.wait()
            self.value = float(self.host)
        return self.value

    def values(self) -> list[float]:
        """All of the tensor's values (for a tensor of several)."""
        self.wait()
        return self.host.tolist()

    def at(self, i: int) -> float:
        """The tensor's i-th value (of a 1-D tensor), without copying the rest into a list."""
        self.wait()
        return float(self.host[i])
