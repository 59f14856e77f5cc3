"""The kernel tools' only window into ``own_kernel``'s private modules.

The public API (``own_kernel.linear_cross_entropy``) is all the tools need to call the kernel;
what they also read (the forward pass alone, the config in force, an override of it, a
backward's chunk plan and what its filter kept, the compiled kernels' resources) is not public
and changes with the kernel. Each such use is one function here, so a change inside
``own_kernel`` is adapted in this file only. The kernel keeps no record of its calls: the plan is
recomputed from ``own_kernel.plan`` (pure), and the filter's counts are read by wrapping the
filtered loop for the duration of a ``with``.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch


def forward_lse(e, c, targets, softcap):
    """The forward pass alone (no autograd), by the forward kernel a call of these tensors
    takes (its route): returns the rows' log-sum-exp."""
    from own_kernel.paths.forward import forward
    from own_kernel.policy.config import config_for
    from own_kernel.policy.options import Options
    from own_kernel.policy.route import call_of, layouts_of, route

    opts = Options(softcap=softcap)
    e_ready, c_ready = layouts_of(e, c)
    call = call_of(e, c, None, opts, needs_grad=False, e_tma_ready=e_ready, c_tma_ready=c_ready)
    return forward(e, c, None, targets, opts, route(call, config_for(e.device, e.dtype)))[1]


def config_in_force(device: torch.device, dtype: torch.dtype) -> dict:
    """The kernel's config for this device and dtype, overrides included, as a nested dict."""
    from own_kernel.policy.config import config_for

    return dataclasses.asdict(config_for(device, dtype))


def config_override(override: dict):
    """A context: the kernel runs with ``override`` (nested field names of own_kernel.policy.config,
    e.g. {"forward": {"tma": False}}) on top of its config."""
    from own_kernel.policy.config import overridden

    return overridden(override)


def backward_plan(n, v, d, dtype, device, filtered) -> list:
    """The chunks [(start, width, "dC" | "tail")] a recompute backward of this shape runs
    (contiguous inputs: TMA-readable where their rows are 16-byte multiples), filtered or
    not, as its route plans them."""
    from own_kernel.policy.config import config_for
    from own_kernel.policy.route import Call, route

    device = torch.device(device)
    call = Call(n, v, d, dtype, workspace_mib=0, filtered=filtered,
                on_cuda=device.type == "cuda")
    plan = route(call, config_for(device, dtype)).vocab_chunks(filtered)
    return [(ch.v_start, ch.width, "tail" if ch.in_tail else "dC") for ch in plan]


@contextlib.contextmanager
def filter_record():
    """Inside the block, each filtered backward appends {'filtered': bool, 'kept': [columns
    kept per chunk] or None, 'flat': rows that never skip} to the yielded list."""
    from own_kernel.paths import recompute as backward

    records, run = [], backward.FilteredRun.run

    def recording(self, plan, replan):
        filtered = run(self, plan, replan)
        sums = self.writer.g.sums
        flat = self.decision.flat
        records.append(dict(filtered=filtered, flat=None if flat is None else flat.numel(),
                            kept=sums.kept_count.tolist() if filtered else None))
        return filtered

    backward.FilteredRun.run = recording
    try:
        yield records
    finally:
        backward.FilteredRun.run = run


def compiled_kernels() -> dict:
    """Every compiled variant of the kernel package's Triton kernels, by name: objects with
    n_regs, n_spills and metadata (shared, num_warps, num_stages)."""
    import importlib
    import pkgutil

    import own_kernel
    from triton.runtime.jit import JITFunction

    out = {}
    for info in pkgutil.walk_packages(own_kernel.__path__, "own_kernel."):
        module = importlib.import_module(info.name)
        for name, fn in vars(module).items():
            if isinstance(fn, JITFunction) and name.startswith("cce_"):
                for i, compiled in enumerate(_compiled_variants(fn)):
                    out[f"{name}#{i}"] = compiled
    return out


def _compiled_variants(fn) -> list:
    variants = []
    for cache in getattr(fn, "device_caches", {}).values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        variants += list(kernels.values()) if isinstance(kernels, dict) else []
    return variants


def run_portable_forward(e, c, targets, softcap) -> None:
    """The forward on the portable path (on a CUDA GPU, its tiles are tuned on first use)."""
    from own_kernel.policy.config import use_target

    with use_target("portable"):
        forward_lse(e, c, targets, softcap)


def run_portable_loss_and_grad(e, c, targets, softcap, filter_eps=None) -> None:
    """Loss and gradients on the portable path through the recompute backward (workspace_mib=0:
    not the three-matmul path), so its softmax_grad and dlogits tiles are tuned on first use."""
    from own_kernel import linear_cross_entropy
    from own_kernel.policy.config import use_target

    e, c = e.detach().requires_grad_(), c.detach().requires_grad_()
    with use_target("portable"):
        linear_cross_entropy(e, c, targets, softcap=softcap, filter_eps=filter_eps,
                             workspace_mib=0).backward()


def portable_tile_cache():
    """(the tile cache's path, its entries)."""
    from own_kernel.policy.autotune import cache_path, read_cache

    return cache_path(), read_cache()
