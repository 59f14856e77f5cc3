"""Shared test setup. Triton kernels run under the interpreter when there is no CUDA device;
the variable must be set before anything imports triton, hence here, at collection time."""
import os

import pytest
import torch  # importing torch does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from suite import catalog, registry  # noqa: E402  (catalog: every provider registered)


@pytest.fixture
def temp_providers():
    """Register throwaway providers for one test: ``temp_providers(name, fn, **register_kw)``."""
    added = []

    def add(name, fn, **kw):
        kw.setdefault("summary", f"test provider {name}")
        registry.register(name, **kw)(fn)
        added.append(name)
        return name

    yield add
    for name in added:
        registry.PROVIDERS.pop(name, None)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The keywords of each call own_kernel.transformers' patched forward makes to the kernel."""
    import own_kernel.integrations.transformers as hf_patch

    calls = []
    kernel = hf_patch.linear_cross_entropy

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(hf_patch, "linear_cross_entropy", spy)
    return calls
