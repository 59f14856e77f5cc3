"""The route of one call: every choice of which kernels run, made once, here.

``route(call, cfg)`` takes integers and flags (``Call``: the shape, the dtype, the options, and
whether the tensors as the kernels read them are 16-byte aligned) and the device's config, and
returns one frozen ``Route``. No tensor is read and nothing is launched, so every decision can
be tested on the CPU at real shapes (tests/test_route.py). ``own_kernel.plan`` returns this very
object; api.py asks ``route`` once per call and hands the Route to the autograd entry it names;
the paths and launchers read it and decide nothing themselves.

Paths (``Route.path``):

- ``"three-matmul"`` (paths/three_matmul.py): a mean or sum with gradients, eager, whose row
  chunks fit the workspace budget (``workspace_mib``; None = the device's default), few enough
  where dC's 16-bit buffer sums them (plan.fused_plan);
- ``"recompute"`` (paths/recompute.py): the forward's lse, then the backward recomputes the
  logits in vocabulary chunks (every other call with gradients);
- ``"low-memory"`` (paths/low_memory.py): ``low_memory=True``;
- ``"forward-only"``: no gradient is needed (torch.no_grad, inference_mode, inputs that do not
  require grad): the forward's lse pass alone.

The entry (how the path is reached, ``Route.entry``): ``"fused"`` (the three-matmul path's
autograd Function), ``"eager"`` or ``"compiled"`` (paths/entries.py: an autograd Function, or
the custom ops under torch.compile) or ``"vocab-parallel"`` (each rank's shard,
paths/vocab_parallel.py).

The kernels (properties of the Route, each derived once from the call and the config):

- ``forward``: ``"ws"`` (kernels/forward_ws.py: where ``"tma"`` would run on plain logits, or
  with a softcap or temperature under ``forward.ws_scaled_logits``, the config asks for it and
  Triton has Gluon's Hopper API), ``"tma"``
  (kernels/forward_tma.py: the config asks for it and e and c are
  16-byte aligned), ``"pointer"`` (kernels/forward.py) or ``"cublas"``: on the three-matmul
  path the chunk's logits from cuBLAS unless they are ``"shifted"`` (then the TMA forward
  writes them); off it, where the pointer forward would run, cuBLAS's fp32 logits of row
  chunks in the budget, each read once (``forward_rows``: config.Forward.cublas_min_d);
  ``logits``: the three-matmul path's logits format;
- ``writer`` / ``tail_writer``: who writes the softmax gradient W of the chunks in dC's free
  rows and of the tail's chunks (``W_WRITERS``: paths/writers.py): ``"ws"``
  (kernels/dlogits_ws.py) where ``"tma"`` would on plain logits, exact and not deterministic,
  the config asks for it and Triton has Gluon's Hopper API;
- ``filter``: the gradient filter that runs (its threshold), or None: asked for, able to skip
  something at this shape (plan.filter_can_skip); ``vocab_chunks``, ``low_memory_plan``,
  ``fused``: the path's chunks.

``batch_invariant`` (``Call.batch_invariant``) pins every choice that could depend on the
batch: the recompute path (or forward-only), kernels by the target and D only (copies where
a view's alignment would change them: ``needs_tma_copies``), no tuning, no filter, no row
gathering, the forward's fixed vocabulary blocks (``forward_grid``) and the backward's fixed
chunks (plan.invariant_chunk_plan), all in the tail's buffer.

Decisions that depend on values read on the device, or on what autograd hands the backward,
are not the route's; the Route says whether they may happen and makes them when asked, from
that data: the rows with a target gathered out (``gathers``, then ``for_rows``), a filter kept
only where the rows weigh alike in fp16 (``backward_filter``), a filter the device's counts
show cannot skip (the rest's chunks: ``exact_chunks_from``), the chunks that filter
(``chunk_filters``).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
from dataclasses import dataclass
from functools import cached_property

import torch

from own_kernel.policy import autotune
from own_kernel.policy.config import Config, RowsGemm
from own_kernel.policy.options import FilterOptions, Options, auto_filter
from own_kernel.policy.plan import (Chunk, ForwardGrid, ForwardRows, FusedPlan, LowMemoryPlan,
                                    TailPlan, chunk_filters, chunk_plan, compaction_pays,
                                    cublas_forward_rows, filter_can_skip, fused_plan,
                                    invariant_chunk_plan, invariant_split_plan, invariant_tail,
                                    looks_ahead, low_memory_plan, split_plan, tail_width,
                                    tma_ready, WS_BLOCK_V)

PATHS = ("three-matmul", "recompute", "low-memory", "forward-only")
ENTRIES = ("fused", "eager", "compiled", "vocab-parallel")
FORWARDS = ("ws", "tma", "pointer", "cublas")
W_WRITERS = ("ws", "tma", "cublas", "pointer")
# the three-matmul path's chunk logits (Route.logits)
LOGITS = ("fp32", "input", "shifted", "target-shifted")


@functools.cache
def gluon_hopper() -> bool:
    """Triton has Gluon's Hopper API, which kernels/forward_ws.py is written in (run with
    Triton 3.6 on a GPU, compiled for sm90 with 3.9 by the CPU tests)."""
    try:
        return importlib.util.find_spec("triton.experimental.gluon.language.nvidia.hopper") \
            is not None
    except ImportError:
        return False


@dataclass(frozen=True)
class Call:
    """What the route depends on: the 2-D problem (n rows, v columns of this rank's c, d
    hidden), the input dtype, the call's options, and the tensors' layouts."""
    n: int
    v: int
    d: int
    dtype: torch.dtype
    reduction: str = "mean"
    needs_grad: bool = True
    has_bias: bool = False
    return_lse: bool = False
    low_memory: bool = False
    filtered: bool = False
    vocab_parallel: bool = False
    compiling: bool = False
    workspace_mib: int | None = None    # the caller's budget; None = the config's default
    entropy: bool = False               # return_entropy: the entropy's sum and gradient
    temperature: bool = False           # logits divided by a temperature other than 1
    # c (and bias) fp32 under 16-bit autocast (dtype: the GEMMs'): their gradients are fp32.
    # The three-matmul path sums dC in fp32 anyway and returns those sums as C's gradient;
    # every other path gets autocast's 16-bit copy and autograd casts dC back to fp32.
    fp32_weight: bool = False
    # e and c as the kernels read them (c: autocast's 16-bit copy of an fp32 weight) can be
    # read through TMA descriptors (tma_ready); None: a contiguous tensor of its own, whose
    # base the allocator aligns (ready where its rows are 16-byte multiples).
    e_tma_ready: bool | None = None
    c_tma_ready: bool | None = None
    # The filter's threshold (options.FilterOptions); filtered=True alone: "auto"'s.
    filter: FilterOptions | None = None
    on_cuda: bool = True                # the portable target tunes its tiles on a GPU only
    softcap: bool = False               # the logits are softcapped (fewer dC chunks: plan.py)
    batch_invariant: bool = False       # every choice pinned independent of the batch
    deterministic: bool = False         # the backward's sums in a fixed order, not by atomics

    def __post_init__(self):
        if self.filter is not None and not self.filtered:
            object.__setattr__(self, "filtered", True)
        elif self.filtered and self.filter is None:
            object.__setattr__(self, "filter", auto_filter(self.dtype))

    @property
    def elt(self) -> int:
        return self.dtype.itemsize

    @property
    def tma_ready(self) -> bool:
        """Both e and c can be read through TMA descriptors."""
        fresh = (self.d * self.elt) % 16 == 0
        return all(fresh if ready is None else ready
                   for ready in (self.e_tma_ready, self.c_tma_ready))


def call_of(e: torch.Tensor, c: torch.Tensor, bias, opts: Options, *, reduction: str = "mean",
            needs_grad: bool = True, vocab_parallel: bool = False, compiling: bool = False,
            workspace_mib: int | None = None, fp32_weight: bool = False,
            e_tma_ready: bool | None = None, c_tma_ready: bool | None = None) -> Call:
    """The Call of 2-D e and c (c: an fp32 weight where fp32_weight) with these options;
    e_tma_ready, c_tma_ready: tma_ready of the tensors the kernels will read (None: copies of
    their own, or not known where the call is traced: the custom ops then route their own
    real tensors)."""
    return Call(e.shape[0], c.shape[0], e.shape[1], e.dtype, reduction, needs_grad,
                bias is not None, opts.ignored_lse, opts.low_memory, opts.filter is not None,
                vocab_parallel, compiling, workspace_mib, entropy=opts.entropy,
                temperature=opts.temperature != 1.0, fp32_weight=fp32_weight,
                e_tma_ready=e_tma_ready, c_tma_ready=c_tma_ready, filter=opts.filter,
                on_cuda=e.device.type == "cuda", batch_invariant=opts.batch_invariant,
                softcap=opts.softcap is not None, deterministic=opts.deterministic)


def layouts_of(e: torch.Tensor | None, c: torch.Tensor | None) -> tuple:
    """(e_tma_ready, c_tma_ready) for call_of, of the tensors the kernels will read as they
    are; None for one they will not (a copy of its own: call_of then takes a fresh tensor's)."""
    return tuple(None if t is None else tma_ready(t) for t in (e, c))


def _entry(call: Call) -> str:
    """The autograd entry that runs the call: vocab-parallel first (each rank's shard), then
    torch.compile's custom ops, then the eager entries."""
    if call.vocab_parallel:
        return "vocab-parallel"
    if call.compiling:
        return "compiled"
    return "eager"


def _three_matmul_excluded(call: Call) -> str:
    """Why the call cannot take the three-matmul path whatever the budget (else "")."""
    reasons = (
        (not call.needs_grad, "no gradient is needed"),
        (call.reduction == "none", 'reduction="none" has per-row upstream gradients'),
        (call.return_lse, "return_lse=True needs the lse's gradient"),
        (call.entropy, "return_entropy=True needs the entropy's gradient"),
        (call.temperature, "temperature= is applied on the recompute path only"),
        (call.low_memory, "low_memory=True asks for the low-memory backward"),
        (call.vocab_parallel, "vocab_parallel shards the vocabulary"),
        (call.compiling, "torch.compile runs the custom ops"),
        (call.n == 0, "there are no rows"),
        (call.batch_invariant, "batch_invariant=True pins the recompute path (cuBLAS picks "
                               "its GEMMs' algorithms by N)"),
    )
    return next((why for excluded, why in reasons if excluded), "")


def budget_mib(call: Call, cfg: Config) -> tuple[int, str]:
    """(the three-matmul budget in MiB, why it is 0 or goes unused, or "")."""
    if call.workspace_mib is not None:
        return call.workspace_mib, ""
    if call.filtered and not cfg.fused.filtered:
        # Measured (results/notes/fused-path.md): the filter skips (row, column) tiles in the
        # recompute path, but hardly a whole column block of a chunk of ~10^3 rows here, so
        # on Hopper filtered calls take this path only when given a budget.
        return 0, f"the {cfg.name} target keeps filtered calls on the recompute path by default"
    fp32 = call.dtype == torch.float32
    return (cfg.fused.default_workspace_mib_fp32 if fp32 else cfg.fused.default_workspace_mib), ""


def _fused_plan(call: Call, cfg: Config, budget_bytes: int):
    """plan.fused_plan of the call at budget_bytes: (plan or None, why not)."""
    # The TMA forward reads rows of D elements at 16-byte aligned strides (the path copies an
    # e or c whose base is not aligned: Route.fused_copies)
    shift_ok = cfg.forward.tma and (call.d * call.elt) % 16 == 0
    # cuBLAS's bias is the target shift's: none left for the call's own; the filter's marks
    # are per block of a row-major chunk
    target_shift_ok = not (call.has_bias or call.filtered)
    return fused_plan(call.n, call.v, call.d, call.elt, budget_bytes, cfg,
                      filtered=call.filtered, dc_fp32=call.fp32_weight, shift_ok=shift_ok,
                      softcap=call.softcap, target_shift_ok=target_shift_ok)


def _zero_budget_in_recompute_memory(call: Call, cfg: Config) -> bool:
    """Given a 0 MiB budget, whether the call tries the three-matmul path within the recompute
    path's own memory (config.Fused.zero_budget): exact calls of 16-bit inputs, whose recompute
    path holds an fp32 dE accumulator (4 N D bytes) beside the gradients. Not an fp32 weight
    under autocast: there the recompute path's peak is its 16-bit dC beside autograd's fp32
    cast, as large as the three-matmul path's fp32 sums beside autocast's copy, and no chunk fits
    (measured: 4-7 % more memory than the recompute path at three shapes, zero-budget.md)."""
    return (cfg.fused.zero_budget == "recompute-memory" and call.elt == 2
            and not call.filtered and not call.fp32_weight)


def route(call: Call, cfg: Config) -> "Route":
    """The call's path and entry, with the three-matmul path's plan where it runs. Cheap: every
    call asks it (no chunk planning beyond fused_plan's few integers; the other paths' chunks
    are planned when first read)."""
    exact = auto_filter_runs_exact(call, cfg)
    if exact is not None:
        return exact
    entry = _entry(call)
    mib, why_not = budget_mib(call, cfg)
    excluded = _three_matmul_excluded(call)
    if not excluded and mib:
        plan, why_not = _fused_plan(call, cfg, mib * 2**20)
        if plan is not None:
            return Route(call, cfg, "three-matmul", "fused", plan, mib)
    elif not excluded and _zero_budget_in_recompute_memory(call, cfg):  # mib is 0 here
        # the recompute path's fp32 dE accumulator as the chunks' room (config.Fused.zero_budget)
        plan, _ = _fused_plan(call, cfg, _de_accumulator_bytes(call))
        if plan is not None:
            return Route(call, cfg, "three-matmul", "fused", plan, 0,
                         "workspace_mib=0: the chunks fit the recompute path's fp32 dE "
                         "accumulator (fused.zero_budget)")
    elif excluded and call.workspace_mib:
        why_not = excluded
    note = f"workspace_mib={mib} unused: {why_not}" if mib and why_not else why_not
    if not call.needs_grad:
        path = "forward-only"
    else:
        path = "low-memory" if call.low_memory else "recompute"
    rows = _cublas_forward_rows(call, cfg)
    if rows is None:
        return Route(call, cfg, path, entry, None, 0, note)
    # the budget holds the forward's logits instead (config.Forward.cublas_min_d)
    note = f"workspace_mib={mib}: the forward's fp32 logits, {rows.rows} rows a chunk"
    if why_not and call.needs_grad:
        note += f"; not the three-matmul path: {why_not}"
    return Route(call, cfg, path, entry, None, mib, note)


def _tma_forward(call: Call, cfg: Config) -> bool:
    """The forward reads e and c through TMA descriptors (kernels/forward_tma.py, or the Gluon
    kernel): the config asks for it and both allow it."""
    return cfg.forward.tma and call.v > 0 and call.tma_ready


def _cublas_forward_rows(call: Call, cfg: Config) -> ForwardRows | None:
    """plan.cublas_forward_rows in the call's budget, where the pointer forward would run
    (no TMA) on one GPU's whole vocabulary: 16-bit inputs (fp32 ones keep the forward's IEEE
    dots, whatever torch's TF32 setting), not batch_invariant (cuBLAS picks its GEMMs by N),
    not low_memory (it asked for the least memory, not for a budget's). Off the three-matmul
    path only (its chunks hold their own logits)."""
    if (call.elt != 2 or call.batch_invariant or call.vocab_parallel or call.low_memory
            or _tma_forward(call, cfg)):
        return None
    return cublas_forward_rows(call.n, call.v, call.d, budget_mib(call, cfg)[0] * 2**20, cfg)


def route_with_copies(e, c, route_of):
    """(e, c, route_of(e, c)), e and c replaced by aligned copies where that route needs them
    (Route.needs_tma_copies: batch_invariant's pinned kernels read them through TMA, every
    batch); route_of: the caller's route of two tensors (the eager call's, a custom op's)."""
    r = route_of(e, c)
    if r.needs_tma_copies:
        e, c = (t if tma_ready(t) else t.clone() for t in (e, c))
        r = route_of(e, c)
    return e, c, r


def rows_gemm_reads_tma(rows_gemm: RowsGemm, a, b) -> bool:
    """Whether batch_invariant's dE GEMM (kernels/gemm_rows.py) reads a chunk's W (a) and C
    rows (b) through TMA: where the config asks for it and both views allow it. The chunks'
    columns start at multiples of 8, so this follows D and V, never N: every batch a row is in
    takes the same loader."""
    return rows_gemm.tma and tma_ready(a) and tma_ready(b)


def auto_filter_runs_exact(call: Call, cfg: Config) -> "Route | None":
    """filter_eps="auto" on a target that filters on the recompute path only (Hopper): the exact
    call's route unless the filter pays, else None (filter). The filter saves GEMM flops (N V D
    times the share of skipped columns) and costs the recompute path's fourth matmul and its
    per-logit marks and sums, so it pays at large V D and wide D. The exact call runs where
    - D < cfg.filter.auto_min_d: at D 1152, V 262144 the filter was slower than the exact
      default, at D 2048 and wider (V 128256 to 256000) faster (H200, filter-auto.md);
    - or the exact three-matmul path fits the default budget with dC's sums in fp32 (V D
      small): there the filter was slower or level at every head tried (H100 and H200)."""
    f = call.filter
    if f is None or not f.auto or call.workspace_mib is not None or cfg.fused.filtered:
        return None
    exact_call = dataclasses.replace(call, filtered=False, filter=None)
    if call.d < cfg.filter.auto_min_d:
        why = f"D {call.d} < {cfg.filter.auto_min_d}, where the filter does not pay"
    else:
        fp32_sums = dataclasses.replace(cfg, fused=dataclasses.replace(cfg.fused,
                                                                       dc_accumulator="fp32"))
        if route(exact_call, fp32_sums).path != "three-matmul":
            return None
        why = "the exact three-matmul path fits the default budget"
    return dataclasses.replace(route(exact_call, cfg),
                               note=f'filter_eps="auto" runs exact: {why}')


@dataclass(frozen=True, repr=False)
class Route:
    """One call's route (module docstring), what ``own_kernel.plan`` returns: its path, the
    entry that runs it, the config every pass of the call runs with (its backward included),
    and, as properties derived once, which kernels run and with which chunks.

    The plan's summary, as ``own_kernel.plan`` reports it: ``path``; ``chunks``, ``chunk_size``:
    the three-matmul path's row chunks and rows per chunk, the recompute path's vocabulary chunks
    and the widest one's columns, the low-memory path's pass-1 row chunks and rows per chunk; 0
    and 0 without a backward; ``peak_bytes``: an estimate of the memory the call holds at its
    peak beyond its inputs (the gradients, the workspaces and per-row vectors; not the gathered
    rows of ignored targets, which depend on the targets' values, nor the filter's gathered
    columns); ``budget_mib``: the workspace budget in force, the three-matmul path's or the
    cuBLAS forward's (``forward_rows``; 0: none); ``note``: why a budget goes unused (the path
    cannot take it, or its chunks do not fit), or what the cuBLAS forward holds in it, or why
    filter_eps="auto" runs exact, or ""."""
    call: Call
    cfg: Config
    path: str
    entry: str
    fused: FusedPlan | None = None
    budget_mib: int = 0
    note: str = ""

    # ---- the forward -------------------------------------------------------------------------

    @cached_property
    def forward(self) -> str:
        """The forward's kernel: "ws", "tma", "pointer", or "cublas" (three-matmul,
        unshifted)."""
        if self.fused is not None:
            return "tma" if self.fused.shifted else "cublas"
        if self.call.batch_invariant:  # by the target and D only (api.py copies unaligned views)
            return "tma" if self.cfg.forward.tma and self.call.v > 0 and self.d_aligned else \
                "pointer"
        tma = _tma_forward(self.call, self.cfg)
        # forward_ws.py's tiles within split_plan's splits (multiples of block_v), up to its D
        fwd = self.cfg.forward
        ws = (fwd.ws and fwd.tiles.block_v % WS_BLOCK_V == 0
              and (fwd.ws_max_d == 0 or self.call.d <= fwd.ws_max_d))
        if tma and ws and self.ws_forward_logits and gluon_hopper():
            return "ws"
        if tma:
            return "tma"
        return "cublas" if self.forward_rows is not None else "pointer"

    @property
    def forward_rows(self) -> ForwardRows | None:
        """The cuBLAS forward's row chunks off the three-matmul path (Route.forward "cublas"),
        else None."""
        return None if self.fused is not None else _cublas_forward_rows(self.call, self.cfg)

    @property
    def ws_forward_logits(self) -> bool:
        """The forward needs only (max, sum[, sum of logits]) of z = softcap(e @ c.T) / T, on
        one GPU's whole vocabulary: what forward_ws.py computes; a softcap or a temperature
        only where the config asks for them there (forward.ws_scaled_logits)."""
        c = self.call
        scaled = (c.softcap or c.temperature) and not self.cfg.forward.ws_scaled_logits
        return c.on_cuda and not (c.has_bias or c.entropy or c.vocab_parallel
                                  or c.batch_invariant or scaled)

    @property
    def plain_logits(self) -> bool:
        """The logits are x = e @ c.T, with no softcap or temperature: what dlogits_ws.py
        differentiates (beside ws_forward_logits)."""
        return self.ws_forward_logits and not (self.call.softcap or self.call.temperature)

    @property
    def forward_tuned(self) -> bool:
        """The pointer forward's tiles are timed on this GPU (policy/autotune.py)."""
        return (self.forward == "pointer" and self.cfg.autotune and self.call.on_cuda
                and not self.call.batch_invariant)

    @property
    def d_aligned(self) -> bool:
        """Rows of D input-dtype elements are 16-byte multiples (TMA descriptors can read
        fresh or aligned copies of e and c)."""
        return (self.call.d * self.call.elt) % 16 == 0

    @property
    def needs_tma_copies(self) -> bool:
        """batch_invariant: the kernels are pinned by the target, so an e or c view TMA
        cannot read is copied rather than sent to other kernels (whose bits differ)."""
        c = self.call
        return c.batch_invariant and (self.forward == "tma" or self.w_by_tma) and \
            (c.e_tma_ready is False or c.c_tma_ready is False)

    def forward_grid(self, slots: int, v: int | None = None) -> ForwardGrid:
        """The forward's grid (plan.split_plan); batch_invariant: vocabulary splits of one
        fixed width (plan.invariant_split_plan), merged left to right by lse_combine.py. v: the
        columns the forward reads, where they are not the call's (a vocab-parallel shard
        extended to whole blocks, paths/vocab_gathered.py)."""
        c = self.call
        v = c.v if v is None else v
        if c.batch_invariant:
            return invariant_split_plan(c.n, v, c.d, c.elt, self.cfg, slots)
        return split_plan(c.n, v, c.d, c.elt, self.cfg, slots)

    @property
    def logits(self) -> str:
        """The three-matmul path's logits (LOGITS): "shifted", "target-shifted", "fp32" or
        "input" (the input dtype); "" on the other paths (no logits are kept)."""
        if self.fused is None:
            return ""
        if self.fused.shifted or self.fused.target_shifted:
            return "shifted" if self.fused.shifted else "target-shifted"
        return "fp32" if self.fused.logits_fp32 else "input"

    @cached_property
    def fused_copies(self) -> tuple[bool, bool]:
        """(copy e, copy c): the three-matmul path's TMA forward reads copies of inputs whose
        base is not 16-byte aligned (an offset view; rare)."""
        if self.fused is None or not self.fused.shifted:
            return False, False
        return self.call.e_tma_ready is False, self.call.c_tma_ready is False

    # ---- the backward's W writers ------------------------------------------------------------

    @cached_property
    def writer(self) -> str | None:
        """Who writes the backward's W (module docstring): of the chunks in dC's free rows on
        the recompute path, of every W on the low-memory path; None on the other paths."""
        if self.path not in ("recompute", "low-memory"):
            return None
        if self.call.batch_invariant:  # every chunk in the tail: one writer, pinned by the target
            return "tma" if self.cfg.chunks.recompute == "tma" and self.d_aligned else "pointer"
        if self.cfg.chunks.recompute == "tma" and self.call.tma_ready:
            c = self.call
            ws = self.cfg.recompute.ws and self.plain_logits and not (c.filtered or
                                                                      c.deterministic)
            return "ws" if ws and gluon_hopper() else "tma"
        return "cublas" if self.path == "recompute" else "pointer"

    @property
    def tail_writer(self) -> str | None:
        """Who writes the W of the recompute path's tail chunks (and of the low-memory path)."""
        return None if self.writer is None else self.writer if self.w_by_tma else "pointer"

    @property
    def w_by_tma(self) -> bool:
        """W is written by a kernel that recomputes the logits with TMA loads ("tma", or "ws"
        on plain logits): the chunks' W slots and widths are planned for TMA's alignment."""
        return self.writer in ("tma", "ws")

    @property
    def col_round_summed(self) -> bool:
        """The writer sums what rounding W removed per column (dC's rank-1 correction): the
        TMA writers only where the config asks for it (recompute.col_round)."""
        return not self.w_by_tma or self.cfg.recompute.col_round

    @property
    def pointer_tuned(self) -> bool:
        """The pointer W writer's tiles are timed on this GPU (policy/autotune.py)."""
        if self.call.batch_invariant:
            return False
        return autotune.tunes(self._device, self.cfg, self.cfg.dlogits_candidates)

    @property
    def softmax_grad_tuned(self) -> bool:
        """The cuBLAS writer's softmax_grad launch shape is timed on this GPU."""
        return (not self.call.batch_invariant and not self.cfg.softmax_grad.tma
                and autotune.tunes(self._device, self.cfg, self.cfg.softmax_grad_candidates))

    @property
    def _device(self) -> str:
        return "cuda" if self.call.on_cuda else "cpu"

    # ---- the recompute backward's filter and chunks -------------------------------------------

    @cached_property
    def filter(self) -> FilterOptions | None:
        """The gradient filter the call runs (its threshold), or None: exact. The three-matmul
        path filters its chunks' column blocks whenever asked; the recompute backward not
        where it cannot pay: too few GEMM flops to skip (plan.filter_can_skip)."""
        f = self.call.filter
        if self.path == "three-matmul":
            return f
        if self.path != "recompute" or f is None or f.eps <= 0:
            return None
        c = self.call
        can_skip = filter_can_skip(c.n, c.v, c.d, c.elt, self.cfg, self.w_by_tma,
                                   vocab_parallel=c.vocab_parallel)
        return f if can_skip else None

    def backward_filter(self, uniform: bool) -> FilterOptions | None:
        """The filter, given how the backward's rows weigh: fp16 with per-row weights (uniform
        False) runs exact (filtered W shares one scale across rows: the small rows' entries
        would underflow; exact per-row scaling keeps every row's gradient)."""
        if self.call.dtype == torch.float16 and not uniform:
            return None
        return self.filter

    def vocab_chunks(self, filtered: bool) -> tuple[Chunk, ...]:
        """The recompute backward's vocabulary chunks, filtered or exact (plan.chunk_plan)."""
        return self._filtered_chunks if filtered else self._exact_chunks

    @cached_property
    def _exact_chunks(self) -> tuple[Chunk, ...]:
        c = self.call
        if c.batch_invariant:
            return tuple(invariant_chunk_plan(c.v, c.d, self.cfg))
        return tuple(chunk_plan(c.n, c.v, c.d, c.elt, self.cfg, tma=self.w_by_tma))

    @cached_property
    def _filtered_chunks(self) -> tuple[Chunk, ...]:
        c = self.call
        return tuple(chunk_plan(c.n, c.v, c.d, c.elt, self.cfg, tma=self.w_by_tma,
                                filtered=True))

    def exact_chunks_from(self, v_first: int) -> list[Chunk]:
        """The chunks of columns [v_first, V) as an exact call runs them (wider: one W slot),
        for a filtered run that finds it cannot skip after its first chunk."""
        c = self.call
        return chunk_plan(c.n, c.v, c.d, c.elt, self.cfg, tma=self.w_by_tma,
                          v_first=v_first, lookahead=False)

    @property
    def lookahead(self) -> bool:
        """Filtered chunks queue the next chunk's W before this one's GEMMs (plan.looks_ahead
        on the tma writer; the cuBLAS writer always does)."""
        return looks_ahead(self.call.n, self.cfg, True) if self.w_by_tma else True

    def chunk_filters(self, chunk: Chunk) -> bool:
        """Whether a chunk of a filtered run filters (plan.chunk_filters)."""
        return chunk_filters(chunk, self.call.n, self.call.d, self.cfg)

    @cached_property
    def tail(self) -> TailPlan:
        c = self.call
        if c.batch_invariant:
            return invariant_tail(c.v, c.d, self.cfg)
        return tail_width(c.n, c.v, c.d, c.elt, self.cfg)

    @cached_property
    def low_memory_plan(self) -> LowMemoryPlan | None:
        c = self.call
        if self.path != "low-memory":
            return None
        return low_memory_plan(c.n, c.v, c.d, c.elt, self.cfg)

    # ---- rows with a target -------------------------------------------------------------------

    @property
    def reads_count_before_forward(self) -> bool:
        """Whether the eager recompute entry reads the targets' count before its forward, to
        run forward and backward on the rows with a target only (gathers). That read idles the
        GPU while the host queues the gather and the forward, so only calls whose forward is
        long enough to hide it (compaction.fwd_min_flops) read it, and only those whose rows
        are gathered for a backward anyway (not an lse asked for, which ignored rows have
        too). The others drop rows in the backward only."""
        c = self.call
        return (self.path == "recompute" and self.entry == "eager" and not c.return_lse
                and not c.batch_invariant
                and c.n > 0 and 2 * c.n * c.v * c.d >= self.cfg.compaction.fwd_min_flops)

    def gathers(self, num_used: int, *, before_forward: bool = False) -> bool:
        """Whether the call runs on its num_used rows with a target only (plan.compaction_pays;
        num_used: the targets' count, read on the host). Before the forward the gathered E is
        kept by autograd for the backward, so dE's rows cannot go into its buffer. The
        low-memory path runs on every row (gathering would cost more memory than its
        workspace; the forward's lse +inf keeps the ignored ones' W zero)."""
        c = self.call
        if self.path == "low-memory" or c.n == 0 or num_used == c.n or c.batch_invariant:
            return False
        return compaction_pays(c.n, num_used, c.v, c.d, c.elt, self.cfg,
                               de_into_e=not before_forward)

    def for_rows(self, n: int) -> "Route":
        """This route on n of the call's rows, gathered into a tensor of their own: the same
        path and entry, its kernels chosen again for that shape and layout."""
        return dataclasses.replace(self, call=dataclasses.replace(self.call, n=n,
                                                                  e_tma_ready=None))

    # ---- what own_kernel.plan reports ------------------------------------------------------------

    @property
    def chunks(self) -> int:
        return self._summary[0]

    @property
    def chunk_size(self) -> int:
        return self._summary[1]

    @property
    def peak_bytes(self) -> int:
        return self._summary[2]

    @cached_property
    def _summary(self) -> tuple[int, int, int]:
        """(chunks, chunk_size, peak_bytes): the path's chunking and its estimated peak."""
        call, n = self.call, self.call.n
        if self.path == "three-matmul":
            # the chunk, dE, autocast's copy of an fp32 weight, the losses and dC; one chunk
            # makes dC's buffer once its dE has dropped the copy and the losses
            # (paths/three_matmul.py): the larger of the two then, not their sum
            held, dc = _weight_copy_bytes(call) + 4 * n, _weight_gradient_bytes(call)
            beside = max(dc, held) if self.fused.chunks == 1 else dc + held
            peak = _gradient_bytes(call) - dc + self.fused.extra_bytes + beside
            return self.fused.chunks, self.fused.rows, peak
        # the cuBLAS forward's logits, freed before any backward allocates
        rows = self.forward_rows
        forward = _vectors(call) + (rows.nbytes if rows is not None else 0)
        if self.path == "forward-only":
            return 0, 0, forward
        if self.path == "low-memory":
            lm = self.low_memory_plan
            return -(-n // max(lm.rows_1, 1)), lm.rows_1, _cast_peak(call, lm.workspace_2)
        chunks = self.vocab_chunks(self.filter is not None)
        peak = max(forward, _cast_peak(call, _de_accumulator_bytes(call)))
        return len(chunks), max((ch.width for ch in chunks), default=0), peak

    def __repr__(self) -> str:
        kernels = f"forward={self.forward!r}"
        if self.writer is not None:
            kernels += f", writer={self.writer!r}, tail_writer={self.tail_writer!r}"
        if self.fused is not None:
            kernels += f", logits={self.logits!r}"
        if self.filter is not None:
            kernels += f", filter={self.filter!r}"
        if self.call.batch_invariant:
            kernels += ", batch_invariant=True"
        return (f"Route(path={self.path!r}, entry={self.entry!r}, {kernels}, chunks={self.chunks},"
                f" chunk_size={self.chunk_size}, peak_bytes={self.peak_bytes}, budget_mib="
                f"{self.budget_mib}, note={self.note!r}, config={self.cfg.name!r})")


def _de_accumulator_bytes(call: Call) -> int:
    """The recompute path's fp32 dE accumulator (N x D): its memory beyond the gradients, which
    a zero budget may give the three-matmul path's chunks instead (config.Fused.zero_budget)."""
    return 4 * call.n * call.d


def _gradient_bytes(call: Call) -> int:
    """dE, dC and dbias in their dtypes (an fp32 weight's: fp32)."""
    return call.n * call.d * call.elt + _weight_gradient_bytes(call)


def _weight_gradient_bytes(call: Call) -> int:
    """dC and dbias in their dtype (an fp32 weight's: fp32)."""
    weight_elt = 4 if call.fp32_weight else call.elt
    return (call.v * call.d + (call.v if call.has_bias else 0)) * weight_elt


def _weight_copy_bytes(call: Call) -> int:
    """Autocast's 16-bit copy of an fp32 weight (and bias), which the GEMMs read: the
    three-matmul path holds it through its forward only, the others through the backward."""
    if not call.fp32_weight:
        return 0
    return (call.v * call.d + (call.v if call.has_bias else 0)) * call.elt


def _cast_peak(call: Call, workspace: int) -> int:
    """The peak of a path that returns a 16-bit dC (every path but the three-matmul one): the
    gradients with its workspace and vectors in the backward. An fp32 weight's 16-bit dC (the
    size of autocast's copy) sits beside that copy in the backward, then beside its fp32 cast,
    which autograd makes once the backward has freed the copy: the larger of the two (at Llama 3
    (8B) under autocast on an H200, 3070 MiB measured and estimated: zero-budget.md)."""
    return _gradient_bytes(call) + max(workspace + _vectors(call), _weight_copy_bytes(call))


def _vectors(call: Call) -> int:
    """The per-row and per-column fp32 vectors (loss, lse, largest probability, nll, weights;
    column sums): a few floats per row and column."""
    return 4 * (6 * call.n + 2 * call.v)
