"""Liger's tensor-parallel fused linear scaled cross-entropy (liger-kernel 0.8.5,
``LigerFusedLinearScaledCrossEntropyTPFunction.apply(_input, weight_shard, target, tp_group,
temperature=1.0, ignore_index=-100, tiles_per_reduce=1, return_entropy=False)``).

Each rank holds a vocabulary shard of the weight; the native path (bf16, sm_90 or sm_100) is a
CUTLASS + NVSHMEM kernel from the separate package ``liger-cute-kernels`` (installed by Liger's
``lck`` extra, with NVSHMEM from ``nvidia-nvshmem-cu12/13``), whose cross-rank MAX/SUM
reductions run in the GEMM epilogue over NVLink (NVLS multicast, or direct peer mappings) on an
NVSHMEM team that ``liger_cute_kernels.configure(...)`` must prepare on every rank first.
Without that package Liger runs a 512-token chunked PyTorch fallback with all-reduces instead.

The suite's providers are one process on one GPU with the whole weight, so none of that can be
set up inside a provider: ``liger_scaled_ce_tp`` is always ``unavailable``, and its reason says
why and what is missing here. A multi-GPU measurement would be a vocabulary-parallel run (one
process per GPU, like ``python -m suite bench --vocab-parallel K``) whose ranks call
``configure`` and then this function on their shard.
"""
import importlib.util

from suite.providers.liger import GREEN, PACKAGE, VERSION
from suite.registry import register

FUNCTION = "LigerFusedLinearScaledCrossEntropyTPFunction"
NATIVE_PACKAGE = "liger-cute-kernels"
NATIVE_INSTALL = f'pip install "{PACKAGE}[lck]=={VERSION}" "{NATIVE_PACKAGE}[cu13]=={VERSION}"'


def missing_here() -> list[str]:
    """What this process lacks for the native TP kernel, besides the ranks themselves."""
    missing = []
    if importlib.util.find_spec("liger_kernel") is None:
        missing.append(f"{PACKAGE} is not installed")
    if importlib.util.find_spec("liger_cute_kernels") is None:
        missing.append(f"{NATIVE_PACKAGE} (CUTLASS + NVSHMEM kernels) is not installed "
                       f"(install: {NATIVE_INSTALL})")
    return missing


def why_unavailable(device) -> str:
    reason = (f"Liger's tensor-parallel scaled CE needs one process per GPU, each with a "
              f"vocabulary shard of the weight, torch.distributed and an NVSHMEM team prepared "
              f"by liger_cute_kernels.configure(); a provider here is one process on one GPU")
    missing = missing_here()
    return reason + ("; also: " + "; ".join(missing) if missing else "")


@register("liger_scaled_ce_tp",
          summary=f"Liger {FUNCTION} (vocab-parallel, CUTLASS + NVSHMEM): needs several ranks",
          features=(), requires=why_unavailable, package=NATIVE_PACKAGE, install=NATIVE_INSTALL,
          style=dict(color=GREEN, marker="^", linestyle="-."), order=34)
def liger_scaled_ce_tp(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    # never reached by the runner (requires always says why); a direct call gets the same reason
    raise RuntimeError(why_unavailable(e.device))
