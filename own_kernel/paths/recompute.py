"""Backward: vocabulary chunks of (softmax gradient W -> dE += W @ C -> dC = W^T @ E).

    d[n, v] = (w_n + w'_n) p[n, v] - w_n ((1 - ls) [v == t_n] + ls / V)   (times softcap'(z))
    dE = sum over chunks of W @ C_chunk   (fp32 accumulator, N x D)
    dC[chunk] = W^T @ E                   (each dC row written once)

A chunk's W (N x width, the input dtype) lives in dC's rows that no chunk has written yet, at
their end (plan.chunk_plan): wide chunks keep the GEMMs near peak at no memory beyond the
gradients. It is written by the route's writer (Route.writer; paths/writers.py):
- "tma": kernels/dlogits_tma.py recomputes the logits on the tensor cores and writes W (Hopper);
- "ws": kernels/dlogits_ws.py does the same for plain logits, warp-specialised (Gluon, Hopper);
- "cublas": cuBLAS writes fp32 logits X beside W, kernels/softmax_grad.py turns X into W (any
  GPU, and inputs TMA cannot read).
Once dC's free rows are too few, the rest (the tail) goes one chunk at a time through a buffer of
its own or dE's output buffer, by the route's tail writer: the same on the TMA writers' route,
"pointer" (kernels/dlogits.py, pointer loads) otherwise. The GEMMs are cuBLAS's (torch),
accumulating in fp32. The chunks, the filter and its threshold are the route's (policy/route.py).

What rounding W to 16 bits removes goes back through the mean rows of C and E (finalize_de.py,
rank1_dc.py): it keeps dE right when all hidden states share a large component.

Gradient filter (filtered_chunks): a chunk skips the columns where every |d| of the rows that
may skip is below their eps, running the GEMMs on the kept columns only (gathered); rows with a
flat softmax get their own exact GEMMs; what was skipped goes back through a rank-1 model. The
host reads each chunk's kept-column count to size the GEMMs, so the next chunk's kernel is
queued first (the look-ahead) and W takes two slots. Whether anything may skip at all is read
after the first chunk's kernel is queued; when nothing may, the rest runs as exact.

batch_invariant (Route's): fixed chunks (plan.invariant_chunk_plan), every W in the tail's
buffer, dE's products by a Triton GEMM with pinned tiles (kernels/gemm_rows.py): each row's
sums do not depend on the other rows.

Memory: dE, dC, dbias, the fp32 dE accumulator (N x D), O(N + V) fp32 vectors, and the tail's
buffer when dE's is too narrow. Nothing N x V.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from own_kernel.kernels.finalize_de import finalize_de
from own_kernel.kernels.gather_kept import gather_kept
from own_kernel.kernels.gemm_rows import addmm_rows
from own_kernel.kernels.gemm import (HostScalar, addmm_fp32, mm_fp32, mm_scaled, sampled_mean,
                                     weighted_mean)
from own_kernel.kernels.rank1_dc import rank1_dc
from own_kernel.kernels.rows import Rows, Sums
from own_kernel.paths.shared import zeros_or_none
from own_kernel.paths.writers import writers_of
from own_kernel.policy.config import Config
from own_kernel.policy.options import FilterOptions, Options
from own_kernel.policy.plan import Chunk, w_slots, x_and_w_slots
from own_kernel.policy.route import Route, rows_gemm_reads_tma


@dataclass
class Grads:
    """What the chunks write and accumulate into."""
    dc: torch.Tensor                  # (V, D), input dtype; its unwritten rows hold W
    de32: torch.Tensor                # (N, D) fp32
    sums: Sums
    row_scale: torch.Tensor | None    # per-row scaled W (normalise_weights), else None


# ---- weights ------------------------------------------------------------------------------

def normalise_weights(e, rows: Rows, filtering: bool, uniform: bool, invariant: bool = False):
    """(rows with weights rescaled, scale_dev, row_scale). The weights are divided by their
    largest magnitude scale_dev (a device scalar) for fp16 inputs or a filtered call; else
    unchanged, scale_dev None. fp16 needs it (a mean over N tokens would push W into
    subnormals), and the filter's eps is relative to it.

    Exact fp16 calls whose weights differ from row to row (uniform False: reduction "none", an
    lse gradient) divide each row by its own largest weight instead: by the call's largest, a
    row weighted 1e-4 beside one weighted 1e4 underflows to 0 in fp16. row_scale[n] is then
    that row's scale over scale_dev (else None): it multiplies the row's dE (finalize_de.py)
    and its W row before dC's GEMM (rescale_rows), where a tiny row's share of dC may underflow
    without harm (it is below dC's rounding).

    invariant (batch_invariant): every fp16 row by its own scale, and the call's scale rounded
    up to a power of 2, by which dividing and multiplying back are exact: a row's W and dE do
    not depend on the other rows' weights."""
    if e.dtype != torch.float16 and not filtering:
        return rows, None, None
    row_abs = row_magnitude(rows)
    scale_dev = row_abs.max()
    if invariant:
        uniform = False
        scale_dev = torch.where(scale_dev > 0, torch.exp2(torch.ceil(torch.log2(scale_dev))), 0.0)
    overall = torch.where(scale_dev > 0, scale_dev, 1.0)  # all weights 0: W = 0, gradients 0
    row_scale, divisor = None, overall
    if e.dtype == torch.float16 and not filtering and not uniform:
        divisor = torch.where(row_abs > 0, row_abs, 1.0)
        row_scale = divisor / overall
    weight_lse = rows.weight_lse / divisor if rows.weight_lse is not None else None
    weight_ent = rows.weight_ent / divisor if rows.weight_ent is not None else None
    return dataclasses.replace(rows, weight=rows.weight / divisor, weight_lse=weight_lse,
                               weight_ent=weight_ent), scale_dev, row_scale


def row_magnitude(rows: Rows) -> torch.Tensor:
    """Each row's largest weight: max(|w_n|, |w_n + w'_n|, |w_H,n|), the scale of its softmax
    gradient (the entropy's terms stay small: z - mu = ln p + H, so |p (z - mu)| <= 1/e + H)."""
    mag = rows.weight.abs()
    if rows.weight_lse is not None:
        mag = torch.maximum(mag, (rows.weight + rows.weight_lse).abs())
    if rows.weight_ent is not None:
        mag = torch.maximum(mag, rows.weight_ent.abs())
    return mag


def rescale_rows(g: Grads, w: torch.Tensor, v_start: int) -> None:
    """A per-row scaled W's rows times row_scale, as dC's GEMM needs them (normalise_weights).
    The column sums the epilogue took of the unscaled rows no longer describe W: dbias's are
    taken again, the rounding ones dropped."""
    w.mul_(g.row_scale[:, None])
    width = w.shape[1]
    torch.sum(w, dim=0, dtype=torch.float32, out=g.sums.col_sum[v_start:v_start + width])
    g.sums.col_round[v_start:v_start + width] = 0


# ---- the filter's decision ----------------------------------------------------------------

class FilterDecision:
    """Whether this call's filter skips anything, from three reductions read on the host: the
    scale of the row weights, how many rows may skip (peaked), how many never do (flat). The
    read is queued when this is made and waited for after the first chunk's kernel is queued,
    so the GPU never idles on it. Used as the scale (float) once resolved."""

    def __init__(self, scale_dev, peaked, row_eps, cfg: Config):
        self.is_flat = row_eps == 0
        self.values = HostScalar(torch.stack([scale_dev, peaked.sum().float(),
                                              self.is_flat.sum().float()]))
        self.max_flat = cfg.filter.max_flat
        self.flat = self.skips = None

    def resolve(self) -> bool:
        """Whether any column may be skipped; sets .flat, the rows that never skip."""
        if self.skips is None:
            self.values.wait()
            self.scale, num_peaked, num_flat = self.values.host.tolist()
            # No peaked row: nothing may skip. Too many flat rows keep every column: column
            # skipping would skip nothing.
            n = self.is_flat.shape[0]
            self.skips = num_peaked > 0 and num_flat <= self.max_flat * n
            if self.skips:
                self.flat = torch.nonzero_static(self.is_flat, size=int(num_flat)).squeeze(1)
        return self.skips

    def __float__(self) -> float:
        self.resolve()
        return self.scale


def filter_rows(rows: Rows, p_max, options: FilterOptions, scale_dev, cfg) -> tuple:
    """(rows with their eps, FilterDecision). Rows with no gradient never keep anything (eps
    inf); rows with a flat softmax keep everything (eps 0); the rest skip entries below eps
    times their weight (1 for every used row of a mean or sum)."""
    active = rows.weight != 0
    if rows.weight_lse is not None:
        active |= rows.weight_lse != 0
    row_rel = row_magnitude(rows)
    peaked = active & (p_max >= options.min_p_max)
    eps = torch.where(peaked, options.eps * row_rel, torch.where(active, 0.0, float("inf")))
    return dataclasses.replace(rows, eps=eps), FilterDecision(scale_dev, peaked, eps, cfg)


# ---- writing W ----------------------------------------------------------------------------

class ChunkWriter:
    """Writes each chunk's W where the plan puts it (dC's unwritten rows, or the tail's
    buffer), by the route's writers, and runs its dense GEMMs."""

    def __init__(self, e, c, bias, rows, g, opts: Options, route: Route, tail_work):
        self.e, self.c, self.bias, self.rows, self.g = e, c, bias, rows, g
        self.route, self.cfg, self.tail_work = route, route.cfg, tail_work
        self.in_dc, self.in_tail = writers_of(route, e, c, bias, opts)
        self.dc_bytes = g.dc.view(-1).view(torch.uint8)
        self.slots: dict[int, int] = {}

    def place(self, chunks: list[Chunk], lookahead: bool) -> None:
        """The tma route's W slots for these chunks (plan.w_slots)."""
        in_dc = [ch for ch in chunks if not ch.in_tail]
        starts = w_slots([ch.width for ch in in_dc], self.dc_bytes.numel(), self.e.shape[0],
                         self.e.element_size(), lookahead)
        self.slots.update({ch.v_start: s for ch, s in zip(in_dc, starts)})

    def write(self, ch: Chunk, filters: bool = False, kept_count=None,
              before_w=None) -> torch.Tensor:
        """Launch the kernels that write ch's W; returns W. before_w (cuBLAS route): called
        between the logits GEMM and the kernel that writes W over the previous chunk's."""
        e, n, elt = self.e, self.e.shape[0], self.e.element_size()
        args = (self.rows, self.g.sums, ch.v_start)
        if ch.in_tail:
            if self.tail_work is None:  # a re-planned rest can reach a tail the first plan had not
                self.tail_work = _tail_work(e, self.route)
            w = self.tail_work[:, :ch.width]
            self.in_tail.write(w, *args)
        elif self.route.w_by_tma:
            at = self.slots[ch.v_start]
            w = self.dc_bytes[at:at + elt * n * ch.width].view(e.dtype).view(n, ch.width)
            self.in_dc.write(w, *args, filters=filters)
        else:
            w_at, x_at, end = x_and_w_slots(self.dc_bytes.numel(), n, ch.width, elt)
            x = self.dc_bytes[x_at:end].view(torch.float32).view(n, ch.width)
            w = self.dc_bytes[w_at:w_at + elt * n * ch.width].view(e.dtype).view(n, ch.width)
            self.in_dc.write(w, *args, x=x, filters=filters, kept_count=kept_count,
                             before_w=before_w)
        return w

    def dense_gemms(self, ch: Chunk, w: torch.Tensor, scale) -> None:
        g = self.g
        c_rows = self.c[ch.v_start:ch.v_start + ch.width]
        if self.route.call.batch_invariant:  # each row's sums independent of the other rows
            rows_gemm = self.cfg.rows_gemm
            addmm_rows(g.de32, w, c_rows, rows_gemm, rows_gemm_reads_tma(rows_gemm, w, c_rows))
        else:
            addmm_fp32(g.de32, w, c_rows)
        if g.row_scale is not None:
            rescale_rows(g, w, ch.v_start)
        mm_scaled(g.dc[ch.v_start:ch.v_start + ch.width], w.t(), self.e, float(scale))


def exact_chunks(writer: ChunkWriter, plan: list[Chunk], scale) -> None:
    """Each chunk's GEMMs right after its W: one W slot, so chunks are as wide as dC allows."""
    writer.place(plan, lookahead=False)
    for ch in plan:
        writer.dense_gemms(ch, writer.write(ch), scale)


@dataclass
class _Written:
    """A chunk whose W is written and whose GEMMs are not yet queued."""
    chunk: Chunk
    w: torch.Tensor
    num_kept: object = None   # its kept-column count: a pinned host copy, or a CPU tensor
    copied: object = None     # the CUDA event after that copy


class FilteredRun:
    """The filtered chunks. On the tma route chunk k+1's kernel is queued before chunk k's
    GEMMs (the look-ahead, up to filter.lookahead_max_n tokens), so the GPU keeps working while
    the host waits for chunk k's kept-column count; on the cuBLAS route chunk k+1's logits GEMM
    is (its W takes chunk k's place, plan.x_and_w_slots). The tail does not filter, nor do chunks
    whose dense GEMMs cost less than the host's wait (filter.min_flops)."""

    def __init__(self, writer: ChunkWriter, decision: FilterDecision, scale):
        self.writer, self.decision, self.scale = writer, decision, scale
        e = writer.e
        self.tma = writer.route.w_by_tma
        self.lookahead = writer.route.lookahead
        self.pinned = ([torch.empty(1, dtype=torch.int32, pin_memory=True) for _ in range(2)]
                       if e.is_cuda else None)
        self.pending: _Written | None = None

    def run(self, plan: list[Chunk], replan) -> bool:
        """Whether the filter ran (False: nothing could skip; replan(v) then gives the rest of
        the vocabulary's chunks for an exact call, which runs here)."""
        sums, route = self.writer.g.sums, self.writer.route
        self.writer.place(plan, self.lookahead)
        for i, ch in enumerate(plan):
            if ch.in_tail:
                self.flush()  # the tail's W shares one buffer
            filters = route.chunk_filters(ch)
            before_w = None if self.tma else self.flush
            w = self.writer.write(ch, filters, sums.kept_count[i:i + 1], before_w=before_w)
            done = _Written(ch, w)
            if filters:
                self._count_to_host(done, i)
            if i == 0 and not self.decision.resolve():
                self.writer.dense_gemms(ch, w, self.scale)
                exact_chunks(self.writer, replan(ch.v_start + ch.width), self.scale)
                return False
            if self.tma:
                self.flush()
            self.pending = done
            if not self.lookahead or ch.in_tail:
                self.flush()
        self.flush()
        return True

    def flush(self) -> None:
        if self.pending is not None:
            self._gemms(self.pending)
            self.pending = None

    def _count_to_host(self, done: _Written, i: int) -> None:
        """Queue the copy of chunk i's kept-column count to the host (a pinned buffer per
        look-ahead slot; on the CPU it is read directly)."""
        sums, ch = self.writer.g.sums, done.chunk
        if self.tma:  # softmax_grad.py counts as it goes; dlogits_tma.py marks columns only
            torch.sum(sums.col_keep[ch.v_start:ch.v_start + ch.width], dim=0, keepdim=True,
                      dtype=torch.int32, out=sums.kept_count[i:i + 1])
        done.num_kept = sums.kept_count[i]
        if self.pinned is not None:
            host = self.pinned[i % 2]
            host.copy_(sums.kept_count[i:i + 1], non_blocking=True)
            done.num_kept, done.copied = host, torch.cuda.Event()
            done.copied.record()

    def _gemms(self, done: _Written) -> None:
        """A chunk's GEMMs: dense, or on the kept columns only."""
        writer, ch, cfg = self.writer, done.chunk, self.writer.cfg
        if done.num_kept is None:
            writer.dense_gemms(ch, done.w, self.scale)
            return
        if done.copied is not None:
            done.copied.synchronize()
        num_kept = int(done.num_kept.item())
        sums = writer.g.sums
        col_keep = sums.col_keep[ch.v_start:ch.v_start + ch.width]
        if num_kept <= cfg.filter.max_kept * ch.width:
            # Padded (with column 0, zeroed in W's copy): an unaligned count sends cuBLAS to
            # its pre-Hopper kernels, and every new count costs a heuristics query on the host.
            size = min(ch.width, -(-num_kept // cfg.filter.kept_align) * cfg.filter.kept_align)
            kept = torch.nonzero_static(col_keep, size=size, fill_value=0).squeeze(1)
            sparse_gemms(writer, done, kept, num_kept, self.decision.flat, self.scale)
            return
        # Dense after all: take back the row sums the kernel added to row_skip for the rows
        # that may skip (not the flat ones).
        col_keep.fill_(1)
        row_sums = done.w.sum(dim=1, dtype=torch.float32)
        if self.decision.flat.numel():
            row_sums.index_fill_(0, self.decision.flat, 0.0)
        sums.row_skip -= row_sums
        writer.dense_gemms(ch, done.w, self.scale)


def sparse_gemms(writer: ChunkWriter, done: _Written, kept, num_kept, flat, scale) -> None:
    """GEMMs on the kept columns of W only (kept[:num_kept]; the rest of kept is padding). The
    skipped columns' dC rows stay zero here; the rank-1 model of what they skipped is added at
    the end. Rows that may not skip (flat) get their own exact GEMMs over every column."""
    e, g, ch, w = writer.e, writer.g, done.chunk, done.w
    c_chunk = writer.c[ch.v_start:ch.v_start + ch.width]
    dc_chunk = g.dc[ch.v_start:ch.v_start + ch.width]
    # W's kept columns, zero in the padding and the flat rows; their share comes off row_skip.
    wk = gather_kept(w, kept, num_kept, writer.rows.eps, g.sums.row_skip)
    dc_chunk.zero_()
    if num_kept:
        addmm_fp32(g.de32, wk, c_chunk.index_select(0, kept))
        dc_kept = torch.empty((kept.numel(), e.shape[1]), device=e.device, dtype=e.dtype)
        mm_scaled(dc_kept, wk.t(), e, float(scale))
        dc_chunk.index_copy_(0, kept[:num_kept], dc_kept[:num_kept])
    if flat.numel():
        wf = w.index_select(0, flat)
        de_flat = torch.empty((flat.numel(), e.shape[1]), device=e.device, dtype=torch.float32)
        mm_fp32(wf, c_chunk, de_flat)
        g.de32.index_add_(0, flat, de_flat)
        mm_scaled(dc_chunk, wf.t(), e.index_select(0, flat), float(scale), accumulate=True)


# ---- the whole backward -------------------------------------------------------------------

def backward(e, c, bias, rows: Rows, opts: Options, route: Route, *, p_max=None, uniform=True,
             de_out=None, de_dtype=None):
    """Gradients (dE, dC, dbias or None) of sum_n w_n loss_n + w'_n lse_n (rows.weight,
    rows.weight_lse; w_n already 0 on ignored rows), by the route's writers, chunks and filter
    (needs p_max, the rows' largest probability). route: of these rows (Route.for_rows where
    they were gathered). uniform: every row with a gradient has the same weight (a mean or sum;
    see normalise_weights). de_out: an (N, D) buffer dE may be written into, e.g. e itself when
    the caller no longer needs it (e is not read after the chunks). de_dtype: dE's dtype (None:
    e's; torch.float32 keeps a partial dE unrounded for a sum across ranks,
    paths/vocab_parallel.py)."""
    (n, d), v = e.shape, c.shape[0]
    if n == 0:
        return torch.zeros_like(e, dtype=de_dtype), torch.zeros_like(c), zeros_or_none(bias)
    cfg = route.cfg
    filter_options = route.backward_filter(uniform)
    rows, scale_dev, row_scale = normalise_weights(e, rows, filter_options is not None, uniform,
                                                   route.call.batch_invariant)
    decision = None
    if filter_options is not None:
        rows, decision = filter_rows(rows, p_max, filter_options, scale_dev, cfg)
    if decision is not None:
        scale = decision
    else:
        scale = HostScalar(scale_dev) if scale_dev is not None else HostScalar(value=1.0)
    # The sampled means first: their fp32 temporaries must not add to the peak that dC and
    # the dE accumulator make together.
    e_mean, c_mean = sampled_mean(e), sampled_mean(c)
    plan = route.vocab_chunks(filtered=decision is not None)
    g = Grads(dc=torch.empty((v, d), device=e.device, dtype=e.dtype),
              de32=torch.zeros((n, d), device=e.device, dtype=torch.float32),
              sums=Sums.zeros(n, v, e.device, len(plan) if decision else None),
              row_scale=row_scale)
    de, tail_work = _tail_buffers(e, route, g)
    writer = ChunkWriter(e, c, bias, rows, g, opts, route, tail_work)
    filtered = False
    if decision is None:
        exact_chunks(writer, plan, scale)
    else:  # the rest, where nothing can skip, as an exact call would run it: wider chunks
        filtered = FilteredRun(writer, decision, scale).run(plan, route.exact_chunks_from)
    writer.tail_work = tail_work = None  # freed before dE's buffer is made (the peak)
    if de_dtype not in (None, e.dtype):  # neither the tail's buffer nor de_out: another dtype
        de = de_out = torch.empty((n, d), device=e.device, dtype=de_dtype)
    return _assemble(writer, scale, filtered, (e_mean, c_mean), de if de is not None else de_out)


def _tail_buffers(e, route: Route, g):
    """(dE's output buffer or None, the tail's W buffer or None): the tail works in dE's buffer
    when that is wide enough (Route.tail: plan.tail_width); else its own buffer is made when a
    tail chunk first needs it (_tail_work)."""
    n, d = e.shape
    tail = route.tail
    de = work = None
    if tail.in_de:
        de = torch.empty((n, d), device=e.device, dtype=e.dtype)
        work = de.view(-1)[: n * tail.width].view(n, tail.width)
    if route.cfg.poison:  # every read of these must follow a write (tests)
        g.dc.fill_(float("nan"))
        if work is not None:
            work.fill_(float("nan"))
    return de, work


def _tail_work(e, route: Route):
    """The tail's own W buffer (N x its chunk width)."""
    work = torch.empty((e.shape[0], route.tail.width), device=e.device, dtype=e.dtype)
    if route.cfg.poison:
        work.fill_(float("nan"))
    return work


def _assemble(writer: ChunkWriter, scale, filtered: bool, means, de):
    """dE from its accumulator, dC's and dbias's corrections: what rounding W removed (through
    the mean rows of C and E) and, filtered, the skipped columns' rank-1 model."""
    e, c, g, cfg = writer.e, writer.c, writer.g, writer.cfg
    e_mean, c_mean = means
    sums = g.sums
    dbias = zeros_or_none(writer.bias)
    scale_f = float(scale)
    if scale_f == 0.0 or not math.isfinite(scale_f):
        return torch.zeros_like(e, dtype=de.dtype if de is not None else None), \
            torch.zeros_like(c), dbias
    skipped = e_skip_mean = c_skip_mean = None
    if filtered:
        skipped = torch.where(sums.col_keep > 0, 0.0, sums.col_wsum)  # per skipped column
        e_skip_mean = weighted_mean(sums.row_skip, e)
        c_skip_mean = weighted_mean(skipped, c)
    if de is None:
        de = torch.empty_like(e)
    finalize_de(g.de32, sums.row_round, c_mean, de, scale_f,
                row_skip=sums.row_skip if filtered else None, c_skip_mean=c_skip_mean,
                row_scale=g.row_scale)
    if writer.route.col_round_summed:
        rank1_dc(g.dc, sums.col_round, e_mean, scale_f, a2=skipped, x2=e_skip_mean)
    elif filtered:
        rank1_dc(g.dc, skipped, e_skip_mean, scale_f)
    if dbias is not None:
        dbias.copy_(sums.col_sum * scale_f)
    return de, g.dc, dbias
