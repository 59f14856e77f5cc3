"""torch_native and torch_native_accurate: torch's own F.linear_cross_entropy(options=...), from
the installed torch (>= 2.13) or from a newer wheel's module files (CCE_BENCH_TORCH_LCE)."""
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from suite import catalog
from suite.providers import torch_native as tn

NATIVE = hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
needs_native = pytest.mark.skipif(
    not NATIVE, reason=f"torch {torch.__version__} has no F.linear_cross_entropy with options "
                       f"(its module files are what the loaded route runs; the GPU machine "
                       f"tests that route through CCE_BENCH_TORCH_LCE)")


@pytest.fixture
def route(monkeypatch):
    """Set (or clear) CCE_BENCH_TORCH_LCE and resolve afresh."""
    def use(folder):
        if folder is None:
            monkeypatch.delenv(tn.ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(tn.ENV_VAR, str(folder))
        tn.resolve.cache_clear()
        return folder
    yield use
    tn.resolve.cache_clear()


def _wheel_files(tmp_path) -> Path:
    """The installed torch's two module files and version.py, as `unzip -j` lays a wheel's out."""
    root = Path(torch.__file__).parent
    out = tmp_path / "torch-lce"
    out.mkdir()
    for rel in ("nn/modules/linear_cross_entropy.py", "nn/modules/linear_cross_entropy_options.py",
                "version.py"):
        shutil.copy(root / rel, out / Path(rel).name)
    return out


def _inputs(n=48, d=16, v=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g, dtype=torch.float32, requires_grad=True)
    c = torch.randn(v, d, generator=g, dtype=torch.float32, requires_grad=True)
    t = torch.randint(0, v, (n,), generator=g)
    t[:5] = -100
    return e, c, t


def _loss_and_grads(name, e, c, t):
    e, c = e.detach().clone().requires_grad_(), c.detach().clone().requires_grad_()
    loss = catalog.get(name).fn(e, c, t)
    loss.backward()
    return loss.detach(), e.grad, c.grad


@needs_native
@pytest.mark.parametrize("name", ["torch_native", "torch_native_accurate"])
def test_loaded_files_compute_what_the_native_function_does(name, route, tmp_path):
    e, c, t = _inputs()
    route(None)
    native = _loss_and_grads(name, e, c, t)
    route(_wheel_files(tmp_path))
    assert tn.resolve().route == "loaded"
    loaded = _loss_and_grads(name, e, c, t)
    for a, b in zip(native, loaded):
        assert torch.equal(a, b)  # the same code on the same inputs
    # and both are the cross-entropy: against the same-dtype naive computation
    ref_e, ref_c = e.detach().clone().requires_grad_(), c.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_e @ ref_c.T, t)
    ref.backward()
    # fp32 sums over V (loss, dE) and N (dC) terms: rounding grows like eps * sqrt(terms)
    tol = 4 * torch.finfo(torch.float32).eps * math.sqrt(max(e.shape[0], c.shape[0]))
    for got, want in zip(loaded, (ref.detach(), ref_e.grad, ref_c.grad)):
        assert torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item())


@needs_native
def test_accurate_provider_asks_for_the_accurate_policy(route, tmp_path, monkeypatch):
    route(_wheel_files(tmp_path))
    ops = tn.resolve().op_module
    policies = []
    real = ops._linear_cross_entropy_batch_chunked

    def spy(*args):
        policies.append(args[9])  # acc_policy, after batch_chunk_size
        return real(*args)

    monkeypatch.setattr(ops, "_linear_cross_entropy_batch_chunked", spy)
    e, c, t = _inputs()
    _loss_and_grads("torch_native_accurate", e, c, t)
    _loss_and_grads("torch_native", e, c, t)
    assert policies[0] == "accurate" and policies[1] != "accurate"


@needs_native
def test_env_records_the_code_version_and_route(route, tmp_path):
    route(None)
    assert catalog.get("torch_native").installed() == {
        "version": torch.__version__, "commit": None, "source": None, "route": "native"}
    folder = route(_wheel_files(tmp_path))
    info = catalog.get("torch_native_accurate").installed()
    assert info["version"] == torch.__version__
    assert info["route"] == f"module files of {folder.as_posix()} loaded onto torch {torch.__version__}"


def test_a_bad_folder_says_what_is_missing(route, tmp_path):
    route(tmp_path)
    reason = catalog.get("torch_native").unavailable_reason("cpu")
    assert tn.ENV_VAR in reason and "linear_cross_entropy.py" in reason
    for name in tn.MODULE_FILES:
        (tmp_path / name).write_text("")
    route(tmp_path)
    assert "no version.py" in catalog.get("torch_native").unavailable_reason("cpu")
    (tmp_path / "version.py").write_text("__version__ = '2.12.1'\n")
    route(tmp_path)
    reason = catalog.get("torch_native_accurate").unavailable_reason("cpu")
    assert "torch 2.12.1" in reason and "need torch >= 2.13" in reason
    assert catalog.get("torch_native").installed() is None
