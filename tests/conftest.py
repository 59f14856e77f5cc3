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
