"""The cuBLAS forward's pass (paths/forward.py; Route.forward "cublas" off the three-matmul
path): a chunk of rows' fp32 logits x, which cuBLAS wrote, read once into each row's forward
partials, as one vocabulary split of lse_combine.py's:

    m = max_v z_v,  s = sum_v exp(z_v - m),  [sum_v z_v],  [t = sum_v exp(z_v - m) (z_v - m)]

with z = softcap(x) / T. One program per row folds BLOCK columns at a time with the pointer
forward's online update (tile.lse_ent_tile_update), so the partials are those its one split
would hold, from the same fp32 sums of E @ C.T (cuBLAS's instead of the tensor cores' in
Triton). The target's logit and the combination into loss, lse and the rest are the forward's
(target.py, lse_combine.py).
"""
import torch
import triton
import triton.language as tl

from own_kernel.kernels.lse_combine import PartialSums
from own_kernel.kernels.tile import (lse_ent_tile_update, lse_init, softcap_scalars,
                                     store_split_partials)


@triton.jit
def _logits_partials_kernel(X, stride_x, Part, row0, N, V, plane, tanh_scale, cap,
                            HAS_SOFTCAP: tl.constexpr, NEED_ZSUM: tl.constexpr,
                            NEED_ENT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = X + row.to(tl.int64) * stride_x
    cols = tl.arange(0, BLOCK)
    m, s, z_sum, t = lse_init(1)
    for v0 in range(0, V, BLOCK):
        v_mask = cols < V - v0
        x = tl.load(x_row + v0 + cols[None, :], mask=v_mask[None, :], other=0.0)
        m, s, z_sum, t = lse_ent_tile_update(x, m, s, z_sum, t, v_mask, tanh_scale, cap,
                                             HAS_SOFTCAP, NEED_ZSUM, NEED_ENT)
    # one split: the grid's second axis has one program, its id the split's 0
    store_split_partials(Part, tl.program_id(1), N, plane, row0 + row + tl.arange(0, 1),
                         tl.full((1,), True, tl.int1), m, s, z_sum, t, NEED_ZSUM, NEED_ENT)


def logits_partials(x: torch.Tensor, part: torch.Tensor, row0: int, softcap, sums: PartialSums,
                    *, block: int, num_warps: int) -> None:
    """Rows row0 .. row0 + len(x) of part (sums.planes x 1 x N fp32) from x, their fp32 raw
    logits (rows x V, unit stride along V)."""
    rows, v = x.shape
    if rows == 0:
        return
    n = part.shape[2]
    _logits_partials_kernel[(rows, 1)](
        x, x.stride(0), part, row0, n, v, n, *softcap_scalars(softcap, sums.temperature),
        HAS_SOFTCAP=softcap is not None, NEED_ZSUM=sums.zsum, NEED_ENT=sums.entropy,
        BLOCK=block, num_warps=num_warps)
