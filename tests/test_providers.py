"""Every provider that can run here agrees with the fp64 reference on tiny fp32 inputs."""
import os

import pytest
import torch

from suite import registry
from suite.inputs import make_inputs
from suite.reference import reference, rel_err

# fp32 inputs, fp64 reference. An exact provider differs only by fp32 rounding of a few hundred
# terms (~1e-7 relative); 1e-5 leaves room for different summation orders, while a wrong
# softcap derivative, bias or ignore mask gives errors of 1e-2 or more.
EXACT_TOL = 1e-5
# Approximate providers (gradient filtering) may drop gradient entries below their threshold.
FILTER_TOL = 2e-2

CASES = {
    "plain": dict(softcap=None, bias=False, ignore_frac=0.0),
    "softcap-bias-ignore": dict(softcap=30.0, bias=True, ignore_frac=0.25),
}


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", registry.names())
def test_provider_matches_reference(name, case):
    opts = CASES[case]
    p = registry.get(name)
    device = _device()
    reason = p.unavailable_reason(device)
    if reason:
        pytest.skip(f"{name} unavailable on {device}: {reason}")
    # Ask only for the options the provider implements; the rest of the case still applies.
    bias = opts["bias"] and "bias" in p.features
    softcap = opts["softcap"] if "softcap" in p.features else None
    if opts != CASES["plain"] and not bias and softcap is None:
        pytest.skip(f"{name} implements neither bias nor softcap")

    x = make_inputs("lm", 48, 32, 100, "fp32", seed=3, device=device, softcap=softcap,
                    bias=bias, ignore_frac=opts["ignore_frac"])
    ref = reference(x["e"].double(), x["c"].double(), x["targets"],
                    bias=None if x["bias"] is None else x["bias"].double(), softcap=softcap)
    e = x["e"].clone().requires_grad_()
    c = x["c"].clone().requires_grad_()
    b = None if x["bias"] is None else x["bias"].clone().requires_grad_()
    try:
        loss = p.fn(e, c, x["targets"], bias=b, softcap=softcap)
        loss.backward()
    except Exception as exc:
        interpreted = os.environ.get("TRITON_INTERPRET") == "1" and device == "cpu"
        if name.startswith("liger") and softcap is not None and interpreted \
                and "InterpreterError" in type(exc).__name__:
            pytest.skip(f"liger's softcap path does not run under the Triton interpreter "
                        f"({type(exc).__name__}: {str(exc)[:120]}); on a GPU, python -m suite bench "
                        f"measures it against the reference")
        raise

    tol = EXACT_TOL if p.exact else FILTER_TOL
    assert abs(loss.item() - ref["loss"]) / ref["loss"] < EXACT_TOL
    assert rel_err(e.grad, ref["de"]) < tol
    assert rel_err(c.grad, ref["dc"]) < tol
    if b is not None:
        assert rel_err(b.grad, ref["dbias"]) < tol


def test_every_provider_is_listed_with_a_reason_when_unavailable():
    for name in registry.names():
        p = registry.get(name)
        for device in ("cpu", "cuda"):
            reason = p.unavailable_reason(device)
            assert reason is None or (isinstance(reason, str) and reason.strip()), name


def test_unknown_provider_names_the_known_ones():
    with pytest.raises(ValueError, match="known providers: .*naive"):
        registry.get("nope")
