"""One registry of loss implementations ("providers").

Every provider has the same call: ``fn(e, c, targets, *, bias=None, softcap=None,
ignore_index=-100) -> scalar mean loss``, where ``e`` is (N, D), ``c`` is (V, D) and
``targets`` is (N,) int64. Adding a peer is one small file in ``suite/providers/`` with a
function decorated by :func:`register`: its name, what it is, the options it implements, what it
needs to run, the package it comes from (with the line that installs it) and how figures draw it.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

# Features a cell may ask for; a provider lists the ones it implements.
FEATURES = ("bias", "softcap")


class UnsupportedInput(ValueError):
    """Raised by a provider for inputs its peer does not take (a shape or layout its kernel
    asserts against, e.g. verl's hidden size % 128): the row's status is ``unsupported`` with
    this message, not ``error``."""


# Figures draw a provider in the colour, marker and line style of its registration; providers of
# one family share a colour (tests/test_plots.py checks it is colour-blind safe) and figures list them
# by ``order``. One unregistered style is the fallback: grey, dash-dot.
FALLBACK_STYLE = dict(color="#999999", marker="*", linestyle="-.")


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
    # The distribution a peer comes from (None: this project's code or torch) and the command
    # that installs the version the suite measures.
    package: str | None = None
    install: str | None = None
    # Where the installed peer comes from: {"version", "commit", "source"}; default: the
    # installed distribution's metadata (commit from pip's direct_url.json record).
    origin: Callable[[], dict | None] | None = None
    label: str = ""
    # Returns why a cell's options cannot run on a device (e.g. a peer's kernel that Triton's
    # interpreter cannot run with softcap), else None; None: every implemented option runs.
    limits: Callable[..., str | None] | None = None
    style: dict = field(default_factory=lambda: dict(FALLBACK_STYLE))
    order: int = 1000
    # Returns what the provider's last call ran (e.g. which backend of a peer, checked after the
    # call), recorded in the row's ``ran`` column; None: the provider reports nothing.
    ran: Callable[[], str] | None = None

    def unavailable_reason(self, device: torch.device | str) -> str | None:
        return self.requires(torch.device(device))

    def installed(self) -> dict | None:
        """The installed peer's version, commit (where pip recorded one) and source, or None
        (not a peer, or not installed)."""
        if self.origin is not None:
            return self.origin()
        return distribution_origin(self.package) if self.package else None

    def unsupported_reason(self, *, bias: bool, softcap: float | None,
                           device: torch.device | str | None = None) -> str | None:
        if bias and "bias" not in self.features:
            return f"{self.name} has no bias input"
        if softcap is not None and "softcap" not in self.features:
            return f"{self.name} has no softcap option"
        if device is not None and self.limits is not None:
            return self.limits(torch.device(device), bias=bias, softcap=softcap)
        return None


PROVIDERS: dict[str, Provider] = {}


def register(name: str, *, summary: str, features=("softcap",), requires=None, exact=True,
             package=None, install=None, origin=None, label=None, style=None, order=1000,
             limits=None, ran=None):
    """Register ``fn`` as provider ``name``. ``package``/``install``: the peer's distribution and
    the line that installs it (``python -m suite list`` shows both); ``label``, ``style`` (a
    matplotlib colour, marker and linestyle) and ``order``: how figures draw and list it;
    ``limits(device, *, bias, softcap)``: why such a cell cannot run on ``device``, or None;
    ``ran()``: what the last call ran (the row's ``ran`` column)."""
    bad = set(features) - set(FEATURES)
    if bad:
        raise ValueError(f"provider {name!r}: features must be among {FEATURES}, got {sorted(bad)}")
    if style is not None and set(style) != set(FALLBACK_STYLE):
        raise ValueError(f"provider {name!r}: style needs exactly {sorted(FALLBACK_STYLE)}, "
                         f"got {sorted(style)}")

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
            package=package,
            install=install,
            origin=origin,
            limits=limits,
            label=label or name,
            style=dict(style or FALLBACK_STYLE),
            order=order,
            ran=ran,
        )
        return fn

    return deco


# ---- reusable availability checks -------------------------------------------------------

def distribution_origin(dist: str, path: list[str] | None = None) -> dict | None:
    """{"version", "commit", "source"} of installed distribution ``dist`` (searched in ``path``,
    default sys.path); ``commit`` and ``source`` come from the direct_url.json pip writes when it
    installs from a repository or a file (PEP 610), else None. None when ``dist`` is absent."""
    found = next(iter(importlib.metadata.distributions(name=dist, path=path)), None) \
        if path is not None else installed_distribution(dist)
    if found is None:
        return None
    direct = {}
    text = found.read_text("direct_url.json")
    if text:
        try:
            direct = json.loads(text)
        except ValueError:
            direct = {}
    vcs = direct.get("vcs_info") or {}
    return {"version": found.version, "commit": vcs.get("commit_id"),
            "source": direct.get("url") or "index"}


def installed_distribution(dist: str):
    try:
        return importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def needs_module(module: str, pip_name: str | None = None, install: str | None = None):
    """Available when ``module`` imports; else the reason names the package and, when given,
    the exact line that installs it."""
    def check(device):
        if importlib.util.find_spec(module) is None:
            how = f" (install: {install})" if install else ""
            return f"{pip_name or module} is not installed{how}"
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
