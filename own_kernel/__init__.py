"""cce-bench's own Cut Cross-Entropy kernel in Triton.

    from own_kernel import linear_cross_entropy
    loss = linear_cross_entropy(hidden, lm_head.weight, targets, softcap=30.0)
    print(plan(hidden, lm_head.weight, targets, softcap=30.0))  # its route and memory, unrun

README.md (in this folder) maps the package: api.py, policy/ (every decision of a call: its
route), paths/ (what each path runs), kernels/ (Triton kernels and their launchers),
integrations/ (Hugging Face, DTensors).
"""
from importlib import metadata as _metadata

from own_kernel.api import (LinearCrossEntropy, LossEntropy, LossEntropyLse, TokenLogprobs,
                            linear_cross_entropy, plan, token_logprobs)
from own_kernel.paths.targets import queue_targets_check
from own_kernel.paths.vocab_parallel import VocabParallel
from own_kernel.policy.route import Route as Plan

# The installed distribution's version; a checkout used without installing says so.
__version__ = next((d.version for d in _metadata.distributions(name="cce-bench")), "0+unknown")

__all__ = ["linear_cross_entropy", "LinearCrossEntropy", "VocabParallel", "plan", "Plan",
           "token_logprobs", "TokenLogprobs", "LossEntropy", "LossEntropyLse",
           "queue_targets_check"]
