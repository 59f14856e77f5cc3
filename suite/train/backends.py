"""The loss backends a training job can use, and how a job's failure is classified."""
from __future__ import annotations

import dataclasses

import torch

from suite import registry

from suite import catalog
from suite.measure import is_oom
from suite.train.data import IGNORE_INDEX

SELECTIVE_PREFIX = "selective+"  # "selective+X": drop ignore_index rows of E, then provider X


def get_backend(name: str) -> registry.Provider:
    """A registry provider, or ``selective+X``: provider X on the rows whose target is not
    ignore_index only (seed 000's last step: selective hidden states + LigerCrossEntropyLoss)."""
    if not name.startswith(SELECTIVE_PREFIX):
        return catalog.get(name)
    base = catalog.get(name[len(SELECTIVE_PREFIX):])

    def fn(e, c, targets, *, ignore_index=IGNORE_INDEX, **kw):
        keep = targets != ignore_index
        return base.fn(e[keep], c, targets[keep], ignore_index=ignore_index, **kw)

    return dataclasses.replace(base, name=name, fn=fn, summary=f"selective rows, then {base.summary}")


def provider_problem(name: str, device, softcap):
    """(provider, status, reason): status and reason are None when it can run here."""
    provider = get_backend(name)
    reason = provider.unavailable_reason(device)
    if reason:
        return provider, "unavailable", reason
    reason = provider.unsupported_reason(bias=False, softcap=softcap, device=device)
    if reason:
        return provider, "unsupported", reason
    return provider, None, None


def status_of(err: BaseException) -> str:
    if is_oom(err):
        return "oom"
    if isinstance(err, ImportError):
        return "unavailable"
    return "error"


def is_fatal(err: BaseException, dev: torch.device) -> bool:
    """True when the CUDA context is probably unusable after ``err`` (the worker must restart)."""
    if dev.type != "cuda" or is_oom(err):
        return False
    text = str(err)
    if any(s in text for s in ("illegal memory access", "device-side assert", "CUDA error",
                               "unspecified launch failure", "misaligned address")):
        return True
    try:
        torch.cuda.synchronize(dev)
    except Exception:  # noqa: BLE001
        return True
    return False


def failure(err: BaseException, dev: torch.device, prefix: str = "") -> dict:
    """A failed job's result fields."""
    return {"status": status_of(err), "error": f"{prefix}{err!r}"[:500],
            "fatal": is_fatal(err, dev)}
