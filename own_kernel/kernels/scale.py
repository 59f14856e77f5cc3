"""dst = src * scale[0], one pass: the three-matmul path's backward (paths/three_matmul.py)
applies the
loss's upstream gradient, a 0-d device tensor, without reading it on the host.

src and dst are contiguous, of any float dtypes (dst may be src: in place; then a scale of 1,
the usual upstream gradient of a loss, moves no bytes: at an fp32 dC of a large vocabulary that
is a pass of 8 bytes per entry saved, read on the device, no host read). torch's own mul with
a 0-d tensor of another dtype than the matrix takes its dynamically casting elementwise kernel,
which ran at half this pass's bandwidth on an H100 (results/notes/fused-path.md).

In place, a few programs per SM stride over the blocks: with one program per block, the
in-place times 1 launched one program per 4096 entries that loaded the scale and exited, 0.1 ms
for Llama 3 (8B)'s dC on an H200, against 0.01 ms strided. Where bytes move, one program per
block streams fastest (strided took 3-8 % longer), so a pass into another tensor (which always
moves them) keeps it (results/notes/scale-pass.md).
"""
import torch
import triton
import triton.language as tl

from own_kernel.kernels.tile import num_sms
from own_kernel.policy.plan import cdiv

BLOCK = 4096
PROGRAMS_PER_SM = 64  # in place; the most tried, closest to one per block where bytes move


@triton.jit
def _scale_kernel(Src, Dst, Scale, numel, BLOCK: tl.constexpr, IN_PLACE: tl.constexpr):
    scale = tl.load(Scale).to(tl.float32)
    limit = numel
    if IN_PLACE:  # times 1 in place is the identity: no load, no store (the usual backward)
        limit = numel * (scale != 1.0).to(tl.int64)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, limit, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < limit
        x = tl.load(Src + offs, mask=mask).to(tl.float32)
        tl.store(Dst + offs, (x * scale).to(Dst.dtype.element_ty), mask=mask)


def scale_into(src: torch.Tensor, dst: torch.Tensor, scale: torch.Tensor,
               max_programs: int | None = None) -> torch.Tensor:
    """dst = src * scale (scale: one element, on src's device); returns dst. max_programs: how
    many programs stride over the blocks (None: in place, a few per SM of src's device; else
    one per block)."""
    if not (src.is_contiguous() and dst.is_contiguous() and src.shape == dst.shape):
        raise ValueError(f"scale_into: src {tuple(src.shape)} and dst {tuple(dst.shape)} must be "
                         f"contiguous and of one shape")
    if max_programs is not None and max_programs < 1:
        raise ValueError(f"scale_into: max_programs must be at least 1, got {max_programs}")
    if src.numel():
        in_place = src.data_ptr() == dst.data_ptr() and src.dtype == dst.dtype
        blocks = cdiv(src.numel(), BLOCK)
        if max_programs is None:
            max_programs = PROGRAMS_PER_SM * num_sms(src.device) if in_place else blocks
        programs = min(blocks, max_programs)
        _scale_kernel[(programs,)](src, dst, scale, src.numel(), BLOCK=BLOCK,
                                   IN_PLACE=in_place, num_warps=8)
    return dst
