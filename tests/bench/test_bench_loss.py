"""GPU benchmarks of the loss providers, for the regression gate (`python -m suite gate`).

One test = one provider at one shape and phase, bf16, ``lm`` inputs. pytest-benchmark times it
(``benchmark.pedantic``: grads cleared in an untimed setup, CUDA synchronised inside the timed
call, warm-up rounds not timed). One more untimed call afterwards gives the peak extra memory
and the errors against the fp32 reference (suite/reference.py); they go into ``extra_info``.

Run them through the gate, or directly with ``pytest tests/bench --benchmark-only``. Without
``--benchmark-only`` they skip, so a plain ``pytest`` on a GPU machine does not spend minutes
here. The own kernel runs at every shape; the peers only at the paper's shape (Gemma 2 (2B))
unless CCE_BENCH_ALL_SHAPES=1 (``python -m suite gate --all-shapes``).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from suite import registry

pytestmark = pytest.mark.gpu

ROUNDS = 5
WARMUP_ROUNDS = 2
DIST = "lm"
DTYPE = "bf16"
SEED = 0

# name: (N, D, V, softcap)
SHAPES = {
    "gemma2-2b": (8192, 2304, 256000, 30.0),  # the paper's Table 1
    "llama3": (8192, 4096, 128256, None),
    "small": (8192, 4096, 32000, None),
}
PEER_SHAPES = ("gemma2-2b",)
OWN = ("own", "own_filter")
# Schema names (suite/schema.py): forward under no_grad; forward + backward.
PHASES = ("fwd", "loss+grad")


def cases():
    all_shapes = os.environ.get("CCE_BENCH_ALL_SHAPES") == "1"
    return [(shape, provider) for shape in SHAPES for provider in registry.names()
            if provider in OWN or all_shapes or shape in PEER_SHAPES]


@pytest.fixture(scope="module")
def case(request):
    """Inputs and fp32 reference of one shape, built once for all providers at that shape."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not request.config.getoption("benchmark_only"):
        pytest.skip("GPU benchmark: run with --benchmark-only (python -m suite gate does)")
    from suite.inputs import make_inputs
    from suite.reference import reference

    n, d, v, softcap = SHAPES[request.param]
    inputs = make_inputs(DIST, n, d, v, DTYPE, seed=SEED, device="cuda", softcap=softcap)
    # fp32 (TF32 off) on the GPU, chunked; the reference gradients are kept on the CPU.
    ref = reference(inputs["e"], inputs["c"], inputs["targets"], softcap=softcap)
    return {"shape": request.param, "n": n, "d": d, "v": v, "softcap": softcap, **inputs,
            "ref_loss": ref["loss"], "ref_de": ref["de"], "ref_dc": ref["dc"]}


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("case, provider", cases(), indirect=["case"])
def test_loss(benchmark, case, provider, phase):
    from suite.reference import loss_rel_err, rel_err

    prov = registry.get(provider)
    reason = prov.unavailable_reason("cuda") or prov.unsupported_reason(bias=False,
                                                                         softcap=case["softcap"])
    if reason:
        pytest.skip(reason)
    grad = phase == "loss+grad"
    e = case["e"].detach().requires_grad_(grad)
    c = case["c"].detach().requires_grad_(grad)
    targets, softcap = case["targets"], case["softcap"]

    def clear():  # untimed, before every round
        e.grad = None
        c.grad = None
        torch.cuda.synchronize()

    def fwd():
        with torch.no_grad():
            loss = prov.fn(e, c, targets, softcap=softcap)
        torch.cuda.synchronize()
        return loss

    def fwd_bwd():
        loss = prov.fn(e, c, targets, softcap=softcap)
        loss.backward()
        torch.cuda.synchronize()
        return loss

    run = fwd_bwd if grad else fwd
    benchmark.pedantic(run, setup=clear, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS, iterations=1)

    # Memory and errors from one more call, after warm-up: compilation and autotuning done.
    clear()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = run()
    peak = torch.cuda.max_memory_allocated()
    info = benchmark.extra_info
    info.update(provider=provider, shape=case["shape"], phase=phase, dist=DIST, dtype=DTYPE,
                seed=SEED, n=case["n"], d=case["d"], v=case["v"], softcap=case["softcap"],
                exact=prov.exact, peak_extra_mib=(peak - before) / 2**20, peak_abs_mib=peak / 2**20)
    loss_value = loss.item()
    info["loss_rel_err"] = loss_rel_err(loss_value, case["ref_loss"])
    if grad:
        info["de_rel_err"] = rel_err(e.grad, case["ref_de"])
        info["dc_rel_err"] = rel_err(c.grad, case["ref_dc"])
    clear()
    assert math.isfinite(loss_value), f"{provider} returned a non-finite loss {loss_value}"
