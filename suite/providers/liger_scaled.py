"""Liger's fused linear scaled cross-entropy (liger-kernel 0.8.5,
``liger_kernel.ops.fused_linear_scaled_cross_entropy.LigerFusedLinearScaledCrossEntropyFunction``):
per-token NLL and, on request, a differentiable per-token entropy, with a temperature; no bias,
no softcap, no reduction (the caller reduces, so the backward takes per-token gradients).

Its ``apply(_input, weight, target, temperature=1.0, ignore_index=-100, m_tiles_per_cluster=1,
return_entropy=False, selected_token_ids=None)`` dispatches by device: on an sm_90 GPU to its
CuTe-DSL kernel (``LigerFusedScaledCrossEntropySM90Function``: bf16 only, needs
``nvidia-cutlass-dsl``), elsewhere (another GPU, the CPU) to a 512-token chunked PyTorch
fallback. The row's ``ran`` column names the autograd function that made the output, read from
the output's ``grad_fn`` after the call, so a fallback can never pass for the CuTe kernel.

``liger_scaled_ce`` is the mean of the NLL over the non-ignored targets (the suite's loss);
:func:`logp_entropy` gives the RL tool (suite/kernel/rl.py) its log-probs and entropy.
"""
import importlib.util

import torch

from suite.providers.liger import CUTE_INSTALL, GREEN, INSTALL, PACKAGE
from suite.registry import all_of, needs_module, register

FUNCTION = "LigerFusedLinearScaledCrossEntropyFunction"
SM90_FUNCTION = "LigerFusedScaledCrossEntropySM90Function"
FALLBACK_FUNCTION = "_FusedLinearPPOFallbackFunction"
# what each autograd function is, for the ran column
KERNELS = {SM90_FUNCTION: "CuTe-DSL SM90 kernel", FALLBACK_FUNCTION: "PyTorch 512-token chunks"}

_LAST_RAN: list[str] = []  # the last call's autograd function, as ran() reports it


def _needs_dsl_on_sm90(device):
    """On sm_90 Liger imports its CuTe-DSL kernel unconditionally (no fallback there)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if torch.cuda.get_device_capability(device.index or 0) == (9, 0) \
            and importlib.util.find_spec("cutlass") is None:
        return (f"on sm_90 Liger's scaled CE runs its CuTe-DSL kernel, and nvidia-cutlass-dsl "
                f"(CuTe DSL) is not installed (install: {CUTE_INSTALL})")
    return None


def _record(output: torch.Tensor) -> None:
    """Remember which autograd function made ``output`` (Liger picks it per device); without
    an autograd graph (no_grad), the one Liger's dispatch picks for the output's device."""
    if output.grad_fn is not None:
        name = type(output.grad_fn).__name__.removesuffix("Backward")
    else:
        from liger_kernel.ops.fused_linear_scaled_cross_entropy import _resolve_implementation

        name = _resolve_implementation(output.device).__name__
    _LAST_RAN[:] = [name]


def ran() -> str:
    if not _LAST_RAN:
        return ""
    name = _LAST_RAN[0]
    return f"{name} ({KERNELS[name]})" if name in KERNELS else name


def scaled_ce(e, c, targets, *, ignore_index=-100, return_entropy=False, temperature=1.0):
    """Liger's per-token NLL (fp32), and its entropy when asked (bf16 on the SM90 kernel)."""
    from liger_kernel.ops.fused_linear_scaled_cross_entropy import (
        LigerFusedLinearScaledCrossEntropyFunction)

    out = LigerFusedLinearScaledCrossEntropyFunction.apply(
        e, c, targets, temperature, ignore_index, 1, return_entropy)
    nll = out[0] if return_entropy else out
    _record(nll)
    return out


def logp_entropy(e, c, targets):
    """(log-prob of each target, entropy), both fp32, differentiable: for the RL tool."""
    nll, entropy = scaled_ce(e, c, targets, return_entropy=True)
    return -nll.float(), entropy.float()


@register("liger_scaled_ce",
          summary=f"Liger {FUNCTION} (per-token NLL; CuTe-DSL kernel on sm_90, PyTorch chunks "
                  f"elsewhere), mean over non-ignored targets",
          features=(), requires=all_of(needs_module("liger_kernel", PACKAGE, INSTALL),
                                       _needs_dsl_on_sm90),
          package=PACKAGE, install=CUTE_INSTALL, ran=ran,
          style=dict(color=GREEN, marker="v", linestyle="-."), order=33)
def liger_scaled_ce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    nll = scaled_ce(e, c, targets, ignore_index=ignore_index)
    # ignored rows are 0 in Liger's output; the mean is over the others
    return nll.sum() / (targets != ignore_index).sum().clamp_min(1)
