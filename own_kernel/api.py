"""Public API: argument checks, layouts, shift and reduction around the passes (the route:
policy/route.py; the paths: paths/)."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor, nn

from own_kernel.integrations.distributed import accepts_dtensors, is_plain
from own_kernel.paths.entries import LceRowsEager, lce_rows, used_rows
from own_kernel.paths.targets import TargetsCheck, queued_or_new_check, raise_on_bad_targets
from own_kernel.paths.three_matmul import FusedLce
from own_kernel.paths.vocab_parallel import (VocabParallel, check_vocab_parallel,
                                             vocab_parallel_rows)
from own_kernel.policy.config import config_for, config_key, forced_target
from own_kernel.policy.options import CallOptions, Options
from own_kernel.policy.route import Route, call_of, layouts_of, route, route_with_copies

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_runnable(device: torch.device, dtype: torch.dtype) -> None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"own_kernel runs on a CUDA device, or on the CPU under TRITON_INTERPRET=1 "
            f"(set it before importing triton); got tensors on {device}")
    if device.type != "cuda" and dtype == torch.bfloat16:
        # The interpreter's bf16 arithmetic is wrong (losses off by orders of magnitude): an
        # error, never a silently wrong loss.
        raise TypeError("e: bfloat16 does not run under the Triton interpreter (its bf16 "
                        "arithmetic is wrong); on the CPU use float32 or float16")


# ---- the public function ---------------------------------------------------------------------

def _validate_tensors(e, c, targets, bias, targets_check=None):
    if not isinstance(e, Tensor) or not isinstance(c, Tensor) or not isinstance(targets, Tensor):
        raise TypeError("e, c and targets must be torch.Tensors")
    if targets_check is not None and not isinstance(targets_check, TargetsCheck):
        raise TypeError(f"targets_check: expected what own_kernel.queue_targets_check returns "
                        f"(or None); got {type(targets_check).__name__}")
    if e.dtype not in DTYPES:
        raise TypeError(f"e: dtype must be one of bfloat16, float16, float32; got {e.dtype}")
    if e.dim() < 1:
        raise ValueError("e: expected shape (..., D)")
    if c.dim() != 2:
        raise ValueError(f"c: expected shape (V, D); got {tuple(c.shape)}")
    if c.shape[1] != e.shape[-1]:
        raise ValueError(f"c: hidden size {c.shape[1]} does not match e's hidden size {e.shape[-1]}")
    if c.dtype != e.dtype and not _fp32_weight(e, c, bias):  # autocast's fp32 weight may differ
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
        if bias.dtype != c.dtype:
            raise TypeError(f"bias: dtype {bias.dtype} must match c's dtype {c.dtype}")
    _check_runnable(e.device, e.dtype)


class LossEntropy(NamedTuple):
    """``linear_cross_entropy(..., return_entropy=True)``: the loss and the softmax entropy
    per token, each reduced as ``reduction`` says."""
    loss: Tensor
    entropy: Tensor


class LossEntropyLse(NamedTuple):
    """``return_entropy=True, return_lse=True``: as LossEntropy, and the per-token lse."""
    loss: Tensor
    entropy: Tensor
    lse: Tensor


class TokenLogprobs(NamedTuple):
    """``token_logprobs(..., return_entropy=True)``: log p(target) and the entropy per token."""
    logprobs: Tensor
    entropy: Tensor


def _readable_as_is(t: Tensor) -> bool:
    """Whether the kernels read 2-D t as it is: unit stride along D and rows that do not
    overlap (not an expanded or transposed view). Offset views and row strides larger than D
    (slices of a wider tensor) are read in place."""
    rows, cols = t.shape
    return t.stride(1) == 1 and (rows <= 1 or t.stride(0) >= max(cols, 1))


def _matrix_for_kernels(t: Tensor) -> Tensor:
    """t, or its contiguous copy where the kernels could not read it as it is."""
    return t if _readable_as_is(t) else t.contiguous()


def _kernel_layouts(e: Tensor, c: Tensor, targets: Tensor, bias: Tensor | None):
    """(e as N x D, c, targets as N int64, bias) in layouts the kernels read correctly, whatever
    views the caller passed: the kernels index vectors with unit stride and matrices along D.
    Each copy is autograd-visible (gradients reach the caller's views) and made only where
    needed; a vector's copy is N or V elements."""
    e2 = _matrix_for_kernels(e.reshape(-1, e.shape[-1]))  # a view where the leading dims allow
    t2 = targets.reshape(-1).to(torch.int64).contiguous()
    bias = bias.contiguous() if bias is not None else None
    return e2, _matrix_for_kernels(c), t2, bias


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _route_of(e2: Tensor, c: Tensor, bias, opts: Options, user: CallOptions, needs_grad: bool,
              layouts: tuple) -> Route:
    """The call's route (policy/route.py), asked once per call: the path, its entry, its
    kernels and the config every pass of the call runs with, its backward included. layouts:
    (e_tma_ready, c_tma_ready) of the tensors the kernels will read."""
    forced = forced_target()
    if forced is not None and e2.device.type != "cuda":
        raise ValueError(f"use_target({forced!r}) (or CCE_OWN_TARGET): selects a CUDA target; "
                         f"the tensors are on {e2.device}, where only the interpreter's config "
                         f"runs")
    call = call_of(e2, c, bias, opts, reduction=user.reduction, needs_grad=needs_grad,
                   vocab_parallel=user.vocab_parallel is not None,
                   compiling=torch.compiler.is_compiling(), workspace_mib=user.workspace_mib,
                   fp32_weight=c.dtype != e2.dtype, e_tma_ready=layouts[0],
                   c_tma_ready=layouts[1])
    return route(call, config_for(e2.device, e2.dtype))


def _layouts(e2: Tensor, c: Tensor) -> tuple:
    """(e_tma_ready, c_tma_ready) of the kernels' e2 and c: None for c where an fp32 weight's
    16-bit copy is read (a tensor of its own) and for both where the call is traced (the
    custom ops route their real tensors)."""
    if torch.compiler.is_compiling():
        return None, None
    return layouts_of(e2, c if c.dtype == e2.dtype else None)


def _eager_rows(e2, c, t2, bias, opts: Options, r: Route, check):
    """(loss per row, lse per row or None, entropy per row or empty) of an eager call. Where the
    route reads the targets' count before the forward (Route.reads_count_before_forward), the
    rows with a target are gathered when that pays: what the backward needs anyway; a call
    without one (evaluation) keeps the forward's few floats of memory and relies on its
    skipped row blocks."""
    rows = None
    if r.reads_count_before_forward and check is not None:
        num_used = int(check.values()[1])
        if r.gathers(num_used, before_forward=True):
            rows = used_rows(t2 != opts.ignore_index, num_used)
    if rows is None:
        loss_rows, lse, _, _, _, ent = LceRowsEager.apply(e2, c, t2, bias, opts, r, check)
        return loss_rows, lse, ent
    # Only the used rows, gathered (index_select's backward scatters their dE back). Their lse
    # is not returned, so the others' is not needed; the others' entropy is 0.
    loss_used, _, _, _, _, ent_used = LceRowsEager.apply(
        e2.index_select(0, rows), c, t2[rows], bias, opts, r.for_rows(num_used), check)

    def scatter(x):
        return x.new_zeros(t2.shape).index_copy(0, rows, x)
    return scatter(loss_used), None, scatter(ent_used) if opts.entropy else ent_used


@accepts_dtensors  # DTensor arguments (tensor parallel, FSDP2): integrations/distributed.py
def linear_cross_entropy(e: Tensor, c: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                         ignore_index: int = -100, softcap: float | None = None,
                         reduction: str = "mean", shift: int = 0, label_smoothing: float = 0.0,
                         filter_eps: float | str | None = None, return_lse: bool = False,
                         low_memory: bool = False, vocab_parallel: VocabParallel | None = None,
                         workspace_mib: int | None = None, temperature: float = 1.0,
                         return_entropy: bool = False, batch_invariant: bool = False,
                         targets_check: TargetsCheck | None = None):
    """Cross-entropy of softcap(e @ c.T + bias) against targets, without materialising the logits.

    Same value and gradients as ``F.cross_entropy(softcap(e @ c.T + bias).float(), targets,
    ignore_index=..., reduction=..., label_smoothing=...)`` with softcap(x) = s * tanh(x / s).
    ``shift=k`` pairs position i with ``targets[..., i + k]`` (sequence dim = e's dim -2) without
    copying e; ``reduction="none"`` then returns shape ``(..., T - k)``. A mean over targets that
    are all ignore_index is NaN, as in torch. Any tensor layout is accepted. The loss is bitwise
    reproducible; the gradients are under ``torch.use_deterministic_algorithms(True)``.
    ``filter_eps`` (None = exact, float or "auto") skips gradient tiles whose every entry is
    below it; "auto" picks the dtype's eps and leaves rows with a flat softmax exact
    (AUTO_FLAT_P_MAX). ``return_lse=True`` also returns the per-token log-sum-exp.
    ``low_memory=True`` (exact only) bounds the backward's workspace to a small fraction of the
    gradients' size, at the cost of a second recompute of the logits (paths/low_memory.py);
    by default the backward holds an fp32 copy of dE (4 bytes per entry of e).
    ``vocab_parallel=VocabParallel(group, start, stop)``: c (and bias) are this rank's columns
    [start, stop) of the vocabulary, e and targets the whole problem's on every rank; the loss
    is the gathered problem's, dE is all-reduced, dC this shard's (eagerly: a graph break under
    torch.compile; paths/vocab_parallel.py).
    ``workspace_mib``: for a mean or sum with gradients (eager, no lse, not low_memory), the
    budget of the three-matmul training path (paths/three_matmul.py): loss and gradients at
    once in row chunks, the call's memory beyond its gradients (a chunk's logits; with several
    chunks dC's own buffer sums them, config.Fused.dc_accumulator; an fp32 c under 16-bit
    autocast: its gradient is those fp32 sums, and the budget holds the chunk only).
    None = the device's default (config.Fused: 1024 MiB, 512 MiB for fp32) for exact calls
    (a filter_eps number on Hopper keeps the recompute path unless given a budget; "auto"
    runs exact below D 2048 or where the exact three-matmul path fits with fp32 dC sums),
    0 = no workspace (Hopper's 16-bit exact calls, bar an fp32 weight: chunks in the recompute
    path's fp32 dE accumulator where they fit, config.Fused.zero_budget). Where they would not
    fit or pay (plan.fused_plan), or the call cannot take that path, the recompute path runs
    and the budget goes unused: ``plan(...)`` says which path a call takes and why.
    ``temperature=T`` (> 0) divides the (softcapped) logits: z = softcap(e @ c.T + bias) / T,
    as RL trainers sample. ``return_entropy=True`` also returns each token's softmax entropy
    H = lse - sum_v p_v z_v (0 for ignored tokens), reduced as the loss is and differentiable:
    one backward takes any upstream gradients of loss and entropy together, without logits.
    Returns ``LossEntropy(loss, entropy)``, or ``LossEntropyLse(loss, entropy, lse)`` with
    return_lse (plain ``(loss, lse)`` without return_entropy). Exact gradients only (no
    filter_eps); such calls take the recompute (or low-memory) path.
    ``batch_invariant=True``: each token's loss, lse, entropy and dE row are the same bits
    whatever else is in the call (other rows, N, their order, padding, workspace_mib): one
    pinned route (no autotuning, no three-matmul path, no filter, no row gathering, fixed
    vocabulary blocks merged in one order); dC, a sum over rows, is bitwise reproducible run
    to run. For a fixed device model, dtype, D, V and library version (a mean's gradient
    weighs each row 1 / count, which depends on the batch: per-row upstream gradients or a sum
    keep dE's rows comparable). Exact only; not with low_memory. With vocab_parallel the
    forward's rows are the same for any number of ranks and any split of the vocabulary
    (own_kernel/README.md, Guarantees); dE is summed over the ranks.
    ``targets_check``: ``queue_targets_check``'s check of these targets, queued before the
    model's trunk so that the call's host read does not wait for it (used only if it matches).
    """
    e, c, bias = _autocast(e, c, bias)
    _validate_tensors(e, c, targets, bias, targets_check)
    user = CallOptions(ignore_index, softcap, reduction, shift, label_smoothing, filter_eps,
                       return_lse, low_memory, vocab_parallel, workspace_mib, temperature,
                       return_entropy, batch_invariant).check(e.shape)
    v_total = c.shape[0]
    if vocab_parallel is not None:  # the targets index the whole vocabulary
        check_vocab_parallel(vocab_parallel, c)
        v_total = vocab_parallel.vocab_size(e.device)
    opts = user.kernel_options(e.dtype)
    lead = targets.shape
    targets = _shifted(targets, shift, ignore_index)
    e2, c, t2, bias = _kernel_layouts(e, c, targets, bias)
    e2, c, r = route_with_copies(e2, c, lambda e2, c: _route_of(
        e2, c, bias, opts, user, _needs_grad(e2, c, bias), _layouts(e2, c)))
    check, count = queued_or_new_check(targets_check, t2, v_total, ignore_index,
                                       split=r.fused.rows if r.fused else 0)
    if r.path == "three-matmul":  # an fp32 weight as it is: its gradient is the path's sums
        return FusedLce.apply(e2, c, t2, bias, opts, r, check, reduction == "mean")
    loss_rows, lse, ent_rows = _rows(e2, c, t2, bias, opts, r, check, vocab_parallel)
    raise_on_bad_targets(check, targets, v_total, ignore_index)
    return _outputs(loss_rows, lse if return_lse else None, ent_rows if return_entropy else None,
                    lead, shift, reduction, count)


def _rows(e2, c, t2, bias, opts: Options, r: Route, check, vocab_parallel):
    """(loss, lse, entropy rows) of a call that is not on the three-matmul path, by its entry
    (Route.entry). An fp32 weight under autocast is read as its 16-bit copy, made here."""
    c, bias = (None if t is None else t.to(e2.dtype) for t in (c, bias))
    if r.entry == "vocab-parallel":
        return vocab_parallel_rows(e2, c, t2, bias, opts, vocab_parallel, check, r)
    if r.entry == "compiled":
        loss_rows, lse, _, _, _, ent_rows = lce_rows(e2, c, t2, bias, *opts.op_args(),
                                                     config_key(e2.device, e2.dtype),
                                                     r.call.workspace_mib)
        return loss_rows, lse, ent_rows
    return _eager_rows(e2, c, t2, bias, opts, r, check)


def _shifted(targets: Tensor, shift: int, ignore_index: int) -> Tensor:
    """Position i predicts targets[..., i + shift]; the last `shift` positions predict nothing
    (and the first `shift` targets are never used, so they are not checked either)."""
    if not shift:
        return targets
    shifted = torch.full_like(targets, ignore_index)
    shifted[..., :-shift] = targets[..., shift:]
    return shifted


def _outputs(loss_rows, lse, ent_rows, lead, shift: int, reduction: str, count):
    """The call's return value from its per-row results (lse / ent_rows None: not asked for)."""
    def reduced(rows):
        # A sum over every row (the last `shift` positions are ignored, their loss 0): its
        # gradient reaches the backward as one expanded value: the rows weigh alike.
        if reduction == "none":
            return rows.view(lead)[..., :-shift] if shift else rows.view(lead)
        return rows.sum() if reduction == "sum" else rows.sum() / count

    if lse is not None:
        lse = lse.view(lead)[..., :-shift] if shift else lse.view(lead)
    loss = reduced(loss_rows)
    if ent_rows is not None:
        entropy = reduced(ent_rows)
        return LossEntropyLse(loss, entropy, lse) if lse is not None else LossEntropy(loss, entropy)
    return (loss, lse) if lse is not None else loss


def token_logprobs(e: Tensor, c: Tensor, targets: Tensor, *, return_entropy: bool = False,
                   temperature: float = 1.0, bias: Tensor | None = None,
                   ignore_index: int = -100, softcap: float | None = None, shift: int = 0,
                   low_memory: bool = False, batch_invariant: bool = False):
    """log p(target) per token of softmax(softcap(e @ c.T + bias) / temperature), shape
    targets.shape (``(..., T - shift)`` with shift), without the logits: ``-loss`` of
    ``linear_cross_entropy(reduction="none")``, so <= 0 and exact on confident tokens; 0 at
    ignored tokens. ``return_entropy=True`` returns ``TokenLogprobs(logprobs, entropy)``.
    Both are differentiable, together in one backward (e.g. a policy-gradient loss weighted
    per token plus an entropy bonus). ``batch_invariant=True``: each token's values (and dE
    row) the same bits whatever else is in the call (``linear_cross_entropy``)."""
    out = linear_cross_entropy(e, c, targets, bias=bias, ignore_index=ignore_index,
                               softcap=softcap, reduction="none", shift=shift,
                               low_memory=low_memory, temperature=temperature,
                               return_entropy=return_entropy, batch_invariant=batch_invariant)
    if return_entropy:
        return TokenLogprobs(out.loss.neg(), out.entropy)
    return out.neg()


def plan(e: Tensor, c: Tensor, targets: Tensor, *, bias: Tensor | None = None,
         ignore_index: int = -100, softcap: float | None = None, reduction: str = "mean",
         shift: int = 0, label_smoothing: float = 0.0, filter_eps: float | str | None = None,
         return_lse: bool = False, low_memory: bool = False,
         vocab_parallel: VocabParallel | None = None, workspace_mib: int | None = None,
         temperature: float = 1.0, return_entropy: bool = False,
         batch_invariant: bool = False) -> Route:
    """The route ``linear_cross_entropy`` takes with the same arguments, here and now (grad
    mode, autocast, use_target): the very Route object the call runs by (policy/route.py), with
    its path, its kernels (forward, W writers, filter), its chunks, the estimated peak bytes
    beyond the inputs and why a budget goes unused (``own_kernel.Plan`` is its type).
    Nothing is launched and no tensor's values are read; the arguments are checked as the call
    checks them. DTensor arguments are refused: pass the local shards and ``vocab_parallel``."""
    for name, t in (("e", e), ("c", c), ("targets", targets), ("bias", bias)):
        if not is_plain(t):
            raise TypeError(f"{name}: plan() takes plain tensors (got {type(t).__name__}); "
                            f"pass the local shard and vocab_parallel= where c is sharded")
    needs_grad = _needs_grad(e, c, bias)
    layouts = _planned_layouts(e, c, bias)
    if torch.is_autocast_enabled(e.device.type):  # stand-ins of the autocast dtype, no copies
        dtype = torch.get_autocast_dtype(e.device.type)
        weight_dtype = torch.float32 if _fp32_weight(e, c, bias) else dtype
        e = torch.empty((), dtype=dtype, device=e.device).expand(e.shape)
        c, bias = (None if t is None else torch.empty((), dtype=weight_dtype, device=t.device)
                   .expand(t.shape).requires_grad_(t.requires_grad) for t in (c, bias))
    _validate_tensors(e, c, targets, bias)
    user = CallOptions(ignore_index, softcap, reduction, shift, label_smoothing, filter_eps,
                       return_lse, low_memory, vocab_parallel, workspace_mib, temperature,
                       return_entropy, batch_invariant).check(e.shape)
    if vocab_parallel is not None:
        check_vocab_parallel(vocab_parallel, c)
    e2, opts = e.reshape(-1, e.shape[-1]), user.kernel_options(e.dtype)
    r = _route_of(e2, c, bias, opts, user, needs_grad, layouts)
    if r.needs_tma_copies:  # the call reads fresh copies of these (route_with_copies)
        fresh = (e2.shape[1] * e2.element_size()) % 16 == 0
        r = _route_of(e2, c, bias, opts, user, needs_grad,
                      tuple(fresh if ready is False else ready for ready in layouts))
    return r


def _planned_layouts(e: Tensor, c: Tensor, bias) -> tuple:
    """_layouts of the tensors a call with these arguments would hand the kernels, found
    without making them: None where the call reads a copy of its own (autocast's cast, a
    reshape that cannot be a view, a layout the kernels cannot read as it is)."""
    dtype = torch.get_autocast_dtype(e.device.type) \
        if torch.is_autocast_enabled(e.device.type) else e.dtype
    try:
        e2 = e.view(-1, e.shape[-1]) if e.dtype == dtype and e.dim() >= 1 else None
    except RuntimeError:  # reshape copies
        e2 = None
    e_read = e2 if e2 is not None and _readable_as_is(e2) else None
    c_kept = c.dtype == dtype and c.dim() == 2 and not _fp32_weight(e, c, bias)
    return layouts_of(e_read, c if c_kept and _readable_as_is(c) else None)


def _fp32_weight(e, c, bias) -> bool:
    """Whether c (and bias) are an fp32 weight whose gradient is wanted under 16-bit autocast:
    the call keeps them fp32 (the three-matmul path's dC sums are fp32 anyway and become the
    gradient; other paths cast them after the route, as autocast would)."""
    if not torch.is_autocast_enabled(e.device.type):
        return False
    dtype = torch.get_autocast_dtype(e.device.type)
    return (dtype != torch.float32 and c.dtype == torch.float32 and c.requires_grad
            and torch.is_grad_enabled() and (bias is None or bias.dtype == torch.float32))


def _autocast(e, c, bias):
    """e, c and bias in autocast's dtype where autocast is on (the GEMMs' dtype), but for an
    fp32 weight that needs its gradient (_fp32_weight): the route decides who casts it."""
    if torch.is_autocast_enabled(e.device.type):
        dtype = torch.get_autocast_dtype(e.device.type)
        if not _fp32_weight(e, c, bias):
            c, bias = c.to(dtype), bias.to(dtype) if bias is not None else None
        e = e.to(dtype)
    return e, c, bias


class LinearCrossEntropy(nn.Module):
    """nn.Module wrapper: ``LinearCrossEntropy(softcap=30.0)(e, c, targets)``."""

    def __init__(self, *, ignore_index: int = -100, softcap: float | None = None,
                 reduction: str = "mean", shift: int = 0, label_smoothing: float = 0.0,
                 filter_eps: float | str | None = None, return_lse: bool = False,
                 low_memory: bool = False, vocab_parallel: VocabParallel | None = None,
                 workspace_mib: int | None = None, temperature: float = 1.0,
                 return_entropy: bool = False, batch_invariant: bool = False):
        super().__init__()
        self.options = dict(ignore_index=ignore_index, softcap=softcap, reduction=reduction,
                            shift=shift, label_smoothing=label_smoothing, filter_eps=filter_eps,
                            return_lse=return_lse, low_memory=low_memory,
                            vocab_parallel=vocab_parallel, workspace_mib=workspace_mib,
                            temperature=temperature, return_entropy=return_entropy,
                            batch_invariant=batch_invariant)

    def forward(self, e: Tensor, c: Tensor, targets: Tensor, bias: Tensor | None = None):
        return linear_cross_entropy(e, c, targets, bias=bias, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())
