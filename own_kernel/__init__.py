"""cce-bench's own Cut Cross-Entropy kernel in Triton.

    from own_kernel import linear_cross_entropy
    loss = linear_cross_entropy(hidden, lm_head.weight, targets, softcap=30.0)
"""
from own_kernel.api import LinearCrossEntropy, linear_cross_entropy

__all__ = ["linear_cross_entropy", "LinearCrossEntropy"]
