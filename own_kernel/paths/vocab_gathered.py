"""Vocab-parallel by gathered partials: each rank runs the forward's partials pass on its shard
(paths/forward.forward_parts: per row, each vocabulary split's running max, sum and, as asked,
the sum of logits and the entropy's t), the ranks all-gather them, and every rank merges all
splits in global column order with the single-GPU combine (kernels/lse_combine.py). The target
logit comes from the rank that owns it (an all-reduce SUM of one value and zeros: exact).

Used where a call asks for what the lse-only combine of paths/vocab_parallel.py cannot give:
``return_entropy`` (the entropy needs the third partial), ``temperature`` and
``batch_invariant``. Under ``batch_invariant`` the partials are per fixed block of
plan.invariant_block columns, each computed whole on the rank where it starts (the rows of a
block that runs past that rank's shard are borrowed from the next ranks: one all_gather of
every rank's first block - 1 rows, only where some boundary is off the blocks). The gathered
partials are then the single-GPU call's, bit for bit, so the forward's rows (loss, lse,
entropy, ...) are the same for any number of ranks and any split of the vocabulary.

Backward: as paths/vocab_parallel.py's (the shard's backward with the global rows, its partial
dE in fp32 all-reduced, label smoothing's target term), with the entropy's gradient. dE is a
sum over the ranks' partials, so its bits depend on the number of ranks (not batch-invariant
across K); on one K it is batch-invariant where batch_invariant is set.

Collectives per call: an all_gather of each rank's (start, splits, targets' checksum), an
all_gather of the partials (planes x splits x N fp32 per rank), an all-reduce SUM of the
target logits (N fp32); backward: the all-reduce of dE (N x D fp32).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from own_kernel.kernels.lse_combine import PartialSums, combine
from own_kernel.kernels.target import target_logit
from own_kernel.paths.entries import rows_backward
from own_kernel.paths.forward import forward_parts
from own_kernel.paths.shared import refuse_create_graph
from own_kernel.policy.plan import invariant_block


def block_range(start: int, stop: int, v_total: int, block: int) -> tuple[int, int]:
    """batch_invariant: the columns [begin, end) of a shard [start, stop)'s partials, the
    blocks of `block` columns whose first column is on the shard (none: begin == end)."""
    begin = -(-start // block) * block
    if begin >= stop:
        return begin, begin
    return begin, min(-(-stop // block) * block, v_total)


def _block_shard(c, bias, call, device):
    """batch_invariant: (c, bias) rows [begin, end) of block_range for this rank. A block that
    starts on this shard and ends on later ones is read whole here: every rank's first
    block - 1 rows (and bias entries) are all-gathered, where some boundary is off the
    blocks, and the rows past this shard's stop taken from the ranks after it."""
    vp, block = call.vp, invariant_block(call.route.cfg)
    bounds = vp.bounds(device)
    begin, end = block_range(vp.start, vp.stop, call.v_total, block)
    rows, entries = c[max(0, begin - vp.start):], None if bias is None else bias[begin - vp.start:]
    if all(a % block == 0 for a, _ in bounds):
        return rows, entries  # every block on one rank: nothing to borrow
    head = block - 1
    heads = _gathered_heads(c, head, vp)
    heads_b = None if bias is None else _gathered_heads(bias, head, vp)
    need = max(0, end - max(vp.stop, begin))
    if need == 0:
        return rows, entries
    # the ranks after this one, in column order (bounds and heads are by group rank)
    later = sorted((a, r) for r, (a, _) in enumerate(bounds) if a >= vp.stop)
    take = [(r, min(head, bounds[r][1] - bounds[r][0])) for _, r in later]
    rows = torch.cat([rows, torch.cat([heads[r][:k] for r, k in take])[:need]])
    if heads_b is not None:
        entries = torch.cat([entries, torch.cat([heads_b[r][:k] for r, k in take])[:need]])
    return rows, entries


def _gathered_heads(x, head: int, vp) -> list:
    """Every rank's first ``head`` rows of x (its c or bias shard; zeros past a shorter
    shard), by group rank: one all_gather."""
    mine = x.new_zeros((head, *x.shape[1:]))
    mine[:min(head, vp.size)] = x[:head]
    heads = [torch.empty_like(mine) for _ in range(dist.get_world_size(vp.group))]
    dist.all_gather(heads, mine, group=vp.group)
    return heads


def _gather_partials(part, call, checksum):
    """Every rank's partials, concatenated in global column order (sorted by shard start);
    raises if the ranks' targets differ."""
    vp, n = call.vp, part.shape[2]
    group = vp.group
    world = dist.get_world_size(group)
    meta = torch.tensor([vp.start, part.shape[1], int(checksum)], dtype=torch.int64,
                        device=part.device)
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta, group=group)
    metas = [m.tolist() for m in metas]
    if len({m[2] for m in metas}) > 1:
        raise ValueError("targets: differ between the ranks of vocab_parallel's group (every "
                         "rank must pass the same targets and e)")
    most = max(m[1] for m in metas)
    padded = part.new_zeros((part.shape[0], most, n))
    padded[:, :part.shape[1]] = part
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    order = sorted(range(world), key=lambda r: metas[r][0])
    return torch.cat([gathered[r][:, :metas[r][1]] for r in order], dim=1).contiguous()


def _partials(e, c, bias, t_local, call, skip):
    """(part, z_target, sums) of this rank (forward.forward_parts); batch_invariant: over
    _block_shard's columns, the target logits over the shard's own."""
    if not call.opts.batch_invariant:
        return forward_parts(e, c, bias, t_local, call.opts, call.route, skip_ignored=skip)
    rows, entries = _block_shard(c, bias, call, e.device)
    opts = call.opts
    z_t = target_logit(e, c, bias, t_local, opts.softcap, opts.temperature)
    if rows.shape[0] == 0:  # no block starts on this shard
        sums = PartialSums(opts.label_smoothing > 0, opts.entropy, float(opts.temperature))
        return e.new_empty((sums.planes, 0, e.shape[0]), dtype=torch.float32), z_t, sums
    part, _, sums = forward_parts(e, rows, entries, t_local, opts, call.route, skip_ignored=skip)
    return part, z_t, sums


class GatheredRows(torch.autograd.Function):
    """(loss, lse, entropy) per row of the gathered problem; call: vocab_parallel._Call."""

    @staticmethod
    def forward(ctx, e, c, t_local, bias, call, checksum):
        skip = not call.ignored_lse
        part, z_t, sums = _partials(e, c, bias, t_local, call, skip)
        full = _gather_partials(part, call, checksum)
        dist.all_reduce(z_t, op=dist.ReduceOp.SUM, group=call.vp.group)
        loss, lse, p_max, nll, lse_lo, ent = combine(
            full, z_t, t_local, call.opts.ignore_index, call.smooth, call.v_total, skip, sums)
        z_own = torch.where(t_local >= 0, z_t, 0.0)
        ctx.save_for_backward(e, c, t_local, bias, lse, nll, p_max, lse_lo, ent, z_own)
        ctx.call = call
        ctx.set_materialize_grads(False)
        return loss, lse, ent

    @staticmethod
    def backward(ctx, grad_loss, grad_lse, grad_ent):
        refuse_create_graph()
        e, c, t_local, bias, lse, nll, p_max, lse_lo, ent, z_own = ctx.saved_tensors
        call = ctx.call
        if grad_loss is None:
            grad_loss = torch.zeros_like(lse)
        if ent.numel() == 0:
            grad_ent = None
        num_used = None if call.counts is None else int(call.counts.values()[1])
        de, dc, dbias = rows_backward(e, c, t_local, bias, (lse, nll, p_max, lse_lo, ent),
                                      grad_loss, grad_lse, call.opts, call.route,
                                      num_used=num_used, de_dtype=torch.float32,
                                      grad_ent=grad_ent)
        if call.smooth and call.vp.size < call.v_total:
            from own_kernel.paths.vocab_parallel import _add_smoothing_target_term
            _add_smoothing_target_term(e, c, t_local, grad_loss, z_own, call, (de, dc, dbias))
        if ctx.needs_input_grad[0]:
            de = de.contiguous()
            dist.all_reduce(de, op=dist.ReduceOp.SUM, group=call.vp.group)
        return de.to(e.dtype), dc, None, dbias if bias is not None else None, None, None


def gathered_rows(e, c, t_local, bias, call, checksum):
    """(loss, lse, entropy or empty) per row (GatheredRows)."""
    return GatheredRows.apply(e, c, t_local, bias, call, checksum)
