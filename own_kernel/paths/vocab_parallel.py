"""Vocab-parallel CCE over torch.distributed: each rank holds columns [start, stop) of the
vocabulary (its shard of C, and of the bias) and the full E and targets, replicated.

    loss = linear_cross_entropy(e, c_shard, targets,
                                vocab_parallel=VocabParallel(group, start, stop))

Every rank returns the same loss (and lse): that of the gathered problem. After backward each
rank holds dE for the whole problem (all-reduced), and dC / dbias for its own shard only.

How it works
------------
Forward: each rank runs the single-GPU forward (entries.rows_forward) on its shard, with its
targets mapped to shard-local columns: a target on another rank's shard becomes -2, an ignored
one -1 (the local ignore_index: a user ignore_index that is a valid column on one rank, e.g. 0,
cannot then be confused with a shard-local column 0). Neither matches any column, so the shard
contributes no target logit for them, and the public API checks the targets against the global
vocabulary, so they are no error. That gives per row and rank r the shard's lse_r, largest
probability, nll_r (on the rank owning the target: the kernel's own -log p_t within the shard)
and, with label smoothing, lse_r - mean of the shard's logits (the shard's forward run with
smoothing 1 returns exactly that as its loss). The ranks then combine these N-vectors, with o
the rank owning the row's target:

    M      = max_r lse_r                                      (the all-reduce MAX)
    T_own  = exp(lse_o - M),  T_rest = sum over r != o of exp(lse_r - M),  nll_o, lse_o,
    and sum_r (V_r / V)(lse_r - mean_r z)                     (the all-reduce SUM)
    lse    = M + log(T_own + T_rest)
    nll    = nll_o + (lse - lse_o),  lse - lse_o = log1p(T_rest / T_own) where T_own > 1/2,
                                                   M - lse_o + log(T_own + T_rest) elsewhere
    loss   = (1 - ls) nll + max(ls (lse - mean z), 0),  mean z = sum_r (V_r / V) mean_r z

Why nll this way (lse_combine.py's confident rows): on a confident row (p_t near 1) lse and z_t
agree to ~1e-7 relative, so lse - z_t is all rounding. Here nll_o is the kernel's own nll on the
owning shard, which is ln(S_o) on such rows (exact, >= 0), and the rest of the vocabulary adds
log1p(T_rest / T_own): the owner's lse is then the largest (p_t > 1/2 puts more than half the
mass on its shard), so T_own is exactly 1 and the log1p of a small, accurately computed ratio
adds no cancellation. The result is >= 0 and as accurate as the single-GPU kernel's ln(S)
(slightly better: ln(1 + x) in fp32 rounds x away below 6e-8, log1p does not). Where T_own <= 1/2
the difference lse - lse_o >= ln 2 is a sum of non-negative terms, M - lse_o + log(T_own +
T_rest), with no cancellation either. The largest probability (the filter's flatness test) is
exp(max_r max-logit_r - lse), the shards' max logits riding in the MAX all-reduce.

Backward: each rank runs the single-GPU backward (paths/entries.rows_backward) on its shard with the
*global* lse, nll and largest probability: its softmax is then the global one restricted to its
columns, the target column matches only on the owning rank (which takes p_t - 1 from the global
nll), and it returns its dC and dbias shard and a partial dE, which is all-reduced (SUM). Label
smoothing's uniform term is ls / V per column with the global V, while the kernels divide by
the shard's V_r: the shard's backward runs with ls' = ls V_r / V (right on every column), and the
target column, where the kernel adds ls' (1 - 1/V_r) instead of ls (1 - 1/V), gets the
difference w ls (1 - V_r / V) softcap'(z_t) added on the owning rank: one row of C per token
into dE, one row of E per token into dC (index_put_ with accumulate, deterministic), O(N D).

Collectives per call (on `group`):
- forward: 2 all-reduces of fp32 vectors: MAX over 2N + 2 floats (each row's shard lse and
  shard max logit; a checksum of the targets and its negative, so that ranks given different
  targets raise instead of returning a wrong loss), then SUM over 4N floats (5N with label
  smoothing). The checksum's verdict is read on the host: the call returns once the forward's
  collectives are done (the host does not run ahead into the backward's queue).
- backward: 1 all-reduce SUM of dE (N x D, fp32: each rank's partial dE unrounded, the sum
  rounded once to the input dtype). Nothing N x V is communicated.
- once per VocabParallel object (its first call): an all_gather of each rank's (start, stop),
  checked to tile [0, V) exactly; V is cached on the object, so make it once and reuse it.

return_entropy, temperature and batch_invariant gather the shards' partials instead
(paths/vocab_gathered.py). Options: softcap, a bias shard, ignore_index, label smoothing, every
reduction, return_lse, shift, low_memory and filter_eps (each rank filters its own shard, with the global largest
probability) all work. It runs eagerly: under torch.compile the call is a graph break (its
collectives and host reads are not traced), and fullgraph=True refuses it, naming vocab_parallel
in the reason (EAGER_ONLY). A traced caller skips the API's targets' check; this path then
checks the targets itself. Each rank's partial dE stays in fp32 (paths/recompute.py's accumulator,
finalized without rounding) through the SUM, and label smoothing's target term is added to those
fp32 rows: the hidden states' shared component cancels across the ranks' partials before dE is
rounded once. The backward runs with the forward's config (the route's, carried in _Call).

DTensors (a c sharded by vocabulary under ColwiseParallel, FSDP2): integrations/distributed.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from own_kernel.kernels import check_targets
from own_kernel.paths.entries import rows_backward, rows_forward
from own_kernel.paths.shared import refuse_create_graph
from own_kernel.paths.vocab_gathered import gathered_rows
from own_kernel.policy.options import Options
from own_kernel.policy.route import Route

# Under torch.compile the vocab-parallel call is a graph break (it runs eagerly); with
# fullgraph=True dynamo refuses it with this reason.
EAGER_ONLY = torch.compiler.disable(
    recursive=True, reason="vocab_parallel runs eagerly (collectives and host reads): a graph "
    "break under torch.compile, so not with fullgraph=True")

LOCAL_IGNORE = -1  # a row whose target is ignore_index, in shard-local targets
NOT_HERE = -2      # a row whose target is on another rank's shard


@dataclass(frozen=True)
class VocabParallel:
    """This rank's shard of the vocabulary, columns [start, stop), within the process group
    `group` (None: the default group). The shards of the group's ranks must tile [0, V)."""
    group: object
    start: int
    stop: int

    def __post_init__(self):
        for name in ("start", "stop"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"vocab_parallel: {name} must be an int; got {value!r}")
        if not 0 <= self.start < self.stop:
            raise ValueError(f"vocab_parallel: expected 0 <= start < stop; got start="
                             f"{self.start}, stop={self.stop}")

    @property
    def size(self) -> int:
        return self.stop - self.start

    @EAGER_ONLY
    def vocab_size(self, device) -> int:
        """The whole vocabulary's size V, from every rank's bounds (one all_gather, on the
        first call only), after checking that the shards tile [0, V)."""
        cached = self.__dict__.get("_vocab_size")
        if cached is None:
            cached = max(stop for _, stop in self.bounds(device))
            self.__dict__["_vocab_size"] = cached  # frozen: the fields, not this cache
        return cached

    @EAGER_ONLY
    def bounds(self, device) -> list[tuple[int, int]]:
        """Every rank's [start, stop), by its rank in the group (one all_gather, on the first
        call only), after checking that they tile [0, V)."""
        cached = self.__dict__.get("_bounds")
        if cached is None:
            cached = _gathered_bounds(self, device)
            self.__dict__["_bounds"] = cached  # frozen: the fields, not this cache
        return cached


def _gathered_bounds(vp: VocabParallel, device) -> list[tuple[int, int]]:
    world = dist.get_world_size(vp.group)
    mine = torch.tensor([vp.start, vp.stop], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=vp.group)
    by_rank = [tuple(int(x) for x in b.tolist()) for b in every]
    bounds = sorted(by_rank)
    tiles = bounds[0][0] == 0 and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    if not tiles:
        raise ValueError(f"vocab_parallel: the ranks' shards {bounds} do not tile the "
                         f"vocabulary [0, V) (each column on exactly one rank)")
    return by_rank


def check_vocab_parallel(vp, c: Tensor) -> None:
    """Validate the vocab_parallel argument against c (the shard)."""
    if not isinstance(vp, VocabParallel):
        raise TypeError(f"vocab_parallel: expected None or a VocabParallel; got "
                        f"{type(vp).__name__}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("vocab_parallel: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    if c.shape[0] != vp.size:
        raise ValueError(f"vocab_parallel: the shard [{vp.start}, {vp.stop}) has {vp.size} "
                         f"rows, but c has {c.shape[0]}")


def with_known_vocab_size(vp: VocabParallel, v_total: int) -> VocabParallel:
    """vp with V given (a DTensor's global shape, whose shards tile [0, V) by construction):
    its calls skip the all_gather of the ranks' bounds."""
    vp.__dict__["_vocab_size"] = v_total  # frozen: the fields, not this cache
    return vp


# ---- the call ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Call:
    """One call's constants: the options of the shard's passes, the shard, the smoothing."""
    opts: Options        # the shard's backward (local ignore_index, ls V_r / V)
    vp: VocabParallel
    v_total: int
    smooth: float        # the caller's label smoothing
    ignored_lse: bool
    counts: object       # api's HostScalar of the targets' check and count, or None
    route: Route         # the call's, for the forward and the backward


def local_targets(targets: Tensor, vp: VocabParallel, ignore_index: int) -> Tensor:
    """Shard-local targets: t - start on this shard, NOT_HERE elsewhere, LOCAL_IGNORE if
    ignored (targets outside [0, V) become NOT_HERE: the API raises on them)."""
    here = (targets >= vp.start) & (targets < vp.stop)
    local = torch.where(here, targets - vp.start, NOT_HERE)
    return torch.where(targets == ignore_index, LOCAL_IGNORE, local)


@EAGER_ONLY
def vocab_parallel_rows(e, c, targets, bias, opts: Options, vp: VocabParallel, counts,
                        route: Route):
    """(loss per row, lse per row, entropy per row or None) of the gathered problem; e, c, targets, bias in the kernels'
    layouts (api.py), targets global. counts: api's targets' check and count (or None). route:
    the call's (policy/route.py: this rank's shard), kept for the backward."""
    v_total = vp.vocab_size(e.device)
    if counts is None and targets.numel():  # traced callers skip the API's check: not here
        counts, _ = check_targets.check_and_count_targets(targets, v_total, opts.ignore_index)
        if counts is not None and counts.values()[0]:
            raise ValueError(f"targets: a value outside [0, {v_total}) that is not "
                             f"ignore_index={opts.ignore_index}")
    local_opts = dataclasses.replace(
        opts, ignore_index=LOCAL_IGNORE,
        label_smoothing=opts.label_smoothing * vp.size / v_total)
    call = _Call(local_opts, vp, v_total, opts.label_smoothing, opts.ignored_lse, counts, route)
    t_local = local_targets(targets, vp, opts.ignore_index)
    if opts.batch_invariant or opts.entropy or opts.temperature != 1.0:
        # the entropy needs a third partial, the invariant mode one merge order: the shards'
        # partials gathered and merged as one GPU would (paths/vocab_gathered.py)
        return gathered_rows(e, c, t_local, bias, call, targets_checksum(targets))
    loss, lse, agree = _VocabParallelRows.apply(e, c, t_local, bias, call,
                                                targets_checksum(targets))
    if not bool(agree):
        raise ValueError("targets: differ between the ranks of vocab_parallel's group (every "
                         "rank must pass the same targets and e)")
    return loss, lse, None


def targets_checksum(targets: Tensor) -> Tensor:
    """A position-weighted checksum of the targets, < 2^23 (exact in fp32)."""
    pos = torch.arange(targets.numel(), device=targets.device) % 4093 + 1
    return (((targets % 8191) * pos).sum() % 8388593).float().reshape(1)


class _VocabParallelRows(torch.autograd.Function):

    @staticmethod
    def forward(ctx, e, c, t_local, bias, call: _Call, checksum):
        fwd_opts = dataclasses.replace(call.opts, label_smoothing=1.0 if call.smooth else 0.0)
        shard = rows_forward(e, c, t_local, bias, fwd_opts, call.route)
        loss, lse, nll, p_max, z_t, agree = combine_shards(shard, t_local, call, checksum)
        ctx.save_for_backward(e, c, t_local, bias, lse, nll, p_max, z_t)
        ctx.call = call
        ctx.mark_non_differentiable(agree)
        ctx.set_materialize_grads(False)
        return loss, lse, agree

    @staticmethod
    def backward(ctx, grad_loss, grad_lse, _grad_agree):
        refuse_create_graph()
        e, c, t_local, bias, lse, nll, p_max, z_t = ctx.saved_tensors
        call = ctx.call
        if grad_loss is None:
            grad_loss = torch.zeros_like(lse)
        num_used = None if call.counts is None else int(call.counts.values()[1])
        # The shard's partial dE in fp32: the ranks' partials cancel in their sum (a shard's
        # softmax gradient does not sum to 0 over its columns), so each is rounded only once
        # the sum is made.
        de, dc, dbias = rows_backward(e, c, t_local, bias, (lse, nll, p_max), grad_loss,
                                      grad_lse, call.opts, call.route, num_used=num_used,
                                      de_dtype=torch.float32)
        if call.smooth and call.vp.size < call.v_total:
            _add_smoothing_target_term(e, c, t_local, grad_loss, z_t, call, (de, dc, dbias))
        if ctx.needs_input_grad[0]:  # the same on every rank: they all call it, or none
            de = de.contiguous()
            dist.all_reduce(de, op=dist.ReduceOp.SUM, group=call.vp.group)
        return de.to(e.dtype), dc, None, dbias if bias is not None else None, None, None


def combine_shards(shard, t_local: Tensor, call: _Call, checksum: Tensor):
    """The gathered problem's (loss, lse, nll, p_max) per row from the shards' forwards (see
    the module docstring), plus this shard's target logit z_t (0 off the owner; for the
    backward's smoothing term) and whether every rank's targets' checksum agrees (a 0-d bool).
    Two all-reduces."""
    loss_r, lse_r, pmax_r, nll_r = shard[:4]
    n = lse_r.shape[0]
    owner = t_local >= 0
    used = t_local != LOCAL_IGNORE
    # Rows the shard's forward skipped (ignored, no lse asked for) hold +inf: finite stand-ins.
    lse_r = lse_r if call.ignored_lse else torch.where(used, lse_r, 0.0)
    max_logit_r = lse_r + torch.log(pmax_r)
    buf = torch.cat([lse_r, max_logit_r, checksum, -checksum])
    dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=call.vp.group)
    big_m, max_logit = buf[:n], buf[n:2 * n]
    agree = buf[2 * n] == -buf[2 * n + 1]
    term = torch.exp(lse_r - big_m)
    parts = [torch.where(owner, term, 0.0), torch.where(owner, 0.0, term),
             torch.where(owner, nll_r, 0.0), torch.where(owner, lse_r, 0.0)]
    if call.smooth:  # this shard's share of -mean_v z: (V_r / V)(loss_r - lse_r), loss_r at ls 1
        parts.append((loss_r - lse_r) * (call.vp.size / call.v_total))
    sums = torch.stack(parts)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=call.vp.group)
    t_own, t_rest, nll_own, lse_own = sums[:4]
    lse = big_m + torch.log(t_own + t_rest)
    gap = torch.where(t_own > 0.5, torch.log1p(t_rest / t_own),
                      (big_m - lse_own) + torch.log(t_own + t_rest))
    nll = nll_own + gap
    loss = (1.0 - call.smooth) * nll
    if call.smooth:
        loss = loss + torch.clamp(call.smooth * (lse + sums[4]), min=0.0)
    p_max = torch.exp(max_logit - lse)
    if not call.ignored_lse:  # as the single-GPU forward: ignored rows inert in the backward
        lse = torch.where(used, lse, float("inf"))
        p_max = torch.where(used, p_max, 0.0)
    z_t = torch.where(owner, lse_r - nll_r, 0.0)
    return torch.where(used, loss, 0.0), lse, nll, p_max, z_t, agree


def _add_smoothing_target_term(e, c, t_local, grad_loss, z_t, call: _Call, grads) -> None:
    """Add w ls (1 - V_r / V) softcap'(z_t) at each owned row's target column into dE, dC and
    dbias (the shard's kernels, run at ls V_r / V, leave it out; module docstring)."""
    de, dc, dbias = grads
    rows = torch.nonzero(t_local >= 0).squeeze(1)
    cols = t_local[rows]
    temperature = call.opts.temperature  # z = softcap(x) / T: dz/dx = softcap'(x) / T
    a = grad_loss.float().expand(t_local.shape[0])[rows] * (
        call.smooth * (1.0 - call.vp.size / call.v_total) / temperature)
    softcap = call.opts.softcap
    if softcap is not None:
        a = a * (1.0 - (z_t[rows] * temperature / softcap) ** 2)
    de.index_put_((rows,), (de[rows].float() + a[:, None] * c[cols].float()).to(de.dtype))
    dc.index_put_((cols,), (a[:, None] * e[rows].float()).to(dc.dtype), accumulate=True)
    if dbias is not None:
        dbias.index_put_((cols,), a.to(dbias.dtype), accumulate=True)
