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

from own_kernel.paths.recompute import backward, zeros_or_none
from own_kernel.paths.low_memory import backward_low_memory
from own_kernel.policy.config import Config, config_for
from own_kernel.kernels.forward import forward
from own_kernel.kernels.gemm import HostScalar
from own_kernel.policy.options import Options
from own_kernel.policy.plan import compaction_pays
from own_kernel.kernels.rows import Rows


# ---- the passes, on plain tensors -------------------------------------------------------------

def rows_forward(e, c, targets, bias, opts: Options, cfg=None):
    """(loss, lse, p_max, nll, lse_lo, entropy) per row (forward.py; entropy empty unless
    opts.entropy). cfg: the Config (None: this device's)."""
    cfg = cfg or config_for(e.device, e.dtype)
    return forward(e, c, bias, targets, opts.softcap, opts.label_smoothing, opts.ignore_index,
                   cfg, skip_ignored=not opts.ignored_lse, temperature=opts.temperature,
                   entropy=opts.entropy)


def _row_weights(grad, used, temperature):
    """An upstream per-row gradient as the kernels' fp32 weights: fresh, unit stride, 0 where
    ignored (None stays None), over the temperature (dz/dx carries 1 / T; tile.py)."""
    if grad is None:
        return None
    w = torch.where(used, grad.float(), 0.0)
    return w / temperature if temperature != 1.0 else w


def rows_backward(e, c, targets, bias, saved, grad_loss, grad_lse, opts: Options, cfg: Config,
                  num_used=None, de_dtype=None, grad_ent=None):
    """(dE, dC, dbias or None). saved: the forward's (lse, nll, p_max[, lse_lo[, entropy]]).
    grad_ent: the gradient into the entropy (opts.entropy), or None. num_used: the number of
    targets that are not ignore_index when the host knows it already (else read here, when it
    matters). cfg: the Config the forward ran with. de_dtype: dE's dtype (None: e's). Rows with
    no gradient are gathered out where that pays (gather_pays); low_memory runs on every row
    (gathering would cost more memory than its workspace; the forward's lse +inf keeps the
    ignored ones' W zero)."""
    lse, nll, p_max = saved[:3]
    lse_lo = saved[3] if len(saved) > 3 else None
    entropy = saved[4] if len(saved) > 4 and grad_ent is not None else None
    # Every row with a gradient weighted alike: autograd hands a mean's or sum's gradient over
    # as one value expanded (stride 0). Else (reduction "none", an lse or entropy gradient)
    # fp16 scales rows apart (backward.normalise_weights).
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
    if opts.low_memory:
        return backward_low_memory(e, c, bias, rows, opts, cfg, uniform=uniform,
                                   de_dtype=de_dtype)
    gathered = None
    if grad_lse is None:  # an lse gradient reaches ignored rows too
        if num_used is None:
            num_used = int(used.sum())
        gathered = used_rows(used, num_used) if gather_pays(e, c, num_used, cfg) else None
    if gathered is None:
        return backward(e, c, bias, rows, opts, cfg, p_max=p_max, uniform=uniform,
                        de_dtype=de_dtype)
    de_zeros = torch.zeros_like(e, dtype=de_dtype)
    if gathered.numel() == 0:
        return de_zeros, torch.zeros_like(c), zeros_or_none(bias)
    e_used = e.index_select(0, gathered)
    used_rows_ = rows.gathered(gathered)
    # dE's rows may go into the gathered E's buffer (it is not read after the chunks).
    de_used, dc, dbias = backward(e_used, c, bias, used_rows_, opts, cfg, p_max=p_max[gathered],
                                  de_out=e_used, uniform=uniform, de_dtype=de_dtype)
    del e_used
    return de_zeros.index_copy_(0, gathered, de_used), dc, dbias


# ---- rows with a target: the one place that gathers them --------------------------------------

def gather_pays(e, c, num_used: int, cfg: Config, *, before_forward: bool = False) -> bool:
    """Whether the call runs on its used rows only (plan.compaction_pays). Before the forward
    (api.py) the gathered E is kept by autograd for the backward, so dE's rows cannot go into
    its buffer."""
    n = e.shape[0]
    if n == 0 or num_used == n:
        return False
    return compaction_pays(n, num_used, c.shape[0], e.shape[1], e.element_size(), cfg,
                           de_into_e=not before_forward)


def used_rows(used: Tensor, num_used: int, offset: int = 0) -> Tensor:
    """The indices (+ offset) of the num_used rows whose mask ``used`` is set, in order, with
    no host read (nonzero_static's size is known)."""
    index = torch.nonzero_static(used, size=num_used).squeeze(1)
    return index + offset if offset else index


def refuse_create_graph() -> None:
    """The gradients are not differentiable: a backward under create_graph=True (which runs
    with grad mode on) raises instead of returning gradients without a graph."""
    if torch.is_grad_enabled():
        raise RuntimeError("linear_cross_entropy: create_graph=True (a double backward) is not "
                           "supported: its gradients are not differentiable")


# ---- the forward's config, carried to the backward ------------------------------------------
# The custom ops' schema takes scalars and strings, not a Config: the forward's config travels
# as its name, a key of this table (the configs in force so far: a few frozen values), so the
# backward op runs with the forward's config whatever override is in force when it runs. The
# name says the target and its overrides (config.with_overrides), so no hash() is needed
# (dynamo on torch 2.11 cannot trace hash() of a dataclass).
_CONFIGS: dict[str, Config] = {}


def config_key(cfg: Config) -> str:
    _CONFIGS.setdefault(cfg.name, cfg)
    return cfg.name


def config_of(key: str, e: Tensor) -> Config:
    """The config of key; no key (""), or one from another process (a compiled graph loaded
    from a cache), resolves this device's config."""
    return _CONFIGS.get(key) or config_for(e.device, e.dtype)


# ---- custom ops (torch.compile) -------------------------------------------------------------

@torch.library.custom_op("own_kernel::lce_rows", mutates_args=())
def lce_rows(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], ignore_index: int,
             softcap: Optional[float], label_smoothing: float, filter_eps: Optional[float],
             filter_min_p_max: float, ignored_lse: bool, low_memory: bool,
             deterministic: bool, temperature: float = 1.0, entropy: bool = False,
             config: str = "") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, lse, largest probability, -log p_target, lse's rounding residue, entropy) per
    row for 2-D e (entropy: empty unless asked for); ignored rows have loss 0 and entropy 0,
    and lse +inf unless ignored_lse. The filter and low_memory only affect the backward."""
    opts = Options.from_op_args(ignore_index, softcap, label_smoothing, filter_eps,
                                filter_min_p_max, ignored_lse, low_memory, deterministic,
                                temperature, entropy)
    return rows_forward(e, c, targets, bias, opts, config_of(config, e))


@lce_rows.register_fake
def _(e, c, targets, bias, *options):
    opts = Options.from_op_args(*options[:10])
    return tuple(e.new_empty(e.shape[0] if i < 5 or opts.entropy else 0, dtype=torch.float32)
                 for i in range(6))


@torch.library.custom_op("own_kernel::lce_rows_backward", mutates_args=())
def lce_rows_backward(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], lse: Tensor,
                      nll: Tensor, p_max: Tensor, lse_lo: Tensor, grad_loss: Tensor,
                      grad_lse: Optional[Tensor],
                      ignore_index: int, softcap: Optional[float], label_smoothing: float,
                      filter_eps: Optional[float], filter_min_p_max: float, ignored_lse: bool,
                      low_memory: bool, deterministic: bool, temperature: float = 1.0,
                      entropy: bool = False, config: str = "",
                      ent: Optional[Tensor] = None,
                      grad_ent: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    opts = Options.from_op_args(ignore_index, softcap, label_smoothing, filter_eps,
                                filter_min_p_max, ignored_lse, low_memory, deterministic,
                                temperature, entropy)
    de, dc, dbias = rows_backward(e, c, targets, bias, (lse, nll, p_max, lse_lo, ent),
                                  grad_loss, grad_lse, opts, config_of(config, e),
                                  grad_ent=grad_ent)
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
    # the options, with the defaults of those the caller left out (temperature, entropy, config)
    args = tuple(ctx.op_args) + (1.0, False, "")[len(ctx.op_args) - 8:]
    de, dc, dbias = lce_rows_backward(e, c, targets, bias, lse, nll, p_max, lse_lo, grad_loss,
                                      grad_lse, *args, ent=ent if grad_ent is not None else None,
                                      grad_ent=grad_ent)
    return (de, dc, None, dbias if bias is not None else None) + (None,) * len(ctx.op_args)


lce_rows.register_autograd(_backward_rule, setup_context=_setup_context)


# ---- eager calls ----------------------------------------------------------------------------

class LceRowsEager(torch.autograd.Function):
    """lce_rows and its backward for eager calls, the same passes called directly. counts: the
    targets' check and count (api.py), read on the host by the time the backward runs."""

    @staticmethod
    def forward(ctx, e, c, targets, bias, opts: Options, cfg: Config,
                counts: HostScalar | None):
        # The backward runs with the forward's config (the route's), whatever target or
        # override is in force when autograd reaches it (use_target may have ended by then).
        lse_etc = rows_forward(e, c, targets, bias, opts, cfg)
        loss, lse, p_max, nll, lse_lo, ent = lse_etc
        ctx.save_for_backward(e, c, targets, bias, lse, nll, p_max, lse_lo, ent)
        ctx.mark_non_differentiable(p_max, nll, lse_lo)
        ctx.opts, ctx.counts, ctx.cfg = opts, counts, cfg
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
                                      grad_loss, grad_lse, ctx.opts, ctx.cfg, num_used=num_used,
                                      grad_ent=grad_ent if ent.numel() else None)
        return de, dc, None, dbias if bias is not None else None, None, None, None
