"""The entries of the per-row paths (forward-only, recompute, low-memory): per-row losses of
2-D inputs and their gradients, as custom ops (what torch.compile sees, opaque: Route.entry
"compiled") and as a plain autograd Function (eager calls, "eager": the custom ops' dispatch
costs the host more per call, and small shapes wait for the host;
results/notes/host-bound-calls.md).

Both run the route's passes: the forward (paths/forward.py), then the backward of the route's
path (paths/recompute.py or paths/low_memory.py) on the rows with a target where the route
gathers them. The call's options travel as one typed object (Options) down to the custom ops'
edge, whose schema takes them as plain optional scalars, and the config as its recipe
(config.config_key): each op asks the route of its own real tensors (the api's tensors are
traced there), the same pure function of the same arguments in the forward and the backward.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from own_kernel.kernels.gemm import HostScalar
from own_kernel.kernels.rows import Rows
from own_kernel.paths.forward import forward
from own_kernel.paths.low_memory import backward_low_memory
from own_kernel.paths.recompute import backward
from own_kernel.paths.shared import refuse_create_graph, used_rows, zeros_or_none
from own_kernel.policy.config import config_of_key
from own_kernel.policy.options import Options
from own_kernel.policy.route import Route, call_of, layouts_of, route, route_with_copies


# ---- the passes, on plain tensors -------------------------------------------------------------

def rows_forward(e, c, targets, bias, opts: Options, route: Route):
    """(loss, lse, p_max, nll, lse_lo, entropy) per row (paths/forward.py; entropy empty unless
    opts.entropy), by the route's forward kernel."""
    return forward(e, c, bias, targets, opts, route, skip_ignored=not opts.ignored_lse)


def _row_weights(grad, used, temperature):
    """An upstream per-row gradient as the kernels' fp32 weights: fresh, unit stride, 0 where
    ignored (None stays None), over the temperature (dz/dx carries 1 / T; tile.py)."""
    if grad is None:
        return None
    w = torch.where(used, grad.float(), 0.0)
    return w / temperature if temperature != 1.0 else w


def _backward_rows(targets, saved, grad_loss, grad_lse, grad_ent, opts: Options):
    """(Rows of the backward, uniform, used): the kernels' per-row inputs from the forward's saved
    (lse, nll, p_max[, lse_lo[, entropy]]) and the upstream gradients; uniform: every row with
    a gradient weighted alike (autograd hands a mean's or sum's gradient over as one value
    expanded, stride 0). Else (reduction "none", an lse or entropy gradient) fp16 scales rows
    apart (recompute.normalise_weights). used: the rows with a target."""
    lse, nll = saved[:2]
    lse_lo = saved[3] if len(saved) > 3 else None
    entropy = saved[4] if len(saved) > 4 and grad_ent is not None else None
    uniform = (grad_lse is None and entropy is None
               and (grad_loss.numel() <= 1 or grad_loss.stride(0) == 0))
    used = targets != opts.ignore_index
    # Fresh, unit-stride fp32 vectors whatever autograd hands over: the kernels index them.
    # An lse gradient reaches ignored rows too (return_lse); an entropy gradient does not.
    t = opts.temperature
    weight_lse = None if grad_lse is None else (grad_lse.float() / t).contiguous()
    rows = Rows(targets, lse, nll, _row_weights(grad_loss, used, t), weight_lse, lse_lo=lse_lo,
                entropy=entropy,
                weight_ent=_row_weights(grad_ent, used, t) if entropy is not None else None)
    return rows, uniform, used


def rows_backward(e, c, targets, bias, saved, grad_loss, grad_lse, opts: Options, route: Route,
                  num_used=None, de_dtype=None, grad_ent=None):
    """(dE, dC, dbias or None) by the backward of the route's path. saved: the forward's (lse,
    nll, p_max[, lse_lo[, entropy]]). grad_ent: the gradient into the entropy (opts.entropy), or
    None. num_used: the number of targets that are not ignore_index when the host knows it
    already (else read here, when it matters). route: the forward's (its config, its kernels).
    de_dtype: dE's dtype (None: e's). Rows with no gradient are gathered out where the route
    says it pays (Route.gathers; an lse gradient reaches ignored rows too)."""
    p_max = saved[2]
    rows, uniform, used = _backward_rows(targets, saved, grad_loss, grad_lse, grad_ent, opts)
    if route.path == "low-memory":
        return backward_low_memory(e, c, bias, rows, opts, route, uniform=uniform,
                                   de_dtype=de_dtype)
    gathered = None
    if grad_lse is None:
        if num_used is None:
            num_used = int(used.sum())
        gathered = used_rows(used, num_used) if route.gathers(num_used) else None
    if gathered is None:
        return backward(e, c, bias, rows, opts, route, p_max=p_max, uniform=uniform,
                        de_dtype=de_dtype)
    de_zeros = torch.zeros_like(e, dtype=de_dtype)
    if gathered.numel() == 0:
        return de_zeros, torch.zeros_like(c), zeros_or_none(bias)
    e_used = e.index_select(0, gathered)
    used_rows_ = rows.gathered(gathered)
    # dE's rows may go into the gathered E's buffer (it is not read after the chunks).
    de_used, dc, dbias = backward(e_used, c, bias, used_rows_, opts, route.for_rows(num_used),
                                  p_max=p_max[gathered], de_out=e_used, uniform=uniform,
                                  de_dtype=de_dtype)
    del e_used
    return de_zeros.index_copy_(0, gathered, de_used), dc, dbias


def _op_route(e, c, bias, opts: Options, config: str, workspace_mib=None) -> Route:
    """The route a custom op runs: that of its real tensors under torch.compile, with the
    config of the recipe its forward was traced with (config.config_key) and the call's
    budget (the cuBLAS forward's: Route.forward_rows)."""
    e_ready, c_ready = layouts_of(e, c)
    call = call_of(e, c, bias, opts, compiling=True, e_tma_ready=e_ready, c_tma_ready=c_ready,
                   workspace_mib=workspace_mib)
    return route(call, config_of_key(config, e.device, e.dtype))


def _op_inputs(e, c, bias, opts: Options, config: str, workspace_mib=None):
    """(e, c, route) of a custom op: batch_invariant's pinned kernels read aligned copies of
    views TMA cannot read (Route.needs_tma_copies), as the eager call does (api.py)."""
    return route_with_copies(e, c, lambda e, c: _op_route(e, c, bias, opts, config,
                                                          workspace_mib))


# ---- custom ops (torch.compile) -------------------------------------------------------------

@torch.library.custom_op("own_kernel::lce_rows", mutates_args=())
def lce_rows(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], ignore_index: int,
             softcap: Optional[float], label_smoothing: float, filter_eps: Optional[float],
             filter_min_p_max: float, ignored_lse: bool, low_memory: bool,
             deterministic: bool, temperature: float = 1.0, entropy: bool = False,
             batch_invariant: bool = False, config: str = "",
             workspace_mib: Optional[int] = None
             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, lse, largest probability, -log p_target, lse's rounding residue, entropy) per
    row for 2-D e (entropy: empty unless asked for); ignored rows have loss 0 and entropy 0,
    and lse +inf unless ignored_lse. The filter and low_memory only affect the backward;
    workspace_mib (the call's budget, None: the config's) only the forward's kernel."""
    opts = Options.from_op_args(ignore_index, softcap, label_smoothing, filter_eps,
                                filter_min_p_max, ignored_lse, low_memory, deterministic,
                                temperature, entropy, batch_invariant)
    e, c, r = _op_inputs(e, c, bias, opts, config, workspace_mib)
    return rows_forward(e, c, targets, bias, opts, r)


@lce_rows.register_fake
def _(e, c, targets, bias, *options):
    opts = Options.from_op_args(*options[:11])
    return tuple(e.new_empty(e.shape[0] if i < 5 or opts.entropy else 0, dtype=torch.float32)
                 for i in range(6))


@torch.library.custom_op("own_kernel::lce_rows_backward", mutates_args=())
def lce_rows_backward(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], lse: Tensor,
                      nll: Tensor, p_max: Tensor, lse_lo: Tensor, grad_loss: Tensor,
                      grad_lse: Optional[Tensor],
                      ignore_index: int, softcap: Optional[float], label_smoothing: float,
                      filter_eps: Optional[float], filter_min_p_max: float, ignored_lse: bool,
                      low_memory: bool, deterministic: bool, temperature: float = 1.0,
                      entropy: bool = False, batch_invariant: bool = False, config: str = "",
                      ent: Optional[Tensor] = None,
                      grad_ent: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    opts = Options.from_op_args(ignore_index, softcap, label_smoothing, filter_eps,
                                filter_min_p_max, ignored_lse, low_memory, deterministic,
                                temperature, entropy, batch_invariant)
    e, c, r = _op_inputs(e, c, bias, opts, config)
    de, dc, dbias = rows_backward(e, c, targets, bias, (lse, nll, p_max, lse_lo, ent),
                                  grad_loss, grad_lse, opts, r, grad_ent=grad_ent)
    return de, dc, dbias if dbias is not None else e.new_empty(0)


@lce_rows_backward.register_fake
def _(e, c, targets, bias, *rest):
    return torch.empty_like(e), torch.empty_like(c), (
        torch.empty_like(bias) if bias is not None else e.new_empty(0))


def _setup_context(ctx, inputs, output):
    e, c, targets, bias = inputs[:4]
    ctx.save_for_backward(e, c, targets, bias, output[1], output[3], output[2], output[4],
                          output[5])
    ctx.mark_non_differentiable(output[2], output[3], output[4])
    ctx.op_args = inputs[4:]


def _backward_rule(ctx, grad_loss, grad_lse, grad_p_max, grad_nll, grad_lse_lo, grad_ent):
    e, c, targets, bias, lse, nll, p_max, lse_lo, ent = ctx.saved_tensors
    if grad_loss is None:
        grad_loss = torch.zeros_like(lse)
    if grad_ent is not None and ent.numel() == 0:
        grad_ent = None
    # the options, with the defaults of those the caller left out (temperature, entropy,
    # batch_invariant, config); not the forward's budget, which the backward does not take
    defaults = (1.0, False, False, "")
    options = tuple(ctx.op_args)[:8 + len(defaults)]
    args = options + defaults[len(options) - 8:]
    de, dc, dbias = lce_rows_backward(e, c, targets, bias, lse, nll, p_max, lse_lo, grad_loss,
                                      grad_lse, *args, ent=ent if grad_ent is not None else None,
                                      grad_ent=grad_ent)
    return (de, dc, None, dbias if bias is not None else None) + (None,) * len(ctx.op_args)


lce_rows.register_autograd(_backward_rule, setup_context=_setup_context)


# ---- eager calls ----------------------------------------------------------------------------

class LceRowsEager(torch.autograd.Function):
    """lce_rows and its backward for eager calls, the same passes called directly. route: the
    call's (api.py); counts: the targets' check and count (api.py), read on the host by the
    time the backward runs."""

    @staticmethod
    def forward(ctx, e, c, targets, bias, opts: Options, route: Route,
                counts: HostScalar | None):
        # The backward runs with the forward's route (its config), whatever target or
        # override is in force when autograd reaches it (use_target may have ended by then).
        lse_etc = rows_forward(e, c, targets, bias, opts, route)
        loss, lse, p_max, nll, lse_lo, ent = lse_etc
        ctx.save_for_backward(e, c, targets, bias, lse, nll, p_max, lse_lo, ent)
        ctx.mark_non_differentiable(p_max, nll, lse_lo)
        ctx.opts, ctx.counts, ctx.route = opts, counts, route
        ctx.set_materialize_grads(False)  # an unused lse gets no gradient pass (None)
        return lse_etc

    @staticmethod
    def backward(ctx, grad_loss, grad_lse, grad_p_max, grad_nll, grad_lse_lo, grad_ent):
        refuse_create_graph()
        e, c, targets, bias, lse, nll, p_max, lse_lo, ent = ctx.saved_tensors
        if grad_loss is None:
            grad_loss = torch.zeros_like(lse)
        num_used = None if ctx.counts is None else int(ctx.counts.values()[1])
        de, dc, dbias = rows_backward(e, c, targets, bias, (lse, nll, p_max, lse_lo, ent),
                                      grad_loss, grad_lse, ctx.opts, ctx.route, num_used=num_used,
                                      grad_ent=grad_ent if ent.numel() else None)
        return de, dc, None, dbias if bias is not None else None, None, None, None
