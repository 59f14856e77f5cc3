"""Planning: integers in, integers out, no kernel launched. Every size the passes choose comes
from here, so each choice can be tested on the CPU at the real shapes.

- the forward's grid: vocabulary splits per row block and the launch order (split_plan);
- the backward's vocabulary chunks: W lives in dC's unwritten tail (its rows still to be
  written) while a chunk wide enough fits there, then in the tail's buffer (chunk_plan,
  tail_width, w_slots, x_and_w_slots);
- whether the gradient filter can skip anything at all (filter_can_skip);
- whether ignored rows are gathered out (compaction_pays);
- the low-memory backward's chunks (low_memory_plan);
- the three-matmul path's row chunks within its workspace budget (fused_plan).
"""
from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass

from own_kernel.policy.config import Config

WORKSPACE_ALIGN = 256  # bytes; every W or X slot inside dC starts on this boundary
WS_BLOCK_V = 128  # kernels/forward_ws.py's tile width (the route keeps its tiles within splits)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tma_ready(t) -> bool:
    """Whether a 2-D tensor can be read through a TMA descriptor: unit stride along its rows,
    16-byte aligned base and row stride (the kernels' layouts, api.py, rule out stride 0)."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0)


# ---- forward --------------------------------------------------------------------------------

def launch_order(num_nb: int, splits: int, group_rows: int,
                 short_last: bool = False) -> list[tuple[int, int]]:
    """(row block, split) of each program, in launch order, as tile.py's row_block_and_split
    maps program ids: groups of group_rows row blocks (the last may hold fewer), every split
    of a group before the next group, row blocks fastest; short_last: the last split of every
    row block after all the groups instead."""
    grouped = splits - 1 if short_last else splits
    order = []
    for first in range(0, num_nb, group_rows):
        rows = min(num_nb - first, group_rows)
        order += [(first + r, k) for k in range(grouped) for r in range(rows)]
    return order + [(r, splits - 1) for r in range(num_nb if short_last else 0)]


def launch_lengths(num_nb: int, num_tiles: int, splits: int, group_rows: int, overhead: int,
                   short_last: bool = False) -> list[int]:
    """Each program's time in tiles (its split's tiles plus ``overhead``), in launch order. The
    last split is short where the splits do not divide the tiles: in launch groups its
    programs close each group, not the launch, unless short_last puts them last."""
    per = cdiv(num_tiles, splits)
    lengths = [min(per, num_tiles - k * per) + overhead for k in range(cdiv(num_tiles, per))]
    return [lengths[k] for _, k in launch_order(num_nb, len(lengths), group_rows, short_last)]


def makespan(lengths: list[int], slots: int) -> int:
    """List scheduling in launch order, as the hardware dispatches: each program starts on the
    first of `slots` resident places to come free."""
    if len(lengths) <= slots:  # one wave: every program on a place of its own
        return max(lengths, default=0)
    free = [0] * slots
    for length in lengths:
        heapq.heappush(free, heapq.heappop(free) + length)
    return max(free)


def group_rows(num_nb: int, splits: int, slots: int, fixed_rows: int) -> int:
    """Row blocks per launch group: fixed_rows where set (forward.l2_group "budget": as many as
    l2_mib holds, or all of them where they fit), else the resident programs over the splits."""
    return min(num_nb, fixed_rows or cdiv(slots, splits))


@functools.lru_cache(maxsize=256)
def balanced_splits(num_nb: int, num_tiles: int, slots: int, min_splits: int, overhead: int,
                    fixed_rows: int, in_launch_order: bool = True,
                    short_last: bool = False) -> tuple[int, bool]:
    """Vocabulary splits per row block (at least min_splits), and whether the last split runs
    after the launch groups. The GPU runs the programs in waves of `slots` (resident
    programs); a last wave that is partly empty idles the rest of the GPU for a whole program's
    time (Gemma 2 (2B) on 132 SMs: 64 row blocks x 5 splits = 2.4 waves, 19 % idle). Pick the
    grid whose simulated makespan (tiles, plus ``overhead`` tiles per program:
    config.Forward.program_overhead_tiles) is least; fewer splits, and the plain order, unless
    the next saves at least 0.5 %. The simulation runs the programs in launch groups
    (group_rows) as the kernels launch them; short_last also tries each split count with its
    last split after the groups. in_launch_order False: in split order, as if in one group,
    which puts every short last-split program at the end; it took grids whose tail the
    hardware leaves 10 % idle (N 4096, D 3584, V 152064: 21 splits in groups of 7;
    forward-grid.md, "The launch order")."""
    lo = max(1, min(min_splits, num_tiles))
    # Past 8 waves of programs the last wave's idle share is small: no need to look further.
    hi = max(lo, min(num_tiles, max(1, 8 * slots // num_nb + 2)))
    best, best_time = (lo, False), None
    for splits in range(lo, hi + 1):
        per = cdiv(num_tiles, splits)
        programs = cdiv(num_tiles, per)  # splits that have tiles
        # No schedule beats its longest program or its work spread evenly over the slots: a
        # grid held to that bound cannot save the 0.5 %, so it is not simulated (at one row
        # block and V 256000 the thousand split counts took 0.2 s of host time otherwise)
        bound = max(per + overhead, num_nb * (num_tiles + overhead * programs) / slots)
        if best_time is not None and bound >= best_time * 0.995:
            continue
        group = group_rows(num_nb, programs, slots, fixed_rows) if in_launch_order else num_nb
        for last in (False, True) if short_last and programs > 1 and group < num_nb else (False,):
            time = makespan(launch_lengths(num_nb, num_tiles, splits, group, overhead, last),
                            slots)
            if best_time is None or time < best_time * 0.995:
                best, best_time = (splits, last), time
    return best


@dataclass(frozen=True)
class ForwardGrid:
    splits: int          # vocabulary splits per row block
    v_per_split: int     # columns per split (a multiple of the tile width)
    group_rows: int      # row blocks launched together (tile.py's row_block_and_split)
    parts_per_split: int = 1  # partials each split stores (batch_invariant: one per block)
    short_last: bool = False  # every row block's last split after the launch groups

    @property
    def grouped_splits(self) -> int:
        """The splits launched in groups (tile.py's row_block_and_split)."""
        return self.splits - 1 if self.short_last else self.splits

    def parts(self, v: int) -> int:
        """Partials per row over a vocabulary of v columns: one per split, or with
        parts_per_split > 1 one per block of v_per_split / parts_per_split columns."""
        if self.parts_per_split == 1:
            return self.splits
        return cdiv(v, self.v_per_split // self.parts_per_split)


def split_plan(n: int, v: int, d: int, elt: int, cfg: Config, slots: int) -> ForwardGrid:
    """The forward's grid. Each program re-reads its E block (BLOCK_N x D) for every C tile.
    With many row blocks resident at once (N 32768: 132 blocks of 128 x 2304 = 78 MB) those
    blocks do not fit in L2 and come from DRAM on every tile; forward.l2_mib bounds the E bytes
    the resident programs share: at least enough splits that slots / splits row blocks fit,
    launched in groups of that many row blocks. slots: the GPU's SMs, times the programs
    resident on each (forward.programs_per_sm)."""
    tiles = cfg.forward.tiles
    slots *= cfg.forward.programs_per_sm
    num_nb, num_tiles = cdiv(n, tiles.block_n), max(1, cdiv(v, tiles.block_v))
    e_block = tiles.block_n * d * elt
    budget = cfg.forward.l2_mib * 2**20
    min_splits, rows_fit = 1, max(1, int(budget // e_block)) if budget else num_nb
    if budget and min(num_nb, slots) * e_block > budget:
        min_splits = cdiv(slots, rows_fit)
    # One group where the row blocks fit; l2_group "budget": as many as l2_mib holds (splits
    # >= slots / rows_fit, so a wave still spans at most one group's row blocks; each group is
    # one more pass over C from DRAM); "splits": the resident programs over the splits.
    fixed_rows = (num_nb if min_splits == 1 else
                  rows_fit if cfg.forward.l2_group == "budget" else 0)
    splits, short_last = balanced_splits(num_nb, num_tiles, slots, min_splits,
                                         cfg.forward.program_overhead_tiles, fixed_rows,
                                         cfg.forward.makespan_order == "launch",
                                         cfg.forward.short_split_last)
    v_per_split = cdiv(num_tiles, splits) * tiles.block_v
    splits = max(1, cdiv(v, v_per_split))  # no empty split
    return ForwardGrid(splits, v_per_split, group_rows(num_nb, splits, slots, fixed_rows),
                       short_last=short_last)


@dataclass(frozen=True)
class ForwardRows:
    """The cuBLAS forward's row chunks (paths/forward.py): rows per chunk of fp32 logits, and
    the elements between two rows (V rounded up to 16 bytes)."""
    rows: int
    row_stride: int

    @property
    def nbytes(self) -> int:
        return 4 * self.rows * self.row_stride


def cublas_forward_rows(n: int, v: int, d: int, budget_bytes: int,
                        cfg: Config) -> ForwardRows | None:
    """Row chunks of n rows' fp32 logits within budget_bytes (and of at most
    forward.cublas_max_rows rows, where set), as few as hold them, evenly sized (rows a
    multiple of 128 where that keeps their number); None where forward.cublas_min_d is 0 or
    above d, or where fewer than forward.cublas_min_rows rows (and not all n) fit."""
    fwd = cfg.forward
    if not fwd.cublas_min_d or d < fwd.cublas_min_d or n == 0 or v == 0:
        return None
    stride = cdiv(v, 4) * 4
    fits = budget_bytes // (4 * stride)
    if fits < min(n, fwd.cublas_min_rows):
        return None
    most = min(fits, n, fwd.cublas_max_rows or n)
    return ForwardRows(even_rows(n, most, 128), stride)


def invariant_block(cfg: Config) -> int:
    """batch_invariant's vocabulary block: forward.invariant_width columns (the tile's width
    where that is smaller). Each row's partials are over the global blocks [k G, (k + 1) G),
    whatever N, and merged left to right (lse_combine.py), so a row's lse does not depend on the
    rest of the call, nor on how the vocabulary is sharded (paths/vocab_gathered.py)."""
    return min(cfg.forward.invariant_width, cfg.forward.tiles.block_v)


def invariant_split_plan(n: int, v: int, d: int, elt: int, cfg: Config, slots: int) -> ForwardGrid:
    """batch_invariant's forward grid: one split per tile of columns, each storing the partials
    of its invariant_block-wide blocks (the values do not depend on the launch order). Row
    blocks go in groups whose E blocks fit in forward.l2_mib, every split of a group before the
    next: C is read once per group."""
    tiles = cfg.forward.tiles
    num_nb = cdiv(n, tiles.block_n)
    e_block = tiles.block_n * d * elt
    budget = cfg.forward.l2_mib * 2**20
    group_rows = num_nb if not budget else max(1, min(num_nb, int(budget // e_block)))
    return ForwardGrid(max(1, cdiv(v, tiles.block_v)), tiles.block_v, max(1, group_rows),
                       tiles.block_v // invariant_block(cfg))


# ---- backward: chunks -----------------------------------------------------------------------

@dataclass(frozen=True)
class Chunk:
    v_start: int
    width: int
    in_tail: bool        # W in the tail's buffer (else in dC's unwritten rows)


@dataclass(frozen=True)
class TailPlan:
    width: int           # the tail's chunk width
    in_de: bool          # its buffer is dE's output buffer (else a buffer of its own)


def tail_width(n: int, v: int, d: int, elt: int, cfg: Config) -> TailPlan:
    """The tail's chunk width: chunks.tail_mib of W, at least chunks.min_tail_width (many
    tokens make a fixed budget's chunks too thin for the GEMMs, and each chunk re-reads the
    fp32 dE accumulator). Its buffer is dE's output buffer (free until the end) when that holds
    at least 3/4 of it; then the chunks take all of it, even past the budget (N 32768, D 2304
    gives 2304 columns against 2048), since each reads and writes the whole accumulator once."""
    bv = cfg.dlogits.block_v
    budget = cfg.chunks.tail_mib * 2**20
    width = max(budget // max(1, n * elt), cfg.chunks.min_tail_width) // bv * bv
    width = int(min(max(width, bv), cdiv(v, bv) * bv))
    de_width = min(d // bv * bv, cdiv(v, bv) * bv)
    if de_width >= max(bv, 3 * width // 4):
        return TailPlan(de_width, True)
    return TailPlan(width, False)


def invariant_tail(v: int, d: int, cfg: Config) -> TailPlan:
    """batch_invariant's chunk width, independent of N: dE's output buffer's width (D, in
    whole tiles of the W writers) where at least one tile fits, else one tile in a buffer of
    its own. Every chunk's W goes there (invariant_chunk_plan)."""
    bv = max(cfg.dlogits.block_v * cfg.dlogits_tiles_per_program, cfg.recompute.tiles.block_v)
    width = min(d // bv * bv, cdiv(v, bv) * bv)
    return TailPlan(width, True) if width >= bv else TailPlan(bv, False)


def invariant_chunk_plan(v: int, d: int, cfg: Config) -> list[Chunk]:
    """batch_invariant's backward chunks: fixed boundaries (multiples of invariant_tail's
    width from column 0, whatever N), each W in the tail's buffer; dE sums the chunks' products
    in this order."""
    width = invariant_tail(v, d, cfg).width
    aligned_end = v // 8 * 8  # the last V mod 8 columns on their own, as chunk_plan does
    plan = [Chunk(s, min(width, aligned_end - s), True) for s in range(0, aligned_end, width)]
    return plan + ([Chunk(aligned_end, v - aligned_end, True)] if aligned_end < v else [])


def looks_ahead(n: int, cfg: Config, filtered: bool) -> bool:
    """Whether filtered chunks look ahead: chunk k+1's W is written before chunk k's GEMMs,
    which hides the host's wait for chunk k's kept-column count, at the price of two W slots
    (narrower chunks). Wide chunks at many tokens absorb the wait without it."""
    return filtered and n <= cfg.filter.lookahead_max_n


def _max_width(n: int, cfg: Config, filtered: bool) -> int:
    """Few tokens: wider chunks for the same workspace bytes (fewer launches per call).
    Filtered chunks may be wider still: the host waits on each one's kept-column count, so each
    must carry enough GPU work to hide that."""
    widest = cfg.chunks.max_width
    if filtered:
        widest = max(cfg.filter.max_width, cfg.filter.max_entries // n)
    return max(widest, cfg.chunks.max_entries // n) // cfg.chunks.align * cfg.chunks.align


def _min_width(n: int, d: int, cfg: Config, tail: int, tma: bool, filtered: bool) -> int:
    """(tma) A chunk narrower than the tail's goes to the tail, which runs the same kernels in
    fewer, wider chunks (the look-ahead it loses only hides the filter's waits). Filtered, the
    chunks wide enough to filter stay: the tail does not filter."""
    least = cfg.chunks.min_width
    if tma and cfg.chunks.tail_min_width:
        least = max(least, tail)
        if filtered:
            filters = math.ceil(cfg.filter.min_flops / (4 * n * d))
            least = min(least, max(cfg.chunks.min_width, filters))
    return least


def chunk_plan(n: int, v: int, d: int, elt: int, cfg: Config, *, tma: bool,
               filtered: bool = False, lookahead: bool | None = None,
               v_first: int = 0) -> list[Chunk]:
    """The backward's chunks from column v_first on (dC's rows before it are written). A chunk
    whose W fits in dC's unwritten rows (below its end, above the chunk's own rows) takes the
    widest width that fits, up to _max_width, until that falls below _min_width; the rest goes
    to the tail in tail_width chunks. W per column: n * elt bytes with tma (dlogits_tma.py),
    plus n * 4 of fp32 logits X on the cuBLAS route; with the look-ahead two chunks' W are live
    (w_slots), so chunks never grow. Widths are multiples of 8 (16-byte TMA rows); the last V mod
    8 columns are their own tail chunk: an unaligned width sends cuBLAS to its slow kernels."""
    if lookahead is None:
        lookahead = looks_ahead(n, cfg, filtered)
    tail = tail_width(n, v, d, elt, cfg).width
    plan, v_start = [], v_first
    if n > 0:
        row, col = d * elt, n * elt
        max_width = _max_width(n, cfg, filtered)
        min_width = _min_width(n, d, cfg, tail, tma, filtered)
        end = v * row // WORKSPACE_ALIGN * WORKSPACE_ALIGN
        below = end  # where the previous chunk's W slot starts (look-ahead)
        while v_start < v:
            if not tma:
                fit = (end - 2 * WORKSPACE_ALIGN - v_start * row) // (n * (4 + elt) + row)
            elif not lookahead:  # every chunk's W at the top, one at a time
                fit = (end - WORKSPACE_ALIGN - v_start * row) // (col + row)
            elif len(plan) % 2 == 0:  # top slot; the next chunk's (no wider) goes right below
                fit = (end - 2 * WORKSPACE_ALIGN - v_start * row) // (2 * col + row)
            else:  # below the previous chunk's slot
                fit = (below - WORKSPACE_ALIGN - v_start * row) // (col + row)
            width = min(max_width, fit // cfg.chunks.align * cfg.chunks.align,
                        (v - v_start) // 8 * 8)
            if tma and plan:
                width = min(width, plan[-1].width)  # never wider: see w_slots
            if width <= 0 or (width < min_width and width < v - v_start):
                break
            plan.append(Chunk(v_start, width, False))
            below = _slot_start(end if len(plan) % 2 else below, n * width * elt)
            v_start += width
    aligned_end = v_start + (v - v_start) // 8 * 8
    plan += [Chunk(s, min(tail, aligned_end - s), True) for s in range(v_start, aligned_end, tail)]
    if aligned_end < v:
        plan.append(Chunk(aligned_end, v - aligned_end, True))
    return plan


def w_slots(widths: list[int], dc_bytes: int, n: int, elt: int, lookahead: bool) -> list[int]:
    """Byte offsets inside dC of the tma chunks' W (n x width each). With the look-ahead,
    chunk k's W is written before chunk k-1's GEMMs run, so consecutive chunks alternate
    between a slot ending at dC's end and one right below the previous slot; with widths that
    never grow, a top slot lies above every slot but the previous one's. Without it, every
    chunk's W ends at dC's end (the stream orders each chunk after the last one's GEMMs)."""
    end = dc_bytes // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    starts = []
    for k, width in enumerate(widths):
        top = end if k % 2 == 0 or not lookahead else starts[-1]
        starts.append(_slot_start(top, n * width * elt))
    return starts


def _slot_start(top: int, size: int) -> int:
    return (top - size) // WORKSPACE_ALIGN * WORKSPACE_ALIGN


def x_and_w_slots(dc_bytes: int, n: int, width: int, elt: int) -> tuple[int, int, int]:
    """Byte offsets (w_start, x_start, end) of a cuBLAS-route chunk's W and fp32 logits X inside
    dC. X ends at dC's end, W lies just below it: a later chunk (never wider) writes its X only
    over this chunk's X, so this chunk's W survives until the look-ahead has read it."""
    end = dc_bytes // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    x_start = end - 4 * n * width
    w_start = (x_start - elt * n * width) // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    return w_start, x_start, end


def chunk_filters(chunk: Chunk, n: int, d: int, cfg: Config) -> bool:
    """Whether a chunk of a filtered backward filters: a chunk in dC (the tail does not) whose
    dense GEMMs cost at least filter.min_flops (below that, the host's wait for its kept-column
    count costs more than skipping saves)."""
    return not chunk.in_tail and 4 * n * chunk.width * d >= cfg.filter.min_flops


def filter_can_skip(n: int, v: int, d: int, elt: int, cfg: Config, tma: bool,
                    vocab_parallel: bool = False) -> bool:
    """Whether a filtered backward of this shape (a vocab-parallel rank's: v its shard) would
    skip anything at all. Only the chunks that filter (chunk_filters) do, and only when their
    dense GEMMs add up to filter.min_total_flops (a shard's: vocab_parallel_min_total_flops):
    below that the filter's fixed host costs (its reductions, a wait per chunk, the gathers'
    launches) exceed what it can save."""
    plan = chunk_plan(n, v, d, elt, cfg, tma=tma, filtered=True)
    filtering = [4 * n * ch.width * d for ch in plan if chunk_filters(ch, n, d, cfg)]
    least = cfg.filter.min_total_flops
    if vocab_parallel and cfg.filter.vocab_parallel_min_total_flops is not None:
        least = cfg.filter.vocab_parallel_min_total_flops
    return bool(filtering) and sum(filtering) >= least


# ---- ignored rows ---------------------------------------------------------------------------

def compaction_pays(n: int, num_used: int, v: int, d: int, elt: int, cfg: Config,
                    de_into_e: bool = True) -> bool:
    """Whether the backward runs on the used rows only. Their gathered E costs memory the full
    call does not have, while the full call holds an fp32 dE accumulator for every row: drop
    rows when that leaves the peak no higher, and when enough are dropped to outweigh the
    gather (compaction.max_used). de_into_e: whether dE's rows may go into the gathered E's
    buffer (not when the forward gathered it: autograd keeps it for a second backward)."""
    if num_used == 0:
        return True
    if num_used > cfg.compaction.max_used * n:
        return False
    # Peak bytes in units of one dE row. Full call: fp32 accumulator (2) and dE (1) per row.
    # Used rows only: gathered E (1) and accumulator (2) per used row, and their dE (1) unless
    # it goes into the gathered E's buffer (not when the tail works in dE's buffer); then the
    # full dE (1 per row) beside the used rows' dE (the gathered E freed).
    separate_de = tail_width(num_used, v, d, elt, cfg).in_de or not de_into_e
    peak_used = max((4 if separate_de else 3) * num_used, n + num_used)
    return peak_used <= 3 * n


# ---- low memory -----------------------------------------------------------------------------

def row_stride(width: int) -> int:
    """A W's row stride in entries: a multiple of 8, so rows start on 16 bytes (TMA)."""
    return cdiv(width, 8) * 8


def round_up(nbytes: int) -> int:
    return cdiv(nbytes, WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def tile_bytes(rows: int, width: int, acc_rows: int, d: int, elt: int) -> int:
    """Workspace bytes of a W of rows x width (16-bit rows padded) and an fp32 acc_rows x d."""
    return round_up(rows * row_stride(width) * elt) + round_up(acc_rows * d * 4)


@dataclass(frozen=True)
class LowMemoryPlan:
    rows_1: int          # pass 1: rows per chunk ...
    width_1: int         # ... and columns per group (< v: an fp32 rows_1 x D sum over groups)
    width_2: int         # pass 2: columns per chunk ...
    rows_2: int          # ... and rows per group (< n: an fp32 width_2 x D sum)
    workspace_2: int     # pass 2's buffer, bytes
    chunks_2: tuple      # ((v0, width, rows per group, W in dC), ...)


def _fitting(nbytes: int, per_row: int, least: int, total: int, step: int) -> int:
    """The most rows (or columns) of per_row bytes that fit: all, or a multiple of step, at
    least `least`."""
    rows = max(0, nbytes - 2 * WORKSPACE_ALIGN) // per_row
    return total if rows >= total else max(least, rows // step * step)


def low_memory_plan(n: int, v: int, d: int, elt: int, cfg: Config) -> LowMemoryPlan:
    """Chunk sizes of the low-memory backward. Pass 1 works in the larger of dC's buffer and
    pass 2's workspace (low_memory.frac of the gradients' bytes, or what the smallest chunks
    need). Chunks are at least low_memory.min_entries / D rows (pass 1) or columns (pass 2), so
    their GEMMs' outputs have enough tiles to fill the GPU; row counts are multiples of
    low_memory.row_align (the kernels' row block) unless they cover every row."""
    lm = cfg.low_memory
    per_d = cdiv(lm.min_entries, d)
    min_rows_1 = min(n, cdiv(per_d, lm.row_align) * lm.row_align)
    min_rows_2 = min(n, lm.row_align)
    min_width = min(v, cdiv(per_d, 8) * 8)
    dc_bytes = v * d * elt
    need_1 = tile_bytes(min_rows_1, min(v, 8), min_rows_1, d, elt)
    workspace_2 = max(int(lm.frac * (n + v) * d * elt),
                      tile_bytes(min_rows_2, min(min_width, 64), min(min_width, 64), d, elt),
                      need_1 if dc_bytes < need_1 else 0)
    buf_1 = max(dc_bytes, workspace_2)
    rows_1, width_1 = _fitting(buf_1, row_stride(v) * elt + 4 * d, 1, n, lm.row_align), v
    if rows_1 < min_rows_1:
        rows_1 = min_rows_1
        width_1 = _fitting(buf_1 - round_up(rows_1 * d * 4), rows_1 * elt, 8, v, 8)
    # Pass 2: every row at once (dC straight from one GEMM) where that leaves chunks at least
    # min_width wide; else row groups, the chunk's fp32 sum taking at most half of the
    # workspace (a min_width sum could leave W only a sliver: GEMMs of a few rows).
    width = _fitting(workspace_2, n * elt, 0, v, 8) if n else v
    if width >= min_width:
        width_2, rows_2 = width, n
    else:
        width_2 = max(min(8, min_width), min(min_width, workspace_2 // 2 // (4 * d) // 8 * 8))
        while width_2 > 8 and tile_bytes(min_rows_2, width_2, width_2, d, elt) > workspace_2:
            width_2 -= 8
        rows_2 = _fitting(workspace_2 - round_up(width_2 * d * 4), row_stride(width_2) * elt,
                          min_rows_2, n, lm.row_align)
    chunks = pass2_chunks(n, v, d, elt, width_2, rows_2, min(width_2, 256))
    return LowMemoryPlan(rows_1, width_1, width_2, rows_2, workspace_2, tuple(chunks))


def pass2_chunks(n: int, v: int, d: int, elt: int, width_2: int, rows_2: int,
                 min_tail: int) -> list[tuple[int, int, int, bool]]:
    """Pass 2's chunks [(v0, width, rows per group, W in dC)]. While dC's unwritten tail can
    hold W for every row of a chunk at least as wide as the workspace's (min_tail with row
    groups), W goes there, at dC's end, above the chunk's own rows (written by its GEMM); then
    width_2 x rows_2 in the workspace. Widths are multiples of 8, the last few columns apart."""
    chunks, v0 = [], 0
    while v0 < v:
        rest = v - v0
        tail = ((rest * d * elt - 2 * WORKSPACE_ALIGN) // (elt * (n + d))) // 8 * 8 if n else 0
        tail = min(tail, rest // 8 * 8)
        if tail >= (width_2 if rows_2 >= n else min_tail) and tail > 0:
            chunks.append((v0, tail, n, True))
            v0 += tail
            continue
        width = min(width_2, rest)
        width = width // 8 * 8 or width
        chunks.append((v0, width, rows_2, False))
        v0 += width
    return chunks


# ---- the three-matmul path (paths/three_matmul.py) ---------------------------------------------

def even_rows(n: int, most: int, align: int = 1) -> int:
    """Rows per chunk of n rows in as few chunks of at most ``most`` rows as hold them, evenly
    (a short last chunk would cost a pass over dC's accumulator for a few rows), rounded up to
    a multiple of ``align`` where that stays within ``most``: as many chunks, the last one
    shorter, none with a partial tile of rows (config.Fused.row_align)."""
    rows = cdiv(n, cdiv(n, most)) if n else most
    up = cdiv(rows, align) * align
    return up if up <= most else rows


# Columns: cuBLAS's fast 16-bit kernels need K and leading dimensions multiples of 8, so the
# GEMMs over all V columns run the last V mod 8 apart (aligned_runs).
ALIGN = 8


def aligned_runs(runs: list[tuple[int, int]], v: int) -> list[tuple[int, int]]:
    """runs with the last V mod 8 columns as their own run (at V 50257 one GEMM over all the
    columns fell off cuBLAS's fast kernels)."""
    cut = v - v % ALIGN
    out = []
    for a, b in runs:
        out += [(a, cut), (cut, b)] if a < cut < b else [(a, b)]
    return out


@dataclass(frozen=True)
class FusedPlan:
    rows: int                # rows per chunk (the last may be shorter)
    chunks: int              # of n rows (fewer run when rows without a target are gathered)
    # dC is summed in an fp32 buffer: 16-bit inputs in several chunks (unless dC's own buffer
    # sums them: config.Fused.dc_accumulator), or an fp32 weight under autocast (any chunks;
    # that buffer is then C's gradient itself)
    accumulate_dc: bool
    de_rows_fp32: bool       # a chunk's dE rows are summed over several GEMMs in fp32 rows
    extra_bytes: int         # the call's peak beyond its gradients' own bytes (<= the budget)
    row_stride: int          # elements between the logits rows: V rounded up to 16 bytes
    logits_fp32: bool = False  # 16-bit inputs whose logits are kept in fp32 (row_stride: fp32)
    # 16-bit logits relative to their forward tile's row max (config.Fused.logits_shifted),
    # with that max per row and tile (shift_tiles fp32 values a row), beside the logits or, in
    # the chunk's own dE rows (tile_max_in_de: config.Fused.tile_max_in_de, where they fit)
    shifted: bool = False
    shift_tiles: int = 0
    tile_max_in_de: bool = False
    row_align: int = 1       # rows per chunk a multiple of it where that keeps the chunks
    # 16-bit logits shifted by each row's target logit, V x rows (config.Fused.target_shift)
    target_shifted: bool = False


def target_shift_splits(rows: int, v: int, block_r: int, block_v: int, programs: int) -> int:
    """Vocabulary splits of the target-shifted pass (kernels/target_shifted_grad.py): enough
    for its (row blocks x splits) grid to hold ``programs``, each split at least 8 column
    steps."""
    most = max(1, cdiv(v, 8 * block_v))
    return max(1, min(most, cdiv(programs, cdiv(rows, block_r))))


def _logits_kind(v: int, d: int, elt: int, cfg: Config, shift_ok: bool,
                 target_shift_ok: bool) -> tuple[dict, int]:
    """The chunk's logits format as FusedPlan's fields (row_stride, logits_fp32, shifted,
    shift_tiles, tile_max_in_de, target_shifted), and the bytes of one logit (fused_plan)."""
    fp32 = elt == 4
    shifted = not fp32 and shift_ok and cfg.fused.logits_shifted
    target_shifted = not (fp32 or shifted) and target_shift_ok and cfg.fused.target_shift
    logits_fp32 = not (fp32 or shifted or target_shifted) and cfg.fused.logits_fp32
    logit_elt = 4 if logits_fp32 else elt
    stride = v if target_shifted else cdiv(v * logit_elt, 16) * 16 // logit_elt
    tiles = cdiv(v, cfg.forward.tiles.block_v) if shifted else 0
    # a chunk's dE rows (d elt bytes a row, 4-byte aligned) are written after its gradient
    # pass, the tile maxima's last reader
    in_de = shifted and cfg.fused.tile_max_in_de and (d * elt) % 4 == 0 and 4 * tiles <= d * elt
    return dict(row_stride=stride, logits_fp32=logits_fp32, shifted=shifted, shift_tiles=tiles,
                tile_max_in_de=in_de, target_shifted=target_shifted), logit_elt


def _chunk_row(kind: dict, logit_elt: int, d: int, elt: int, de_rows_fp32: bool,
               cfg: Config) -> tuple[int, int]:
    """(bytes a chunk row holds, rows per chunk a multiple of this) for fused_plan."""
    target_shifted = kind["target_shifted"]
    tile_maxima = 0 if kind["tile_max_in_de"] else 4 * kind["shift_tiles"]
    per_row = (kind["row_stride"] * logit_elt + tile_maxima + (d * 4 if de_rows_fp32 else 0)
               + (elt if target_shifted else 0))
    # Target-shifted logits are V x rows: cuBLAS's fast kernels need that leading dimension a
    # multiple of 8 (chunks of 2731 rows took 4.4x torch.compile's time), so chunks are too
    # (config.Fused.target_shift_row_align: at least 8).
    if target_shifted:
        return per_row, max(cfg.fused.row_align, cfg.fused.target_shift_row_align)
    return per_row, cfg.fused.row_align


def fused_plan(n: int, v: int, d: int, elt: int, budget_bytes: int, cfg: Config,
               filtered: bool = False, dc_fp32: bool = False, shift_ok: bool = False,
               softcap: bool = False, target_shift_ok: bool = False
               ) -> tuple[FusedPlan | None, str]:
    """(plan, "") of n rows in chunks whose memory beyond the gradients fits budget_bytes, or
    (None, why not).

    Per chunk row the path holds its V logits (fp32, or the input dtype: config.Fused) and, for
    16-bit inputs whose dE rows are summed over several GEMMs (the filter's kept column runs, or
    V's last V mod 8 columns apart), an fp32 dE row; one GEMM writes dE's rows itself, rounding
    its fp32 sums once. With several chunks and 16-bit inputs, dC is summed in an fp32
    accumulator (4 V D bytes) that the backward rounds into dC (2 V D bytes) once the chunk is
    freed: the forward holds chunk and accumulator but not yet dC, the backward accumulator and
    dC, so the peak beyond the gradients is max(chunk + 2 V D, 4 V D). fp32 inputs accumulate in
    dE and dC themselves (gradients, not workspace). So does an fp32 weight under 16-bit
    autocast (``dc_fp32``: elt is then the GEMMs' 16-bit size): its gradient is fp32 anyway, so
    dC's fp32 sums, in one chunk or several, are that gradient and the budget holds the chunk
    alone (the weight's 16-bit copy that the GEMMs read is autocast's, not the budget's:
    route.describe counts it). With config.Fused.dc_accumulator "dc", dC's own 16-bit buffer
    sums the chunks (one rounding per chunk) and the budget holds the chunk alone too. Chunks
    are of equal size (a short last chunk would cost a pass over dC for a few rows), or of a
    multiple of config.Fused.row_align rows where that keeps their number. Fewer than
    fused.min_rows rows per chunk make dC's accumulation memory-bound: the recompute path is
    faster then, and so it is where each of several chunks holds fewer than
    fused.min_chunk_flops. dC's own 16-bit sums round once per chunk, so they take at most
    fused.dc_max_chunks chunks (dc_max_chunks_softcap where the logits are softcapped:
    ``softcap``), else no plan.
    shift_ok: the TMA forward can write shifted logits (config.Fused.logits_shifted:
    16-bit logits and an fp32 max per row and forward tile, instead of fp32 logits; the maxima
    in the chunk's dE rows with config.Fused.tile_max_in_de, where they fit there, else beside
    the logits in the budget).
    target_shift_ok: elsewhere, the chunk's 16-bit logits may be shifted by each row's target
    logit (config.Fused.target_shift: V x rows, the rows a multiple of 8, and one 16-bit shift
    a row)."""
    fp32 = elt == 4
    dc_fp32 = dc_fp32 and not fp32  # fp32 inputs: dC is fp32 already
    kind, logit_elt = _logits_kind(v, d, elt, cfg, shift_ok, target_shift_ok)
    target_shifted = kind["target_shifted"]
    de_rows_fp32 = not fp32 and (filtered or v % ALIGN != 0)
    per_row, row_align = _chunk_row(kind, logit_elt, d, elt, de_rows_fp32, cfg)
    cap = cfg.fused.max_rows or n
    # a ragged last target-shifted chunk runs padded to 8-row multiples (paths/three_matmul.py)
    held = cdiv(n, ALIGN) * ALIGN if target_shifted else n
    kind["row_align"] = row_align
    if held * per_row <= budget_bytes and n <= cap:
        return FusedPlan(n, 1, dc_fp32, de_rows_fp32, held * per_row, **kind), ""
    # (dC's fp32 accumulator, dC) beyond the gradients: none where the sums are the gradient,
    # or where dC's own 16-bit buffer sums them (config.Fused.dc_accumulator "dc")
    in_dc = not (fp32 or dc_fp32) and cfg.fused.dc_accumulator == "dc"
    acc, dc = (0, 0) if fp32 or dc_fp32 or in_dc else (v * d * 4, v * d * elt)
    mib = f"the workspace ({budget_bytes / 2**20:.0f} MiB)"
    if acc > budget_bytes:
        return None, f"{mib} cannot hold dC's fp32 accumulator ({acc / 2**20:.0f} MiB)"
    fits = (budget_bytes - acc + dc) // per_row
    if target_shifted:
        fits = fits // ALIGN * ALIGN
    if fits < 1:
        return None, f"{mib} holds no row of logits ({per_row} bytes)"
    if min(fits, cap) < cfg.fused.min_rows:
        beside = " beside dC's fp32 accumulator" if acc else ""
        return None, (f"{mib} holds {min(fits, cap)} rows of logits per chunk{beside}; fewer "
                      f"than {cfg.fused.min_rows} make the path slower than recomputing")
    rows = min(cap, even_rows(n, fits, row_align))
    chunks, chunk_flops = cdiv(n, rows), 6 * rows * v * d
    if chunks > 1 and chunk_flops < cfg.fused.min_chunk_flops:
        return None, (f"{mib} makes chunks of {rows} rows, {chunk_flops:.1e} flops each: under "
                      f"fused.min_chunk_flops ({cfg.fused.min_chunk_flops:.0e}) a chunk's fixed "
                      f"cost outweighs the matmul the path saves")
    name = "dc_max_chunks_softcap" if softcap else "dc_max_chunks"
    max_chunks = getattr(cfg.fused, name)
    if in_dc and max_chunks and chunks > max_chunks:
        return None, (f"{mib} makes {chunks} chunks of {rows} rows; dC's 16-bit sums "
                      f"would round once per chunk, more than fused.{name} ({max_chunks})")
    extra = max(rows * per_row + acc - dc, acc)
    return FusedPlan(rows, chunks, not in_dc, de_rows_fp32, extra, **kind), ""
