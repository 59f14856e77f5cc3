"""Backward, step 1, by a warp-specialised Gluon kernel on Hopper: dlogits_tma.py's softmax
gradient W of a chunk of plain logits, its epilogue under the tensor cores.

    x = E[rows] @ C[v_start + cols].T                                (fp32, over D)
    d = (w_n + w'_n) p - w_n ((1 - ls) [v == t_n] + ls / V),   p = exp(x - lse_n)
    W[rows, cols] = d rounded to the input dtype;  RowRound[n] += sum over cols of (d - W)

Why: dlogits_tma.py's epilogue (the exponentials, W's store) runs between its tiles' matmuls,
as forward_tma.py's did; forward_ws.py's ping-pong hides it (results/notes/gluon-forward.md).
Here the same producer warp and ring feed two consumer warpgroups that take tiles in turn;
each consumer writes its tile's W through its own shared-memory buffer and a TMA store, so the
store too runs under the other consumer's matmul.

The tiles: 128 x 128 per consumer, in dlogits_tma.py's order (groups of group_n row blocks, row
blocks fastest, then the chunk's column tiles), a persistent program taking tiles pid, pid + P,
...: the programs resident at once share C's and E's tiles through L2, and each gets its share
to one tile. The target column's p_t - 1 comes from the forward's nll, as tile.py explains.

Plain logits only (the route sends bias, softcap, temperature, the entropy, the filter, the
column rounding sums and deterministic calls to dlogits_tma.py): 16-bit E, C and W through TMA
(16-byte aligned bases and rows) and sm90. Rows past N have lse +inf and weight 0: d = 0; TMA
clips W's store at its rows and the chunk's width. Gluon has no interpreter: the CPU tests
compile it for sm90; the GPU tests run it.
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from own_kernel.kernels.forward_ws import (BLOCK_K, BLOCK_N, BLOCK_V, CONSUMER_REGS, LOG2E,
                                           MAXNREG, PRODUCER_REGS, STAGES, TMA_LOAD,
                                           _tile_logits, ring_and_barriers)
from own_kernel.kernels.tile import num_sms
from own_kernel.policy.plan import cdiv

# Triton 3.6's name for a TMA store from shared memory; later Tritons call it async_store only.
TMA_STORE = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _tile_at(tile, num_nb, num_vb, group_n, block_n: gl.constexpr, block_v: gl.constexpr):
    # (first row, first chunk column) of a tile: dlogits_tma.py's order
    per_group = group_n * num_vb
    first_nb = (tile // per_group) * group_n
    group_size = gl.minimum(num_nb - first_nb, group_n)
    local = tile % per_group
    return (first_nb + local % group_size) * block_n, (local // group_size) * block_v


@gluon.jit
def _producer(e_desc, c_desc, ready, empty, ring_e, ring_c, v_start, num_nb, num_vb, group_n,
              k_steps):
    stages: gl.constexpr = ring_e.type.shape[0]
    block_n: gl.constexpr = ring_e.type.shape[1]
    block_v: gl.constexpr = ring_c.type.shape[1]
    block_k: gl.constexpr = ring_e.type.shape[2]
    nbytes: gl.constexpr = e_desc.block_type.nbytes + c_desc.block_type.nbytes
    cnt = 0
    for tile in range(gl.program_id(0), num_nb * num_vb, gl.num_programs(0)):
        n0, w0 = _tile_at(tile, num_nb, num_vb, group_n, block_n, block_v)
        for kk in range(k_steps):
            st = cnt % stages
            # a stage's empty barrier starts complete: the first pass waits on phase 1
            mbarrier.wait(empty.index(st), ((cnt // stages) & 1) ^ 1)
            mbarrier.expect(ready.index(st), nbytes)
            TMA_LOAD(e_desc, [n0, kk * block_k], ready.index(st), ring_e.index(st))
            TMA_LOAD(c_desc, [v_start + w0, kk * block_k], ready.index(st), ring_c.index(st))
            cnt += 1


@gluon.jit
def _expm1(x):
    # exp(x) - 1 without the cancellation near 0 (tile.py's expm1)
    series = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0))))
    return gl.where(gl.abs(x) < 0.015625, series, gl.exp2(x * LOG2E) - 1.0)


@gluon.jit
def _grad(acc, rows, cols, row_in, n, v, v_start, width, smooth):
    # The tile's d (module docstring) from its fp32 logits; 0 past the chunk's width
    lse_ptr, lo_ptr, nll_ptr, w_ptr, wp_ptr, tgt_ptr = row_in
    live = rows < n
    lse = gl.load(lse_ptr + rows, mask=live, other=float("inf"))
    lo2 = gl.load(lo_ptr + rows, mask=live, other=0.0) * LOG2E
    w = gl.load(w_ptr + rows, mask=live, other=0.0)
    wp = gl.load(wp_ptr + rows, mask=live, other=0.0)
    tgt = gl.load(tgt_ptr + rows, mask=live, other=-1).to(gl.int32)
    pt_m1 = _expm1(-gl.load(nll_ptr + rows, mask=live, other=float("inf")))
    p = gl.exp2((acc - lse[:, None]) * LOG2E - lo2[:, None])
    d = wp[:, None] * p - (w * (smooth / v))[:, None]
    d_target = w * pt_m1 + (wp - w) * (1.0 + pt_m1) + w * (smooth * (1.0 - 1.0 / v))
    d = gl.where((v_start + cols)[None, :] == tgt[:, None], d_target[:, None], d)
    return gl.where((cols < width)[None, :], d, 0.0)


@gluon.jit
def _consume(WHICH: gl.constexpr, bufs, w_desc, row_in, row_round, n, v, v_start, width,
             num_nb, num_vb, group_n, k_steps, smooth):
    # This program's tiles 0, 1, 2, ... (tile pid + i P) go to consumer i % 2; tile i's first
    # k-slice is ring use i k_steps (the producer fills the ring in tile order).
    ready, empty, turn, ring_e, ring_c, w_smem = bufs
    stages: gl.constexpr = ring_e.type.shape[0]
    block_n: gl.constexpr = ring_e.type.shape[1]
    block_v: gl.constexpr = ring_c.type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, block_v, 16])
    out = w_smem.index(WHICH)
    programs = gl.num_programs(0)
    j = 0
    for tile in range(gl.program_id(0) + WHICH * programs, num_nb * num_vb, 2 * programs):
        # the other consumer's turn first (consumer 0 starts: phase 1 of a fresh barrier)
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        acc, cnt = _tile_logits(ready, empty, ring_e, ring_c, (2 * j + WHICH) * k_steps,
                                k_steps, acc_layout)
        mbarrier.arrive(turn.index(1 - WHICH))
        j += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((cnt + stages - 1) % stages))
        n0, w0 = _tile_at(tile, num_nb, num_vb, group_n, block_n, block_v)
        rows = n0 + gl.arange(0, block_n, layout=gl.SliceLayout(1, acc_layout))
        cols = w0 + gl.arange(0, block_v, layout=gl.SliceLayout(0, acc_layout))
        d = _grad(acc, rows, cols, row_in, n, v, v_start, width, smooth)
        d_used = d.to(w_desc.dtype)
        # relaxed: a fire-and-forget add (tile.accumulate says why)
        gl.atomic_add(row_round + rows, gl.sum(d - d_used.to(gl.float32), axis=1),
                      mask=rows < n, sem="relaxed")
        tma.store_wait(0)  # the previous tile's W has left this consumer's buffer
        out.store(d_used)
        fence_async_shared()
        TMA_STORE(w_desc, [n0, w0], out)
    tma.store_wait(0)


# The partitions, one function each (a constexpr argument would not reach a worker's body).
@gluon.jit
def _consumer0(bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
               k_steps, smooth):
    _consume(0, bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
             k_steps, smooth)


@gluon.jit
def _consumer1(bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
               k_steps, smooth):
    _consume(1, bufs, w_desc, row_in, row_round, n, v, v_start, width, num_nb, num_vb, group_n,
             k_steps, smooth)


# Integers the workers receive are never specialised to constexprs (a constexpr does not cross
# warp_specialize's arguments).
@gluon.jit(do_not_specialize=["n", "v", "v_start", "width", "d", "group_n"])
def cce_dlogits_ws_kernel(e_desc, c_desc, w_desc, lse, lse_lo, nll, weight, weight_p, targets,
                          row_round, n, v, v_start, width, d, group_n, smooth,
                          STAGES_: gl.constexpr, CONSUMER_REGS_: gl.constexpr,
                          PRODUCER_REGS_: gl.constexpr):
    ring_e, ring_c, ready, empty, turn = ring_and_barriers(e_desc, c_desc, STAGES_)
    # each consumer's staging buffer for its tile of W
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [2] + w_desc.block_type.shape,
                                       w_desc.layout)
    num_nb = gl.cdiv(n, e_desc.block_type.shape[0])
    num_vb = gl.cdiv(width, c_desc.block_type.shape[0])
    k_steps = gl.cdiv(d, e_desc.block_type.shape[1])
    consumer_args = ((ready, empty, turn, ring_e, ring_c, w_smem), w_desc,
                     (lse, lse_lo, nll, weight, weight_p, targets), row_round, n, v, v_start,
                     width, num_nb, num_vb, group_n, k_steps, smooth)
    producer_args = (e_desc, c_desc, ready, empty, ring_e, ring_c, v_start, num_nb, num_vb,
                     group_n, k_steps)
    gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                        (_producer, producer_args)], [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])


class RecomputeWs:
    """The launcher, made once per backward: C's descriptor and the call's constants.
    ``write(w, rows, sums, v_start, e_rows=None)`` writes W (rows x w.shape[1]) of e's rows (or
    e_rows, the low-memory path's row chunks) at columns [v_start, v_start + width), adding
    RowRound into sums."""

    def __init__(self, e, c, smooth: float, group_n: int):
        self.e, self.v, self.smooth, self.group_n = e, c.shape[0], float(smooth), group_n
        self.gl_dtype = gl.bfloat16 if e.dtype == torch.bfloat16 else gl.float16
        self.c_desc = self._desc(c, [BLOCK_V, BLOCK_K])
        self.slots = num_sms(e.device)

    def _desc(self, t, block):
        return TensorDescriptor.from_tensor(
            t, block, gl.NVMMASharedLayout.get_default_for(block, self.gl_dtype))

    def write(self, w, rows, sums, v_start, e_rows=None):
        e = self.e if e_rows is None else e_rows
        (n, d), width = e.shape, w.shape[1]
        weight_p = rows.weight if rows.weight_lse is None else rows.weight + rows.weight_lse
        tiles = cdiv(n, BLOCK_N) * cdiv(width, BLOCK_V)
        if tiles == 0:
            return
        cce_dlogits_ws_kernel[(min(tiles, self.slots),)](
            self._desc(e, [BLOCK_N, BLOCK_K]), self.c_desc, self._desc(w, [BLOCK_N, BLOCK_V]),
            rows.lse, rows.lse_lo_or_zeros(), rows.nll, rows.weight, weight_p, rows.targets,
            sums.row_round, n, self.v, v_start, width, d, self.group_n, self.smooth,
            STAGES_=STAGES, CONSUMER_REGS_=CONSUMER_REGS, PRODUCER_REGS_=PRODUCER_REGS,
            num_warps=4, maxnreg=MAXNREG)
