"""Public API: argument checks, layouts, shift and reduction around the op (ops.py)."""
from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from own_kernel.check_targets import check_and_count_targets, raise_on_bad_targets
from own_kernel.config import Config, config_for
from own_kernel.distributed import accepts_dtensors
from own_kernel.fused import FusedLce
from own_kernel.gemm import HostScalar
from own_kernel.ops import LceRowsEager, lce_rows
from own_kernel.options import FilterOptions, Options
from own_kernel.plan import FusedPlan, compaction_pays, fused_plan
from own_kernel.vocab_parallel import (VocabParallel, check_vocab_parallel,
                                       vocab_parallel_rows)

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# filter_eps="auto": skip a tile when every gradient entry is below the input dtype's resolution
# relative to the target's O(1) entry.
AUTO_EPS = {torch.bfloat16: 2.0**-12, torch.float16: 2.0**-14, torch.float32: 2.0**-20}
# ... but only in rows whose softmax is peaked (largest probability >= AUTO_FLAT_P_MAX). In a flat
# row the skipped tail carries almost all the mass and it correlates with the row's own hidden
# state (p_v grows with e.c_v), a direction no mean-row compensation can restore: on the suite's
# uniform inputs filtering every row costs a 2e-2 dE error (naive bf16: 2e-3), as Apple's does.
AUTO_FLAT_P_MAX = 2.0**-8


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

def _validate_tensors(e, c, targets, bias):
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
    _check_runnable(e.device, e.dtype)


def _validate_options(e, reduction, shift, label_smoothing, softcap, filter_eps, low_memory,
                      workspace_mib=None):
    if workspace_mib is not None and (not isinstance(workspace_mib, int)
                                      or isinstance(workspace_mib, bool) or workspace_mib < 0):
        raise ValueError(f"workspace_mib: expected None or an int >= 0; got {workspace_mib!r}")
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
    if 2 * n * v * d < cfg.compaction.fwd_min_flops:
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


def _options(dtype, ignore_index, softcap, label_smoothing, filter_eps, return_lse,
             low_memory) -> Options:
    filt = None
    if filter_eps == "auto":
        filt = FilterOptions(AUTO_EPS[dtype], AUTO_FLAT_P_MAX)
    elif filter_eps is not None and float(filter_eps) > 0:
        filt = FilterOptions(float(filter_eps))
    return Options(int(ignore_index), float(softcap) if softcap is not None else None,
                   float(label_smoothing), filt, bool(return_lse), low_memory,
                   torch.are_deterministic_algorithms_enabled())


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _fused_path(e2, c, bias, opts: Options, reduction: str, workspace_mib: int | None,
                eligible: bool) -> tuple[Config, FusedPlan] | None:
    """(config, plan) when this call takes the three-matmul path (fused.py): a mean or sum with
    gradients (eligible: the caller's conditions) whose row chunks fit the workspace
    (plan.fused_plan), else None (the recompute path runs). Decided without reading anything
    on the host: the path reads the targets' check itself once its first chunk is queued."""
    if not eligible or reduction == "none" or not e2.shape[0] or not _needs_grad(e2, c, bias):
        return None
    cfg = config_for(e2.device, e2.dtype)
    if workspace_mib is None and opts.filter is not None and not cfg.fused.filtered:
        # Measured (results/notes/fused-path.md): the filter skips (row, column) tiles in the
        # recompute path, but hardly a whole column block of a chunk of ~10^3 rows here, so
        # on Hopper filtered calls take this path only when asked to (an explicit workspace_mib).
        return None
    mib = workspace_mib
    if mib is None:
        mib = (cfg.fused.default_workspace_mib_fp32 if e2.dtype == torch.float32
               else cfg.fused.default_workspace_mib)
    if mib == 0:
        return None
    n, d = e2.shape
    plan, _ = fused_plan(n, c.shape[0], d, e2.element_size(), mib * 2**20, cfg,
                         filtered=opts.filter is not None)
    return None if plan is None else (cfg, plan)


def _eager_rows(e2, c, t2, bias, opts: Options, check):
    """(loss per row, lse per row or None) of an eager call. Gathered rows are what the
    backward needs anyway; a call without one (evaluation) keeps the forward's few floats of
    memory and relies on its skipped row blocks."""
    needs_grad = _needs_grad(e2, c, bias)
    rows = (None if opts.ignored_lse or opts.low_memory or check is None or not needs_grad
            else _rows_to_gather(e2, c, t2, opts.ignore_index, check))
    if rows is None:
        loss_rows, lse, *_ = LceRowsEager.apply(e2, c, t2, bias, opts, check)
        return loss_rows, lse
    # Only the used rows, gathered (index_select's backward scatters their dE back). Their lse
    # is not returned, so the others' is not needed.
    loss_used, *_ = LceRowsEager.apply(e2.index_select(0, rows), c, t2[rows], bias, opts,
                                            check)
    return loss_used.new_zeros(t2.shape).index_copy(0, rows, loss_used), None


@accepts_dtensors  # DTensor arguments (tensor parallel, FSDP2): distributed.py
def linear_cross_entropy(e: Tensor, c: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                         ignore_index: int = -100, softcap: float | None = None,
                         reduction: str = "mean", shift: int = 0, label_smoothing: float = 0.0,
                         filter_eps: float | str | None = None, return_lse: bool = False,
                         low_memory: bool = False, vocab_parallel: VocabParallel | None = None,
                         workspace_mib: int | None = None):
    """Cross-entropy of softcap(e @ c.T + bias) against targets, without materialising the logits.

    Same value and gradients as ``F.cross_entropy(softcap(e @ c.T + bias).float(), targets,
    ignore_index=..., reduction=..., label_smoothing=...)`` with softcap(x) = s * tanh(x / s).
    ``shift=k`` pairs position i with ``targets[..., i + k]`` (sequence dim = e's dim -2) without
    copying e; ``reduction="none"`` then returns shape ``(..., T - k)``. A mean over targets that
    are all ignore_index is NaN, as in torch. Any tensor layout is accepted. The loss is bitwise
    reproducible; the gradients are under ``torch.use_deterministic_algorithms(True)``. ``filter_eps`` (None = exact, float or "auto") skips gradient tiles whose every
    entry is below it; "auto" picks the dtype's eps and leaves rows with a flat softmax exact
    (AUTO_FLAT_P_MAX). ``return_lse=True`` also returns the per-token log-sum-exp.
    ``low_memory=True`` (exact only) bounds the backward's workspace to a small fraction of the
    gradients' size, at the cost of a second recompute of the logits (backward_low_memory.py);
    by default the backward holds an fp32 copy of dE (4 bytes per entry of e).
    ``vocab_parallel=VocabParallel(group, start, stop)``: c (and bias) are this rank's columns
    [start, stop) of the vocabulary, e and targets the whole problem's on every rank; the loss
    is the gathered problem's, dE is all-reduced, dC this shard's (eagerly: a graph break under
    torch.compile; vocab_parallel.py).
    ``workspace_mib``: for a mean or sum with gradients (eager, no lse, not low_memory), the
    budget of the three-matmul training path (fused.py): loss and gradients computed at once in
    row chunks, the call's memory beyond its gradients (a chunk's logits and, with several
    chunks, dC's fp32 accumulator) within it;
    None = the device's default (config.Fused: 1024 MiB, 512 MiB for fp32) for exact calls
    (filtered calls on Hopper keep the recompute path unless given a budget), 0 = off. When
    the chunks would not fit or be too small to pay (plan.fused_plan), the recompute path runs.
    """
    if torch.is_autocast_enabled(e.device.type):
        dtype = torch.get_autocast_dtype(e.device.type)
        e, c = e.to(dtype), c.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    _validate_tensors(e, c, targets, bias)
    _validate_options(e, reduction, shift, label_smoothing, softcap, filter_eps, low_memory,
                      workspace_mib)
    v_total = c.shape[0]
    if vocab_parallel is not None:  # the targets index the whole vocabulary
        check_vocab_parallel(vocab_parallel, c)
        v_total = vocab_parallel.vocab_size(e.device)
    opts = _options(e.dtype, ignore_index, softcap, label_smoothing, filter_eps, return_lse,
                    low_memory)
    lead = targets.shape
    if shift:
        # Position i predicts targets[..., i + shift]; the last `shift` positions predict nothing
        # (and the first `shift` targets are never used, so they are not checked either).
        shifted = torch.full_like(targets, ignore_index)
        shifted[..., :-shift] = targets[..., shift:]
        targets = shifted
    e2, c, t2, bias = _kernel_layouts(e, c, targets, bias)
    fused = _fused_path(e2, c, bias, opts, reduction, workspace_mib,
                        eligible=not (return_lse or low_memory or vocab_parallel is not None
                                      or torch.compiler.is_compiling()))
    check, count = check_and_count_targets(t2, v_total, ignore_index,
                                           split=fused[1].rows if fused else 0)
    if fused:
        return FusedLce.apply(e2, c, t2, bias, opts, *fused, check, reduction == "mean")
    if vocab_parallel is not None:
        loss_rows, lse = vocab_parallel_rows(e2, c, t2, bias, opts, vocab_parallel, check)
    elif torch.compiler.is_compiling():
        loss_rows, lse, *_ = lce_rows(e2, c, t2, bias, *opts.op_args())
    else:
        loss_rows, lse = _eager_rows(e2, c, t2, bias, opts, check)
    raise_on_bad_targets(check, targets, v_total, ignore_index)
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
                 low_memory: bool = False, vocab_parallel: VocabParallel | None = None,
                 workspace_mib: int | None = None):
        super().__init__()
        self.options = dict(ignore_index=ignore_index, softcap=softcap, reduction=reduction,
                            shift=shift, label_smoothing=label_smoothing, filter_eps=filter_eps,
                            return_lse=return_lse, low_memory=low_memory,
                            vocab_parallel=vocab_parallel, workspace_mib=workspace_mib)

    def forward(self, e: Tensor, c: Tensor, targets: Tensor, bias: Tensor | None = None):
        return linear_cross_entropy(e, c, targets, bias=bias, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())
