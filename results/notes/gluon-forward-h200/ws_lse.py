"""A prototype, not the kernel: the forward's per-row log-sum-exp as a warp-specialised Gluon
kernel on Hopper, to measure whether hiding the epilogue under the tensor cores brings the
forward to one floor (warp-specialize.md: Triton 3.6 does not split own_kernel's loops).

    x = E[rows] @ C[cols].T,  (m, s) <- online max and sum of exp(x - m) over the columns

Ping-pong (as CUTLASS's Hopper kernels): one producer warp streams (E, C) k-slices through one
ring of shared-memory stages, tile after tile of this program's column range; two consumer
warpgroups take the tiles in turn (even, odd), each with its own accumulator (128 x BLOCK_V)
and its own online (m, s). The ring is in tile order, so one consumer's matmul can only start
once the other has released the previous tile's stages: the matmuls run one after the other and
each consumer's epilogue (max, exp, sum) runs under the other's matmul. Each consumer writes its
(m, s) per row as one partial; the host folds the partials (lse = M + log sum s exp(m - M)).

No bias, softcap, targets or ignored rows: only what decides the time of the forward's GEMM and
its log-sum-exp epilogue. bf16 or fp16 E and C, 16-byte aligned, unit stride along D.
"""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _producer(e_desc, c_desc, ready, empty, ring_e, ring_c, row0, t_begin, t_end, k_steps):
    # (constexprs do not cross warp_specialize's arguments: the shapes come from the buffers)
    STAGES: gl.constexpr = ring_e.type.shape[0]
    BLOCK_V: gl.constexpr = ring_c.type.shape[1]
    BLOCK_K: gl.constexpr = ring_e.type.shape[2]
    nbytes: gl.constexpr = e_desc.block_type.nbytes + c_desc.block_type.nbytes
    cnt = 0
    for t in range(t_begin, t_end):
        for kk in range(k_steps):
            st = cnt % STAGES
            # a stage's empty barrier starts complete: the first pass waits on phase 1
            mbarrier.wait(empty.index(st), ((cnt // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(st), nbytes)
            tma.async_copy_global_to_shared(e_desc, [row0, kk * BLOCK_K], ready.index(st),
                                            ring_e.index(st))
            tma.async_copy_global_to_shared(c_desc, [t * BLOCK_V, kk * BLOCK_K],
                                            ready.index(st), ring_c.index(st))
            cnt += 1


@gluon.jit
def _consume(WHICH: gl.constexpr, STEP: gl.constexpr, ready, empty, turn, ring_e, ring_c,
             part_m, part_s, n_rows, v, row0, t_begin, t_end, k_steps, part_col, n_parts):
    STAGES: gl.constexpr = ring_e.type.shape[0]
    BLOCK_N: gl.constexpr = ring_e.type.shape[1]
    BLOCK_V: gl.constexpr = ring_c.type.shape[1]
    # Tiles t_begin + WHICH, + 2, ...; the ring position of tile t's first k-slice is
    # (t - t_begin) * k_steps, since the producer fills the ring in tile order.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_V, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    m = gl.full([BLOCK_N], float("-inf"), gl.float32, row_layout)
    s = gl.zeros([BLOCK_N], gl.float32, row_layout)
    j = 0
    for t in range(t_begin + WHICH, t_end, STEP):
        cnt = (t - t_begin) * k_steps
        acc = gl.zeros([BLOCK_N, BLOCK_V], gl.float32, acc_layout)
        if STEP == 2:
            # The other consumer's turn first: a stage's ready barrier is waited by parity, so
            # no consumer may wait on a stage more than one use ahead of the other's waits
            # (and the matmuls then run one after the other, as ping-pong wants).
            mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        for kk in range(k_steps):
            st = cnt % STAGES
            mbarrier.wait(ready.index(st), (cnt // STAGES) & 1)
            acc = warpgroup_mma(ring_e.index(st), ring_c.index(st).permute((1, 0)), acc,
                                is_async=True)
            # at most this slice's MMA in flight: the previous slice's stage is free
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((cnt + STAGES - 1) % STAGES), pred=kk > 0)
            cnt += 1
        if STEP == 2:
            mbarrier.arrive(turn.index(1 - WHICH))
        j += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((cnt + STAGES - 1) % STAGES))
        cols = t * BLOCK_V + gl.arange(0, BLOCK_V, layout=col_layout)
        x = gl.where((cols < v)[None, :], acc * LOG2E, float("-inf"))
        m_new = gl.maximum(m, gl.max(x, axis=1))
        s = s * gl.exp2(m - m_new) + gl.sum(gl.exp2(x - m_new[:, None]), axis=1)
        m = m_new
    rows = row0 + gl.arange(0, BLOCK_N, layout=row_layout)
    at = rows.to(gl.int64) * n_parts + part_col + WHICH
    gl.store(part_m + at, m, mask=rows < n_rows)      # base-2 units: m = max x log2(e)
    gl.store(part_s + at, s, mask=rows < n_rows)


@gluon.jit
def _consumer0(ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0, t_begin,
               t_end, k_steps, part_col, n_parts):
    _consume(0, 2, ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0, t_begin,
             t_end, k_steps, part_col, n_parts)


@gluon.jit
def _consumer1(ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0, t_begin,
               t_end, k_steps, part_col, n_parts):
    _consume(1, 2, ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0, t_begin,
             t_end, k_steps, part_col, n_parts)


@gluon.jit
def _consumer_all(ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0, t_begin,
                  t_end, k_steps, part_col, n_parts):
    # One consumer takes every tile (no ping-pong; the other partial stays empty)
    _consume(0, 1, ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0, t_begin,
             t_end, k_steps, part_col, n_parts)
    rows = row0 + gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    at = rows.to(gl.int64) * n_parts + part_col + 1
    gl.store(part_m + at, gl.full([128], float("-inf"), gl.float32,
                                  gl.BlockedLayout([1], [32], [4], [0])), mask=rows < n_rows)
    gl.store(part_s + at, gl.zeros([128], gl.float32, gl.BlockedLayout([1], [32], [4], [0])),
             mask=rows < n_rows)


@gluon.jit
def ws_lse_kernel(e_desc, c_desc, part_m, part_s, n_rows, v, d, tiles_per_split, splits,
                  GROUP_ROWS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  PRODUCER_REGS: gl.constexpr, PINGPONG: gl.constexpr):
    BLOCK_N: gl.constexpr = e_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = e_desc.block_type.shape[1]
    BLOCK_V: gl.constexpr = c_desc.block_type.shape[0]
    # Launch order: GROUP_ROWS row blocks, every split of them, then the next group: programs
    # resident together share C tiles (one split) and E blocks (one group) through L2.
    num_nb = gl.cdiv(n_rows, BLOCK_N)
    pid = gl.program_id(0)
    in_group = GROUP_ROWS * splits
    first = (pid // in_group) * GROUP_ROWS
    group = gl.minimum(num_nb - first, GROUP_ROWS)
    local = pid % in_group
    nb = first + local % group
    split = local // group
    t_begin = split * tiles_per_split
    t_end = gl.minimum(t_begin + tiles_per_split, gl.cdiv(v, BLOCK_V))
    k_steps = gl.cdiv(d, BLOCK_K)
    row0 = nb * BLOCK_N

    ring_e = gl.allocate_shared_memory(e_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], e_desc.layout)
    ring_c = gl.allocate_shared_memory(c_desc.dtype, [STAGES, BLOCK_V, BLOCK_K], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    consumer_args = (ready, empty, turn, ring_e, ring_c, part_m, part_s, n_rows, v, row0,
                     t_begin, t_end, k_steps, split * 2, splits * 2)
    producer_args = (e_desc, c_desc, ready, empty, ring_e, ring_c, row0, t_begin, t_end,
                     k_steps)
    if PINGPONG:
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_consumer_all, consumer_args), (_producer, producer_args)], [1],
                           [PRODUCER_REGS])


def ws_lse(e, c, splits=None, block_v=128, block_k=64, stages=4, group_rows=8, maxnreg=168,
           consumer_regs=232, producer_regs=40, sm_count=None, pingpong=True):
    """The rows' natural log-sum-exp of e @ c.T (fp32): the kernel's partials, folded here."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, d = e.shape
    v = c.shape[0]
    block_n = 128
    tiles = triton.cdiv(v, block_v)
    num_nb = triton.cdiv(n, block_n)
    if splits is None:   # about two programs per SM, as the resident waves go
        sm_count = sm_count or torch.cuda.get_device_properties(e.device).multi_processor_count
        splits = max(1, min(tiles, round(2 * sm_count / num_nb)))
    tiles_per_split = triton.cdiv(tiles, splits)
    splits = triton.cdiv(tiles, tiles_per_split)
    gdt = gl.bfloat16 if e.dtype == torch.bfloat16 else gl.float16
    e_desc = TensorDescriptor.from_tensor(
        e, [block_n, block_k], gl.NVMMASharedLayout.get_default_for([block_n, block_k], gdt))
    c_desc = TensorDescriptor.from_tensor(
        c, [block_v, block_k], gl.NVMMASharedLayout.get_default_for([block_v, block_k], gdt))
    part_m = torch.empty(n, 2 * splits, device=e.device, dtype=torch.float32)
    part_s = torch.empty_like(part_m)
    grid = (num_nb * splits, )
    ws_lse_kernel[grid](e_desc, c_desc, part_m, part_s, n, v, d, tiles_per_split, splits,
                        group_rows, stages, consumer_regs, producer_regs, pingpong,
                        num_warps=4, maxnreg=maxnreg)
    top = part_m.max(dim=1).values
    return (top + torch.log2((part_s * torch.exp2(part_m - top[:, None])).sum(1))) / LOG2E.value
