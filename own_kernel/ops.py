"""The op: per-row losses of 2-D inputs and their gradients, as custom ops (what torch.compile
sees, opaque) and as a plain autograd Function (eager calls: the custom ops' dispatch costs the
host more per call, and small shapes wait for the host; results/notes/host-bound-calls.md).

The call's options travel as one typed object (Options) down to the custom ops' edge, whose
schema takes them as plain optional scalars.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from own_kernel.backward import backward, zeros_or_none
from own_kernel.backward_low_memory import backward_low_memory
from own_kernel.config import config_for
from own_kernel.forward import forward
from own_kernel.gemm import HostScalar
from own_kernel.options import Options
from own_kernel.plan import compaction_pays
from own_kernel.rows import Rows


# ---- the passes, on plain tensors -------------------------------------------------------------

def rows_forward(e, c, targets, bias, opts: Options, cfg=None):
    """(loss, lse, p_max, nll, lse_lo) per row (forward.py). cfg: the Config (None: this device's)."""
    cfg = cfg or config_for(e.device, e.dtype)
    return forward(e, c, bias, targets, opts.softcap, opts.label_smoothing, opts.ignore_index,
                   cfg, skip_ignored=not opts.ignored_lse)


def rows_backward(e, c, targets, bias, saved, grad_loss, grad_lse, opts: Options,
                  num_used=None, cfg=None):
    """(dE, dC, dbias or None). saved: the forward's (lse, nll, p_max[, lse_lo]). num_used: the number of
    targets that are not ignore_index when the host knows it already (else read here, when it
    matters). cfg: the Config the forward ran with (None: this device's now). Rows with no
    gradient are gathered out where that pays (plan.compaction_pays); low_memory runs on every
    row (gathering would cost more memory than its workspace; the forward's lse +inf keeps the
    ignored ones' W zero)."""
    lse, nll, p_max = saved[:3]
    lse_lo = saved[3] if len(saved) > 3 else None
    cfg = cfg or config_for(e.device, e.dtype)
    # Every row with a gradient weighted alike: autograd hands a mean's or sum's gradient over
    # as one value expanded (stride 0). Else (reduction "none", an lse gradient) fp16 scales
    # rows apart (backward.normalise_weights).
    uniform = grad_lse is None and (grad_loss.numel() <= 1 or grad_loss.stride(0) == 0)
    used = targets != opts.ignore_index
    # Fresh, unit-stride fp32 vectors whatever autograd hands over: the kernels index them.
    rows = Rows(targets, lse, nll, torch.where(used, grad_loss.float(), 0.0),
                grad_lse.float().contiguous() if grad_lse is not None else None, lse_lo=lse_lo)
    if opts.low_memory:
        return backward_low_memory(e, c, bias, rows, opts, cfg, uniform=uniform)
    gathered = _used_rows(e, c, used, grad_lse, num_used, cfg)
    if gathered is None:
        return backward(e, c, bias, rows, opts, cfg, p_max=p_max, uniform=uniform)
    if gathered.numel() == 0:
        return torch.zeros_like(e), torch.zeros_like(c), zeros_or_none(bias)
    e_used = e.index_select(0, gathered)
    used_rows = Rows(targets[gathered], lse[gathered], nll[gathered], rows.weight[gathered], None,
                     lse_lo=lse_lo[gathered] if lse_lo is not None else None)
    # dE's rows may go into the gathered E's buffer (it is not read after the chunks).
    de_used, dc, dbias = backward(e_used, c, bias, used_rows, opts, cfg, p_max=p_max[gathered],
                                  de_out=e_used, uniform=uniform)
    del e_used
    return torch.zeros_like(e).index_copy_(0, gathered, de_used), dc, dbias


def _used_rows(e, c, used, grad_lse, num_used, cfg):
    """The rows with a gradient, when the backward should run on them only (no host sync:
    nonzero_static's size is known), else None. An lse gradient reaches ignored rows too."""
    n = e.shape[0]
    if grad_lse is not None or n == 0:
        return None
    if num_used is None:
        num_used = int(used.sum())
    if not compaction_pays(n, num_used, c.shape[0], e.shape[1], e.element_size(), cfg):
        return None
    return torch.nonzero_static(used, size=num_used).squeeze(1)


# ---- custom ops (torch.compile) -------------------------------------------------------------

@torch.library.custom_op("own_kernel::lce_rows", mutates_args=())
def lce_rows(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], ignore_index: int,
             softcap: Optional[float], label_smoothing: float, filter_eps: Optional[float],
             filter_min_p_max: float, ignored_lse: bool, low_memory: bool,
             deterministic: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, lse, largest probability, -log p_target, lse's rounding residue) per row for 2-D
    e; ignored rows have loss 0, and lse +inf unless ignored_lse. The filter and low_memory only affect the
    backward."""
    opts = Options.from_op_args(ignore_index, softcap, label_smoothing, filter_eps,
                                filter_min_p_max, ignored_lse, low_memory, deterministic)
    return rows_forward(e, c, targets, bias, opts)


@lce_rows.register_fake
def _(e, c, targets, bias, *options):
    return tuple(e.new_empty(e.shape[0], dtype=torch.float32) for _ in range(5))


@torch.library.custom_op("own_kernel::lce_rows_backward", mutates_args=())
def lce_rows_backward(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], lse: Tensor,
                      nll: Tensor, p_max: Tensor, lse_lo: Tensor, grad_loss: Tensor,
                      grad_lse: Optional[Tensor],
                      ignore_index: int, softcap: Optional[float], label_smoothing: float,
                      filter_eps: Optional[float], filter_min_p_max: float, ignored_lse: bool,
                      low_memory: bool, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    opts = Options.from_op_args(ignore_index, softcap, label_smoothing, filter_eps,
                                filter_min_p_max, ignored_lse, low_memory, deterministic)
    de, dc, dbias = rows_backward(e, c, targets, bias, (lse, nll, p_max, lse_lo), grad_loss,
                                  grad_lse, opts)
    return de, dc, dbias if dbias is not None else e.new_empty(0)


@lce_rows_backward.register_fake
def _(e, c, targets, bias, *rest):
    return torch.empty_like(e), torch.empty_like(c), (
        torch.empty_like(bias) if bias is not None else e.new_empty(0))


def _setup_context(ctx, inputs, output):
    e, c, targets, bias = inputs[:4]
    ctx.save_for_backward(e, c, targets, bias, output[1], output[3], output[2], output[4])
    ctx.mark_non_differentiable(output[2], output[3], output[4])
    ctx.op_args = inputs[4:]


def _backward_rule(ctx, grad_loss, grad_lse, grad_p_max, grad_nll, grad_lse_lo):
    e, c, targets, bias, lse, nll, p_max, lse_lo = ctx.saved_tensors
    if grad_loss is None:
        grad_loss = torch.zeros_like(lse)
    de, dc, dbias = lce_rows_backward(e, c, targets, bias, lse, nll, p_max, lse_lo, grad_loss,
                                      grad_lse, *ctx.op_args)
    return (de, dc, None, dbias if bias is not None else None) + (None,) * 8


lce_rows.register_autograd(_backward_rule, setup_context=_setup_context)


# ---- eager calls ----------------------------------------------------------------------------

class LceRowsEager(torch.autograd.Function):
    """lce_rows and its backward for eager calls, the same passes called directly. counts: the
    targets' check and count (api.py), read on the host by the time the backward runs."""

    @staticmethod
    def forward(ctx, e, c, targets, bias, opts: Options, counts: HostScalar | None):
        # The backward runs with the forward's config, whatever target or override is in
        # force when autograd reaches it (use_target("portable") may have ended by then).
        cfg = config_for(e.device, e.dtype)
        lse_etc = rows_forward(e, c, targets, bias, opts, cfg)
        loss, lse, p_max, nll, lse_lo = lse_etc
        ctx.save_for_backward(e, c, targets, bias, lse, nll, p_max, lse_lo)
        ctx.mark_non_differentiable(p_max, nll, lse_lo)
        ctx.opts, ctx.counts, ctx.cfg = opts, counts, cfg
        ctx.set_materialize_grads(False)  # an unused lse gets no gradient pass (None)
        return lse_etc

    @staticmethod
    def backward(ctx, grad_loss, grad_lse, grad_p_max, grad_nll, grad_lse_lo):
        e, c, targets, bias, lse, nll, p_max, lse_lo = ctx.saved_tensors
        if grad_loss is None:
            grad_loss = torch.zeros_like(lse)
        num_used = None if ctx.counts is None else int(ctx.counts.values()[1])
        de, dc, dbias = rows_backward(e, c, targets, bias, (lse, nll, p_max, lse_lo), grad_loss,
                                      grad_lse, ctx.opts, num_used=num_used, cfg=ctx.cfg)
        return de, dc, None, dbias if bias is not None else None, None, None
