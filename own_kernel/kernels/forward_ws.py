"""Forward partials by a warp-specialised Gluon kernel on Hopper: forward_tma.py's (max, sum[,
sum of logits]) per row and split, its epilogue under the tensor cores.

    x = E[rows] @ C[cols].T,  z = softcap(x) / T,
    (m, s[, z_sum]) <- online max, sum of exp(z - m)[, sum of z]

Why: Triton 3.6 does not split forward_tma.py's loop into producer and consumer warps on Hopper
(results/notes/warp-specialize.md), so each tile's log-sum-exp epilogue runs between its
matmuls; here it runs under the other consumer's (results/notes/gluon-forward.md).

Ping-pong, as CUTLASS's Hopper kernels: one producer warp streams (E, C) k-slices through one
ring of shared-memory stages, tile after tile of the program's split; two consumer warpgroups
take the tiles in turn, each with its own 128 x 128 fp32 accumulator and online state, and a
pair of mbarriers hands the turn over after each tile's last k-slice. So the matmuls run one
after the other, each consumer's epilogue under the other's matmul, and no consumer waits on a
stage more than one use ahead (the stages' barriers are waited by phase parity). Each consumer
stores its state as one partial: split k's two consumers are partials 2k and 2k + 1 of
lse_combine.py's layout (plane x partial x row).

No bias and no entropy's sum (the route sends those to forward_tma.py, and a softcap or a
temperature unless config.Forward.ws_scaled_logits): what forward.py's docstring defines, in
natural-log units. The softcap's tanh is tile.py's exp2 form, an exp2 and a division per logit
more, which the other consumer's matmul does not wholly hide (results/notes/gluon-forward.md).
Needs 16-bit E and C through TMA (16-byte aligned bases and rows, unit stride along D) and sm90.
Gluon has no interpreter: the CPU tests compile it for sm90; the GPU tests run it.
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from own_kernel.kernels.tile import LOG2E_F, softcap_scalars
from own_kernel.policy.plan import WS_BLOCK_V, cdiv

LOG2E = gl.constexpr(LOG2E_F)
# Triton 3.6's name for a TMA load into shared memory; later Tritons call it async_load only.
TMA_LOAD = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# 128 x 128 tiles per consumer, 64-wide k-slices, 4 stages of 32 KB; three stages were
# 1.22-1.34x slower, five level or slower (results/notes/gluon-forward.md). 12 warps (4 + 4 +
# the producer's warpgroup) at 168 registers, re-split as 232 per consumer thread and 40 per
# producer's.
BLOCK_N, BLOCK_V, BLOCK_K, STAGES = 128, WS_BLOCK_V, 64, 4
MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 168, 232, 40


@gluon.jit
def _producer(e_desc, c_desc, ready, empty, ring_e, ring_c, row0, t_begin, t_end, k_steps):
    # (constexprs do not cross warp_specialize's arguments: the shapes come from the buffers)
    stages: gl.constexpr = ring_e.type.shape[0]
    block_v: gl.constexpr = ring_c.type.shape[1]
    block_k: gl.constexpr = ring_e.type.shape[2]
    nbytes: gl.constexpr = e_desc.block_type.nbytes + c_desc.block_type.nbytes
    cnt = 0
    for t in range(t_begin, t_end):
        for kk in range(k_steps):
            st = cnt % stages
            # a stage's empty barrier starts complete: the first pass waits on phase 1
            mbarrier.wait(empty.index(st), ((cnt // stages) & 1) ^ 1)
            mbarrier.expect(ready.index(st), nbytes)
            TMA_LOAD(e_desc, [row0, kk * block_k], ready.index(st), ring_e.index(st))
            TMA_LOAD(c_desc, [t * block_v, kk * block_k], ready.index(st), ring_c.index(st))
            cnt += 1


@gluon.jit
def _tile_logits(ready, empty, ring_e, ring_c, cnt, k_steps, acc_layout: gl.constexpr):
    # One tile's fp32 logits from the ring's k-slices cnt, cnt + 1, ...; each stage is released
    # once the MMA after it is issued (at most one MMA in flight).
    stages: gl.constexpr = ring_e.type.shape[0]
    block_n: gl.constexpr = ring_e.type.shape[1]
    block_v: gl.constexpr = ring_c.type.shape[1]
    acc = gl.zeros([block_n, block_v], gl.float32, acc_layout)
    for kk in range(k_steps):
        st = cnt % stages
        mbarrier.wait(ready.index(st), (cnt // stages) & 1)
        acc = warpgroup_mma(ring_e.index(st), ring_c.index(st).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        mbarrier.arrive(empty.index((cnt + stages - 1) % stages), pred=kk > 0)
        cnt += 1
    return acc, cnt


@gluon.jit
def _consume(WHICH: gl.constexpr, ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0,
             t_begin, t_end, k_steps, part_index, tanh_scale, cap, need_zsum,
             HAS_SOFTCAP: gl.constexpr):
    # Tiles t_begin + WHICH, + 2, ...; tile t's first k-slice is ring use (t - t_begin) k_steps
    # (the producer fills the ring in tile order). Base-2 online state; stored in natural units.
    # tanh_scale, cap: tile.softcap_scalars's; need_zsum: a runtime flag (a uniform branch per
    # tile), so that two consumers' functions serve both sums.
    stages: gl.constexpr = ring_e.type.shape[0]
    block_n: gl.constexpr = ring_e.type.shape[1]
    block_v: gl.constexpr = ring_c.type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, block_v, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    m = gl.full([block_n], float("-inf"), gl.float32, row_layout)
    s = gl.zeros([block_n], gl.float32, row_layout)
    z_sum = gl.zeros([block_n], gl.float32, row_layout)
    j = 0
    for t in range(t_begin + WHICH, t_end, 2):
        # the other consumer's turn first (consumer 0 starts: phase 1 of a fresh barrier)
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        acc, cnt = _tile_logits(ready, empty, ring_e, ring_c, (t - t_begin) * k_steps, k_steps,
                                acc_layout)
        mbarrier.arrive(turn.index(1 - WHICH))
        j += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((cnt + stages - 1) % stages))
        cols = t * block_v + gl.arange(0, block_v, layout=gl.SliceLayout(0, acc_layout))
        valid = (cols < v)[None, :]
        if HAS_SOFTCAP:  # z = cap tanh(x / s) = cap (1 - 2 / (2^(x tanh_scale) + 1))
            z = (1.0 - 2.0 / (gl.exp2(acc * tanh_scale) + 1.0)) * cap
        else:
            z = acc * cap
        if need_zsum:  # before x, so that x can take z's registers
            z_sum += gl.sum(gl.where(valid, z, 0.0), axis=1)
        x = gl.where(valid, z * LOG2E, float("-inf"))
        m_new = gl.maximum(m, gl.max(x, axis=1))
        s = s * gl.exp2(m - m_new) + gl.sum(gl.exp2(x - m_new[:, None]), axis=1)
        m = m_new
    rows = row0 + gl.arange(0, block_n, layout=row_layout)
    at = (part_index + WHICH).to(gl.int64) * n + rows
    gl.store(part + at, m / LOG2E, mask=rows < n)
    gl.store(part + plane + at, s, mask=rows < n)
    if need_zsum:
        gl.store(part + 2 * plane + at, z_sum, mask=rows < n)


# The partitions, one function each: a constexpr in a partition's arguments does not reach
# the worker's body as one in Triton 3.6 (a False one arrives as a runtime i1 that fails to lower).
@gluon.jit
def _consumer0(ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin, t_end,
               k_steps, part_index, tanh_scale, cap, need_zsum):
    _consume(0, ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin, t_end,
             k_steps, part_index, tanh_scale, cap, need_zsum, False)


@gluon.jit
def _consumer1(ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin, t_end,
               k_steps, part_index, tanh_scale, cap, need_zsum):
    _consume(1, ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin, t_end,
             k_steps, part_index, tanh_scale, cap, need_zsum, False)


@gluon.jit
def _consumer0_softcap(ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin,
                       t_end, k_steps, part_index, tanh_scale, cap, need_zsum):
    _consume(0, ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin, t_end,
             k_steps, part_index, tanh_scale, cap, need_zsum, True)


@gluon.jit
def _consumer1_softcap(ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin,
                       t_end, k_steps, part_index, tanh_scale, cap, need_zsum):
    _consume(1, ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin, t_end,
             k_steps, part_index, tanh_scale, cap, need_zsum, True)


@gluon.jit
def ring_and_barriers(e_desc, c_desc, STAGES_: gl.constexpr):
    # The producer's ring of (E, C) k-slices, a ready and an empty barrier per stage, and the
    # two consumers' turn barriers, initialised (dlogits_ws.py's kernel has the same).
    block_n: gl.constexpr = e_desc.block_type.shape[0]
    block_k: gl.constexpr = e_desc.block_type.shape[1]
    block_v: gl.constexpr = c_desc.block_type.shape[0]
    ring_e = gl.allocate_shared_memory(e_desc.dtype, [STAGES_, block_n, block_k], e_desc.layout)
    ring_c = gl.allocate_shared_memory(c_desc.dtype, [STAGES_, block_v, block_k], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES_):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    return ring_e, ring_c, ready, empty, turn


# need_zsum: 0 or 1, kept a runtime int (Triton would make a 1 a constexpr, which a partition's
# arguments do not carry reliably: see above)
@gluon.jit(do_not_specialize=["need_zsum"])
def cce_fwd_ws_kernel(e_desc, c_desc, part, plane, n, v, d, v_per_split, splits, group_rows,
                      grouped_splits, tanh_scale, cap, need_zsum, HAS_SOFTCAP: gl.constexpr,
                      STAGES_: gl.constexpr, CONSUMER_REGS_: gl.constexpr,
                      PRODUCER_REGS_: gl.constexpr):
    block_n: gl.constexpr = e_desc.block_type.shape[0]
    block_k: gl.constexpr = e_desc.block_type.shape[1]
    block_v: gl.constexpr = c_desc.block_type.shape[0]
    # tile.py's row_block_and_split: group_rows row blocks, their first grouped_splits splits,
    # then the next group; the last split of every row block after all groups where
    # grouped_splits < splits
    num_nb = gl.cdiv(n, block_n)
    pid = gl.program_id(0)
    grouped = num_nb * grouped_splits
    g = gl.minimum(pid, grouped - 1)
    first = (g // (group_rows * grouped_splits)) * group_rows
    local = g % (group_rows * grouped_splits)
    rows_in_group = gl.minimum(num_nb - first, group_rows)
    last = pid >= grouped
    split = gl.where(last, splits - 1, local // rows_in_group)
    t_begin = split * (v_per_split // block_v)
    t_end = gl.minimum(t_begin + v_per_split // block_v, gl.cdiv(v, block_v))

    ring_e, ring_c, ready, empty, turn = ring_and_barriers(e_desc, c_desc, STAGES_)
    row0 = gl.where(last, pid - grouped, first + local % rows_in_group) * block_n
    k_steps = gl.cdiv(d, block_k)
    consumer_args = (ready, empty, turn, ring_e, ring_c, part, plane, n, v, row0, t_begin,
                     t_end, k_steps, split * 2, tanh_scale, cap, need_zsum)
    producer_args = (e_desc, c_desc, ready, empty, ring_e, ring_c, row0, t_begin, t_end, k_steps)
    if HAS_SOFTCAP:
        gl.warp_specialize([(_consumer0_softcap, consumer_args),
                            (_consumer1_softcap, consumer_args), (_producer, producer_args)],
                           [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])
    else:
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])


def forward_partials_ws(e, c, part, grid, zsum: bool, softcap=None, temperature=1.0):
    """Split k's two consumers' (max, sum[, sum of logits]) per row of z = softcap(x) / T into
    part[:, 2k] and part[:, 2k + 1] (part: planes x 2 grid.splits x n fp32). grid:
    plan.ForwardGrid, whose v_per_split is a multiple of BLOCK_V."""
    (n, d), v = e.shape, c.shape[0]
    if grid.v_per_split % BLOCK_V or part.shape[1] != 2 * grid.splits:
        raise ValueError(f"forward_partials_ws: v_per_split {grid.v_per_split} must be a "
                         f"multiple of {BLOCK_V} and part hold {2 * grid.splits} partials")
    dtype = gl.bfloat16 if e.dtype == torch.bfloat16 else gl.float16

    def desc(t, rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, BLOCK_K], dtype)
        return TensorDescriptor.from_tensor(t, [rows, BLOCK_K], layout)

    cce_fwd_ws_kernel[(cdiv(n, BLOCK_N) * grid.splits,)](
        desc(e, BLOCK_N), desc(c, BLOCK_V), part, part.shape[1] * n, n, v, d, grid.v_per_split,
        grid.splits, grid.group_rows, grid.grouped_splits, *softcap_scalars(softcap, temperature),
        int(zsum), HAS_SOFTCAP=softcap is not None, STAGES_=STAGES,
        CONSUMER_REGS_=CONSUMER_REGS, PRODUCER_REGS_=PRODUCER_REGS, num_warps=4,
        maxnreg=MAXNREG)
