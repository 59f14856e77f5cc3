"""Fixtures of the gates: the CUDA device (else a skip that says why), each shape's inputs and
reference built once (the inputs read from CCE_GATE_INPUTS_CACHE where a session of several
processes keeps them: suite/gates/cache.py), the injections; and the gate's plugin
(suite/gates/plugin.py)."""
from __future__ import annotations

import os
import sys

import pytest

# The gate's plugin: its options and hooks (suite/gates/plugin.py).
from suite.gates.plugin import PLUGIN_NAME, pytest_addoption, pytest_configure  # noqa: F401
from suite.gates.spec import KERNEL_FROM_ENV


def _kernel_from_another_checkout() -> None:
    """CCE_GATE_KERNEL_FROM=<folder>: import own_kernel from that folder (another checkout),
    before anything imports this checkout's."""
    folder = os.environ.get(KERNEL_FROM_ENV)
    if not folder:
        return
    folder = os.path.abspath(folder)
    if not os.path.isfile(os.path.join(folder, "own_kernel", "__init__.py")):
        raise RuntimeError(f"{KERNEL_FROM_ENV}={folder}: no own_kernel/ package there")
    sys.path.insert(0, folder)
    import own_kernel

    if not os.path.abspath(own_kernel.__file__).startswith(folder + os.sep):
        raise RuntimeError(f"{KERNEL_FROM_ENV}={folder}: own_kernel was already imported from "
                           f"{own_kernel.__file__}")


_kernel_from_another_checkout()


@pytest.fixture(scope="session")
def cuda_device():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("the gates measure on a CUDA GPU (baselines are per GPU model); this machine "
                    "has no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


class ShapeInputs:
    """Inputs (suite.inputs) and fp32 reference (suite.reference) of one gate shape at a time:
    the tests come grouped by shape, so each shape's are built once and dropped after."""

    def __init__(self, device):
        self.device = device
        self.shape = None
        self.inputs = self.ref = None

    def get(self, shape):
        import torch

        from suite.gates.cache import shape_inputs
        from suite.gates.spec import DIST, DTYPE, SEED
        from suite.measure import free_memory
        from suite.reference import reference

        if shape.name != self.shape:
            self.shape, self.inputs, self.ref = None, None, None
            if "torch._dynamo" in sys.modules:  # fresh compile caches per shape, as the suite
                torch._dynamo.reset()
            free_memory(self.device)
            self.inputs = shape_inputs(shape, DIST, DTYPE, SEED, self.device)
            self.ref = reference(self.inputs["e"], self.inputs["c"], self.inputs["targets"],
                                 bias=self.inputs["bias"], softcap=shape.softcap)
            self.shape = shape.name
            free_memory(self.device)
        return self.inputs, self.ref


@pytest.fixture(scope="session")
def gate_inputs(cuda_device):
    return ShapeInputs(cuda_device)


@pytest.fixture(scope="session")
def injected(request):
    from suite.gates.inject import Injected

    return Injected(request.config.pluginmanager.get_plugin(PLUGIN_NAME).injections)
