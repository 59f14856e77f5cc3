"""Liger Kernel: cross-entropy on materialised logits, and its fused linear cross-entropy on each
of its two CUDA backends.

Liger 0.8.5 picks the fused linear CE's inner cross-entropy kernel per call: its
``LigerFusedLinearCrossEntropyLoss`` module always runs the Triton kernel, while
``liger_kernel.functional.fused_linear_cross_entropy`` dispatches, and with no ``impl`` prefers
the CuTe-DSL kernel on Hopper and newer whenever ``cutlass.cute`` imports. Both providers here
call the dispatching function with ``impl`` named, so neither depends on what is installed;
``liger_flce_cute`` also runs in Liger's strict mode, which turns its fallback to Triton (for a
vocabulary the CuTe kernel cannot load) into an error, so its rows are the CuTe kernel's or say
why not. On top of that it counts the CuTe kernel's launches in each call (Liger's CuTe backend
replaces only the per-chunk cross-entropy; the chunks' GEMMs are cuBLAS on both backends, so
the times alone cannot tell the two apart): a call that launched none is an error, and the
row's ``ran`` column names the kernel and its launches.
"""
import contextlib
import importlib
import os

from suite.providers.naive import logits_of
from suite.registry import (all_of, installed_distribution, needs_cuda, needs_module,
                            needs_triton_device, register)

PACKAGE = "liger-kernel"
VERSION = "0.8.5"
INSTALL = f"pip install {PACKAGE}=={VERSION}"
CUTE_INSTALL = f'pip install "{PACKAGE}[cutedsl]=={VERSION}"'
TRITON_IMPL = "nvidia-triton"
CUTE_IMPL = "nvidia-cutedsl"
STRICT_ENV = "LIGER_KERNEL_STRICT"
DSL_PACKAGE = "nvidia-cutlass-dsl"
# The CuTe-DSL cross-entropy launch that Liger's CuTe per-chunk primitive calls (imported from
# this module at each call, so counting it here sees every launch).
CUTE_CE_MODULE = "liger_kernel.ops.cutedsl.ops.cross_entropy"
CUTE_CE_LAUNCH = "_launch_ce_fwd"
GREEN = "#009E73"  # figures: Liger's family colour

_has = needs_module("liger_kernel", PACKAGE, INSTALL)
_requires = all_of(_has, needs_triton_device)


def _interpreter_limits(device, *, bias, softcap):
    """Liger's Triton cross-entropy kernel calls ``softcap.to(tl.float32)`` on its float
    argument: compiled, a scalar argument is a tensor; Triton's interpreter passes it as a
    Python float, which has no ``.to``, so softcap cells cannot run on the CPU."""
    if device.type == "cpu" and softcap is not None:
        return ("Liger's softcap path calls .to() on a float kernel argument, which Triton's "
                "interpreter passes as a Python float: it runs on CUDA only")
    return None


def _style(marker, linestyle):
    return dict(color=GREEN, marker=marker, linestyle=linestyle)


@register("liger_ce", summary="LigerCrossEntropyLoss on materialised logits",
          features=("bias", "softcap"), requires=_requires, package=PACKAGE, install=INSTALL,
          limits=_interpreter_limits, style=_style("d", "--"), order=31)
def liger_ce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    from liger_kernel.transformers import LigerCrossEntropyLoss

    loss = LigerCrossEntropyLoss(ignore_index=ignore_index, softcap=softcap)
    return loss(logits_of(e, c, bias), targets)


def _flce(e, c, targets, bias, softcap, ignore_index, impl):
    from liger_kernel.functional import fused_linear_cross_entropy

    loss, *_ = fused_linear_cross_entropy(e, c, targets, bias, ignore_index=ignore_index,
                                          softcap=softcap, impl=impl)
    return loss


@register("liger_flce",
          summary=f"Liger fused linear CE (chunked, grads in forward), impl={TRITON_IMPL!r}",
          features=("bias", "softcap"), requires=_requires, package=PACKAGE, install=INSTALL,
          limits=_interpreter_limits, style=_style("D", "-"), order=30)
def liger_flce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _flce(e, c, targets, bias, softcap, ignore_index, TRITON_IMPL)


@contextlib.contextmanager
def counted_calls(module_name: str, attr: str):
    """Inside: ``module.attr`` counts its calls in the yielded one-element list (a function
    that imports ``attr`` from ``module`` at each call sees the counting one). A module that
    does not import (no CuTe DSL) counts nothing: the call itself then says why it failed."""
    calls = [0]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        yield calls
        return
    original = getattr(module, attr)

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(module, attr, counting)
    try:
        yield calls
    finally:
        setattr(module, attr, original)


_LAST_CUTE_LAUNCHES: list[int] = []  # the last liger_flce_cute call's CuTe launches


def cute_ran() -> str:
    """liger_flce_cute's ``ran``: the CuTe-DSL kernel and its launches in the last call."""
    if not _LAST_CUTE_LAUNCHES:
        return ""
    dsl = installed_distribution(DSL_PACKAGE)
    return (f"inner CE {CUTE_CE_MODULE}.{CUTE_CE_LAUNCH} (CuTe DSL"
            f"{f' {dsl.version}' if dsl else ''}): {_LAST_CUTE_LAUNCHES[0]} launches per call")


def _needs_cute(device):
    """Liger's CuTe-DSL kernels need the CuTe DSL and an sm_90 or newer GPU."""
    import importlib.util

    import torch

    if importlib.util.find_spec("cutlass") is None:
        return f"nvidia-cutlass-dsl (CuTe DSL) is not installed (install: {CUTE_INSTALL})"
    index = device.index or 0
    if torch.cuda.get_device_capability(index) < (9, 0):
        return f"Liger's CuTe-DSL kernels need sm_90 or newer, this GPU is sm_" \
               f"{''.join(map(str, torch.cuda.get_device_capability(index)))}"
    return None


@register("liger_flce_cute",
          summary=f"Liger fused linear CE, impl={CUTE_IMPL!r} (inner CE in CuTe DSL; no silent "
                  f"fallback to Triton)",
          features=("bias", "softcap"), requires=all_of(_has, needs_cuda, _needs_cute),
          package=PACKAGE, install=CUTE_INSTALL, style=_style("X", ":"), order=32,
          ran=cute_ran)
def liger_flce_cute(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    # Liger warns once per process and runs its Triton kernel when the CuTe one cannot take a
    # chunk; in its strict mode (read at each fallback) it raises instead, so such a cell's row
    # is an error saying why, not a Triton time under a CuTe name.
    before = os.environ.get(STRICT_ENV)
    os.environ[STRICT_ENV] = "1"
    try:
        with counted_calls(CUTE_CE_MODULE, CUTE_CE_LAUNCH) as launches:
            loss = _flce(e, c, targets, bias, softcap, ignore_index, CUTE_IMPL)
    finally:
        if before is None:
            del os.environ[STRICT_ENV]
        else:
            os.environ[STRICT_ENV] = before
    _LAST_CUTE_LAUNCHES[:] = [launches[0]]
    if not launches[0]:
        raise RuntimeError(f"Liger's impl={CUTE_IMPL!r} launched no CuTe-DSL cross-entropy "
                           f"kernel ({CUTE_CE_MODULE}.{CUTE_CE_LAUNCH}) in this call")
    return loss
