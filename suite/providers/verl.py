"""verl's fused linear cross-entropy kernel (``verl.utils.kernel.linear_cross_entropy``, PyPI
``verl``; its Triton kernels are in the sibling ``kernels.py``): per-token log-probabilities and
entropy of ``hidden @ weight.T / temperature`` without the logits, backward through both, as RL
trainers call it: ``linear_cross_entropy(hidden, weight, labels, temperature, "none")``.

verl's package ``__init__`` imports Ray, Hydra, transformers and more (installed with
``--no-deps`` they are absent), so :func:`load_kernel` imports the kernel module without running
``verl/__init__.py``, ``verl/utils/__init__.py`` or ``verl/utils/kernel/__init__.py``: empty
package modules stand in for those three, and the kernel's own imports (``verl.utils.device``,
``verl.plugin.platform``: torch and the standard library only) load from the installed files.

What verl requires, and what this provider does about it:
- hidden size % 128 == 0, 2-D contiguous CUDA inputs, int64 labels (asserted in
  ``efficient_entropy_forward``/``_backward``): other cells are ``unsupported`` rows;
- contiguous upstream gradients: ``efficient_entropy_backward`` asserts
  ``dlogprobs.is_contiguous() and dentropy.is_contiguous()``, so the gradient of ``H.sum()`` (an
  expanded tensor, stride 0) fails there with a bare AssertionError. The provider passes its
  outputs through an identity whose backward makes both gradients contiguous
  (:class:`ContiguousGrads`); :func:`probe_expanded_grads` shows the failure and the fix;
- no ``ignore_index``: an ignored label matches no vocabulary column and its log-prob is never
  written (``torch.empty``), so the provider gives verl label 0 there and zeroes those rows.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import traceback
import types
from pathlib import Path

import torch

from suite.registry import UnsupportedInput, all_of, needs_cuda, needs_module, register

PACKAGE = "verl"
VERSION = "0.9.1"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"
KERNEL_MODULE = "verl.utils.kernel.linear_cross_entropy"
# packages whose __init__ pulls verl's heavy dependencies: stand-ins replace them
STAND_INS = ("verl", "verl.utils", "verl.utils.kernel")
HIDDEN_MULTIPLE = 128
GRAD_ASSERTION = "dlogprobs.is_contiguous() and dentropy.is_contiguous()"
# figures: verl's colour; Okabe & Ito's eight are all taken by families, so it shares sky blue
# with the chunked baseline (its marker and line style tell them apart)
SKY_BLUE = "#56B4E9"


def load_kernel():
    """verl's kernel module, imported without running verl's package ``__init__`` files (the
    real package when the process imported it already)."""
    if KERNEL_MODULE in sys.modules:
        return sys.modules[KERNEL_MODULE]
    if "verl" not in sys.modules:
        spec = importlib.util.find_spec("verl")  # finds the folder, runs nothing
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{PACKAGE} is not installed (install: {INSTALL})")
        root = Path(list(spec.submodule_search_locations)[0])
        for name in STAND_INS:
            folder = root.joinpath(*name.split(".")[1:])
            stand_in = types.ModuleType(name, f"stand-in for {name} (suite.providers.verl)")
            stand_in.__path__ = [str(folder)]
            stand_in.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stand_in.__spec__.submodule_search_locations = stand_in.__path__
            sys.modules[name] = stand_in
    return importlib.import_module(KERNEL_MODULE)


class ContiguousGrads(torch.autograd.Function):
    """Identity on its tensors; backward hands each upstream gradient on contiguous (verl's
    backward asserts it; a sum's gradient is an expanded, stride-0 tensor)."""

    @staticmethod
    def forward(ctx, *tensors):
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(None if g is None else g.contiguous() for g in grads)


def unsupported_reason(e, c, targets) -> str | None:
    """Why verl's kernel cannot take these inputs (its assertions), else None."""
    d = e.shape[-1]
    if e.dim() != 2 or c.dim() != 2 or targets.dim() != 1:
        return f"verl asserts 2-D hidden and weight and 1-D labels; got {e.dim()}-D, " \
               f"{c.dim()}-D, {targets.dim()}-D"
    if d % HIDDEN_MULTIPLE:
        return f"verl asserts hidden size % {HIDDEN_MULTIPLE} == 0; D is {d}"
    if not (e.is_contiguous() and c.is_contiguous()):
        return "verl asserts contiguous hidden and weight"
    return None


def logp_entropy(e, c, targets, *, ignore_index=-100, temperature=1.0):
    """(log-prob of each target, entropy), fp32, differentiable through verl's kernel; rows
    whose target is ``ignore_index`` are 0 in both (and get no gradient)."""
    why = unsupported_reason(e, c, targets)
    if why:
        raise UnsupportedInput(why)
    valid = targets != ignore_index
    labels = targets.masked_fill(~valid, 0).contiguous()
    logp, entropy = load_kernel().linear_cross_entropy(e, c, labels, float(temperature), "none")
    logp, entropy = ContiguousGrads.apply(logp, entropy)
    zero = torch.zeros((), device=logp.device, dtype=logp.dtype)
    return torch.where(valid, logp, zero), torch.where(valid, entropy, zero)


def ran() -> str:
    module = sys.modules.get(KERNEL_MODULE)
    where = f" from {Path(module.__file__).parent}" if module is not None else ""
    return (f"{KERNEL_MODULE} (Triton){where}; upstream gradients made contiguous (its backward "
            f"asserts {GRAD_ASSERTION})")


@register("verl_lce",
          summary="verl linear_cross_entropy (fused Triton log-prob + entropy, reduction "
                  "'none'), mean NLL over non-ignored targets; contiguous upstream gradients",
          features=(), requires=all_of(needs_module("verl", PACKAGE, INSTALL), needs_cuda),
          package=PACKAGE, install=INSTALL, ran=ran,
          style=dict(color=SKY_BLUE, marker="h", linestyle="-."), order=70)
def verl_lce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    logp, _ = logp_entropy(e, c, targets, ignore_index=ignore_index)
    return -logp.sum() / (targets != ignore_index).sum().clamp_min(1)


def _assertion_site(err: AssertionError) -> str:
    frame = traceback.extract_tb(err.__traceback__)[-1]
    return f"AssertionError at {Path(frame.filename).name}:{frame.lineno}: {frame.line}"


def probe_expanded_grads(n=256, d=256, v=2048, device="cuda") -> dict:
    """verl's backward with the upstream gradients of ``H.sum()`` and ``logp.sum()`` (expanded,
    stride 0): called bare, and through :func:`logp_entropy`. Returns what each did."""
    g = torch.Generator(device="cpu").manual_seed(0)
    e = (torch.randn(n, d, generator=g) / d ** 0.5).to(device, torch.bfloat16)
    c = torch.randn(v, d, generator=g).to(device, torch.bfloat16)
    t = torch.randint(0, v, (n,), generator=g).to(device)
    out = {}
    for objective in ("entropy.sum()", "logp.sum()"):
        for how, call in (("bare", lambda ee, cc: load_kernel().linear_cross_entropy(
                              ee, cc, t, 1.0, "none")),
                          ("suite provider", lambda ee, cc: logp_entropy(ee, cc, t))):
            ee, cc = e.detach().requires_grad_(), c.detach().requires_grad_()
            logp, entropy = call(ee, cc)
            picked = entropy if objective.startswith("entropy") else logp
            try:
                picked.sum().backward()
                out[f"{objective}, {how}"] = "ok"
            except AssertionError as err:
                out[f"{objective}, {how}"] = _assertion_site(err)
    return out
