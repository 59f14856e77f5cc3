"""One registry of loss implementations ("providers").

Every provider has the same call: ``fn(e, c, targets, *, bias=None, softcap=None,
ignore_index=-100) -> scalar mean loss``, where ``e`` is (N, D), ``c`` is (V, D) and
``targets`` is (N,) int64. Adding a peer is one small file in ``suite/providers/`` with a
function decorated by :func:`register`.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

# Features a cell may ask for; a provider lists the ones it implements.
FEATURES = ("bias", "softcap")


@dataclass(frozen=True)
class Provider:
    name: str
    fn: Callable
    summary: str
    features: frozenset = field(default_factory=frozenset)
    # Returns None when the provider can run on `device`, else the reason it cannot.
    requires: Callable[[torch.device], str | None] = lambda device: None
    # True when the provider's gradient is exact up to rounding (no filtering/approximation).
    exact: bool = True

    def unavailable_reason(self, device: torch.device | str) -> str | None:
        return self.requires(torch.device(device))

    def unsupported_reason(self, *, bias: bool, softcap: float | None) -> str | None:
        if bias and "bias" not in self.features:
            return f"{self.name} has no bias input"
        if softcap is not None and "softcap" not in self.features:
            return f"{self.name} has no softcap option"
        return None


PROVIDERS: dict[str, Provider] = {}


def register(name: str, *, summary: str, features=("softcap",), requires=None, exact=True):
    """Register ``fn`` as provider ``name``."""

    def deco(fn):
        if name in PROVIDERS:
            raise ValueError(f"provider {name!r} registered twice")
        PROVIDERS[name] = Provider(
            name=name,
            fn=fn,
            summary=summary,
            features=frozenset(features),
            requires=requires or (lambda device: None),
            exact=exact,
        )
        return fn

    return deco


def get(name: str) -> Provider:
    load_all()
    try:
        return PROVIDERS[name]
    except KeyError:
        known = ", ".join(sorted(PROVIDERS))
        raise ValueError(f"unknown provider {name!r}; known providers: {known}") from None


def names() -> list[str]:
    load_all()
    return list(PROVIDERS)


def load_all() -> None:
    import suite.providers  # noqa: F401  (importing registers every provider)


# ---- reusable availability checks -------------------------------------------------------

def needs_module(module: str, pip_name: str | None = None):
    def check(device):
        if importlib.util.find_spec(module) is None:
            return f"{pip_name or module} is not installed"
        return None

    return check


def needs_cuda(device):
    if device.type != "cuda":
        return "needs a CUDA device"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def needs_triton_device(device):
    """Triton kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1."""
    if device.type == "cuda":
        return needs_cuda(device)
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return "Triton kernel on CPU needs TRITON_INTERPRET=1"


def all_of(*checks):
    def check(device):
        for ch in checks:
            reason = ch(device)
            if reason:
                return reason
        return None

    return check
