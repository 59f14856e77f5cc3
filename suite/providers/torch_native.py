"""PyTorch's own F.linear_cross_entropy (chunked when options are given; torch >= 2.13)."""
import torch
import torch.nn.functional as F

from suite.registry import register


def _requires(device):
    if not hasattr(F, "linear_cross_entropy") or not hasattr(torch.nn, "LinearCrossEntropyOptions"):
        return f"torch {torch.__version__} has no F.linear_cross_entropy (needs torch >= 2.13)"
    return None


@register("torch_native", summary="F.linear_cross_entropy with LinearCrossEntropyOptions()",
          features=("bias",), requires=_requires,
          style=dict(color="#CC79A7", marker="<", linestyle="-"), order=4)
def torch_native(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return F.linear_cross_entropy(e, c, targets, linear_bias=bias, ignore_index=ignore_index,
                                  options=torch.nn.LinearCrossEntropyOptions())
