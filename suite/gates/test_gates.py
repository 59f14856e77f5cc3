"""The gated benchmarks: one per (shape, provider, phase) of suite.gates.spec.cases().

Each is ``benchmark.pedantic`` with the suite's protocol (suite/measure.py's phase calls):
inputs and reference built once per shape; before every round, untimed, the gradients cleared,
the L2 cache flushed and CUDA synchronised; the timed call ends with a synchronisation; warm-up
rounds untimed. One more call after the timed rounds gives ``peak_extra_mib`` and the errors
against the fp32 reference (suite.measure's memory run and accuracy), kept in ``extra_info``
with, for the own kernel, the path ``own_kernel.plan`` gives for the same arguments. The own
kernel is called through its public API with spec.OWN_VARIANTS' arguments; the peers through
the suite's providers. The gate's plugin checks each against the baseline as its test ends.

Run them with ``nox -s gate`` or ``python -m suite gate`` (pytest-benchmark compares them with
this GPU's baseline); the default ``pytest`` never collects them.
"""
from __future__ import annotations

import statistics
import time

import pytest

from suite.gates import spec

CASES = spec.cases()
CALIBRATION_REPS = 5  # untimed calls that size the slow injection's GPU work


def phase_calls(phase, fn, x, kwargs, device):
    """(setup, run) for benchmark.pedantic: setup prepares the phase (untimed), flushes the L2
    cache and synchronises; run(state) is the phase's call, not synchronised."""
    import torch

    from suite.measure import L2_FLUSH_BYTES, _phase_calls, sync

    prepare, run = _phase_calls(phase, fn, x, kwargs)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def setup():
        state = prepare()
        flush.zero_()
        sync(device)
        return (state,), {}

    return setup, run


def wall_ms(setup, target, reps: int) -> float:
    """Median milliseconds of ``target`` timed as pytest-benchmark times it (after one
    untimed call)."""
    times = []
    for _ in range(reps + 1):
        args, kwargs = setup()
        t0 = time.perf_counter()
        target(*args, **kwargs)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def own_call(variant: dict):
    """own_kernel.linear_cross_entropy with a variant's keyword arguments (spec.OWN_VARIANTS),
    in the providers' calling convention."""
    def call(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
        from own_kernel import linear_cross_entropy

        return linear_cross_entropy(e, c, targets, bias=bias, softcap=softcap,
                                    ignore_index=ignore_index, **variant)

    return call


def own_path(phase, x, kwargs, variant: dict) -> str:
    """The path own_kernel.plan says the call of ``phase`` takes with these arguments."""
    import torch
    from own_kernel import plan

    with torch.set_grad_enabled(phase != "fwd"):
        return plan(x.e, x.c, x.targets, bias=x.bias, **kwargs, **variant).path


def measure_case(benchmark, phase, fn, inputs, ref, softcap, injected, device, rounds: int,
                 variant: dict | None = None) -> list[str]:
    """Time ``fn``'s phase with ``benchmark``, then its memory, errors and (``variant``: an own
    call's arguments) the own kernel's path into extra_info; returns what came out non-finite."""
    from suite.measure import _Leaves, _memory_run, accuracy, sync

    fn = injected.provider(fn)
    kwargs = {"softcap": softcap, "ignore_index": -100}
    x = _Leaves(inputs, grad=phase != "fwd")
    setup, run = phase_calls(phase, fn, x, kwargs, device)

    def timed_with(work):
        def call(state):
            run(state)
            work()
            sync(device)
        return wall_ms(setup, call, CALIBRATION_REPS)

    extra = injected.extra_work(timed_with, device)

    def target(state):
        run(state)
        extra()  # nothing unless CCE_GATE_INJECT=slow:F
        sync(device)

    benchmark.pedantic(target, setup=setup, rounds=rounds,
                       warmup_rounds=spec.WARMUP_ROUNDS, iterations=1)
    if variant is not None:
        benchmark.extra_info[spec.PATH_METRIC] = own_path(phase, x, kwargs, variant)
    loss, peak_extra, peak_abs = _memory_run(phase, fn, x, kwargs, device)
    injected.gradients(x, ref)  # nothing unless CCE_GATE_INJECT=err:F
    loss = injected.loss(loss, ref["loss"])  # nothing unless CCE_GATE_INJECT=loss_err:F
    errors, bad = accuracy(phase, loss, x, ref)
    x.clear_grads()
    benchmark.extra_info.update(peak_extra_mib=peak_extra, peak_abs_mib=peak_abs, **errors)
    return bad


def gated_call(case: spec.Case, device, softcap):
    """(the call, whether its gradient is exact, why it cannot run here or None)."""
    from suite import catalog
    from suite.registry import needs_triton_device

    if case.own:
        return (own_call(spec.OWN_VARIANTS[case.provider]), case.provider not in spec.OWN_INEXACT,
                needs_triton_device(device))
    provider = catalog.get(case.provider)
    reason = (provider.unavailable_reason(device)
              or provider.unsupported_reason(bias=False, softcap=softcap))
    return provider.fn, provider.exact, reason


@pytest.mark.benchmark(disable_gc=True)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gate(benchmark, case, gate_inputs, injected):
    from suite.measure import free_memory

    shape = spec.GATE_SHAPES[case.shape]
    fn, exact, reason = gated_call(case, gate_inputs.device, shape.softcap)
    if reason:
        pytest.skip(f"{case.provider}: {reason}")
    inputs, ref = gate_inputs.get(shape)
    injected = injected.for_benchmark(case.id)
    benchmark.extra_info.update(
        shape=shape.name, provider=case.provider, phase=case.phase, n=shape.n, d=shape.d,
        v=shape.v, softcap=shape.softcap, dtype=spec.DTYPE, dist=spec.DIST, seed=spec.SEED,
        exact=exact, rounds=spec.rounds(case.shape), warmup_rounds=spec.WARMUP_ROUNDS,
        inject=injected.text)
    try:
        bad = measure_case(benchmark, case.phase, fn, inputs, ref, shape.softcap, injected,
                           gate_inputs.device, spec.rounds(case.shape),
                           spec.OWN_VARIANTS[case.provider] if case.own else None)
    except BaseException:
        free_memory(gate_inputs.device)
        raise
    # As the suite does: the cycle collector (~0.3 s with torch.compile loaded) only after a
    # failure; refcounting has freed this benchmark's tensors.
    free_memory(gate_inputs.device, collect=False)
    assert not bad, f"{case.id}: non-finite {', '.join(bad)}"
