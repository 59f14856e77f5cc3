"""The pointer kernels' in-bounds loads (kernels/tile.logit_tile's IN_BOUNDS): clamped rows and
columns read without masks give the masked loads' results bit for bit, and never read past E or
C; loads from pointers fixed before the k-loop (FIXED_BASE, config.Forward.fixed_base_loads)
give the same. The forward (config.Forward.in_bounds_loads, kernels/forward.py) and the W writer
(config.Config.dlogits_in_bounds_loads, kernels/dlogits.py). Under the interpreter (fp32, tiny
shapes) a read past either raises; with CCE_TEST_DEVICE=cuda the same calls run compiled (bf16,
ragged shapes the GPU's tiles leave partial) against the masked loads and fp64."""
import os
import warnings

import pytest
import torch

from own_kernel import linear_cross_entropy, token_logprobs
from own_kernel.kernels import dlogits, forward as pointer
from own_kernel.policy.config import INTERPRETER, PORTABLE, overridden, with_overrides
from tests.test_backward_portable import chunk_case
from tests.test_own_kernel import reference, spy_kernel_args

DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
CPU = DEV.type == "cpu"
# (N, D, V): rows past N and columns past V in the last tiles, a depth with and without a
# partial last k-step (the interpreter's tiles are 16 deep, the GPU's 64)
SHAPES = ([(50, 24, 300), (50, 32, 37)] if CPU else
          [(1000, 2048, 49157), (1000, 2056, 4099), (129, 1152, 262144)])


def _view_with_overflowing_rows_after(rows: int, d: int, dtype) -> torch.Tensor:
    """A rows x d view of a buffer whose next 16 rows overflow any product: under the
    interpreter a load past the view turns into numpy's overflow warning."""
    return torch.full((rows + 16, d), 3e38 if dtype == torch.float32 else 6e4,
                      dtype=dtype, device=DEV)[:rows]


@pytest.mark.parametrize("n, d, v", SHAPES)
def test_in_bounds_loads_give_the_masked_loads_results_bit_for_bit(monkeypatch, n, d, v):
    launches = spy_kernel_args(monkeypatch, pointer, "cce_fwd_kernel", "IN_BOUNDS", "EVEN_D",
                               "FIXED_BASE")
    dtype = torch.float32 if CPU else torch.bfloat16
    g = torch.Generator().manual_seed(3)
    e, c = (_view_with_overflowing_rows_after(r, d, dtype) for r in (n, v))
    e.copy_(torch.randn(n, d, generator=g))
    c.copy_(torch.randn(v, d, generator=g) / d ** 0.5)
    b = torch.randn(v, generator=g).to(DEV, dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[::7] = -100
    t = t.to(DEV)

    def run(in_bounds: bool, fixed_base: bool = False):
        # autotune off: its trial launches would sit in the spy's list
        with overridden({"autotune": False,
                         "forward": {"tma": False, "ws": False, "cublas_min_d": 0,
                                     "in_bounds_loads": in_bounds,
                                     "fixed_base_loads": fixed_base}}), \
                torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            return (*linear_cross_entropy(e, c, t, bias=b, softcap=5.0, label_smoothing=0.1,
                                          reduction="none", return_lse=True),
                    token_logprobs(e, c, t))
    masked, in_bounds = run(False), run(True)
    variants = [run(False, True), run(True, True)]  # fixed base pointers, masked and in bounds
    even = d % (16 if CPU else 64) == 0
    assert launches == [(False, even, False)] * 2 + [(True, even, False)] * 2 + \
        [(False, even, True)] * 2 + [(True, even, True)] * 2
    for other in [in_bounds] + variants:
        for a, b_ in zip(masked, other):
            assert torch.equal(a, b_)
    # and right: the losses against fp64, to the fp32 sums over D and V (and bf16's rounding
    # of each logit on the GPU, whose inputs are exact in both)
    loss = reference(e, c, t, bias=b, softcap=5.0, reduction="none", ls=0.1)[0]
    tol = 8 * torch.finfo(torch.float32).eps * (d + v) * 5.0
    assert torch.allclose(in_bounds[0].double(), loss, atol=tol)


@pytest.mark.parametrize("d", [24, 32] if CPU else [2048, 2056])
def test_the_w_writers_in_bounds_loads_give_the_masked_loads_w_and_sums(monkeypatch, d):
    # One chunk of 40 columns from column 8 of 53: its last tile runs past the chunk and past V,
    # and 19 rows leave the last row block partial (the GPU's: 1000 rows, 4099 columns from 8).
    launches = spy_kernel_args(monkeypatch, dlogits, "cce_dlogits_kernel", "IN_BOUNDS", "EVEN_D",
                               "FIXED_BASE")
    shape = dict(n=19, v=53, width=40) if CPU else dict(n=1000, v=4107, width=4099)
    dtype = torch.float32 if CPU else torch.bfloat16
    base = with_overrides(INTERPRETER if CPU else PORTABLE, {"autotune": False})
    cases = {}
    loads = [(False, False), (True, False), (False, True), (True, True)]  # in bounds, fixed base
    for in_bounds, fixed_base in loads:
        case = cases[in_bounds, fixed_base] = chunk_case(dtype, d=d, v_start=8, device=DEV,
                                                         **shape)
        for name in ("e", "c"):  # past their last row: values no product can hold
            t = getattr(case, name)
            view = _view_with_overflowing_rows_after(t.shape[0], d, dtype)
            setattr(case, name, view.copy_(t))
        cfg = with_overrides(base, {"dlogits_in_bounds_loads": in_bounds,
                                    "dlogits_fixed_base_loads": fixed_base})
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            dlogits.write_w_pointer(case.e, case.c, case.w, case.bias, case.rows, case.sums,
                                    case.v_start, case.softcap, case.ls, cfg)
    even = d % base.dlogits.block_d == 0
    assert launches == [(i, even, f) for i, f in loads]
    masked = cases[False, False]
    for key in loads[1:]:
        assert torch.equal(masked.w, cases[key].w), key
        for name in ("row_round", "col_round", "col_sum"):
            a, b = getattr(masked.sums, name), getattr(cases[key].sums, name)
            # the interpreter adds tiles in one order; a GPU's atomics in the order they finish
            assert torch.equal(a, b) if CPU else torch.allclose(a, b, rtol=1e-5, atol=1e-6), \
                (key, name)
