"""Backward, step 1 fused: recompute a chunk's logits on the tensor cores and write its softmax
gradient W directly, with TMA loads and stores.

One program per (BLOCK_N x BLOCK_V) tile of the chunk [v_start, v_start + width):

    x = E[rows] @ C[v_start + cols].T (+ bias)                      (fp32 accumulator, over D)
    d = (w_n + w'_n) p - w_n ((1 - ls) [v == t_n] + ls / V)
        - w_H,n p (z - mu)  (an entropy gradient; tile.py),   times softcap'(z)
    W[rows, cols] = d rounded to the input dtype

This is softmax_grad.py's epilogue on forward_tma.py's main loop: the cuBLAS path's fp32 logits
X (4 bytes per entry written, then read back) never exist, so a chunk's workspace is W alone
(2 bytes per entry). The sums the GEMMs will miss are kept exactly as softmax_grad.py keeps them
(see there): RowRound / ColRound, with FILTER RowWSum / ColWSum / ColKeep, ColSum
for dbias. Here they are reduced per tile and added with atomics, once per tile of D-deep work.
ColRound is optional (COL_ROUND; configs.py's col_round): a sum across the tile's rows crosses
warps through shared memory, the epilogue's most expensive part.

TMA zero-fills rows past N, columns past V and the D tail, and clips W's stores at N and width.
"""
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.policy.plan import cdiv
from own_kernel.kernels.rows import Partials
from own_kernel.kernels.tile import (accumulate, dot_precision, entropy_terms, halves, num_sms,
                             row_terms, softcap_scalars, softmax_ent_grad_tile)


@triton.jit
def _subtile_grad(x, out, rows, scalars, n0, w0,
                  HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
                  HAS_ENTROPY: tl.constexpr, COL_ROUND: tl.constexpr,
                  DETERMINISTIC: tl.constexpr, SUB_V: tl.constexpr):
    # One (BLOCK_N x SUB_V) slice of the tile's logits -> W and the column sums; returns the
    # slice's row sums (rounding removed, rounded values of the rows that may skip). out, rows
    # and scalars: the kernel's tuples (cce_dlogits_tma_kernel).
    W, Bias, ColRound, ColWSum, ColKeep, ColSum, ColPart = out
    offs_n, n_mask, lse, lo2, w, wp, tgt, pt_m1, ent, pz_t, wh, eps = rows
    V, v_start, width, tanh_scale, cap, smooth, col_plane = scalars
    offs_w = w0 + tl.arange(0, SUB_V)
    offs_v = v_start + offs_w
    w_mask = offs_w < width
    if HAS_BIAS:
        x += tl.load(Bias + offs_v, mask=w_mask, other=0.0).to(tl.float32)[None, :]
    d = softmax_ent_grad_tile(x, lse, lo2, w, wp, tgt, pt_m1, ent, pz_t, wh, offs_v, V, smooth,
                              tanh_scale, cap, HAS_SOFTCAP, HAS_ENTROPY)
    d = tl.where(n_mask[:, None] & w_mask[None, :], d, 0.0)
    d_used = d.to(W.dtype)
    W.store([n0, w0], d_used)
    d_used = d_used.to(tl.float32)
    r = d - d_used
    # DETERMINISTIC: this row block's partials, planes (ColRound, ColSum, ColWSum) of ColPart
    part = ColPart + (n0 // x.shape[0]) * width + offs_w
    if COL_ROUND:
        accumulate(ColRound + offs_v, part, tl.sum(r, axis=0), w_mask, DETERMINISTIC)
    if HAS_BIAS:
        accumulate(ColSum + offs_v, part + col_plane, tl.sum(d, axis=0), w_mask, DETERMINISTIC)
    row_wsum = tl.zeros_like(lse)
    if FILTER:
        # Over the rows that may skip (eps > 0): a column is kept when one of its entries
        # exceeds its row's eps. (paths/recompute.py counts the kept columns afterwards: an atomic
        # whose old value is used here stalls the tile for an L2 round trip, 6 ms per call.)
        may_skip = eps > 0
        d_skip = tl.where(may_skip[:, None], d_used, 0.0)
        row_wsum = tl.sum(d_skip, axis=1)
        accumulate(ColWSum + offs_v, part + 2 * col_plane, tl.sum(d_skip, axis=0), w_mask,
                   DETERMINISTIC)
        over = tl.where(may_skip[:, None], tl.abs(d) - eps[:, None], -1.0)
        keep = (tl.max(over, axis=0) > 0).to(tl.int32)
        tl.atomic_max(ColKeep + offs_v, keep, mask=w_mask, sem="relaxed")
    return tl.sum(r, axis=1), row_wsum


@triton.jit
def _pair_grad(x, out, rows, scalars, n0, w0,
               HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
               HAS_ENTROPY: tl.constexpr, COL_ROUND: tl.constexpr,
               DETERMINISTIC: tl.constexpr, BLOCK_N: tl.constexpr, SUB_V: tl.constexpr):
    # _subtile_grad on the two column halves of x (BLOCK_N x 2 SUB_V), one after the other
    a0, a1 = halves(x, BLOCK_N, SUB_V)
    r, ws = _subtile_grad(a0, out, rows, scalars, n0, w0, HAS_BIAS, HAS_SOFTCAP, FILTER,
                          HAS_ENTROPY, COL_ROUND, DETERMINISTIC, SUB_V)
    r1, ws1 = _subtile_grad(a1, out, rows, scalars, n0, w0 + SUB_V, HAS_BIAS, HAS_SOFTCAP,
                            FILTER, HAS_ENTROPY, COL_ROUND, DETERMINISTIC, SUB_V)
    return r + r1, ws + ws1


@triton.jit
def _tile_grad(x, out, rows, scalars, n0, w0,
               HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FILTER: tl.constexpr,
               HAS_ENTROPY: tl.constexpr, COL_ROUND: tl.constexpr,
               DETERMINISTIC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
               SUBTILES: tl.constexpr):
    # The whole tile's epilogue (x: BLOCK_N x BLOCK_V) in SUBTILES column slices, one after
    # the other; returns its row sums (_subtile_grad's). Slices because a whole 128 x 256
    # tile's temporaries next to its accumulator spill registers (ptxas, sm90: 236 bytes of
    # spill stores, 88 in halves).
    if SUBTILES == 1:
        r, ws = _subtile_grad(x, out, rows, scalars, n0, w0, HAS_BIAS, HAS_SOFTCAP, FILTER,
                              HAS_ENTROPY, COL_ROUND, DETERMINISTIC, BLOCK_V)
    elif SUBTILES == 2:
        r, ws = _pair_grad(x, out, rows, scalars, n0, w0, HAS_BIAS, HAS_SOFTCAP, FILTER,
                           HAS_ENTROPY, COL_ROUND, DETERMINISTIC, BLOCK_N, BLOCK_V // 2)
    else:
        tl.static_assert(SUBTILES == 4, "SUBTILES must be 1, 2 or 4")
        h0, h1 = halves(x, BLOCK_N, BLOCK_V // 2)
        r, ws = _pair_grad(h0, out, rows, scalars, n0, w0, HAS_BIAS, HAS_SOFTCAP, FILTER,
                           HAS_ENTROPY, COL_ROUND, DETERMINISTIC, BLOCK_N, BLOCK_V // 4)
        r1, ws1 = _pair_grad(h1, out, rows, scalars, n0, w0 + BLOCK_V // 2, HAS_BIAS,
                             HAS_SOFTCAP, FILTER, HAS_ENTROPY, COL_ROUND, DETERMINISTIC,
                             BLOCK_N, BLOCK_V // 4)
        r += r1
        ws += ws1
    return r, ws


@triton.jit
def cce_dlogits_tma_kernel(E, C, W, Bias, Targets, Lse, LseLo, Nll, RowWeight, RowWeightLse,
                           Ent, RowWeightEnt, RowEps,
                           RowRound, ColRound, RowWSum, ColWSum, ColKeep, ColSum, Part,
                           N, V, v_start, width,
                           tanh_scale, cap, smooth,
                           HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                           FILTER: tl.constexpr, HAS_GRAD_LSE: tl.constexpr,
                           HAS_ENTROPY: tl.constexpr, COL_ROUND: tl.constexpr,
                           DETERMINISTIC: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                           SUBTILES: tl.constexpr, GROUP_N: tl.constexpr, FLATTEN: tl.constexpr,
                           D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           WARP_SPECIALIZE: tl.constexpr):
    # Tiles in groups of GROUP_N row blocks x every column tile of the chunk, row blocks fastest:
    # the resident programs share a few blocks of E and the chunk's C in L2. Row blocks fastest
    # over all of E (as forward.py does) let W's stores evict E from L2 between its re-reads.
    # A program takes tiles pid, pid + programs, ... (one each unless launched persistent);
    # FLATTEN pipelines the next tile's loads under this tile's epilogue.
    num_nb = tl.cdiv(N, BLOCK_N)
    num_vb = tl.cdiv(width, BLOCK_V)
    per_group = GROUP_N * num_vb
    num_tiles = num_nb * num_vb
    # DETERMINISTIC partials (rows.Partials): per column tile, rows (RowRound, RowWSum); then
    # per row block, columns (ColRound, ColSum, ColWSum).
    col_part = Part + 2 * num_vb * N
    col_plane = num_nb * width
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        first_nb = (tile // per_group) * GROUP_N
        group_size = tl.minimum(num_nb - first_nb, GROUP_N)
        n0 = (first_nb + (tile % per_group) % group_size) * BLOCK_N
        w0 = ((tile % per_group) // group_size) * BLOCK_V  # first column of the tile, in the chunk

        acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            acc = tl.dot(E.load([n0, d0]), C.load([v_start + w0, d0]).T, acc,
                         input_precision=DOT_PRECISION)

        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        lse, lo2, w, wp, tgt, pt_m1 = row_terms(Lse, LseLo, Nll, RowWeight, RowWeightLse, Targets,
                                                offs_n, n_mask, HAS_GRAD_LSE)
        ent, pz_t, wh = entropy_terms(Ent, RowWeightEnt, Nll, offs_n, n_mask, HAS_ENTROPY)
        eps = lse
        if FILTER:
            eps = tl.load(RowEps + offs_n, mask=n_mask, other=float("inf"))

        # the epilogue's operands, as tuples: where it writes, its rows' terms, its scalars
        out = (W, Bias, ColRound, ColWSum, ColKeep, ColSum, col_part)
        rows = (offs_n, n_mask, lse, lo2, w, wp, tgt, pt_m1, ent, pz_t, wh, eps)
        scalars = (V, v_start, width, tanh_scale, cap, smooth, col_plane)
        r, ws = _tile_grad(acc, out, rows, scalars, n0, w0, HAS_BIAS, HAS_SOFTCAP, FILTER,
                           HAS_ENTROPY, COL_ROUND, DETERMINISTIC, BLOCK_N, BLOCK_V, SUBTILES)
        row_part = Part + (w0 // BLOCK_V) * N + offs_n
        accumulate(RowRound + offs_n, row_part, r, n_mask, DETERMINISTIC)
        if FILTER:
            accumulate(RowWSum + offs_n, row_part + num_vb * N, ws, n_mask, DETERMINISTIC)


class RecomputeTma:
    """The launcher, made once per backward: the descriptors of E and C, the call's constants.
    ``write(w, rows, sums, v_start, filters)`` writes W (rows x w.shape[1]) for e's rows at
    columns [v_start, v_start + width), adding RowRound, ColRound (cfg.col_round and
    col_round), ColSum and, filtered, the filter's sums into sums; deterministic: through
    rows.Partials instead of atomics."""

    def __init__(self, e, c, bias, softcap, smooth, cfg, deterministic=False, temperature=1.0):
        k = cfg.recompute
        self.k, self.v, self.d = k, c.shape[0], e.shape[1]
        self.bias, self.deterministic = bias, deterministic
        self.e_desc = TensorDescriptor.from_tensor(e, [k.tiles.block_n, k.tiles.block_d])
        self.c_desc = TensorDescriptor.from_tensor(c, [k.tiles.block_v, k.tiles.block_d])
        self.scalars = (*softcap_scalars(softcap, temperature), float(smooth))
        self.flags = dict(HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
                          DOT_PRECISION=dot_precision(e.dtype), SUBTILES=k.subtiles,
                          GROUP_N=k.group_n, FLATTEN=k.flatten,
                          WARP_SPECIALIZE=k.warp_specialize, **k.tiles.launch())
        self.slots = num_sms(e.device)

    def write(self, w, rows, sums, v_start, filters=False, col_round=True, e_desc=None):
        """e_desc: a descriptor of other rows of E than the whole (low memory's row chunks)."""
        n, width = w.shape
        k = self.k.tiles
        w_desc = TensorDescriptor.from_tensor(w, [k.block_n, k.block_v // self.k.subtiles])
        tiles = cdiv(n, k.block_n) * cdiv(width, k.block_v)
        grid = (min(tiles, self.slots) if self.k.persistent else tiles,)
        col_round = self.k.col_round and col_round
        part = Partials(self.deterministic, cdiv(width, k.block_v), n, cdiv(n, k.block_n),
                        width, w.device)
        stand_in = sums.col_round  # for pointers whose flag is off: never read
        cce_dlogits_tma_kernel[grid](
            e_desc or self.e_desc, self.c_desc, w_desc,
            self.bias if self.bias is not None else stand_in,
            rows.targets, rows.lse, rows.lse_lo_or_zeros(), rows.nll, rows.weight,
            rows.weight_lse if rows.weight_lse is not None else rows.weight,
            *rows.entropy_args(), rows.eps if filters else rows.weight,
            sums.row_round, sums.col_round, sums.row_skip,
            sums.col_wsum if filters else stand_in, sums.col_keep if filters else stand_in,
            sums.col_sum, part.buffer, n, self.v, v_start, width, *self.scalars, D=self.d,
            FILTER=filters, HAS_GRAD_LSE=rows.weight_lse is not None,
            HAS_ENTROPY=rows.weight_ent is not None, COL_ROUND=col_round,
            DETERMINISTIC=self.deterministic, **self.flags)
        part.add_to(sums, v_start, _written(col_round, self.bias is not None, filters))


def _written(col_round: bool, bias: bool, filters: bool) -> set:
    """The sums a softmax-gradient launch adds to."""
    return ({"row_round"} | ({"col_round"} if col_round else set())
            | ({"col_sum"} if bias else set())
            | ({"row_skip", "col_wsum"} if filters else set()))
