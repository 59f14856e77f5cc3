"""Liger Kernel: cross-entropy on materialised logits, and its fused linear cross-entropy."""
from suite.providers.naive import logits_of
from suite.registry import all_of, needs_module, needs_triton_device, register

_requires = all_of(needs_module("liger_kernel", "liger-kernel"), needs_triton_device)


@register("liger_ce", summary="LigerCrossEntropyLoss on materialised logits",
          features=("bias", "softcap"), requires=_requires)
def liger_ce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    from liger_kernel.transformers import LigerCrossEntropyLoss

    loss = LigerCrossEntropyLoss(ignore_index=ignore_index, softcap=softcap)
    return loss(logits_of(e, c, bias), targets)


@register("liger_flce", summary="LigerFusedLinearCrossEntropyLoss (chunked, grads in forward)",
          features=("bias", "softcap"), requires=_requires)
def liger_flce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, softcap=softcap)
    return loss(c, e, targets, bias)  # weight first
