"""The kernel tools' only window into ``own_kernel``'s private modules.

The public API (``own_kernel.linear_cross_entropy``) is all the tools need to call the kernel;
what they also read — the forward pass alone, the config in force, an override of it, the last
call's chunk plan and compiled kernels — is not public and changes with the kernel. Each such use
is one function here, so a change inside ``own_kernel`` is adapted in this file only.
"""
from __future__ import annotations

import contextlib
import json
import os

import torch


def forward_lse(e, c, targets, softcap):
    """The forward pass alone (no autograd): returns the rows' log-sum-exp."""
    from own_kernel.configs import config_for
    from own_kernel.forward import forward

    return forward(e, c, None, targets, softcap, 0.0, -100, config_for(e.device, e.dtype))[1]


def config_in_force(device: torch.device, dtype: torch.dtype) -> dict:
    """The kernel's config for this device and dtype, overrides included."""
    from own_kernel.configs import config_for

    return config_for(device, dtype)


@contextlib.contextmanager
def config_override(override: dict):
    """Run the kernel with ``override`` merged into its config (CCE_OWN_CONFIG)."""
    previous = os.environ.get("CCE_OWN_CONFIG")
    os.environ["CCE_OWN_CONFIG"] = json.dumps(override)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CCE_OWN_CONFIG", None)
        else:
            os.environ["CCE_OWN_CONFIG"] = previous


def last_backward_plan() -> dict:
    """The last backward's chunks [(start, width, kind)], its flat rows and, filtered, how many
    columns each cuBLAS chunk kept (keys plan, num_flat, kept_count)."""
    from own_kernel.backward import LAST_PLAN

    return dict(LAST_PLAN)


def last_compiled_kernels() -> dict:
    """The last compiled Triton kernel of each launch site (registers, spills, shared memory)."""
    from own_kernel.forward import LAST_COMPILED

    return dict(LAST_COMPILED)
