"""dst = src * scale[0], one pass: the three-matmul path's backward (paths/three_matmul.py)
applies the
loss's upstream gradient, a 0-d device tensor, without reading it on the host.

src and dst are contiguous, of any float dtypes (dst may be src: in place; then a scale of 1,
the usual upstream gradient of a loss, moves no bytes: at an fp32 dC of a large vocabulary that
is a pass of 8 bytes per entry saved, read on the device, no host read). torch's own mul with
a 0-d tensor of another dtype than the matrix takes its dynamically casting elementwise kernel,
which ran at half this pass's bandwidth on an H100 (results/notes/fused-path.md).
"""
import torch
import triton
import triton.language as tl

from own_kernel.policy.plan import cdiv

BLOCK = 4096


@triton.jit
def _scale_kernel(Src, Dst, Scale, numel, BLOCK: tl.constexpr, IN_PLACE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    scale = tl.load(Scale).to(tl.float32)
    limit = numel
    if IN_PLACE:  # times 1 in place is the identity: no load, no store (the usual backward)
        limit = numel * (scale != 1.0).to(tl.int64)
    mask = offs < limit
    x = tl.load(Src + offs, mask=mask).to(tl.float32)
    tl.store(Dst + offs, (x * scale).to(Dst.dtype.element_ty), mask=mask)


def scale_into(src: torch.Tensor, dst: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """dst = src * scale (scale: one element, on src's device); returns dst."""
    if not (src.is_contiguous() and dst.is_contiguous() and src.shape == dst.shape):
        raise ValueError(f"scale_into: src {tuple(src.shape)} and dst {tuple(dst.shape)} must be "
                         f"contiguous and of one shape")
    if src.numel():
        in_place = src.data_ptr() == dst.data_ptr() and src.dtype == dst.dtype
        _scale_kernel[(cdiv(src.numel(), BLOCK),)](src, dst, scale, src.numel(), BLOCK=BLOCK,
                                                   IN_PLACE=in_place, num_warps=8)
    return dst
