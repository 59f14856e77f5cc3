"""The paper's baseline and its direct variants: full logits, upcast, F.cross_entropy."""
import functools

import torch
import torch.nn.functional as F

from suite.registry import register


def logits_of(e, c, bias=None, softcap=None):
    """Logits in the input dtype, as a model's lm_head would produce them."""
    logits = e @ c.T
    if bias is not None:
        logits = logits + bias
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits


BLACK, ORANGE = "#000000", "#E69F00"  # figures: the baseline's and torch.compile's colours


@register("naive", summary="E @ C.T in the input dtype, softcap, .float(), F.cross_entropy",
          features=("bias", "softcap"), style=dict(color=BLACK, marker="o", linestyle="-"),
          order=0)
def naive(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    logits = logits_of(e, c, bias, softcap)
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)


@functools.cache
def _compiled():
    return torch.compile(naive)


@register("torch_compile", summary="the naive baseline under torch.compile",
          features=("bias", "softcap"), style=dict(color=ORANGE, marker="s", linestyle="-"),
          order=2)
def torch_compile(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _compiled()(e, c, targets, bias=bias, softcap=softcap, ignore_index=ignore_index)


@register("selective", summary="project only rows whose target is not ignore_index, then naive CE",
          features=("bias", "softcap"), style=dict(color=BLACK, marker="v", linestyle=":"),
          order=1)
def selective(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    keep = targets != ignore_index
    # Boolean indexing copies only the kept rows; the logits shrink by the ignored fraction.
    logits = logits_of(e[keep], c, bias, softcap)
    return F.cross_entropy(logits.float(), targets[keep])
