"""Public API: argument checks, shift/reduction handling, and the autograd-aware custom op."""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor, nn

from own_kernel.backward import HostScalar, backward as _backward, tail_width
from own_kernel.backward_low_memory import backward_low_memory
from own_kernel.check_targets import cce_check_targets_kernel
from own_kernel.configs import config_for
from own_kernel.forward import forward as _forward

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# filter_eps="auto": skip a tile when every gradient entry is below the input dtype's resolution
# relative to the target's O(1) entry.
AUTO_EPS = {torch.bfloat16: 2.0**-12, torch.float16: 2.0**-14, torch.float32: 2.0**-20}
# ... but only in rows whose softmax is peaked (largest probability >= AUTO_FLAT_P_MAX). In a flat
# row the skipped tail carries almost all the mass and it correlates with the row's own hidden
# state (p_v grows with e.c_v), a direction no mean-row compensation can restore: on the suite's
# uniform inputs filtering every row costs a 2e-2 dE error (naive bf16: 2e-3), as Apple's does.
AUTO_FLAT_P_MAX = 2.0**-8


def _check_runnable(device: torch.device) -> None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"own_kernel runs on a CUDA device, or on the CPU under TRITON_INTERPRET=1 "
            f"(set it before importing triton); got tensors on {device}")


# ---- the op: per-row losses and log-sum-exp ---------------------------------------------------

@torch.library.custom_op("own_kernel::lce_rows", mutates_args=())
def lce_rows(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], ignore_index: int,
             softcap: float, label_smoothing: float, filter_eps: float,
             filter_min_p_max: float, ignored_lse: bool,
             low_memory: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, lse, largest probability, -log p_target) per row for 2-D e; ignored rows have
    loss 0, and lse +inf unless ignored_lse (then the forward skips their logits where it can).
    softcap 0 = none; filter_eps < 0 = exact; the filter skips only in rows whose largest
    probability is >= filter_min_p_max; low_memory picks backward_low_memory.py (these three
    only affect the backward)."""
    return _rows_forward(e, c, targets, bias, ignore_index, softcap, label_smoothing, ignored_lse)


def _rows_forward(e, c, targets, bias, ignore_index, softcap, label_smoothing, ignored_lse):
    cfg = config_for(e.device, e.dtype)
    return _forward(e, c, bias, targets, softcap or None, label_smoothing, ignore_index, cfg,
                    skip_ignored=not ignored_lse)


@lce_rows.register_fake
def _(e, c, targets, bias, ignore_index, softcap, label_smoothing, filter_eps, filter_min_p_max,
      ignored_lse, low_memory):
    n = e.shape[0]
    return tuple(e.new_empty(n, dtype=torch.float32) for _ in range(4))


@torch.library.custom_op("own_kernel::lce_rows_backward", mutates_args=())
def lce_rows_backward(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor], lse: Tensor,
                      nll: Tensor, p_max: Tensor, grad_loss: Tensor, grad_lse: Optional[Tensor], ignore_index: int,
                      softcap: float, label_smoothing: float, filter_eps: float,
                      filter_min_p_max: float, low_memory: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _rows_backward(e, c, targets, bias, lse, nll, p_max, grad_loss, grad_lse, ignore_index,
                          softcap, label_smoothing, filter_eps, filter_min_p_max, low_memory)


def _rows_backward(e, c, targets, bias, lse, nll, p_max, grad_loss, grad_lse, ignore_index, softcap,
                   label_smoothing, filter_eps, filter_min_p_max, low_memory, num_used=None):
    """dE, dC, dbias (empty without bias). num_used: the number of targets that are not
    ignore_index, when the host knows it already (else it is read here, when it matters).
    low_memory: backward_low_memory.py, on every row (gathering the used ones would cost more
    memory than its workspace; the forward's lse +inf keeps the ignored ones' W zero)."""
    options = (softcap or None, label_smoothing, filter_eps if filter_eps >= 0 else None,
               filter_min_p_max)
    # Every row with a gradient weighted alike: autograd hands a mean's or sum's gradient over
    # as one value expanded (stride 0). Else (reduction "none", an lse gradient) fp16 scales
    # rows apart (backward.normalise_weights).
    uniform = grad_lse is None and (grad_loss.numel() <= 1 or grad_loss.stride(0) == 0)
    used = targets != ignore_index
    # Fresh, unit-stride fp32 vectors whatever autograd hands over (an expanded scalar for
    # sum / mean, any view for reduction "none" or the lse): the kernels index them per row.
    row_weight = torch.where(used, grad_loss.float(), 0.0)
    weight_lse = grad_lse.float().contiguous() if grad_lse is not None else None
    n = e.shape[0]
    rows = None
    if low_memory:
        de, dc, dbias = backward_low_memory(e, c, bias, targets, lse, nll, p_max, row_weight,
                                            weight_lse, *options, uniform=uniform)
        return de, dc, dbias if dbias is not None else e.new_empty(0)
    if grad_lse is None and n:  # an lse gradient reaches ignored rows too: nothing to drop
        if num_used is None:
            num_used = int(used.sum())
        if compaction_pays(n, num_used, c.shape[0], e.shape[1], e.element_size(),
                           config_for(e.device, e.dtype)):
            # Rows with no gradient, out of the backward: gather the used ones (no host sync:
            # nonzero_static's size is known) and scatter their dE back.
            rows = torch.nonzero_static(used, size=num_used).squeeze(1)
    if rows is None:
        de, dc, dbias = _backward(e, c, bias, targets, lse, nll, p_max, row_weight, weight_lse,
                                  *options, uniform=uniform)
    elif num_used == 0:
        de, dc = torch.zeros_like(e), torch.zeros_like(c)
        dbias = torch.zeros_like(bias) if bias is not None else None
    else:
        e_used = e.index_select(0, rows)
        de_used, dc, dbias = _backward(e_used, c, bias, targets[rows], lse[rows], nll[rows],
                                       p_max[rows],
                                       row_weight[rows], None, *options, de_out=e_used,
                                       uniform=uniform)
        del e_used  # dE's rows may have been written into its buffer
        de = torch.zeros_like(e).index_copy_(0, rows, de_used)
    return de, dc, dbias if dbias is not None else e.new_empty(0)


@lce_rows_backward.register_fake
def _(e, c, targets, bias, lse, nll, p_max, grad_loss, grad_lse, ignore_index, softcap,
      label_smoothing, filter_eps, filter_min_p_max, low_memory):
    return torch.empty_like(e), torch.empty_like(c), (
        torch.empty_like(bias) if bias is not None else e.new_empty(0))


def compaction_pays(n: int, num_used: int, v: int, d: int, elt: int, cfg: dict,
                    de_into_e: bool = True) -> bool:
    """Whether the backward runs on the used rows only. Their gathered E costs memory the full
    call does not have, while the full call holds an fp32 dE accumulator for every row: drop
    rows when that leaves the peak no higher, and when enough are dropped to outweigh the
    gather (compact_max_used). de_into_e: whether dE's rows may go into the gathered E's buffer
    (not when the forward gathered it: autograd keeps it for a second backward)."""
    if num_used == 0:
        return True
    if num_used > cfg.get("compact_max_used", 15 / 16) * n:
        return False
    # Peak bytes in units of one dE row. Full call: fp32 accumulator (2) and dE (1) per row.
    # Used rows only: gathered E (1) and accumulator (2) per used row, and their dE (1) unless
    # it goes into the gathered E's buffer (it cannot when the backward's tail works in dE's,
    # tail_width); then the full dE (1 per row) beside the used rows' dE (the gathered E freed).
    separate_de = tail_width(num_used, v, d, elt, cfg)[1] or not de_into_e
    peak_used = max((4 if separate_de else 3) * num_used, n + num_used)
    return peak_used <= 3 * n


def _setup_context(ctx, inputs, output):
    e, c, targets, bias, ignore_index, softcap, label_smoothing, filter_eps, filter_min_p_max = inputs[:9]
    ctx.save_for_backward(e, c, targets, bias, output[1], output[3], output[2])
    ctx.mark_non_differentiable(output[2], output[3])
    ctx.options = (ignore_index, softcap, label_smoothing, filter_eps, filter_min_p_max, inputs[10])


def _input_grads(ctx, grad_loss, grad_lse, rows_backward, **kw):
    """Gradients of lce_rows' eleven inputs from those of its (loss, lse) outputs (None: unused)."""
    e, c, targets, bias, lse, nll, p_max = ctx.saved_tensors
    if grad_loss is None:
        grad_loss = torch.zeros_like(lse)
    de, dc, dbias = rows_backward(e, c, targets, bias, lse, nll, p_max, grad_loss, grad_lse,
                                  *ctx.options, **kw)
    return (de, dc, None, (dbias if bias is not None else None)) + (None,) * 7


def _backward_rule(ctx, grad_loss, grad_lse, grad_p_max, grad_nll):
    return _input_grads(ctx, grad_loss, grad_lse, lce_rows_backward)


lce_rows.register_autograd(_backward_rule, setup_context=_setup_context)


class _LceRowsEager(torch.autograd.Function):
    """lce_rows with its backward for eager calls: the same two passes as the custom ops, called
    directly. The custom ops are what torch.compile sees; eagerly, their dispatch and generated
    autograd wrapper cost the host more per call than this Function does, and at small shapes
    the GPU waits for the host (own_kernel/measurements/host-v15). counts: the targets' check
    and count (_check_and_count_targets), read on the host by the time the backward runs."""

    @staticmethod
    def forward(ctx, e, c, targets, bias, ignore_index, softcap, label_smoothing, filter_eps,
                filter_min_p_max, ignored_lse, low_memory, counts):
        inputs = (e, c, targets, bias, ignore_index, softcap, label_smoothing, filter_eps,
                  filter_min_p_max, ignored_lse, low_memory)
        output = _rows_forward(e, c, targets, bias, ignore_index, softcap, label_smoothing,
                               ignored_lse)
        _setup_context(ctx, inputs, output)
        ctx.counts = counts
        ctx.set_materialize_grads(False)  # an unused lse gets no gradient pass (None)
        return output

    @staticmethod
    def backward(ctx, grad_loss, grad_lse, grad_p_max, grad_nll):
        num_used = None if ctx.counts is None else int(ctx.counts.values()[1])
        return _input_grads(ctx, grad_loss, grad_lse, _rows_backward, num_used=num_used) + (None,)


# ---- the public function ---------------------------------------------------------------------

def _validate(e, c, targets, bias, ignore_index, softcap, reduction, shift, label_smoothing,
              filter_eps, low_memory):
    if not isinstance(e, Tensor) or not isinstance(c, Tensor) or not isinstance(targets, Tensor):
        raise TypeError("e, c and targets must be torch.Tensors")
    if e.dtype not in DTYPES:
        raise TypeError(f"e: dtype must be one of bfloat16, float16, float32; got {e.dtype}")
    if e.dim() < 1:
        raise ValueError("e: expected shape (..., D)")
    if c.dim() != 2:
        raise ValueError(f"c: expected shape (V, D); got {tuple(c.shape)}")
    if c.shape[1] != e.shape[-1]:
        raise ValueError(f"c: hidden size {c.shape[1]} does not match e's hidden size {e.shape[-1]}")
    if c.dtype != e.dtype:
        raise TypeError(f"c: dtype {c.dtype} must match e's dtype {e.dtype}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise TypeError(f"targets: expected an integer tensor; got {targets.dtype}")
    if tuple(targets.shape) != tuple(e.shape[:-1]):
        raise ValueError(f"targets: shape {tuple(targets.shape)} must equal e.shape[:-1] = "
                         f"{tuple(e.shape[:-1])}")
    for name, t in (("c", c), ("targets", targets), ("bias", bias)):
        if t is not None and t.device != e.device:
            raise ValueError(f"{name}: on {t.device}, but e is on {e.device}")
    if bias is not None:
        if bias.shape != (c.shape[0],):
            raise ValueError(f"bias: expected shape ({c.shape[0]},); got {tuple(bias.shape)}")
        if bias.dtype != e.dtype:
            raise TypeError(f"bias: dtype {bias.dtype} must match e's dtype {e.dtype}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction: expected 'mean', 'sum' or 'none'; got {reduction!r}")
    if not isinstance(shift, int) or isinstance(shift, bool) or shift < 0:
        raise ValueError(f"shift: expected an int >= 0; got {shift!r}")
    if shift and (e.dim() < 2 or shift >= e.shape[-2]):
        raise ValueError(f"shift: {shift} needs a sequence dimension longer than it "
                         f"(e.shape = {tuple(e.shape)})")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing: expected a value in [0, 1]; got {label_smoothing}")
    if softcap is not None and not float(softcap) > 0:
        raise ValueError(f"softcap: expected None or a positive number; got {softcap}")
    if filter_eps is not None and filter_eps != "auto":
        if isinstance(filter_eps, str) or not float(filter_eps) >= 0:
            raise ValueError(f"filter_eps: expected None, 'auto' or a float >= 0; got {filter_eps!r}")
    if not isinstance(low_memory, bool):
        raise TypeError(f"low_memory: expected True or False; got {low_memory!r}")
    if low_memory and filter_eps is not None:
        raise ValueError(f"low_memory: computes exact gradients only; got filter_eps={filter_eps!r} "
                         f"(pass filter_eps=None)")
    _check_runnable(e.device)


def _check_and_count_targets(targets: Tensor, v: int, ignore_index: int):
    """(check, count): [whether any target is outside [0, V) and not ignore_index, how many are
    not ignore_index], copied to the host without waiting (HostScalar; the backward reads the
    count there), and that count as a 0-d fp32 device tensor (the mean's divisor). The check is
    queued before the forward and read after it is queued (its kernels mask such targets): the
    host then waits for this small kernel only, not for the forward, and runs on into the
    backward's launches while the GPU computes (unless _rows_to_gather reads it earlier)."""
    if torch.compiler.is_compiling() or not targets.numel():
        # A data-dependent check would break the graph; eager calls still check.
        return None, (targets != ignore_index).sum()
    out = torch.empty(2, device=targets.device, dtype=torch.float32)
    cce_check_targets_kernel[(1,)](targets, out, targets.numel(), v, int(ignore_index), BLOCK=1024)
    return HostScalar(out), out[1]


def _raise_on_bad_targets(check: HostScalar | None, targets: Tensor, v: int, ignore_index: int):
    if check is not None and check.values()[0]:
        bad = (targets != ignore_index) & ((targets < 0) | (targets >= v))
        first = targets[bad][0].item()
        raise ValueError(f"targets: value {first} is outside [0, {v}) and is not "
                         f"ignore_index={ignore_index}")


def _rows_to_gather(e: Tensor, c: Tensor, targets: Tensor, ignore_index: int,
                    check: HostScalar) -> Tensor | None:
    """The used rows, when forward and backward should run on them only (else None). This
    reads the targets' count on the host before the forward is queued: the GPU then idles while
    the host queues the gather and the forward, so only calls whose forward is long enough to
    hide that (compact_fwd_min_flops) read it. The decision depends on this call's inputs
    alone (an earlier version looked at the previous call, which made results depend on call
    history). Calls that do not read it here drop rows in the backward only."""
    n, d = e.shape
    v = c.shape[0]
    cfg = config_for(e.device, e.dtype)
    if 2 * n * v * d < cfg.get("compact_fwd_min_flops", 0):
        return None
    num_used = int(check.values()[1])
    if num_used == n or not compaction_pays(n, num_used, v, d, e.element_size(), cfg,
                                            de_into_e=False):
        return None
    return torch.nonzero_static(targets != ignore_index, size=num_used).squeeze(1)


def _matrix_for_kernels(t: Tensor) -> Tensor:
    """t, or its contiguous copy where the kernels could not read it as it is: they need unit
    stride along D and rows that do not overlap (an expanded or transposed view). Offset views
    and row strides larger than D (slices of a wider tensor) are read in place."""
    rows, cols = t.shape
    if t.stride(1) == 1 and (rows <= 1 or t.stride(0) >= max(cols, 1)):
        return t
    return t.contiguous()


def _kernel_layouts(e: Tensor, c: Tensor, targets: Tensor, bias: Tensor | None):
    """(e as N x D, c, targets as N int64, bias) in layouts the kernels read correctly, whatever
    views the caller passed: the kernels index vectors with unit stride and matrices along D.
    Each copy is autograd-visible (gradients reach the caller's views) and made only where
    needed; a vector's copy is N or V elements."""
    e2 = _matrix_for_kernels(e.reshape(-1, e.shape[-1]))  # a view where the leading dims allow
    t2 = targets.reshape(-1).to(torch.int64).contiguous()
    bias = bias.contiguous() if bias is not None else None
    return e2, _matrix_for_kernels(c), t2, bias


def linear_cross_entropy(e: Tensor, c: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                         ignore_index: int = -100, softcap: float | None = None,
                         reduction: str = "mean", shift: int = 0, label_smoothing: float = 0.0,
                         filter_eps: float | str | None = None, return_lse: bool = False,
                         low_memory: bool = False):
    """Cross-entropy of softcap(e @ c.T + bias) against targets, without materialising the logits.

    Same value and gradients as ``F.cross_entropy(softcap(e @ c.T + bias).float(), targets,
    ignore_index=..., reduction=..., label_smoothing=...)`` with softcap(x) = s * tanh(x / s).
    ``shift=k`` pairs position i with ``targets[..., i + k]`` (sequence dim = e's dim -2) without
    copying e. ``filter_eps`` (None = exact, float or "auto") skips gradient tiles whose every
    entry is below it; "auto" picks the dtype's eps and leaves rows with a flat softmax exact
    (AUTO_FLAT_P_MAX). ``return_lse=True`` also returns the per-token log-sum-exp.
    ``low_memory=True`` (exact only) bounds the backward's workspace to a small fraction of the
    gradients' size, at the cost of a second recompute of the logits (backward_low_memory.py);
    by default the backward holds an fp32 copy of dE (4 bytes per entry of e).
    """
    if torch.is_autocast_enabled(e.device.type):
        dtype = torch.get_autocast_dtype(e.device.type)
        e, c = e.to(dtype), c.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    _validate(e, c, targets, bias, ignore_index, softcap, reduction, shift, label_smoothing,
              filter_eps, low_memory)
    min_p_max = 0.0
    if filter_eps == "auto":
        filter_eps, min_p_max = AUTO_EPS[e.dtype], AUTO_FLAT_P_MAX

    lead = targets.shape
    if shift:
        # Position i predicts targets[..., i + shift]; the last `shift` positions predict nothing
        # (and the first `shift` targets are never used, so they are not checked either).
        shifted = torch.full_like(targets, ignore_index)
        shifted[..., :-shift] = targets[..., shift:]
        targets = shifted
    e2, c, t2, bias = _kernel_layouts(e, c, targets, bias)
    check, count = _check_and_count_targets(t2, c.shape[0], ignore_index)
    options = (int(ignore_index), float(softcap or 0.0), float(label_smoothing),
               -1.0 if filter_eps is None else float(filter_eps), min_p_max, bool(return_lse),
               low_memory)
    if torch.compiler.is_compiling():
        loss_rows, lse, _, _ = lce_rows(e2, c, t2, bias, *options)
    else:
        # Gathered rows are what the backward needs anyway; a call without one (evaluation)
        # keeps the forward's few floats of memory and relies on its skipped row blocks.
        needs_grad = torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (e2, c, bias))
        rows = (None if return_lse or low_memory or check is None or not needs_grad
                else _rows_to_gather(e2, c, t2, ignore_index, check))
        if rows is None:
            loss_rows, lse, _, _ = _LceRowsEager.apply(e2, c, t2, bias, *options, check)
        else:
            # Only the used rows, gathered (index_select's backward scatters their dE back).
            # Their lse is not returned, so the others' is not needed.
            loss_used, _, _, _ = _LceRowsEager.apply(e2.index_select(0, rows), c, t2[rows], bias,
                                                  *options, check)
            loss_rows = loss_used.new_zeros(t2.shape).index_copy(0, rows, loss_used)
            lse = None
    _raise_on_bad_targets(check, targets, c.shape[0], ignore_index)
    if return_lse:
        lse = lse.view(lead)[..., :-shift] if shift else lse.view(lead)
    # A sum over every row (the last `shift` positions are ignored, their loss 0): its gradient
    # reaches the backward as one expanded value, which tells it the rows weigh alike.
    if reduction == "none":
        loss = loss_rows.view(lead)[..., :-shift] if shift else loss_rows.view(lead)
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        loss = loss_rows.sum() / count
    return (loss, lse) if return_lse else loss


class LinearCrossEntropy(nn.Module):
    """nn.Module wrapper: ``LinearCrossEntropy(softcap=30.0)(e, c, targets)``."""

    def __init__(self, *, ignore_index: int = -100, softcap: float | None = None,
                 reduction: str = "mean", shift: int = 0, label_smoothing: float = 0.0,
                 filter_eps: float | str | None = None, return_lse: bool = False,
                 low_memory: bool = False):
        super().__init__()
        self.options = dict(ignore_index=ignore_index, softcap=softcap, reduction=reduction,
                            shift=shift, label_smoothing=label_smoothing, filter_eps=filter_eps,
                            return_lse=return_lse, low_memory=low_memory)

    def forward(self, e: Tensor, c: Tensor, targets: Tensor, bias: Tensor | None = None):
        return linear_cross_entropy(e, c, targets, bias=bias, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())
