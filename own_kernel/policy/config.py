"""The kernel's configuration: one frozen, validated value per target, resolved once per
(device, dtype) and passed down.

Targets: ``HOPPER_16BIT`` (sm90, bf16/fp16: TMA loads, the persistent recompute kernel),
``PORTABLE`` (any other CUDA device, and fp32 inputs: pointer kernels, cuBLAS recompute) and
``INTERPRETER`` (TRITON_INTERPRET=1 on the CPU: tiny tiles, one config per kernel, chunks small
enough that every path runs on tiny shapes). Every tuned number carries its reason; the notes
under ``results/notes/`` hold the measurements and the commands that repeat them.

Experiments and tests override fields without touching the hot path: ``overridden({...})`` (a
context manager) or ``CCE_OWN_CONFIG='{"forward": {"tma": false}}'`` (read once, at import),
both as nested dicts of field names; an unknown name is an error that names it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Literal

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _power_of_two(name: str, value: int) -> None:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two, got {value}")


@dataclass(frozen=True)
class Tiles:
    """One Triton launch shape: rows x columns x depth per program, warps, pipeline stages."""
    block_n: int
    block_v: int
    block_d: int
    num_warps: int
    num_stages: int

    def __post_init__(self):
        for name in ("block_n", "block_v", "block_d", "num_warps"):
            _power_of_two(f"tiles.{name}", getattr(self, name))
        if self.num_stages < 1:
            raise ValueError(f"tiles.num_stages: expected >= 1, got {self.num_stages}")

    def launch(self) -> dict:
        """The kernel keywords of this shape."""
        return dict(BLOCK_N=self.block_n, BLOCK_V=self.block_v, BLOCK_D=self.block_d,
                    num_warps=self.num_warps, num_stages=self.num_stages)


@dataclass(frozen=True)
class Forward:
    """The forward's log-sum-exp GEMM (forward.py, forward_tma.py)."""
    tiles: Tiles
    tma: bool = False        # TMA loads where the inputs allow (Hopper)
    flatten: bool = False    # pipeline loads across vocabulary tiles
    l2_mib: int = 0          # E bytes the resident programs may share in L2; 0 = no bound
    warp_specialize: bool = False  # TMA loop: Triton's producer/consumer warp groups (sm90+)
    # batch_invariant: each row's partials per block of this many columns (or the tile's width
    # where smaller); a vocab-parallel shard that starts off a block borrows at most this many
    # columns less one from its neighbour (paths/vocab_gathered.py), not a whole tile's.
    invariant_width: int = 64
    # Programs plan.split_plan counts as resident per SM (its waves, its L2 groups). 2 plans
    # more splits for the same tile: faster at N 4096, D 7168, level or slower at the frontier's
    # shapes, so 1 (results/notes/forward-grid.md; the 128-column tiles that two programs could
    # share an SM with were 10-23 % slower).
    programs_per_sm: int = 1
    # Row blocks per launch group where l2_mib bounds them: "splits", the resident programs
    # over the split count; "budget", as many as l2_mib holds (fewer passes over C from DRAM):
    # faster at N 4096, D 7168, slower at D 5120 and Gemma 2 (2B) (forward-grid.md).
    l2_group: Literal["budget", "splits"] = "splits"
    # What plan.balanced_splits adds to each program's tiles for its prologue and epilogue,
    # in tiles' time. Under the split-order model 2 took fewer splits in larger groups: on an
    # H200 faster at four of six grids at N 4096, slower in one process at N 2048, D 8192 and
    # N 12288, D 4096, V 32000 (forward-grid.md, call35a-c, g). Both followed from the model's
    # order (makespan_order below): in launch order 1 takes the faster grids and keeps the
    # others. 1.
    program_overhead_tiles: int = 1
    # The order plan.balanced_splits runs the programs in: "launch", the kernels' (each launch
    # group's splits in turn, so the short last split closes every group); "split", every row
    # block's program of a split before the next split, as if in one group: it took grids that
    # leave the GPU's last wave ragged (ncu at N 4096, D 3584, V 152064: the SMs' active cycles
    # the same, elapsed 11 % over their mean at 21 splits, 5 % at 8). On an H200 "launch" was
    # faster at seven grids it moves (N 4096 and N 16384), level at eleven, slower at none;
    # loss+grad level (forward-grid.md, "The launch order").
    makespan_order: Literal["launch", "split"] = "launch"
    # Where the launch is grouped, plan.balanced_splits may also put every row block's last
    # split (the short one) after all the groups, where its programs fill the last wave. On an
    # H200 (call36d): faster at N 4096 with D 3584 and 4096, V 152064, level at four heads, but
    # slower at N 16384, D 3072 and 3584, V 128256, where the tail's 128 row blocks of E (100 MB
    # and more) do not stay in L2, as forward.l2_mib's groups do. Off (forward-grid.md, "The
    # launch order").
    short_split_last: bool = False
    # Softcapped logits: the forward (forward.py, forward_tma.py) folds each tile into its
    # online log-sum-exp as two column halves, so half the epilogue's fp32 temporaries (the
    # tanh's among them) live beside the accumulator at once. Forced on an H200 at Gemma 2
    # (2B) with its softcap: the portable forward 1.24 floors against 1.36 without them, the
    # TMA forward level alone and its loss+grad faster; slower without a softcap, so only with
    # one (both GPU configs set it; portable-forward-softcap.md).
    softcap_halves: bool = False
    # The pointer forward (forward.py) reads clamped rows and columns without masks, and with
    # D a multiple of the tile's depth no depth mask either: the masks' compares and selects
    # issued more instructions per k-step than the loads and products. The same logits bit for
    # bit; on an H200 forced portable, faster at four heads, interleaved and blocked
    # (results/notes/portable-forward-loads.md).
    in_bounds_loads: bool = True
    # The pointer forward's k-loop loads base + d0 from pointers fixed before the loop, where it
    # stepped every pointer by the tile's depth each k-step: in Triton 3.6's SASS the step was a
    # 64-bit add per 16-byte load (python -m suite kernel sass counts the k-loop). The same loads,
    # so the same logits bit for bit. On an H200 forced portable, at four heads in two rounds:
    # slower nowhere; faster interleaved and blocked at one head in one round, near the runs'
    # noise (results/notes/fixed-base-loads.md).
    fixed_base_loads: bool = True
    # Plain logits (no bias, softcap, temperature or entropy's sum) through the warp-specialised
    # Gluon kernel (forward_ws.py), where Triton has Gluon's Hopper API: its epilogue runs under
    # the tensor cores. On an H200, faster than forward_tma.py interleaved in one process at
    # six shapes of seven (1.02-1.06 floors where it took 1.05-1.21), but level or slower a
    # process per provider, and level or faster in every loss+grad measured: it takes fewer
    # cycles and draws more power, so alone at the power cap its clock is lower
    # (results/notes/gluon-forward.md). Not the three-matmul path's shifted logits (tried: level
    # or slower, the same note).
    ws: bool = False
    # ws up to this hidden size (0: any). At the power cap, each kernel timed at the clock its
    # own power sets (blocked after untimed calls, or a process per provider), forward_tma.py
    # was faster at D 3584-5120 and level at D 1152, where the Gluon kernel was faster
    # interleaved and level or faster blocked up to D 3072 (the same note's power-cap section);
    # checked since at heads no preset names: faster or level at D 7168 and 8192, level at
    # D 2048 and 3072.
    ws_max_d: int = 0
    # ws also with a softcap or a temperature. Off: at Gemma 2's three softcapped heads it was
    # faster than forward_tma.py interleaved, but level or slower forward-only a process per
    # provider, and level inside loss+grad (the same note's softcap section).
    ws_scaled_logits: bool = False
    # Off the three-matmul path (forward-only and recompute calls of 16-bit inputs),
    # the forward as row chunks of cuBLAS's fp32 logits in the call's workspace budget, each
    # read once into its rows' (max, sum) (kernels/logits_lse.py), from this hidden size up
    # (0: never; where the route would run the pointer forward only). That pass reads 4 bytes a
    # logit against the GEMM's 2 D flops, so it pays at wide D only, where the pointer forward
    # (no TMA) lags cuBLAS most. Fewer than cublas_min_rows rows per chunk: the pointer forward.
    cublas_min_d: int = 0
    cublas_min_rows: int = 256
    cublas_max_rows: int = 0     # rows per chunk at most (0: what fits; tests: many chunks)

    def __post_init__(self):
        _power_of_two("forward.invariant_width", self.invariant_width)
        if self.cublas_min_d < 0:
            raise ValueError(f"forward.cublas_min_d: expected >= 0 (0: never), got "
                             f"{self.cublas_min_d}")
        if self.cublas_min_rows < 1:
            raise ValueError(f"forward.cublas_min_rows: expected >= 1, got "
                             f"{self.cublas_min_rows}")
        if self.cublas_max_rows < 0:
            raise ValueError(f"forward.cublas_max_rows: expected >= 0 (0: what fits), got "
                             f"{self.cublas_max_rows}")
        if self.ws_max_d < 0:
            raise ValueError(f"forward.ws_max_d: expected >= 0 (0: any D), got {self.ws_max_d}")
        if not isinstance(self.short_split_last, bool):
            raise ValueError(f"forward.short_split_last: expected a bool, got "
                             f"{self.short_split_last!r}")
        if self.makespan_order not in ("launch", "split"):
            raise ValueError(f"forward.makespan_order: expected 'launch' or 'split', got "
                             f"{self.makespan_order!r}")
        if self.l2_group not in ("budget", "splits"):
            raise ValueError(f"forward.l2_group: expected 'budget' or 'splits', got "
                             f"{self.l2_group!r}")
        if self.program_overhead_tiles < 0:
            raise ValueError(f"forward.program_overhead_tiles: expected >= 0, got "
                             f"{self.program_overhead_tiles}")
        if self.programs_per_sm < 1:
            raise ValueError(f"forward.programs_per_sm: expected >= 1, got "
                             f"{self.programs_per_sm}")


@dataclass(frozen=True)
class Recompute:
    """The backward's persistent recompute kernel (dlogits_tma.py): logits on the tensor cores,
    W written by the epilogue in `subtiles` column slices."""
    tiles: Tiles
    subtiles: int = 1
    group_n: int = 8         # row blocks sharing the chunk's C tiles in L2
    persistent: bool = False
    flatten: bool = False
    col_round: bool = True   # sum what rounding W removed per column (dC's correction)
    warp_specialize: bool = False  # the tile loop in Triton's producer/consumer warp groups
    # W of plain logits (no bias, softcap, temperature, entropy, filter; not deterministic)
    # by the warp-specialised Gluon kernel (dlogits_ws.py), where Triton has Gluon's Hopper
    # API; it sums no column rounding, so only with col_round off. On an H200 faster than
    # dlogits_tma.py at two heads, level at two, never slower (results/notes/gluon-writer.md).
    ws: bool = False

    def __post_init__(self):
        if self.subtiles not in (1, 2, 4) or self.tiles.block_v % self.subtiles:
            raise ValueError(f"recompute.subtiles: expected 1, 2 or 4 dividing block_v, got "
                             f"{self.subtiles}")
        if self.ws and self.col_round:
            raise ValueError("recompute.ws: the Gluon writer sums no column rounding; set "
                             "recompute.col_round to False with it")


@dataclass(frozen=True)
class SoftmaxGrad:
    """cuBLAS-recompute route: fp32 logits X -> W (softmax_grad.py)."""
    block_n: int
    block_v: int
    num_warps: int
    stages: int
    waves: int               # programs per SM the grid aims at
    tma: bool = True         # X and W through TMA descriptors (Hopper); else pointer loads

    def __post_init__(self):
        for name in ("block_n", "block_v", "num_warps"):
            _power_of_two(f"softmax_grad.{name}", getattr(self, name))
        for name in ("stages", "waves"):
            if getattr(self, name) < 1:
                raise ValueError(f"softmax_grad.{name}: expected >= 1, got {getattr(self, name)}")
        if not isinstance(self.tma, bool):
            raise ValueError(f"softmax_grad.tma: expected a bool, got {self.tma!r}")


@dataclass(frozen=True)
class Chunks:
    """Vocabulary chunks of the backward (policy/plan.py): W lives in dC's unwritten tail."""
    recompute: Literal["tma", "cublas"]
    max_width: int           # columns per chunk at most ...
    max_entries: int         # ... or max_entries / N when that is more (few tokens)
    min_width: int           # narrower chunks go to the tail
    align: int               # widths are multiples of this
    tail_min_width: bool     # (tma) cuBLAS chunks narrower than the tail's go to the tail
    min_tail_width: int      # the tail's chunks are at least this wide ...
    tail_mib: int            # ... else this many MiB of W

    def __post_init__(self):
        if self.recompute not in ("tma", "cublas"):
            raise ValueError(f"chunks.recompute: expected 'tma' or 'cublas', got "
                             f"{self.recompute!r}")
        if self.align % 8:
            raise ValueError(f"chunks.align: expected a multiple of 8 (16-byte TMA rows), got "
                             f"{self.align}")


@dataclass(frozen=True)
class Filter:
    """The gradient filter's host-side choices (paths/recompute.py)."""
    max_width: int           # filtered chunks may be wider: each costs the host a wait
    max_entries: int
    min_flops: float         # chunks with fewer dense GEMM flops run exact
    min_total_flops: float   # calls whose filtering chunks add up to less run exact
    max_kept: float          # a chunk keeping more than this fraction of columns runs dense
    kept_align: int          # gathered column counts are padded to a multiple of this
    max_flat: float          # more flat rows than this fraction: no column skipping
    lookahead_max_n: int     # queue chunk k+1's kernel before chunk k's GEMMs up to this N
    # A vocab-parallel shard's call filters from this many flops (None: min_total_flops)
    vocab_parallel_min_total_flops: float | None = None
    # filter_eps="auto" runs exact below this hidden size (0: no bound; policy/route.py,
    # auto_filter_runs_exact): the filter saves GEMM flops, N V D times the share of skipped
    # columns, at a cost per logit (the recompute kernel's marks and sums), so it pays only
    # where D is wide enough
    auto_min_d: int = 0


@dataclass(frozen=True)
class Compaction:
    """Rows whose target is ignored, left out of the work (api.py, paths/entries.py)."""
    max_used: float = 15 / 16      # gather only when at most this fraction is used
    fwd_min_flops: float = 0.0     # gather before the forward from this many forward flops


@dataclass(frozen=True)
class LowMemory:
    """low_memory=True (paths/low_memory.py)."""
    frac: float = 1 / 16           # pass 2's workspace, of the gradients' bytes
    min_entries: int = 2**21       # least rows x D (pass 1) or columns x D (pass 2) per chunk
    row_align: int = 128
    max_k: int = 8192              # longest GEMM reduction: one K = 256000 lost dE accuracy


@dataclass(frozen=True)
class Fused:
    """The three-matmul training path (paths/three_matmul.py): row chunks whose logits fit a
    workspace."""
    min_rows: int = 1024           # fewer rows per chunk: dC's accumulation is memory-bound
    block: int = 2048              # columns per step of the logits-to-gradient pass (and per
    num_warps: int = 8             # filter block: the dE / dC GEMMs skip whole blocks)
    default_workspace_mib: int = 1024
    # fp32 inputs: IEEE fp32 GEMMs run at a fraction of the tensor cores' rate, so chunks of a
    # few thousand rows keep them as busy as larger ones, and the call stays nearer the
    # gradients' size (portable-h100-2).
    default_workspace_mib_fp32: int = 512
    max_rows: int = 0              # rows per chunk at most (0: what fits; tests: many chunks)
    filtered: bool = False         # filtered calls take the path at the default budget too
    # A budget of 0 MiB, 16-bit inputs, exact: "recompute", the recompute path; "recompute-
    # memory", the three-matmul path where its chunks (at least min_rows rows, at most
    # dc_max_chunks of them) fit in the fp32 dE accumulator the recompute path holds
    # (4 N D bytes), so the call holds no more memory (HOPPER_16BIT sets it). Not for an fp32
    # weight under autocast, whose fp32 dC sums leave no room (route.py).
    zero_budget: Literal["recompute", "recompute-memory"] = "recompute"
    # 16-bit inputs: the chunk's logits kept in fp32 (4 bytes each, not 2). The loss and
    # gradients then come from the GEMM's fp32 sums, as on the recompute path; 16-bit logits
    # give naive 16-bit accuracy on confident rows (own_kernel/README.md, "Accuracy").
    logits_fp32: bool = True
    # 16-bit inputs on the TMA forward: each logit in the input dtype relative to its row's
    # largest in its forward tile (forward_tma.py), written by the forward beside its lse:
    # half fp32's bytes at about its accuracy; the loss and lse come from the forward's sums.
    # Takes precedence over logits_fp32 where the TMA forward runs. y_slices: the tile's
    # stores in 1 or 2 column slices (shared memory for the store's staging).
    logits_shifted: bool = False
    y_slices: int = 2
    # 16-bit inputs off the TMA forward: the chunk's logits in the input dtype, shifted by each
    # row's target logit, which cuBLAS adds as its bias in the GEMM's fp32 epilogue (so the
    # logits are written vocabulary-major; kernels/target_shifted_grad.py): half fp32's bytes,
    # with the values that carry a row's mass near zero. Not with a bias or the filter.
    # target_shift_tiles: the pass's rows and columns per program, warps, and programs per SM
    # (the vocabulary split until the grid has them: a strip's pass keeps the memory busy only
    # with many programs in flight; at 2736 rows, 4 splits took 1.6x the time of 16, H200,
    # target-shifted-logits.md). On in the portable config.
    target_shift: bool = False
    target_shift_tiles: tuple[int, int, int, int] = (128, 32, 8, 8)
    # Target-shifted chunks' rows a multiple of this where the chunks keep their number (at
    # least 8: the logits' leading dimension for cuBLAS's fast kernels; plan.fused_plan); what
    # row_align is to the other logits. The portable config sets 128.
    target_shift_row_align: int = 8
    # Shifted logits: the tile maxima (4 bytes per row and forward tile) kept in the chunk's own
    # dE rows where they fit there (4 x tiles <= D x 2 bytes), not beside the logits: dE's rows
    # are written only after the gradient pass, the maxima's last reader. The budget then holds
    # the logits alone, which is a chunk fewer where the maxima tipped the count (N 8192,
    # D 5120, V 131072 at 1 GiB: 3 chunks become 2, faster than 3 in both rounds and level with
    # torch.compile; level with the maxima beside at Llama 3 (8B): H200, frontier.md).
    tile_max_in_de: bool = True
    # Rows per chunk rounded up to a multiple of this where the chunks still fit and do not grow
    # in number (the last one then shorter): N 16384 at Qwen 2.5 (7B) and 1 GiB makes five
    # chunks of 3277 rows, each with a partial 128-row tile in the forward and dE's GEMM and a
    # partial step of dC's reduction; 128 makes them 3328 (the last 3072). 1: off (HOPPER_16BIT
    # sets 128).
    row_align: int = 1
    # 16-bit inputs in several chunks: dC's sums over the chunks in dC's own 16-bit buffer
    # ("dc": each chunk's GEMM adds its fp32 sums into it, one rounding per chunk; the budget
    # holds the chunk alone, and each chunk reads and writes 2 V D bytes of dC), or in an fp32
    # accumulator ("fp32": 4 V D bytes of workspace and of traffic per chunk, one rounding).
    # "dc" took Llama 3 (8B) and Gemma 2 (2B) at 1 GiB from the recompute path to 2 and 4
    # chunks, level with torch.compile, dC's error under half of torch.compile's (H200,
    # dc-accumulator.md).
    dc_accumulator: str = "dc"
    # dc_accumulator "dc": row chunks at most (more: no plan, so the recompute path; 0: no
    # cap), as dC's error grows with its roundings, one per chunk. Without a softcap, bf16 at
    # Llama 3 (8B): 16 chunks 0.77x torch.compile's dC error, 32 chunks 1.23x, over the 1.2x
    # the path keeps to; 22 chunks at Qwen 2.5 (7B) 0.96x; 17 and 33 at D 1152, V 262144 0.89x
    # and 1.38x. With a softcap the bound comes sooner: at Gemma 2 (2B) (softcap 30), N 8192,
    # torch.compile's own dC error is half the other heads' while ours at a given count is
    # not lower, so 8 chunks 0.92x, 16 1.26x; at N 65536, 16 chunks 0.97x, 32 1.57x (H200,
    # zero-budget.md, dc-accumulator.md). Chunks number N / rows: N 65536 at Gemma 2 (2B) and
    # 1 GiB makes 32.
    dc_max_chunks: int = 24
    dc_max_chunks_softcap: int = 8
    # Several chunks only where each holds at least this many flops (6 rows V D: its three
    # matmuls): every chunk costs its launches and passes whatever its size, and at small V D
    # that outweighs the matmul the path saves. HOPPER_16BIT sets it: on an H200 chunks of
    # 2e11 were slower than recomputing, 4.0e11-4.6e11 level or split, 6.3e11 and up faster
    # (zero-budget.md).
    min_chunk_flops: float = 0.0

    def __post_init__(self):
        _power_of_two("fused.block", self.block)
        if self.y_slices not in (1, 2):
            raise ValueError(f"fused.y_slices: expected 1 or 2, got {self.y_slices}")
        block_r, block_v, warps, per_sm = self.target_shift_tiles
        for name, value in (("rows", block_r), ("columns", block_v), ("warps", warps)):
            _power_of_two(f"fused.target_shift_tiles' {name}", value)
        if per_sm < 1:
            raise ValueError(f"fused.target_shift_tiles' programs per SM: expected >= 1, got "
                             f"{per_sm}")
        if self.min_rows < 1:
            raise ValueError(f"fused.min_rows: expected >= 1, got {self.min_rows}")
        for name in ("dc_max_chunks", "dc_max_chunks_softcap", "min_chunk_flops"):
            if getattr(self, name) < 0:
                raise ValueError(f"fused.{name}: expected >= 0 (0: no cap), got "
                                 f"{getattr(self, name)}")
        if self.zero_budget not in ("recompute", "recompute-memory"):
            raise ValueError(f"fused.zero_budget: expected 'recompute' or 'recompute-memory', "
                             f"got {self.zero_budget!r}")
        if self.row_align < 1:
            raise ValueError(f"fused.row_align: expected >= 1, got {self.row_align}")
        if self.target_shift_row_align < 8 or self.target_shift_row_align % 8:
            raise ValueError(f"fused.target_shift_row_align: expected a multiple of 8, got "
                             f"{self.target_shift_row_align}")
        if self.dc_accumulator not in ("fp32", "dc"):
            raise ValueError(f"fused.dc_accumulator: expected 'fp32' or 'dc', got "
                             f"{self.dc_accumulator!r}")
        for name in ("default_workspace_mib", "default_workspace_mib_fp32"):
            if getattr(self, name) < 0:
                raise ValueError(f"fused.{name}: expected >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class RowsGemm:
    """batch_invariant's dE GEMM (gemm_rows.py): one pinned launch shape, never autotuned (a
    tile that followed N would change a row's sums). tiles: block_n rows, block_v columns of
    D, block_d of the reduction per step."""
    tiles: Tiles
    tma: bool = False        # TMA descriptors where the operands allow (Hopper)
    group_m: int = 8         # row blocks per column block in launch order (L2 reuse)

    def __post_init__(self):
        if self.group_m < 1:
            raise ValueError(f"rows_gemm.group_m: expected >= 1, got {self.group_m}")


@dataclass(frozen=True)
class Config:
    name: str
    forward: Forward
    dlogits: Tiles                 # the pointer W writer (dlogits.py)
    dlogits_tiles_per_program: int
    recompute: Recompute
    softmax_grad: SoftmaxGrad
    chunks: Chunks
    filter: Filter
    compaction: Compaction = field(default_factory=Compaction)
    low_memory: LowMemory = field(default_factory=LowMemory)
    fused: Fused = field(default_factory=Fused)
    # The pointer W writer's k-loop as the pointer forward's: its logits read clamped rows and
    # columns unmasked (Forward.in_bounds_loads) from pointers fixed before the loop
    # (Forward.fixed_base_loads); the same W and sums bit for bit, and in sm90 SASS the
    # forward's loop length only with both. On: forced portable on an H200 with low_memory,
    # the pair was faster interleaved and blocked at two of three heads in its second round,
    # slower at none in two rounds; each alone was level in six of eight cells
    # (results/notes/fixed-base-loads.md).
    dlogits_in_bounds_loads: bool = True
    dlogits_fixed_base_loads: bool = True
    rows_gemm: RowsGemm = field(
        default_factory=lambda: RowsGemm(Tiles(64, 128, 32, num_warps=4, num_stages=3)))
    poison: bool = False           # fill workspaces with NaN first (tests: reads follow writes)
    # Tiles timed on the user's GPU on first use and cached on disk (policy/autotune.py): the
    # forward's, the pointer dlogits kernel's and the pointer softmax_grad's (tma False) from
    # these candidates. Off: the tiles above as they are.
    autotune: bool = False
    forward_candidates: tuple = ()
    dlogits_candidates: tuple = ()
    softmax_grad_candidates: tuple = ()

    def __post_init__(self):
        for name, kind in (("forward_candidates", Tiles), ("dlogits_candidates", Tiles),
                           ("softmax_grad_candidates", SoftmaxGrad)):
            if not all(isinstance(k, kind) for k in getattr(self, name)):
                raise ValueError(f"{name}: expected a tuple of {kind.__name__}")
        if any(k.tma for k in self.softmax_grad_candidates):
            raise ValueError("softmax_grad_candidates: expected tma False (only the pointer "
                             "variant is tuned)")
        if self.fused.block % self.forward.tiles.block_v:  # kernels/logits_grad.py's layout
            raise ValueError(f"fused.block: expected a multiple of forward.tiles.block_v "
                             f"({self.forward.tiles.block_v}): the logits -> gradient pass adds "
                             f"one tile maximum per tile row; got {self.fused.block}")


# Hopper (sm90), 16-bit inputs. Measured on an H200 unless said otherwise.
HOPPER_16BIT = Config(
    name="hopper-16bit",
    # 128 x 256 TMA tiles with nested loops: the fastest forward (results/notes/forward-tiles.md);
    # l2_mib 24: E's resident row blocks stay in L2 (19 -> 1.7 GB DRAM at N 32768; forward-l2.md).
    forward=Forward(Tiles(128, 256, 64, num_warps=8, num_stages=3), tma=True, l2_mib=24,
                    softcap_halves=True, ws=True, ws_max_d=3072),
    dlogits=Tiles(128, 128, 64, num_warps=8, num_stages=4),
    dlogits_tiles_per_program=1,
    # Persistent, flattened: the next tile's loads overlap this one's epilogue; column sums of
    # the rounding residual cost the most and change dC the least (recompute-kernel.md,
    # column-rounding.md).
    recompute=Recompute(Tiles(128, 256, 64, num_warps=8, num_stages=3), subtiles=4, group_n=8,
                        persistent=True, flatten=True, col_round=False, ws=True),
    # 16 x 128: 3-4 programs per SM; 32 x 256 ran at 25 % occupancy (softmax-grad-tiles.md).
    softmax_grad=SoftmaxGrad(16, 128, num_warps=8, stages=4, waves=8, tma=True),
    # 2048-column tail chunks in dE's buffer beat 1024 at N 32768 (tail-chunks.md).
    chunks=Chunks("tma", max_width=8192, max_entries=4096 * 8192, min_width=1024, align=64,
                  tail_min_width=True, min_tail_width=2048, tail_mib=40),
    # A filtered chunk costs the host ~0.5 ms: 3e11 flops of dense GEMM (filter-min-flops.md);
    # few tokens need wide chunks to hide it (filter-chunk-width.md); the look-ahead stops
    # paying past N 16384 (filter-lookahead.md).
    # A vocab-parallel shard filters only from 4e12 flops: at K = 4 the shards of Gemma 2 (2B)
    # (2.3e12) ran slower filtered than exact, Qwen 2.5 (7B)'s (5.9e12) faster (filter-sharded.md).
    # "auto" filters from D 2048: at V 256000 it was faster than the exact default there, and
    # slower at D 1152, V 262144, at both entropies tried (H200, filter-auto.md).
    filter=Filter(max_width=16384, max_entries=2**28, min_flops=3e11, min_total_flops=1e12,
                  max_kept=0.5, kept_align=256, max_flat=0.25, lookahead_max_n=16384,
                  vocab_parallel_min_total_flops=4e12, auto_min_d=2048),
    # The count's read before the forward idles the GPU: only calls long enough to hide it
    # (ignored-targets.md).
    compaction=Compaction(fwd_min_flops=4e12),
    # Shifted 16-bit logits: fp32 logits' accuracy at half their bytes, so half the chunks
    # (shifted-logits.md). Rows per chunk a multiple of the forward's 128-row tile: Qwen 2.5
    # (7B)'s 3277 at 1 GiB made 3328 was faster in both rounds, 8192x1536x151936's 2731 made
    # 2816 in one, level in the other, D 1152 level (row-align.md).
    # At a 0 MiB budget the chunks in the recompute path's memory: 3.5-4.1 floors against its
    # 4.1-4.9 at six heads, 410-820 rows a chunk; 256-row chunks slower than recomputing, so
    # chunks hold at least 384 rows, at any budget; fewer chunks bound dC's error
    # (dc_max_chunks) (zero-budget.md). Chunks of 2.1e11 flops (N 4096, D 2048, V 32768 at a
    # 0 MiB budget: 8 of 512 rows) were 1.75x slower than recomputing, of 7.7e11 (V 49152,
    # D 2048) and more faster: 5e11 between them (zero-budget.md).
    fused=Fused(logits_shifted=True, row_align=128, zero_budget="recompute-memory",
                min_rows=384, min_chunk_flops=5e11),
    # TMA, 128 x 256: 1.14-1.17x cuBLAS's fp32-output GEMM at the Llama 3 / Qwen 2.5 chunks,
    # where the pointer 128 x 128 took 1.53-1.57x (H100, batch-invariant.md).
    rows_gemm=RowsGemm(Tiles(128, 256, 64, num_warps=8, num_stages=3), tma=True, group_m=16),
)

# The portable forward's candidate tiles: the fixed 64 x 128 x 32 that runs everywhere, and
# larger ones for GPUs with the registers and shared memory (sm80 and later); a candidate a GPU
# cannot compile or run is skipped.
_PORTABLE_FORWARD_CANDIDATES = (
    Tiles(64, 128, 32, num_warps=4, num_stages=3),
    Tiles(128, 128, 32, num_warps=4, num_stages=3),
    Tiles(128, 128, 64, num_warps=8, num_stages=3),
    Tiles(128, 256, 64, num_warps=8, num_stages=3),
    Tiles(128, 128, 64, num_warps=4, num_stages=4),
    Tiles(64, 256, 64, num_warps=8, num_stages=4),
    # Deeper or taller: the largest tile won every bucket on the H100 (portable-h100); these
    # need more shared memory than an A100's and are skipped there.
    Tiles(128, 256, 64, num_warps=8, num_stages=4),
    Tiles(256, 128, 64, num_warps=8, num_stages=3),
)

# The pointer dlogits kernel's candidates (tail chunks, low_memory): a GEMM like the forward's
# with a heavier epilogue (W's store, row and column sums), so no 128 x 256 tile; the fixed
# 64 x 128 x 32 first.
_PORTABLE_DLOGITS_CANDIDATES = (
    Tiles(64, 128, 32, num_warps=4, num_stages=3),
    Tiles(128, 128, 32, num_warps=4, num_stages=3),
    Tiles(128, 128, 32, num_warps=8, num_stages=3),
    Tiles(64, 128, 64, num_warps=4, num_stages=3),
    Tiles(128, 64, 64, num_warps=4, num_stages=3),
    Tiles(64, 256, 32, num_warps=8, num_stages=3),
)

# The pointer softmax_grad's candidates: it streams X once, so tiles differ in how many bytes
# each loop step keeps in flight (BLOCK_N x BLOCK_V fp32, STAGES deep) against the registers
# its column sums take (up to four BLOCK_N x BLOCK_V fp32 accumulators); Hopper's 16 x 128
# first.
_PORTABLE_SOFTMAX_GRAD_CANDIDATES = (
    SoftmaxGrad(16, 128, num_warps=8, stages=4, waves=8, tma=False),
    SoftmaxGrad(16, 128, num_warps=4, stages=3, waves=8, tma=False),
    SoftmaxGrad(32, 128, num_warps=8, stages=3, waves=8, tma=False),
    SoftmaxGrad(16, 256, num_warps=8, stages=3, waves=8, tma=False),
    SoftmaxGrad(8, 256, num_warps=4, stages=4, waves=8, tma=False),
    SoftmaxGrad(32, 64, num_warps=4, stages=4, waves=8, tma=False),
)

# Any other CUDA device, and fp32 inputs (IEEE fp32 dots use far more registers and shared
# memory). The tiles of the forward, of dlogits.py and of softmax_grad.py are tuned on the
# user's GPU (policy/autotune.py); the rest is fixed.
PORTABLE = Config(
    name="portable",
    # l2_mib: as on Hopper, the resident programs' E row blocks kept within L2 (every GPU since
    # the A100 has at least 40 MB; forward-l2.md).
    # cublas_min_d 3072: forced on an H200, the cuBLAS forward was faster than the pointer one
    # at D 3584-8192 (1.08-1.20 floors against 1.19-1.29), slower at D 1152, level at D 2048,
    # level or slower at D 2304 (portable-cublas-forward.md). Not measured on an A100.
    forward=Forward(Tiles(64, 128, 32, num_warps=4, num_stages=3), l2_mib=24,
                    softcap_halves=True, cublas_min_d=3072),
    dlogits=_PORTABLE_DLOGITS_CANDIDATES[0],
    dlogits_tiles_per_program=1,
    recompute=Recompute(Tiles(64, 128, 32, num_warps=4, num_stages=3)),  # unused: cuBLAS route
    # Pointer loads: GPUs before Hopper have no TMA (Triton only emulates descriptors there).
    softmax_grad=_PORTABLE_SOFTMAX_GRAD_CANDIDATES[0],
    chunks=Chunks("cublas", max_width=4096, max_entries=4096 * 8192, min_width=1024, align=64,
                  tail_min_width=False, min_tail_width=1024, tail_mib=48),
    # Hopper's filtered chunks: the host waits on each chunk's kept-column count, a cost of the
    # host, not the GPU; narrow chunks left the H100 idle most of a filtered call
    # (portable-h100-2/profile-gemma-filter.txt). A slower GPU hides the waits sooner.
    filter=Filter(max_width=16384, max_entries=2**28, min_flops=3e11, min_total_flops=1e12,
                  max_kept=0.5, kept_align=256, max_flat=0.25, lookahead_max_n=16384),
    compaction=Compaction(fwd_min_flops=4e12),
    # The cuBLAS route's filter saved nothing at N 32768 V 32000, where the three-matmul path
    # is faster (portable-h100, fused-n32768-h100); larger vocabularies exceed the default
    # budget and keep the recompute route's filter. Hopper's row_align 128 was level and
    # slower here at 8192x1536x151936 (forced on an H200, row-align.md): off. Shifted logits
    # written by the pointer forward halved the chunks and were slower or level at two heads
    # (portable-shifted-logits.md). Target-shifted 16-bit logits (cuBLAS's bias) instead of
    # fp32 ones: faster or level at every shape and head measured, never slower, dE errors
    # under 0.7x torch.compile's (forced on an H200, target-shifted-logits.md); calls with a
    # bias or the filter keep fp32 logits. Their chunks aligned to 128 rows (the forward's and
    # dE's row tile) instead of 8: at the 1 GiB default, faster at three shapes whose chunks
    # were ragged (N 8192, D 1536, V 151936; D 5120; Qwen 2.5 (7B)), level at D 1152; shapes
    # whose chunks were aligned are unchanged (forced on an H200, row-align.md).
    fused=Fused(filtered=True, target_shift=True, target_shift_row_align=128),
    autotune=True,
    forward_candidates=_PORTABLE_FORWARD_CANDIDATES,
    dlogits_candidates=_PORTABLE_DLOGITS_CANDIDATES,
    softmax_grad_candidates=_PORTABLE_SOFTMAX_GRAD_CANDIDATES,
)

# The interpreter runs on numpy: tiny tiles, and chunks a few columns wide so that tiny shapes
# take every route (several chunks, a tail, dlogits programs of two tiles).
INTERPRETER = Config(
    name="interpreter",
    # invariant_width 8: two partials per 16-column tile, as Hopper has four per tile.
    forward=Forward(Tiles(16, 16, 16, num_warps=1, num_stages=1), tma=True, invariant_width=8),
    dlogits=Tiles(16, 16, 16, num_warps=1, num_stages=1),
    dlogits_tiles_per_program=2,
    recompute=Recompute(Tiles(16, 32, 16, num_warps=1, num_stages=1), subtiles=2, group_n=2),
    # Pointer loads by default (the portable target's variant; the tests cover tma too).
    softmax_grad=SoftmaxGrad(8, 16, num_warps=1, stages=1, waves=2, tma=False),
    chunks=Chunks("tma", max_width=48, max_entries=0, min_width=8, align=8,
                  tail_min_width=False, min_tail_width=0, tail_mib=1),
    filter=Filter(max_width=48, max_entries=0, min_flops=0.0, min_total_flops=0.0,
                  max_kept=0.5, kept_align=8, max_flat=0.5, lookahead_max_n=2**62),
    # Off by default: each test picks the path it covers (workspace_mib, or an override).
    fused=Fused(min_rows=1, block=16, num_warps=1,
                default_workspace_mib=0, default_workspace_mib_fp32=0),
    rows_gemm=RowsGemm(Tiles(16, 16, 16, num_warps=1, num_stages=1), group_m=2),
)


# ---- resolution ----------------------------------------------------------------------------

def with_overrides(cfg: Config, overrides: dict) -> Config:
    """cfg with fields replaced from a nested dict of field names ({"forward": {"tma": False}});
    an unknown name raises, naming it. A Config's name gains the overrides, so that the name
    tells configs apart."""
    changes = {}
    for name, value in overrides.items():
        if not any(f.name == name for f in dataclasses.fields(cfg)):
            known = ", ".join(f.name for f in dataclasses.fields(cfg))
            raise ValueError(f"config override: unknown field {name!r} of "
                             f"{type(cfg).__name__} (fields: {known})")
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            value = with_overrides(current, value)
        changes[name] = value
    if isinstance(cfg, Config) and "name" not in overrides:
        changes["name"] = f"{cfg.name}+{json.dumps(overrides, sort_keys=True, default=repr)}"
    return dataclasses.replace(cfg, **changes)


_ENV_OVERRIDES = json.loads(os.environ.get("CCE_OWN_CONFIG") or "{}")
# Process-wide, not per thread: autograd runs CUDA backwards on threads of its own, which must
# see the override the forward saw. Experiments and tests only; single-threaded use.
_OVERRIDES: list[dict] = []


@contextlib.contextmanager
def overridden(overrides: dict):
    """Calls inside the block resolve their config with these overrides (on top of any
    CCE_OWN_CONFIG and of enclosing blocks), e.g. ``with overridden({"chunks": {"recompute":
    "cublas"}}): ...``."""
    _OVERRIDES.append(_merged(_OVERRIDES[-1] if _OVERRIDES else {}, overrides))
    try:
        yield
    finally:
        _OVERRIDES.pop()


def _merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for name, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            value = _merged(out[name], value)
        out[name] = value
    return out


def config_for(device: torch.device, dtype: torch.dtype) -> Config:
    """The config of this (device, dtype): resolved once, then a dictionary look-up."""
    base = _resolved(_target_key(device, dtype))
    if _OVERRIDES:
        return _cached_override(base, json.dumps(_OVERRIDES[-1], sort_keys=True))
    return base


def config_key(device: torch.device, dtype: torch.dtype) -> str:
    """The recipe of config_for(device, dtype) as it is now: its target, and the overrides in
    force as JSON after a newline. The custom ops carry it from a forward to its backward
    (their schema takes strings, not a Config): config_of_key makes the same config again
    whatever target or override is in force when the backward runs."""
    target = _target_key(device, dtype)
    return f"{target}\n{json.dumps(_OVERRIDES[-1], sort_keys=True)}" if _OVERRIDES else target


def config_of_key(key: str, device: torch.device, dtype: torch.dtype) -> Config:
    """The config of a config_key recipe; no recipe ("") resolves config_for(device, dtype)."""
    if not key:
        return config_for(device, dtype)
    target, _, overrides = key.partition("\n")
    base = _resolved(target)
    return _cached_override(base, overrides) if overrides else base


TARGETS = ("hopper-16bit", "portable")
_FORCED_TARGET: list[str] = ([os.environ["CCE_OWN_TARGET"]] if os.environ.get("CCE_OWN_TARGET")
                              else [])


@contextlib.contextmanager
def use_target(name: str):
    """Calls inside the block on a CUDA device take this target's config, e.g. "portable" on a
    Hopper GPU (the path every other GPU takes). CCE_OWN_TARGET=portable does the same for a
    whole process. Process-wide, as overridden() is. An eager call's backward keeps its
    forward's config (the block may have ended by then); a compiled graph's backward op
    resolves its config when it runs, so run it inside the block."""
    if name not in TARGETS:
        raise ValueError(f"use_target: expected one of {', '.join(TARGETS)}; got {name!r}")
    _FORCED_TARGET.append(name)
    try:
        yield
    finally:
        _FORCED_TARGET.pop()


def forced_target() -> str | None:
    """The target use_target (or CCE_OWN_TARGET) forces now, or None."""
    return _FORCED_TARGET[-1] if _FORCED_TARGET else None


def _target_key(device: torch.device, dtype: torch.dtype) -> str:
    if INTERPRET or device.type != "cuda":
        return "interpreter"
    hopper = torch.cuda.get_device_capability(device)[0] == 9 and dtype != torch.float32
    if _FORCED_TARGET:
        forced = _FORCED_TARGET[-1]
        if forced not in TARGETS:
            raise ValueError(f"CCE_OWN_TARGET: expected one of {', '.join(TARGETS)}; got "
                             f"{forced!r}")
        if forced == "hopper-16bit" and not hopper:
            raise ValueError("use_target('hopper-16bit'): needs a Hopper GPU (sm90) and 16-bit "
                             "inputs")
        return forced
    return "hopper-16bit" if hopper else "portable"


@functools.lru_cache(maxsize=None)
def _resolved(target: str) -> Config:
    base = {"interpreter": INTERPRETER, "hopper-16bit": HOPPER_16BIT, "portable": PORTABLE}[target]
    return with_overrides(base, _ENV_OVERRIDES) if _ENV_OVERRIDES else base


@functools.lru_cache(maxsize=64)
def _cached_override(base: Config, overrides_json: str) -> Config:
    return with_overrides(base, json.loads(overrides_json))
