"""Liger's tensor-parallel fused linear scaled cross-entropy (liger-kernel 0.8.5,
``LigerFusedLinearScaledCrossEntropyTPFunction.apply(_input, weight_shard, target, tp_group,
temperature=1.0, ignore_index=-100, tiles_per_reduce=1, return_entropy=False)``).

Each rank holds an equal vocabulary shard of the weight (rank r holds rows [r·V/K, (r+1)·V/K));
targets stay global. The native path (bf16, sm_90 or sm_100) is a CUTLASS + NVSHMEM kernel from
the separate package ``liger-cute-kernels``, whose cross-rank MAX/SUM reductions run in the GEMM
epilogue over NVLink (NVLS multicast, or direct peer mappings where multicast is off) on an
NVSHMEM team that ``liger_cute_kernels.configure(...)`` prepares on every rank first. Without
that package Liger runs a 512-token chunked PyTorch fallback with all-reduces instead.

Two ways in:
- ``liger_scaled_ce_tp``, the single-GPU provider, is always ``unavailable`` (a provider there is
  one process with the whole weight), its reason naming what a run needs;
- the vocabulary-parallel bench (``python -m suite bench --vocab-parallel K``, suite/ranks.py)
  measures it for real: :func:`sharded_fn` configures LCK once per rank process and calls the
  function on the rank's shard. ``liger_scaled_ce_tp`` there is the native kernel only (a call
  that Liger routed to its fallback is an error naming it); ``liger_scaled_ce_tp_torch`` is
  Liger's own fallback, called directly. The loss is the mean NLL over non-ignored targets.

NVSHMEM's symmetric heap and LCK's workspaces are allocated outside torch's allocator, so the
rows' peak memory leaves them out; the ``ran`` column gives the device memory ``configure``
took on the rank (``torch.cuda.mem_get_info`` before and after).
"""
import importlib.util

import torch

from suite.providers.liger import GREEN, PACKAGE, VERSION
from suite.registry import register

FUNCTION = "LigerFusedLinearScaledCrossEntropyTPFunction"
NATIVE_FUNCTION = "LigerFusedLinearScaledCrossEntropyNativeTPFunction"
NATIVE_PACKAGE = "liger-cute-kernels"
NATIVE_INSTALL = f'pip install "{PACKAGE}[lck]=={VERSION}" "{NATIVE_PACKAGE}[cu13]=={VERSION}"'
HIDDEN_ALIGNMENT = 8  # LCK pads the hidden size to this; its capacity is the padded size

# Per rank process, because LCK's runtime is per process: the capacity configure() was given
# (it can be reused by smaller calls, never grown), the memory it took, the last call's function.
_LCK: dict = {}
_LAST_RAN: list[str] = []


def missing_here() -> list[str]:
    """What this process lacks for the native TP kernel, besides the ranks themselves."""
    missing = []
    if importlib.util.find_spec("liger_kernel") is None:
        missing.append(f"{PACKAGE} is not installed")
    if importlib.util.find_spec("liger_cute_kernels") is None:
        missing.append(f"{NATIVE_PACKAGE} (CUTLASS + NVSHMEM kernels) is not installed "
                       f"(install: {NATIVE_INSTALL})")
    return missing


def why_unavailable(device, native: bool = True) -> str:
    team = (" and an NVSHMEM team prepared by liger_cute_kernels.configure()" if native else "")
    reason = (f"Liger's tensor-parallel scaled CE needs one process per GPU, each with a "
              f"vocabulary shard of the weight, torch.distributed{team}; a provider here is "
              f"one process on one GPU (measure it with: python -m suite bench --vocab-parallel K)")
    missing = missing_here() if native else []
    return reason + ("; also: " + "; ".join(missing) if missing else "")


@register("liger_scaled_ce_tp",
          summary=f"Liger {FUNCTION} (vocab-parallel, CUTLASS + NVSHMEM): needs several ranks",
          features=(), requires=why_unavailable, package=NATIVE_PACKAGE, install=NATIVE_INSTALL,
          style=dict(color=GREEN, marker="^", linestyle="-."), order=34)
def liger_scaled_ce_tp(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    # never reached by the runner (requires always says why); a direct call gets the same reason
    raise RuntimeError(why_unavailable(e.device))


@register("liger_scaled_ce_tp_torch",
          summary=f"Liger {FUNCTION}'s PyTorch fallback (vocab-parallel, 512-token chunks, "
                  f"all-reduces): needs several ranks",
          features=(), requires=lambda device: why_unavailable(device, native=False),
          package=PACKAGE, style=dict(color=GREEN, marker="<", linestyle=":"), order=35)
def liger_scaled_ce_tp_torch(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    raise RuntimeError(why_unavailable(e.device, native=False))


# ---- the vocabulary-parallel bench's calls (suite/ranks.py) -----------------------------------

def _native_core_error() -> str | None:
    """Why LCK's native core does not load here (None: it loads)."""
    try:
        from liger_cute_kernels import tvm_ffi

        tvm_ffi._load_module()
    except Exception as exc:  # noqa: BLE001 - any failure to load is the reason
        return f"{type(exc).__name__}: {exc}"
    return None


def sharded_unavailable(name: str, device) -> str | None:
    """Why ``name`` cannot run on this rank's ``device`` (None: it can)."""
    if torch.device(device).type != "cuda":
        return "Liger's tensor-parallel scaled CE takes CUDA tensors only"
    if importlib.util.find_spec("liger_kernel") is None:
        return f"{PACKAGE} is not installed"
    if name == "liger_scaled_ce_tp_torch":
        return None
    major, _ = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return f"the native kernel is built for sm_90 and sm_100; this GPU is sm_{major}x"
    missing = missing_here()
    if missing:
        return "; ".join(missing)
    error = _native_core_error()
    return f"{NATIVE_PACKAGE}'s native core does not load: {error}" if error else None


def sharded_unsupported(name: str, cell, world: int) -> str | None:
    """Why the cell's options are not Liger's TP function's (None: they are)."""
    if cell.bias:
        return f"{name} has no bias input"
    if cell.softcap is not None:
        return f"{name} has no softcap option"
    if cell.v % world:
        return (f"{name} takes equal vocabulary shards (rank r holds rows r*V/K onward): "
                f"V {cell.v} is not a multiple of {world} ranks")
    if name == "liger_scaled_ce_tp" and cell.dtype != "bf16":
        return f"the native kernel is bf16 only (Liger would run its PyTorch fallback for {cell.dtype})"
    return None


def _configure(cells, world: int, device) -> None:
    """LCK's collective set-up, once per process, at the largest cell's capacity."""
    import liger_cute_kernels as lck

    tokens = max(c.n for c in cells)
    hidden = max(-(-c.d // HIDDEN_ALIGNMENT) * HIDDEN_ALIGNMENT for c in cells)
    local_vocab = max(c.v // world for c in cells)
    capacity = (tokens, hidden, local_vocab)
    if "capacity" in _LCK:
        if all(a <= b for a, b in zip(capacity, _LCK["capacity"])):
            return
        raise RuntimeError(f"LCK was configured for {_LCK['capacity']} (tokens, hidden, local "
                           f"vocab) in this process; {capacity} would need more")
    torch.cuda.synchronize(device)
    free_before = torch.cuda.mem_get_info(device)[0]
    lck.configure(device=device, flsce=lck.FusedLinearCrossEntropyConfig(
        max_tokens=tokens, hidden_size=hidden, local_vocab_size=local_vocab))
    torch.cuda.synchronize(device)
    _LCK.update(capacity=capacity,
                outside_mib=(free_before - torch.cuda.mem_get_info(device)[0]) / 2**20)


def sharded_fn(name: str, *, cells, world: int, device):
    """This rank's call: (e, c_shard, targets) -> mean NLL over non-ignored targets."""
    import torch.distributed as dist
    from liger_kernel.ops import fused_linear_scaled_cross_entropy as flsce

    group = dist.group.WORLD
    _LAST_RAN.clear()
    if name == "liger_scaled_ce_tp":
        if flsce._load_native_tp_function() is None:  # Liger's own test before it dispatches
            raise RuntimeError("Liger's dispatch would take its PyTorch fallback: the native "
                               "TP function is not available")
        _configure([c for c in cells if sharded_unsupported(name, c, world) is None],
                   world, device)

    def fn(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
        if name == "liger_scaled_ce_tp":
            nll = flsce.LigerFusedLinearScaledCrossEntropyTPFunction.apply(
                e, c, targets, group, 1.0, ignore_index, 1, False)
        else:  # Liger's own fallback, as its dispatch calls it without the native package
            nll = flsce._apply_tp_fallback(e, c, targets, 1.0, ignore_index, False, group)
        _record(name, nll)
        return nll.sum() / (targets != ignore_index).sum().clamp_min(1)
    return fn


def _record(name: str, nll: torch.Tensor) -> None:
    """Which autograd function made ``nll`` (none under no_grad: the last one stays); the
    native provider refuses Liger's fallback."""
    if nll.grad_fn is None:
        return
    made_by = type(nll.grad_fn).__name__.removesuffix("Backward")
    if name == "liger_scaled_ce_tp" and made_by != NATIVE_FUNCTION:
        raise RuntimeError(f"Liger ran {made_by}, not its native CUTLASS + NVSHMEM kernel")
    _LAST_RAN[:] = [made_by]


def ran(name: str) -> str:
    """The ``ran`` column: the function that ran and, natively, LCK's memory outside torch."""
    made_by = _LAST_RAN[0] if _LAST_RAN else ""
    if name == "liger_scaled_ce_tp" and "outside_mib" in _LCK:
        return (f"{made_by or NATIVE_FUNCTION} (CUTLASS + NVSHMEM); configure() took "
                f"{_LCK['outside_mib']:.0f} MiB of device memory outside torch's allocator, "
                f"not in the peak columns")
    return f"{made_by} (PyTorch 512-token chunks, all-reduces)" if made_by else ""
